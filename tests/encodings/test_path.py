"""PaTH attention (Yang et al. 2025) against a float64 transcription of the paper's logit,

    a_ij = softmax_j(q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(d) [+ sum_{l=j+1..i} log f_l]),
    H_t = I - beta_t w_t w_t^T,

with every ``Dh x Dh`` product between a key and its query formed as a matrix (``O(L^2 d^3)``),
and ``w_t``, ``beta_t`` (and FoX's ``f_t``) transcribed from the paper and the official layer
(low-rank projection, causal convolution of size 3 with SiLU, L2 normalisation, ``beta = 2
sigmoid``), never calling the code under test. On the ``einsum`` and ``blocked`` paths at the
training length and 16 times it, forward and gradients (through the layer input and every
parameter); ``beta = 0`` gives NoPE, and PaTH-FoX with ``beta = 0`` the ``forgetting`` encoder;
the fused and linear paths and bidirectional models refuse it. A key/value cache against a full
pass: tests/test_generate.py and the battery's patterns check run over the registry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings, testing
from posenc.attention.core import attend, check_implementation, choose_implementation
from posenc.decoding import window as window_lib
from posenc.decoding.lm import greedy_generate, greedy_generate_reference
from posenc.encodings import Dims
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer
from posenc.testing import patterns

H, DH, D = 2, 8, 12  # the layer input's width D differs from H * DH, so no axis is mixed up
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=D)
TRAIN_LENGTH = 12
EXTRA_KEYS = 3  # the queries are the last T of S = T + 3 keys
TILE = 5  # the blocked path's tile at the training length; 7 * 5 + 4 = 39 at 16 times it

_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size"),
    compiler_options={"xla_backend_optimization_level": 0},
)


# -- the transcription --------------------------------------------------------------------------


def _factors(xp, x, p, conv_size=3):
    """``w [B, S, H, d]`` and ``beta [B, S, H]`` from the layer input ``x [B, S, D]``: the
    paper's low-rank projection, causal short convolution (the official ``ShortConvolution``:
    tap m multiplies x_{t - size + 1 + m}, then SiLU), L2 normalisation (``w / sqrt(|w|^2 +
    1e-6)``, fla's ``l2_norm``) and ``beta = 2 sigmoid(x . u + b)``."""
    w = x @ p["w_down"] @ p["w_up"]  # [B, S, H d]
    if conv_size:
        s = w.shape[1]
        rows = []
        for t in range(s):
            acc = 0.0 * w[:, t]
            for m in range(conv_size):
                src = t - conv_size + 1 + m
                if src >= 0:
                    acc = acc + p["conv"][m] * w[:, src]
            rows.append(acc)
        w = xp.stack(rows, axis=1)
        w = w / (1.0 + xp.exp(-w))  # SiLU
    w = w.reshape(*w.shape[:2], H, DH)
    w = w / xp.sqrt((w * w).sum(-1, keepdims=True) + 1e-6)
    beta = 2.0 / (1.0 + xp.exp(-(x @ p["beta_w"] + p["beta_b"])))
    return w, beta


def _naive(xp, q, k, v, w, beta, log_f=None):
    """PaTH attention, causal (queries the last T of S keys): ``[B, T, H, d]``.

    ``M[j] = H_{j+dist} ... H_{j+1}`` for each key ``j``, one distance at a time (the product
    for the pair (j + dist, j)), so every pair's product is an explicit ``d x d`` matrix."""
    b, t, h, d = q.shape
    s = k.shape[1]
    eye = xp.eye(d)
    # H_t for t = 0 .. 2S - 1 (identity past the window): [B, 2S, H, d, d].
    house = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]
    house = xp.concatenate([house, xp.broadcast_to(eye, house.shape)], axis=1)
    # Queries by key index (zeros before the first query): [B, 2S, H, d].
    q_key = xp.concatenate([xp.zeros((b, s - t, h, d)), q, xp.zeros((b, s, h, d))], axis=1)
    m = xp.broadcast_to(eye, (b, s, h, d, d))
    by_distance = []  # [B, H, S]: the logit of query key index j + dist and key j, for every j
    for dist in range(s):
        if dist:
            m = xp.einsum("bshde,bshef->bshdf", house[:, dist : dist + s], m)
        by_distance.append(xp.einsum("bshd,bshde,bshe->bhs", q_key[:, dist : dist + s], m, k))
    cols = xp.arange(s)
    dist = xp.clip(cols[:, None] - cols[None, :], 0, s - 1)  # [i, j]
    table = xp.stack(by_distance, axis=2)  # [B, H, dist, j]
    logits = xp.take_along_axis(table, xp.broadcast_to(dist, (b, h, s, s)), axis=2)
    logits = logits[:, :, s - t :] / np.sqrt(d)  # the query rows
    if log_f is not None:
        c = xp.cumsum(log_f, axis=1).transpose(0, 2, 1)  # [B, H, S]: sum_{l <= i} log f_l
        logits = logits + c[:, :, s - t :, None] - c[:, :, None, :]
    visible = cols[None, :] <= xp.arange(t)[:, None] + (s - t)
    logits = xp.where(visible, logits, -1e30)
    a = xp.exp(logits - logits.max(-1, keepdims=True))
    a = a / a.sum(-1, keepdims=True)
    return xp.einsum("bhts,bshd->bthd", a, v)


