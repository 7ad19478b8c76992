"""The encoder contract as an importable test battery.

Every registered encoder runs these checks in posenc's own test suite (parametrised over
``posenc.encodings.names()``), so an encoder is tested the day it is registered. Run them on
your own encoder, registered or not::

    from posenc import testing
    testing.check_encoder(MyEncoding(width=3))     # all checks; one AssertionError lists failures
    testing.check_encoder("kerple")                # a registered name

or parametrise your own pytest over them::

    @pytest.mark.parametrize("check", testing.CHECKS)
    def test_contract(check):
        testing.CHECKS[check](MyEncoding())

The checks (each ``check(encoder, settings=None)``, see :mod:`posenc.testing.checks`):

==================  ===========================================================================
``declarations``    the class declarations (``name``, ``paper``, ``relative``, ...) well formed
``paths_agree``     every softmax path that takes the encoder equals the ``einsum`` reference
``carry``           ``contextual_logits`` on key tiles, last to first with the carry, equal one call
``causal``          no output depends on a later input (Jacobian through the model)
``bidirectional``   ``causal=False``: paths equal the reference, later inputs matter; or refused
``shift``           shifting all positions changes nothing iff ``relative = True``
``param_shapes``    ``init`` == ``param_shapes``, float32, held per layer or shared as declared
``bf16``            bfloat16 compute over several tiles: finite and close to float32
``trains``          a few Adam steps lower the loss
``extrapolates``    built for ``T``, runs at ``4T`` (or raises ``check_length``'s error)
``linear``          each linear attention path equals RoFormer eq. (19) and is causal, or refuses
``augment``         a training key changes nothing but ``augment_positions`` (same key, same
                    logits); ``continuous_positions`` encoders read fractional positions
==================  ===========================================================================

Sizes are tiny (one layer, width 32, two heads, float32, 12 tokens) and configurable through
:class:`Settings`; :data:`HPARAMS` holds the battery's hyperparameters for the founding encoders
that need non-default ones at these sizes (a new encoder needs none).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from posenc.encodings import registry
from posenc.encodings.base import Encoding
from posenc.testing._harness import BIDIRECTIONAL_HPARAMS, HPARAMS, Settings, resolve
from posenc.testing.checks import (
    check_augment,
    check_bf16,
    check_bidirectional,
    check_carry,
    check_causal,
    check_declarations,
    check_extrapolates,
    check_param_shapes,
    check_paths_agree,
    check_shift,
    check_trains,
)
from posenc.testing.linear import check_linear

Check = Callable[..., None]

CHECKS: dict[str, Check] = {
    "declarations": check_declarations,
    "paths_agree": check_paths_agree,
    "carry": check_carry,
    "causal": check_causal,
    "bidirectional": check_bidirectional,
    "shift": check_shift,
    "param_shapes": check_param_shapes,
    "bf16": check_bf16,
    "trains": check_trains,
    "extrapolates": check_extrapolates,
    "linear": check_linear,
    "augment": check_augment,
}


def cases() -> list[tuple[str, str]]:
    """``(encoder name, check name)`` for every registered encoder and every check: what the
    test suite parametrises over."""
    return [(name, check) for name in registry.names() for check in CHECKS]


def check_encoder(
    encoder: str | Encoding,
    settings: Settings | None = None,
    checks: tuple[str, ...] | None = None,
) -> None:
    """Runs the checks (all by default) on one encoder and raises one ``AssertionError`` listing
    every check that failed.

    Args:
      encoder: a registered name or an unbound encoder instance.
      settings: sizes and tolerances; :class:`Settings` defaults.
      checks: names from :data:`CHECKS`.
    """
    failures = []
    for name in checks or tuple(CHECKS):
        try:
            CHECKS[name](encoder, settings)
        except AssertionError as err:
            failures.append(f"- {name}: {err}")
    if failures:
        raise AssertionError(
            f"{len(failures)} of {len(checks or CHECKS)} contract checks failed:\n"
            + "\n".join(failures)
        )


@contextlib.contextmanager
def temporary_registry() -> Iterator[None]:
    """Restores the encoder registry on exit, so a test can ``@register`` a throwaway encoder."""
    registry.names()  # load the package and plugins first, so they are not "restored" away
    saved = dict(registry._REGISTRY)
    try:
        yield
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)


__all__ = [
    "BIDIRECTIONAL_HPARAMS",
    "CHECKS",
    "HPARAMS",
    "Settings",
    "cases",
    "check_augment",
    "check_bf16",
    "check_bidirectional",
    "check_carry",
    "check_causal",
    "check_declarations",
    "check_encoder",
    "check_extrapolates",
    "check_linear",
    "check_param_shapes",
    "check_paths_agree",
    "check_shift",
    "check_trains",
    "resolve",
    "temporary_registry",
]
