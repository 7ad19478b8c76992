"""posenc: positional encodings for transformers, compared.

``posenc.load_run(workdir)`` loads a trained run (:mod:`posenc.runs.trained`); importing ``posenc``
itself stays cheap (JAX is imported on first use).
"""

__version__ = "0.1.0"

__all__ = ["TrainedRun", "load_run"]


def __getattr__(name: str):
    if name in __all__:
        from posenc.runs import trained

        return getattr(trained, name)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")