def _reference(xp, q, k, v, x, p, forget):
    w, beta = _factors(xp, x, p)
    log_f = None
    if forget:
        log_f = -xp.log(1.0 + xp.exp(-(x @ p["gate_w"] + p["gate_b"])))  # log sigmoid
    return _naive(xp, q, k, v, w, beta, log_f)


# -- inputs ---------------------------------------------------------------------------------------


def _params(forget, seed=0):
    """Parameters that make every map matter: ``w`` far from the normalisation's epsilon and
    ``beta`` spread over (0, 2), one head reflecting more than the other."""
    rng = np.random.default_rng(seed)
    p = {
        "w_down": rng.standard_normal((D, 32)) * 0.5,
        "w_up": rng.standard_normal((32, H * DH)) * 0.5,
        "conv": rng.standard_normal((3, H * DH)),
        "beta_w": rng.standard_normal((D, H)) * 0.7,
        "beta_b": np.array([1.0, -0.5]),
    }
    if forget:
        p.update(gate_w=rng.standard_normal((D, H)) * 0.5, gate_b=np.array([2.0, -0.5]))
    return {n: jnp.asarray(a, jnp.float32) for n, a in p.items()}


def _inputs(length, seed=0):
    rng = np.random.default_rng(seed)
    t, s = length, length + EXTRA_KEYS
    q, k, v = (jnp.asarray(rng.standard_normal((2, n, H, DH)), jnp.float32) for n in (t, s, s))
    x = jnp.asarray(rng.standard_normal((2, s, D)), jnp.float32)
    return q, k, v, x


def _encoder(forget=False):
    return encodings.get("path", forget_gate=forget).bind(DIMS)


def _run(impl, block, q, k, v, x, params, forget, fn=_attend):
    s, t = k.shape[1], q.shape[1]
    return fn(
        q,
        k,
        v,
        encoding=_encoder(forget),
        params=params,
        q_pos=jnp.arange(s - t, s),
        k_pos=jnp.arange(s),
        implementation=impl,
        block_size=block,
        inputs=x,
    )


def _f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


# The default suite keeps one case per path and length; the rest in the slow step.
CASES = [
    ("einsum", 1, False),
    pytest.param("einsum", 16, True, marks=pytest.mark.slow),
    ("blocked", 1, True),
    pytest.param("blocked", 16, False, marks=pytest.mark.slow),
    ("blocked", 16, True),
    ("blocked", 24, False),  # tiles of 128: two chunks of 64 in each (householder.CHUNK)
    ("auto", 1, False),
]


@pytest.mark.parametrize("impl,factor,forget", CASES)
def test_every_path_equals_the_papers_products(impl, factor, forget):
    length = factor * TRAIN_LENGTH
    blocked = {1: TILE, 16: 7 * TILE + 4, 24: 128}.get(factor)
    block = {"einsum": 512, "auto": 64, "blocked": blocked}[impl]
    q, k, v, x = _inputs(length, seed=factor)
    params = _params(forget)
    got = np.asarray(_run(impl, block, q, k, v, x, params, forget), np.float64)
    expected = _reference(np, *_f64((q, k, v, x, params)), forget)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)
    # The products matter: NoPE's attention is far from it.
    nope = _reference(
        np, *_f64((q, k, v, x)), {**_f64(params), "beta_b": np.full(H, -np.inf)}, forget
    )
    assert np.abs(nope - expected).max() > 0.05


