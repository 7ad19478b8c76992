"""The parts against naive transcriptions: MLP kinds, grouped-query attention, projection
biases, post-norm and parallel residual blocks."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.layers.block import Block
from posenc.layers.config import ModelConfig
from posenc.layers.mlp import MLP_KINDS, Mlp

D, H, DH, F = 16, 4, 4, 24


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_erf(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


NAIVE = {
    "gelu": lambda wi, wg, x: _gelu_tanh(x @ wi),
    "gelu_exact": lambda wi, wg, x: _gelu_erf(x @ wi),
    "relu": lambda wi, wg, x: np.maximum(x @ wi, 0),
    "swiglu": lambda wi, wg, x: (x @ wg) / (1 + np.exp(-(x @ wg))) * (x @ wi),
    "geglu": lambda wi, wg, x: _gelu_tanh(x @ wg) * (x @ wi),
}


def _randomize(module, seed):
    """Every parameter (biases too) drawn from N(0, 0.5^2), so zero biases cannot hide."""
    state = nnx.state(module, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [0.5 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)]
    nnx.update(module, jax.tree.unflatten(tree, new))


@pytest.mark.parametrize("kind", MLP_KINDS)
def test_mlp_kinds_equal_their_formulas(kind):
    mlp = Mlp(kind, D, F, use_bias=True, dtype=jnp.float32, rngs=nnx.Rngs(0))
    _randomize(mlp, 1)
    x = np.random.default_rng(2).normal(size=(3, D)).astype(np.float32)
    p = {k: np.asarray(v, np.float64) for k, v in _flat(mlp).items()}
    wi = np.vstack([p["wi/kernel"], p["wi/bias"][None]])
    wg = np.vstack([p["wg/kernel"], p["wg/bias"][None]]) if "wg/kernel" in p else None
    xb = np.hstack([x, np.ones((3, 1))]).astype(np.float64)
    want = NAIVE[kind](wi, wg, xb) @ p["wo/kernel"] + p["wo/bias"]
    np.testing.assert_allclose(mlp(jnp.asarray(x)), want, rtol=2e-5, atol=2e-5)


def _flat(module) -> dict[str, jax.Array]:
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(module, nnx.Param))[0]

    def name(k):
        return str(getattr(k, "key", getattr(k, "name", k)))

    return {"/".join(name(k) for k in path if name(k) != "value"): v for path, v in leaves}


def _config(**kw) -> ModelConfig:
    base = dict(vocab_size=32, num_layers=1, model_dim=D, num_heads=H, mlp_dim=F, dtype="float32")
    return ModelConfig(**{**base, **kw})


def _block(seed=0, encoding="rope", **kw) -> Block:
    config = _config(**kw)
    enc = encodings.get(encoding).bind(config.dims)
    return Block(config, enc, rngs=nnx.Rngs(seed), causal=True)


def _run(block, x):
    t = x.shape[1]
    return block(jnp.asarray(x), jnp.arange(t)[None], {})


def test_grouped_query_attention_equals_heads_sharing_their_keys_and_values():
    """A GQA block (2 key/value heads for 4 query heads) equals a full block whose key and
    value weights repeat each group's, head for head."""
    gqa = _block(num_kv_heads=2, qkv_bias=True)
    _randomize(gqa, 3)
    full = _block(qkv_bias=True)
    g, f = _flat(gqa), _flat(full)
    shared = ("attn/k", "attn/v", "attn/k_bias", "attn/v_bias")  # [.., KV, Dh] -> [.., H, Dh]
    new = {k: np.repeat(g[k], 2, axis=-2) if k in shared else g[k] for k in f}
    state = nnx.state(full, nnx.Param)
    nnx.update(full, jax.tree.unflatten(jax.tree.structure(state), [new[n] for n in f]))
    x = np.random.default_rng(4).normal(size=(2, 7, D)).astype(np.float32)
    np.testing.assert_allclose(_run(gqa, x), _run(full, x), rtol=1e-5, atol=1e-5)
    assert g["attn/k"].shape == (D, 2, DH) and f["attn/k"].shape == (D, H, DH)


