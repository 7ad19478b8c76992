"""posenc runs in EleutherAI's lm-evaluation-harness (``pip install posenc[harness]``).

Importing this package registers the harness model ``posenc`` (:mod:`posenc.harness.model`), so
that the harness's Python API takes it::

    import lm_eval
    import posenc.harness  # registers model="posenc"

    results = lm_eval.simple_evaluate(
        model="posenc", model_args="workdir=runs/rope,max_length=256", tasks=["lambada_openai"]
    )

lm_eval 0.4 finds models only in its own registry (it has no plugin entry points), so its
``lm_eval`` command does not know ``posenc``; ``posenc harness <lm_eval arguments>``
(:func:`posenc.harness.cli.run_cli`) registers the model and runs the harness's own command line
with those arguments. The numeric core (:mod:`posenc.harness.scoring`) does not need the harness.
"""

from __future__ import annotations

try:
    import lm_eval  # noqa: F401
except ImportError as e:  # pragma: no cover - the extra is installed where this is imported
    raise ImportError(
        "posenc.harness needs EleutherAI's lm-evaluation-harness: pip install 'posenc[harness]'"
    ) from e

from posenc.harness.model import NAME, PosencLM, parse_model_args

__all__ = ["NAME", "PosencLM", "parse_model_args"]