@pytest.mark.parametrize(
    "impl,factor",
    [
        pytest.param("einsum", 1, marks=pytest.mark.slow),
        ("blocked", 1),
        pytest.param("blocked", 16, marks=pytest.mark.slow),
    ],
)
def test_gradients_equal_the_papers(impl, factor):
    """Through queries, keys, values, the layer input and every parameter (PaTH-FoX), against
    autodiff of the transcription."""
    length = factor * TRAIN_LENGTH
    block = {"einsum": 512, "blocked": TILE if factor == 1 else 7 * TILE + 4}[impl]
    q, k, v, x = _inputs(length, seed=3 + factor)
    params = _params(True, seed=factor)
    weights = np.random.default_rng(7).standard_normal(q.shape)

    def loss(q, k, v, x, params):
        return jnp.sum(_run(impl, block, q, k, v, x, params, True, fn=attend) * weights)

    # At XLA:CPU's default optimisation level: at level 0 the blocked path's gradient with a
    # log_decay hook (the `forgetting` encoder's too, before PaTH) comes out NaN on this VM.
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, x, params)

    # Autodiff of the transcription (float32: its forward is checked in float64 above).
    def reference(q, k, v, x, params):
        return jnp.sum(_reference(jnp, q, k, v, x, params, True) * weights)

    expected = jax.jit(jax.grad(reference, argnums=(0, 1, 2, 3, 4)))(q, k, v, x, params)
    for name, g, e in zip(("q", "k", "v", "x", "params"), got, expected, strict=True):
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(e), strict=True):
            scale = max(1.0, float(np.abs(b).max()))
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-3, atol=1e-3 * scale, err_msg=name)


@pytest.mark.parametrize("impl,block", [("einsum", 512), ("blocked", TILE)])
def test_without_reflection_it_is_nope_and_with_the_gate_forgetting(impl, block):
    """``beta = 0`` (``H = I``) gives NoPE's attention, and PaTH-FoX the ``forgetting``
    encoder's: the products change nothing when there is nothing to reflect. Bit for bit on the
    ``einsum`` path; to float32 rounding on the ``blocked`` one (its far tiles' logits are
    another matrix product, of the same values, inside a ``lax.cond``)."""
    q, k, v, x = _inputs(TRAIN_LENGTH)
    s, t = k.shape[1], q.shape[1]
    kw = dict(q_pos=jnp.arange(s - t, s), k_pos=jnp.arange(s), implementation=impl)
    kw.update(block_size=block, inputs=x)
    for forget, other, other_params in (
        (False, "nope", {}),
        (True, "forgetting", None),
    ):
        params = {**_params(forget), "beta_b": jnp.full((H,), -jnp.inf)}  # beta = 2 sigmoid(-inf)
        if other_params is None:
            other_params = {"w": params["gate_w"], "b": params["gate_b"]}
        got = _attend(q, k, v, encoding=_encoder(forget), params=params, **kw)
        expected = _attend(
            q, k, v, encoding=encodings.get(other).bind(DIMS), params=other_params, **kw
        )
        if impl == "einsum":
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
        else:
            np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6)