def _ln(x, scale, bias, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def _rms(x, scale, axes=(-1,), eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps) * scale


def _attention(p, h, qk_norm="none", offset=0.0):
    """Causal multi-head attention with RoPE (half layout) over ``h [B, T, D]``, float64; the
    keys and values of grouped heads repeated for their queries; QK-norm (``"rms"`` per head,
    ``"rms_all_heads"`` over each token's whole projection, as OLMo 2) before the rotation,
    its scales plus ``offset``."""
    b, t, _ = h.shape
    q = np.einsum("btd,dhk->bthk", h, p["attn/q"]) + p.get("attn/q_bias", 0)
    k = np.einsum("btd,dhk->bthk", h, p["attn/k"]) + p.get("attn/k_bias", 0)
    v = np.einsum("btd,dhk->bthk", h, p["attn/v"]) + p.get("attn/v_bias", 0)
    if qk_norm == "rms":
        q = _rms(q, offset + p["attn_params/q_norm"])
        k = _rms(k, offset + p["attn_params/k_norm"])
    elif qk_norm == "rms_all_heads":  # [B, T, heads * Dh] normed, then split into heads again
        q = _rms(q.reshape(b, t, -1), offset + p["attn_params/q_norm"]).reshape(q.shape)
        k = _rms(k.reshape(b, t, -1), offset + p["attn_params/k_norm"]).reshape(k.shape)
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    half = DH // 2
    inv = 10000.0 ** (-np.arange(half) / half)
    ang = np.arange(t)[:, None] * inv[None]  # [T, half]
    cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]

    def rot(x):
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    logits = np.einsum("bthk,bshk->bhts", rot(q), rot(k)) / math.sqrt(DH)
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("bhts,bshk->bthk", probs, v)
    return np.einsum("bthk,hkd->btd", out, p["attn/o"]) + p.get("attn/o_bias", 0)


