"""Which attention path a model's layers take on each backend, asked from any machine.

``model.attention_impl="auto"`` picks a path per layer from the layer's encoder and options, the
window length, the dtype and the backend (:func:`posenc.attention.core.choose_implementation`).
The backend is the one question a laptop cannot answer by running: this module asks the same
rules for ``cpu``, ``gpu`` (NVIDIA, where cuDNN's fused kernel is chosen) and ``tpu`` without
being on them, so ``posenc plan`` and the benchmark report say what a GPU run would use.

An explicit ``attention_impl`` (anything but ``auto``) is the path on every backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from posenc.attention.core import choose_implementation

# The backends :func:`paths_by_backend` answers for (JAX's ``default_backend()`` names).
BACKENDS = ("cpu", "gpu", "tpu")


def layer_path(model, length: int, backend: str, impl: str | None = None) -> str:
    """The attention path ``model``'s layers take over a window of ``length`` tokens on
    ``backend``: the distinct paths of its blocks joined by ``+`` in layer order (one name when
    every layer takes the same).

    Args:
      model: a decoder-only model (:class:`posenc.models.lm.Transformer`, or its
        ``nnx.eval_shape``): anything with ``config`` and ``blocks`` whose blocks have
        ``encoding`` and ``options``.
      length: queries (and keys) per window.
      backend: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
      impl: the attention implementation (default ``model.config.attention_impl``).
    """
    m = model.config
    impl = impl or m.attention_impl
    if impl != "auto":
        return impl
    paths: list[str] = []
    for block in model.blocks:
        path = choose_implementation(
            block.encoding,
            length,
            m.dtype,
            m.attention_block_size,
            platform=backend,
            options=block.options,
        )
        if path not in paths:
            paths.append(path)
    return "+".join(paths)


def paths_by_backend(
    model, length: int, backends: Sequence[str] = BACKENDS, impl: str | None = None
) -> dict[str, str]:
    """``{backend: path}`` of :func:`layer_path` for each of ``backends``."""
    return {b: layer_path(model, length, b, impl) for b in backends}


def paths_table(model, lengths: Iterable[int], backends: Sequence[str] = BACKENDS) -> dict:
    """``{length: {backend: path}}`` for each window length (JSON-friendly: string keys)."""
    return {str(n): paths_by_backend(model, n, backends) for n in lengths}


def describe(paths: dict[str, str]) -> str:
    """``{"cpu": "xla", "gpu": "cudnn", ...}`` -> ``"cpu xla, gpu cudnn, tpu xla"``."""
    return ", ".join(f"{b} {p}" for b, p in paths.items())