def test_householder_hook_is_the_papers_w_and_beta():
    enc = encodings.get("path").bind(DIMS)
    params = _params(False)
    _, _, _, x = _inputs(4)
    w, beta = enc.householder(params, x.astype(jnp.bfloat16))
    assert w.shape == (2, 7, H, DH) and beta.shape == (2, 7, H) and w.dtype == jnp.float32
    want_w, want_beta = _factors(np, *_f64((x.astype(jnp.bfloat16), params)))
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(beta), want_beta, rtol=1e-5, atol=1e-5)
    assert ((0 < want_beta) & (want_beta < 2)).all() and np.ptp(want_beta) > 1.0
    # A full-rank projection and no convolution: w = l2norm(x W) per head.
    full = encodings.get("path", rank=0, conv_size=0).bind(DIMS)
    proj = np.random.default_rng(1).standard_normal((D, H * DH)).astype(np.float32)
    w, _ = full.householder({**params, "w_proj": jnp.asarray(proj)}, x)
    raw = (np.asarray(x, np.float64) @ proj).reshape(2, 7, H, DH)
    want = raw / np.sqrt((raw**2).sum(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5, atol=1e-5)


def test_declarations_parameters_and_refusals():
    enc = encodings.get("path")
    assert enc.hooks == ("householder",) and enc.relative and enc.causal_only and enc.cacheable
    assert encodings.get("path", forget_gate=True).hooks == ("log_decay", "householder")
    params = enc.bind(DIMS).init(jax.random.key(0), DIMS)
    assert {n: a.shape for n, a in params.items()} == {
        "w_down": (D, 32),
        "w_up": (32, H * DH),
        "conv": (3, H * DH),
        "beta_w": (D, H),
        "beta_b": (H,),
    }
    assert not np.asarray(params["beta_b"]).any()  # the official zero bias: beta = 1 at first
    assert 0.01 < float(np.std(np.asarray(params["w_up"]))) < 0.03  # and std 0.02
    full = encodings.get("path", rank=0, conv_size=0, forget_gate=True).bind(DIMS)
    assert set(full.init(jax.random.key(0), DIMS)) == {
        "w_proj",
        "beta_w",
        "beta_b",
        "gate_w",
        "gate_b",
    }
    for bad, field in (
        ({"rank": -1}, "rank"),
        ({"conv_size": 2.5}, "conv_size"),
        ({"forget_gate": 1}, "forget_gate"),
        ({"init_std": -1.0}, "init_std"),
    ):
        with pytest.raises(ValueError, match=rf"^encoding\.(hparams\.)?{field} must be"):
            encodings.get("path", **bad)
    # Only einsum and blocked form the transported logits; auto never picks a fused kernel.
    bound = enc.bind(Dims(2, 64, 128))
    for platform in ("cpu", "gpu"):
        assert choose_implementation(bound, 64, jnp.bfloat16, 512, platform) == "einsum"
        assert choose_implementation(bound, 4096, jnp.bfloat16, 512, platform) == "blocked"
    for impl in ("xla", "cudnn", "linear", "linear_performer"):
        with pytest.raises(ValueError, match=r"attention_impl=.*'path'.*Householder") as err:
            check_implementation(bound, impl)
        assert "\n" not in str(err.value)
        config = ModelConfig(num_layers=1, model_dim=16, num_heads=2, attention_impl=impl)
        with pytest.raises(ValueError, match="Householder"):
            Transformer(config, enc, rngs=nnx.Rngs(0))
    config = ModelConfig(num_layers=1, model_dim=16, num_heads=2, causal=False)
    with pytest.raises(ValueError, match=r"model.causal=False: encoding 'path' is causal only"):
        Transformer(config, enc, rngs=nnx.Rngs(0))
    q, k, v, x = _inputs(4)
    kw = dict(encoding=_encoder(), params=_params(False), q_pos=jnp.arange(3, 7))
    with pytest.raises(ValueError, match=r"'path' reads the layer input.*inputs=\[B, S=7"):
        attend(q, k, v, k_pos=jnp.arange(7), **kw)


@pytest.mark.slow
def test_a_sliding_window_layer_decodes_what_full_recomputation_gives():
    """A local layer's window cache would drop the tokens before its window, which PaTH's maps
    at the window's first tokens read (the short convolution): such a layer keeps a full cache,
    and greedy generation gives the full recomputation's logits."""
    model = patterns.build_pattern(
        encodings.get("path"), testing.Settings(), "beside_itself", "auto", "sliding:3"
    )
    prompt, new = 5, 6
    assert [b.options.window for b in model.blocks] == ["full", "sliding:3"]
    assert window_lib.layouts(model, prompt + new)[1] == window_lib.Layout("full", prompt + new)
    prompts = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, prompt)), jnp.int32)
    tokens, logits = greedy_generate(model, prompts, new, return_logits=True)
    want_tokens, want = greedy_generate_reference(model, prompts, new, return_logits=True)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
