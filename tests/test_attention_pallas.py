"""The ``pallas`` attention path (posenc.attention.pallas), in Pallas's interpret mode on CPU:
forward against a float64 naive attention written here (bias from the encoder's own hook, masks
transcribed from the window definitions), gradients of ``q``, ``k``, ``v`` and the encoder's
parameters against the ``einsum`` path's, for every registered encoder with a ``bias`` the
kernel takes (chosen by its hooks, not its name), at 16 tokens (two tiles of 8) and at 16
times it, causal and bidirectional, with sliding, banded and chunked windows. Interpret mode
compiles slowly: one case in the default suite, the sweep in the slow step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings, testing
from posenc.attention import pallas
from posenc.attention.core import attend, check_implementation, choose_implementation
from posenc.attention.options import AttentionOptions
from posenc.attention.terms import plain_terms
from posenc.encodings import Dims

H, DH = 3, 8
TILE = 8
EXTRA_KEYS = 3
OFFSETS = (0, 37)
DIMS = Dims(H, DH, H * DH)


def _kernel_bias_encoders() -> list[str]:
    """Registered encoders with a ``bias`` hook that the kernel takes (asked of the contract)."""
    out = []
    for name in encodings.names():
        enc = testing.resolve(name)
        if "bias" not in enc.hooks:
            continue
        try:
            check_implementation(enc.bind(DIMS), "pallas")
        except ValueError:
            continue
        out.append(name)
    return out


def _inputs(length: int, seed: int = 0):
    b, t, s = len(OFFSETS), length, length + EXTRA_KEYS
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((b, n, H, DH)), jnp.float32) for n in (t, s, s))
    k_pos = jnp.asarray(np.asarray(OFFSETS)[:, None] + np.arange(s)[None, :], jnp.int32)
    return q, k, v, k_pos[:, s - t :], k_pos


def _visible(t: int, s: int, causal: bool, window: str) -> np.ndarray:
    """``[T, S]`` numpy transcription of the masks (options.py's docstring): query ``a`` at key
    index ``a = i + S - T``."""
    a = np.arange(t)[:, None] + (s - t)
    j = np.arange(s)[None, :]
    ok = (j <= a) if causal else np.ones((t, s), bool)
    kind, _, size = window.partition(":")
    if kind in ("sliding", "banded"):
        ok &= j > a - int(size)
    if kind == "banded":
        ok &= j < a + int(size)
    if kind == "chunked":
        ok &= (j // int(size)) == (a // int(size))
    return ok


def _naive(q, k, v, bias, causal, window) -> np.ndarray:
    q, k, v, bias = (np.asarray(x, np.float64) for x in (q, k, v, bias))
    t, s = q.shape[1], k.shape[1]
    logits = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(DH) + bias
    logits = np.where(_visible(t, s, causal, window), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


def _setup(name: str, causal: bool):
    enc = testing.resolve(name, bidirectional=not causal).bind(DIMS)
    return enc, enc.init(jax.random.key(1), DIMS)


def _run(enc, params, impl, q, k, v, q_pos, k_pos, causal, window, block=TILE):
    return attend(
        q,
        k,
        v,
        encoding=enc,
        params=params,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        implementation=impl,
        block_size=block,
        options=AttentionOptions(window=window),
    )


def _check_forward(name, length, causal, window):
    enc, params = _setup(name, causal)
    q, k, v, q_pos, k_pos = _inputs(length)
    run = jax.jit(_run, static_argnums=(0, 2, 8, 9))
    got = np.asarray(run(enc, params, "pallas", q, k, v, q_pos, k_pos, causal, window))
    bias = np.asarray(enc.bias(params, q_pos, k_pos), np.float64)
    expected = _naive(q, k, v, bias, causal, window)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def _check_gradients(name, length, causal, window):
    enc, params = _setup(name, causal)
    q, k, v, q_pos, k_pos = _inputs(length)
    weights = jnp.asarray(np.random.default_rng(5).standard_normal(q.shape), jnp.float32)

    @jax.jit
    def grads(q, k, v, params):
        def loss(impl, *args):
            out = _run(enc, args[3], impl, *args[:3], q_pos, k_pos, causal, window)
            return jnp.sum(out * weights)

        return [
            jax.grad(lambda *a, impl=impl: loss(impl, *a), argnums=(0, 1, 2, 3))(q, k, v, params)
            for impl in ("einsum", "pallas")
        ]

    ref, got = grads(q, k, v, params)
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4)


def test_the_kernel_equals_naive_attention_with_a_bias_and_a_sliding_window():
    """The default suite's one kernel case: the first bias encoder the kernel takes, a sliding
    window over two tiles, 16 queries (two query tiles of 8, the last key tile padded)."""
    _check_forward(_kernel_bias_encoders()[0], 16, True, "sliding:11")


CASES = [
    pytest.param(name, length, causal, marks=pytest.mark.slow)
    for name in _kernel_bias_encoders()
    for length in (16, 16 * 16)
    for causal in (True, False)
]


@pytest.mark.parametrize("name,length,causal", CASES)
def test_every_bias_encoder_forward_and_gradients(name, length, causal):
    _check_forward(name, length, causal, "full")
    _check_gradients(name, length, causal, "full")


@pytest.mark.slow
@pytest.mark.parametrize("window", ["sliding:11", "banded:6", "chunked:8"])
@pytest.mark.parametrize("causal", [True, False])
def test_windows_with_a_distance_table_and_with_a_bias_per_pair(window, causal):
    """Both ways the kernel takes a bias: the first encoder declaring ``bias_by_distance`` (the
    table's band) and the first that does not (the hook called per tile)."""
    names = _kernel_bias_encoders()
    by_distance = [n for n in names if testing.resolve(n).bias_by_distance]
    per_pair = [n for n in names if not testing.resolve(n).bias_by_distance]
    for name in (by_distance[0], per_pair[0]):
        _check_forward(name, 40, causal, window)
        _check_gradients(name, 40, causal, window)


def test_the_kernel_refuses_what_it_cannot_compute_in_one_line():
    refused = {"content_logits", "value_term", "contextual_logits", "log_decay", "householder"}
    for name in encodings.names():
        enc = testing.resolve(name).bind(DIMS)
        reason = pallas.refusal(enc)
        assert (reason is not None) == (bool(refused & set(enc.hooks)) or not enc.normalized)
        if reason:
            with pytest.raises(ValueError, match=r"^model.attention_impl='pallas' cannot run"):
                check_implementation(enc, "pallas")
    alibi = encodings.get("alibi").bind(DIMS)
    with pytest.raises(ValueError, match=r"attention_impl='pallas' cannot take model.sinks"):
        check_implementation(alibi, "pallas", AttentionOptions(sinks=True))
    check_implementation(alibi, "pallas", AttentionOptions(softcap=30.0))  # in the kernel
    q, k, v, q_pos, k_pos = _inputs(4)
    with pytest.raises(ValueError, match=r"k_valid.*not implementation='pallas'"):
        attend(
            q,
            k,
            v,
            encoding=alibi,
            params={},
            q_pos=q_pos,
            k_pos=k_pos,
            implementation="pallas",
            k_valid=jnp.ones((1, k.shape[1]), bool),
        )


def test_auto_never_picks_the_unmeasured_kernel():
    for name in encodings.names():
        enc = testing.resolve(name)
        for platform in ("gpu", "cpu", "tpu"):
            for length in (16, 4096):
                got = choose_implementation(enc, length, jnp.bfloat16, 512, platform, 64)
                assert got != "pallas"


def test_tiles_are_powers_of_two_within_the_gpu_bounds():
    assert [pallas.tile_for(n, gpu=False) for n in (1, 5, 8, 12, 512)] == [1, 4, 8, 8, 512]
    assert [pallas.tile_for(n, gpu=True) for n in (1, 5, 32, 512)] == [16, 16, 32, 64]


def _lowers_for_cuda(name: str) -> str:
    """The StableHLO of the kernel exported for CUDA on this GPU-less machine (Pallas's Triton
    lowering runs without a GPU; compiling the Triton IR to PTX needs one)."""
    enc = testing.resolve(name).bind(Dims(4, 64, 256))
    params = enc.init(jax.random.key(0), enc.dims)
    x = jnp.zeros((1, 256, 4, 64), jnp.bfloat16)
    pos = jnp.arange(256, dtype=jnp.int32)[None]
    terms = plain_terms(64)

    def run(q, k, v, params, q_pos, k_pos):
        return pallas.flash(q, k, v, enc, params, q_pos, k_pos, True, terms, 64, interpret=False)

    triton = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
    exported = jax.export.export(jax.jit(run), platforms=["cuda"], disabled_checks=[triton])
    return exported(x, x, x, params, pos, pos).mlir_module()


LOWERING = [
    "nope" if name == "nope" else pytest.param(name, marks=pytest.mark.slow)
    for name in [
        "nope",
        *(n for n in _kernel_bias_encoders() if testing.resolve(n).bias_by_distance),
    ]
]


@pytest.mark.parametrize("name", LOWERING)
def test_the_kernel_lowers_to_triton_for_cuda_without_a_gpu(name):
    """Not a GPU run: the kernel's body is accepted by Pallas's Triton lowering (every primitive
    it uses exists there) and becomes XLA's Triton custom call. FIRE's bias hook (a 4-D einsum
    for its MLP) does not lower today: docs/attention.md says so."""
    assert "xla.gpu.triton" in _lowers_for_cuda(name)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
def test_soft_capping_and_a_logit_scale_inside_the_kernel(causal):
    """Soft-capping and a logit scale, which the kernel applies per tile, against the ``einsum``
    path (forward and gradients), on the first bias encoder the kernel takes."""
    enc, params = _setup(_kernel_bias_encoders()[0], causal)
    q, k, v, q_pos, k_pos = _inputs(20)
    options = AttentionOptions(softcap=1.5, logit_scale=0.7, window="sliding:9")
    weights = jnp.asarray(np.random.default_rng(6).standard_normal(q.shape), jnp.float32)

    @jax.jit
    def run(q, k, v):
        def loss(impl, q, k, v):
            out = attend(
                q,
                k,
                v,
                encoding=enc,
                params=params,
                q_pos=q_pos,
                k_pos=k_pos,
                causal=causal,
                implementation=impl,
                block_size=TILE,
                options=options,
            )
            return jnp.sum(out * weights), out

        grad = jax.grad(loss, argnums=(1, 2, 3), has_aux=True)
        return [grad(impl, q, k, v) for impl in ("einsum", "pallas")]

    (ref_grads, ref_out), (got_grads, got_out) = run(q, k, v)
    np.testing.assert_allclose(np.asarray(got_out), np.asarray(ref_out), rtol=2e-5, atol=2e-5)
    for r, g in zip(ref_grads, got_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4)
