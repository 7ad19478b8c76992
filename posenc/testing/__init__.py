"""The encoder contract as an importable test battery.

Every registered encoder runs these checks in posenc's own test suite (parametrised over
``posenc.encodings.names()``), so an encoder is tested the day it is registered. Run them on
your own encoder, registered or not::

    from posenc import testing
    testing.check_encoder(MyEncoding(width=3))     # all checks; one AssertionError lists failures
    testing.check_encoder("kerple")                # a registered name

or parametrise your own pytest over those that apply to it::

    @pytest.mark.parametrize("check", testing.applicable(MyEncoding()))
    def test_contract(check):
        testing.CHECKS[check](MyEncoding())

The checks (each ``check(encoder, settings=None)``, see :mod:`posenc.testing.checks`):

==================  ===========================================================================
``declarations``    the class declarations (``name``, ``paper``, ``relative``, ...) well formed
``paths_agree``     every float32 softmax path that takes the encoder equals the ``einsum`` one
``cudnn``           cuDNN's fused kernel equals the ``einsum`` reference in bfloat16 (NVIDIA GPUs)
``pallas``          the Pallas flash kernel (interpret mode off a GPU) equals ``einsum``, forward
                    and gradients of ``q``, ``k``, ``v`` and the encoder's parameters
``carry``           ``contextual_logits`` on key tiles, last to first with the carry, equal one call
``unnormalized``    ``normalized = False``: every row's weights ``exp(logits)`` sum to at most 1,
                    masked pairs weigh 0
``householder``     ``householder`` on the first tiles of a window equals one call on the whole
                    (each entry reads the inputs up to its own), float32 and finite
``causal``          no output depends on a later input (Jacobian through the model)
``bidirectional``   ``causal=False``: paths equal the reference, later inputs matter; or refused
``shift``           shifting all positions changes nothing iff ``relative = True``
``param_shapes``    ``init`` == ``param_shapes``, float32, held per layer or shared as declared
``bf16``            bfloat16 compute over several tiles: finite and close to float32
``trains``          a few Adam steps lower the loss; every encoder parameter gets a gradient
``extrapolates``    built for ``T``, runs at ``4T`` (or raises ``check_length``'s error)
``linear``          each linear attention path equals RoFormer eq. (19) and is causal, or refuses
``augment``         a training key changes nothing but ``augment_positions`` (same key, same
                    logits); ``continuous_positions`` encoders read fractional positions
``encoder_decoder`` inside the encoder-decoder: padding removed exactly, a causal decoder over
                    the whole source, cached decoding equal to teacher forcing; or refused in
                    one line for the encoder side (causal-only encoders)
``classifier``      inside the sequence classifier: a padded row classified as the row alone
                    (first-token and mean pooling), the last token read; or refused in one line
                    (causal-only encoders)
``bias_by_distance`` ``bias`` of each pair equals ``bias`` at its distance ``k_pos - q_pos`` alone
``reach``           past the declared reach, every key gets the same terms (per query and side)
``carry_limit``     past the declared carry limit, every key gets the probe key's contextual terms
``context_parallel`` evaluation with each window split over ``mesh.context`` devices scores one
                    device's loss (blocked path; needs several devices, a skip with one)
``patterns``        in a two-layer pattern beside NoPE and beside itself with a sliding window
                    (the model's encoder where it adds an input term): paths equal einsum, the
                    window matters, cached decoding equals a full pass
``pattern_trains``  a few Adam steps on those patterns: finite losses, every encoder parameter
                    a gradient
``key_lookback``    ``rotate`` of each key reads no more earlier keys than ``key_lookback``
                    says (and, when positive, the last it names); encoders with ``rotate``
==================  ===========================================================================

A check that does not apply to an encoder (``carry`` without ``contextual_logits``,
``unnormalized`` for one that normalises, ``householder`` without that hook, ``augment``
without continuous positions, ``bias_by_distance``, ``reach`` and ``carry_limit`` without the
declaration, ``cudnn`` and ``pallas`` for an encoder the path refuses) or cannot run here
(``cudnn`` without an NVIDIA GPU, ``context_parallel`` on one device) raises
:class:`NotApplicable` rather than passing: :func:`applicable` and :func:`cases` leave the first
kind out, and the second is a skip.

Sizes are tiny (one layer, width 32, two heads, float32, 12 tokens) and configurable through
:class:`Settings`; :data:`HPARAMS` holds the battery's hyperparameters for the founding encoders
that need non-default ones at these sizes (a new encoder needs none).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from posenc.encodings import registry
from posenc.encodings.base import Encoding
from posenc.testing._harness import (
    BIDIRECTIONAL_HPARAMS,
    HPARAMS,
    NotApplicable,
    Settings,
    resolve,
)
from posenc.testing.checks import (
    check_augment,
    check_bf16,
    check_bidirectional,
    check_carry,
    check_causal,
    check_cudnn,
    check_declarations,
    check_extrapolates,
    check_householder,
    check_key_lookback,
    check_param_shapes,
    check_paths_agree,
    check_shift,
    check_trains,
    check_unnormalized,
    inapplicable,
)
from posenc.testing.classifier import check_classifier
from posenc.testing.context import check_context_parallel
from posenc.testing.encdec import check_encoder_decoder
from posenc.testing.linear import check_linear
from posenc.testing.pallas import check_pallas
from posenc.testing.patterns import check_pattern_trains, check_patterns
from posenc.testing.tiling import check_bias_by_distance, check_carry_limit, check_reach

Check = Callable[..., None]

CHECKS: dict[str, Check] = {
    "declarations": check_declarations,
    "paths_agree": check_paths_agree,
    "cudnn": check_cudnn,
    "pallas": check_pallas,
    "carry": check_carry,
    "unnormalized": check_unnormalized,
    "householder": check_householder,
    "causal": check_causal,
    "bidirectional": check_bidirectional,
    "shift": check_shift,
    "param_shapes": check_param_shapes,
    "bf16": check_bf16,
    "trains": check_trains,
    "extrapolates": check_extrapolates,
    "linear": check_linear,
    "augment": check_augment,
    "encoder_decoder": check_encoder_decoder,
    "classifier": check_classifier,
    "bias_by_distance": check_bias_by_distance,
    "reach": check_reach,
    "carry_limit": check_carry_limit,
    "context_parallel": check_context_parallel,
    "patterns": check_patterns,
    "pattern_trains": check_pattern_trains,
    "key_lookback": check_key_lookback,
}


def applicable(encoder: str | Encoding, settings: Settings | None = None) -> list[str]:
    """The names of the checks in :data:`CHECKS` that apply to ``encoder`` (:func:`inapplicable`
    gives none; ``cudnn`` may still find no GPU to run on)."""
    return [check for check in CHECKS if inapplicable(check, encoder, settings) is None]


def cases() -> list[tuple[str, str]]:
    """``(encoder name, check name)`` for every registered encoder and every check that applies
    to it: what the test suite parametrises over."""
    return [(name, check) for name in registry.names() for check in applicable(name)]


def check_encoder(
    encoder: str | Encoding,
    settings: Settings | None = None,
    checks: tuple[str, ...] | None = None,
) -> dict[str, str]:
    """Runs the checks (all by default) on one encoder and raises one ``AssertionError`` listing
    every check that failed.

    Args:
      encoder: a registered name or an unbound encoder instance.
      settings: sizes and tolerances; :class:`Settings` defaults.
      checks: names from :data:`CHECKS`.

    Returns:
      ``{check: reason}`` for the checks that did not run (:class:`NotApplicable`): they passed
      nothing.
    """
    failures, not_run = [], {}
    for name in checks or tuple(CHECKS):
        try:
            CHECKS[name](encoder, settings)
        except NotApplicable as why:
            not_run[name] = str(why)
        except AssertionError as err:
            failures.append(f"- {name}: {err}")
    if failures:
        raise AssertionError(
            f"{len(failures)} of {len(checks or CHECKS)} contract checks failed:\n"
            + "\n".join(failures)
        )
    return not_run


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
    "NotApplicable",
    "Settings",
    "applicable",
    "cases",
    "check_augment",
    "check_bf16",
    "check_bias_by_distance",
    "check_bidirectional",
    "check_carry",
    "check_carry_limit",
    "check_causal",
    "check_classifier",
    "check_context_parallel",
    "check_cudnn",
    "check_declarations",
    "check_encoder",
    "check_pallas",
    "check_extrapolates",
    "check_householder",
    "check_linear",
    "check_param_shapes",
    "check_paths_agree",
    "check_pattern_trains",
    "check_patterns",
    "check_reach",
    "check_shift",
    "check_trains",
    "inapplicable",
    "resolve",
    "temporary_registry",
]