def _mlp(p, h):
    return (
        _gelu_tanh(h @ p["mlp/wi/kernel"] + p["mlp/wi/bias"]) @ p["mlp/wo/kernel"]
        + p["mlp/wo/bias"]
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(norm_position="post"),
        dict(residual="parallel"),
        dict(qkv_bias=True, out_bias=True),
        dict(norm_position="sandwich"),
        dict(norm_position="post_branch", norm="rmsnorm"),
        dict(norm_position="sandwich", norm="rmsnorm", norm_unit_offset=True),
        dict(norm_unit_offset=True),
        dict(residual="parallel_shared_norm", norm="layernorm_nobias"),
    ],
    ids=[
        "pre",
        "post",
        "parallel",
        "biases",
        "sandwich",
        "post_branch",
        "gemma",
        "offset_ln",
        "shared_norm",
    ],
)
def test_block_equals_its_formula(options):
    block = _block(**options)
    _randomize(block, 5)
    p = {k: np.asarray(v, np.float64) for k, v in _flat(block).items()}
    x = np.random.default_rng(6).normal(size=(2, 6, D))
    offset = 1.0 if options.get("norm_unit_offset") else 0.0

    def norm(name, y):
        if options.get("norm") == "rmsnorm":
            return _rms(y, offset + p[f"{name}/scale"])
        return _ln(y, offset + p[f"{name}/scale"], p.get(f"{name}/bias", 0.0))

    position = options.get("norm_position")
    if options.get("residual") == "parallel_shared_norm":  # one norm, no bias (Cohere's)
        assert not any(k.startswith("mlp_norm") or k.endswith("norm/bias") for k in p)
        h = norm("attn_norm", x)
        want = x + _attention(p, h) + _mlp(p, h)
    elif position == "sandwich":  # x + norm(f(norm(x))) per sublayer
        y = x + norm("attn_out_norm", _attention(p, norm("attn_norm", x)))
        want = y + norm("mlp_out_norm", _mlp(p, norm("mlp_norm", y)))
    elif position == "post_branch":  # x + norm(f(x)): no input norms
        assert "attn_norm/scale" not in p and "mlp_norm/scale" not in p
        y = x + norm("attn_out_norm", _attention(p, x))
        want = y + norm("mlp_out_norm", _mlp(p, y))
    elif options.get("norm_position") == "post":
        y = norm("attn_norm", x + _attention(p, x))
        want = norm("mlp_norm", y + _mlp(p, y))
    elif options.get("residual") == "parallel":
        want = x + _attention(p, norm("attn_norm", x)) + _mlp(p, norm("mlp_norm", x))
    else:
        y = x + _attention(p, norm("attn_norm", x))
        want = y + _mlp(p, norm("mlp_norm", y))
    np.testing.assert_allclose(_run(block, x.astype(np.float32)), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize(
    "qk_norm,offset,kv", [("rms_all_heads", False, 2), ("rms", True, 4), ("rms_all_heads", True, 1)]
)
def test_qk_norm_in_a_block_equals_its_formula(qk_norm, offset, kv):
    """OLMo 2's QK-norm over the whole projection (the keys' over ``KV * Dh`` channels, before
    they are repeated for their query heads), and Gemma 3's per-head one with scales ``1 + w``
    (``norm_unit_offset``)."""
    options = dict(qk_norm=qk_norm, num_kv_heads=kv, norm="rmsnorm", norm_unit_offset=offset)
    block = _block(**options)
    _randomize(block, 7)
    p = {k: np.asarray(v, np.float64) for k, v in _flat(block).items()}
    width = (H if qk_norm == "rms_all_heads" else 1) * DH
    assert p["attn_params/q_norm"].shape == (width,)
    assert p["attn_params/k_norm"].shape == ((kv if qk_norm == "rms_all_heads" else 1) * DH,)
    x = np.random.default_rng(8).normal(size=(2, 6, D))
    unit = 1.0 if offset else 0.0
    y = x + _attention(p, _rms(x, unit + p["attn_norm/scale"]), qk_norm, unit)
    want = y + _mlp(p, _rms(y, unit + p["mlp_norm/scale"]))
    np.testing.assert_allclose(_run(block, x.astype(np.float32)), want, rtol=2e-4, atol=2e-4)


def test_output_softcap_caps_the_logits():
    """``output_softcap``: ``cap * tanh(z / cap)`` of the logits the same model gives without
    it (Gemma 2's final_logit_softcapping), on the forward pass and the cache's decode."""
    from posenc.models.lm import Transformer

    config = _config(num_layers=1, norm="rmsnorm", output_softcap=2.0)
    tokens = jnp.asarray(np.random.default_rng(9).integers(0, 32, (2, 5)))
    capped = Transformer(config, encodings.get("rope"), rngs=nnx.Rngs(0))
    free = Transformer(
        dataclasses.replace(config, output_softcap=0.0), encodings.get("rope"), rngs=nnx.Rngs(0)
    )
    z = np.asarray(free(tokens), np.float64)
    assert np.abs(z).max() > 2.0  # the cap bites
    np.testing.assert_allclose(capped(tokens), 2.0 * np.tanh(z / 2.0), rtol=1e-5, atol=1e-6)


def test_bad_options_are_refused_in_one_line():
    for kw, match in [
        (dict(num_kv_heads=3), r"model\.num_kv_heads=3 must divide model\.num_heads=4"),
        (dict(mlp="glu"), r"model\.mlp must be one of"),
        (dict(norm_position="middle"), r"model\.norm_position must be one of"),
        (dict(residual="parallel", norm_position="post"), r"model\.residual='parallel' needs"),
        (dict(residual="parallel", norm_position="sandwich"), r"model\.residual='parallel' needs"),
        (dict(output_softcap=-1.0), r"model\.output_softcap must be a finite number >= 0"),
        (dict(norm_unit_offset=1), r"model\.norm_unit_offset must be True or False"),
        (dict(norm_eps=0), r"model\.norm_eps must be a positive number"),
        (dict(head_transform="swiglu"), r"model\.head_transform must be None or one of"),
        (dict(output_bias=1), r"model\.output_bias must be True or False"),
        (
            dict(residual="parallel_shared_norm", norm_position="post"),
            r"model\.residual='parallel_shared_norm' needs",
        ),
        (dict(norm="layernorm_bias"), r"model\.norm must be one of"),
        (dict(output_logit_scale=0.0), r"model\.output_logit_scale must be a finite number > 0"),
        (dict(output_logit_scale=True), r"model\.output_logit_scale must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            _config(**kw)
    with pytest.raises(ValueError, match="cross-attention"):
        config = _config(residual="parallel")
        Block(config, encodings.get("nope").bind(config.dims), rngs=nnx.Rngs(0), cross=True)


def test_default_options_are_posencs_model():
    """The defaults are the decoder-only model posenc has always built (a fused projection
    drawn in one piece, biases only in the MLP, pre-norm, sequential)."""
    c = ModelConfig()
    assert (c.num_kv_heads, c.qkv_bias, c.out_bias, c.mlp, c.mlp_bias) == (
        None,
        False,
        False,
        "gelu",
        True,
    )
    assert (c.norm_position, c.residual, c.scale_embeddings, c.embed_norm) == (
        "pre",
        "sequential",
        True,
        False,
    )
    assert (c.head_transform, c.output_bias, c.output_logit_scale) == (None, False, 1.0)
    assert dataclasses.replace(c).dims == c.dims


def test_output_logit_scale_multiplies_the_logits():
    """``output_logit_scale`` (Cohere's ``logit_scale``) multiplies the logits of the same
    parameters and nothing else."""
    from posenc.models.lm import Transformer

    def model(scale):
        config = _config(num_layers=2, output_logit_scale=scale)
        return Transformer(config, encodings.get("rope"), rngs=nnx.Rngs(0))

    plain, scaled = model(1.0), model(0.0625)
    _randomize(plain, 7)
    nnx.update(scaled, nnx.state(plain, nnx.Param))
    x = jnp.asarray(np.random.default_rng(8).normal(size=(2, 5, D)), jnp.float32)
    want = np.asarray(plain.head(x), np.float64) * 0.0625  # the head: every forward ends there
    np.testing.assert_allclose(np.asarray(scaled.head(x)), want, rtol=1e-6, atol=1e-7)


def test_output_logit_scale_is_refused_where_there_are_no_output_logits():
    """The encoder-decoder's and the classifier's heads take no factor: refused, not ignored."""
    from posenc.layers.pool import HeadConfig
    from posenc.models.classifier import Classifier
    from posenc.models.encdec import EncoderDecoder

    config = _config(output_logit_scale=0.5, causal=False)
    with pytest.raises(ValueError, match=r"model\.output_logit_scale .* encoder-decoder"):
        EncoderDecoder(config, encodings.get("t5"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"model\.output_logit_scale .* classifier"):
        Classifier(config, encodings.get("rope"), HeadConfig(), rngs=nnx.Rngs(0))
