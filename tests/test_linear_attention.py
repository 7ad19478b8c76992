"""Linear attention (posenc.attention.linear, the ``linear`` and ``linear_performer`` paths).

Both paths against an explicit O(T^2) float64 numpy transcription of RoFormer eq. (19) with NoPE
and RoPE (at a few tokens, and RoPE at 16 times a training length of 8), written here from the
papers (elu + 1, Katharopoulos et al. 2020; FAVOR+, Choromanski et al. 2021, with the path's
random projection passed in; RoPE, Su et al. 2021), not from posenc's code. Also: FAVOR+
approximates softmax attention with many features; large inputs stay finite; no output depends
on a later key, to the bit; the projection; refusals; ``auto``; evaluation. Every registered
encoder is checked on both paths by the contract battery (``posenc.testing.check_linear``);
memory by tests/test_memory.py.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from posenc import encodings, testing
from posenc.attention import linear as linear_attention
from posenc.attention.core import attend, check_implementation, choose_implementation
from posenc.encodings import Dims, Encoding
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer
from posenc.runs.config import evaluation_changes, load_config

H, DH = 2, 8
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=H * DH)
M = 12  # FAVOR+ features: not a multiple of Dh (a cut last block) and not Dh
LAYER = 3
PATHS = linear_attention.PATHS

_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
_attend = _jit(
    attend,
    static_argnames=(
        "encoding",
        "causal",
        "implementation",
        "block_size",
        "layer",
        "performer_features",
    ),
)


def _run(name, impl, q, k, v, q_pos, k_pos, causal, block_size=512, m=M, layer=LAYER):
    return _attend(
        *(jnp.asarray(x, jnp.float32) for x in (q, k, v)),
        encoding=encodings.get(name).bind(DIMS),
        params={},
        q_pos=jnp.asarray(q_pos),
        k_pos=jnp.asarray(k_pos),
        causal=causal,
        implementation=impl,
        block_size=block_size,
        layer=layer,
        performer_features=m,
    )


# -- the transcription ----------------------------------------------------------------------


def _phi(x, impl, w=None):
    """float64 feature maps: elu(x) + 1, or exp(w . x' - |x'|^2 / 2) / sqrt(m), x' = x d^(-1/4)."""
    x = np.asarray(x, np.float64)
    if impl == "linear":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    x = x / x.shape[-1] ** 0.25
    return np.exp(x @ w.T - (x**2).sum(-1, keepdims=True) / 2) / np.sqrt(w.shape[0])


def _rope(x, pos):
    """RoPE over the last axis (any even width d): pair (c, c + d/2) turns by
    pos * 10000^(-2c/d) ("half" layout, posenc's default)."""
    d = x.shape[-1]
    out = x.copy()
    for c in range(d // 2):
        angle = np.asarray(pos, np.float64)[:, :, None] * 10000.0 ** (-2.0 * c / d)  # [B, T, 1]
        a, b = x[..., c], x[..., c + d // 2]
        out[..., c] = np.cos(angle) * a - np.sin(angle) * b
        out[..., c + d // 2] = np.sin(angle) * a + np.cos(angle) * b
    return out


def _eq19(q, k, v, q_pos, k_pos, impl, causal, rope, w=None):
    """RoFormer eq. (19): sum_j (R_i phi(q_i)).(R_j phi(k_j)) v_j / sum_j phi(q_i).phi(k_j), over
    every pair, the queries the last T of the S keys."""
    fq, fk = _phi(q, impl, w), _phi(k, impl, w)
    rq, rk = (_rope(fq, q_pos), _rope(fk, k_pos)) if rope else (fq, fk)
    t, s = fq.shape[1], fk.shape[1]
    out = np.zeros((q.shape[0], t, H, v.shape[-1]))
    for i in range(t):
        seen = range(i + s - t + 1) if causal else range(s)
        num = sum(np.einsum("bhm,bhm->bh", rq[:, i], rk[:, j])[..., None] * v[:, j] for j in seen)
        den = sum(np.einsum("bhm,bhm->bh", fq[:, i], fk[:, j]) for j in seen)
        out[:, i] = num / den[..., None]
    return out


def _projection(m=M, layer=LAYER):
    return np.asarray(linear_attention.layer_projection(layer, m, DH), np.float64)


def _inputs(seed, b, t, s, scale=1.0):
    r = np.random.default_rng(seed)
    q, k, v = (r.standard_normal((b, n, H, DH)) for n in (t, s, s))
    return scale * q, scale * k, v


def _positions(t, s, offsets=(0, 37)):
    """Each batch row at its own offset."""
    k_pos = np.stack([o + np.arange(s) for o in offsets])
    return k_pos[:, s - t :], k_pos


# (T, S, chunk): chunks dividing T, not dividing it (S > T, the queries the last T), and one
# chunk longer than the window.
CAUSAL_CASES = [(8, 8, 4), (6, 10, 4), (5, 5, 16)]


@pytest.mark.parametrize("impl", PATHS)
@pytest.mark.parametrize("name", ["nope", "rope"])
@pytest.mark.parametrize("causal", [True, False])
def test_paths_equal_eq19(impl, name, causal):
    cases = CAUSAL_CASES if causal else [(8, 8, 512), (6, 10, 512)]
    for seed, (t, s, chunk) in enumerate(cases):
        q, k, v = _inputs(seed, 2, t, s)
        q_pos, k_pos = _positions(t, s)
        got = _run(name, impl, q, k, v, q_pos, k_pos, causal, block_size=chunk)
        w = _projection() if impl == "linear_performer" else None
        expected = _eq19(q, k, v, q_pos, k_pos, impl, causal, name == "rope", w)
        assert got.shape == q.shape
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", PATHS)
def test_rope_paths_equal_eq19_at_16x_the_training_length(impl):
    """RoPE's rotations over 128 queries (16 times a training length of 8) of 131 keys, causal in
    chunks of 5 (dividing neither), each row at its own offset."""
    t, s = 128, 131
    q, k, v = _inputs(11, 2, t, s)
    q_pos, k_pos = _positions(t, s)
    got = _run("rope", impl, q, k, v, q_pos, k_pos, True, block_size=5)
    w = _projection() if impl == "linear_performer" else None
    expected = _eq19(q, k, v, q_pos, k_pos, impl, True, True, w)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-5)


def test_bf16_inputs_give_bf16_outputs_close_to_float32():
    q, k, v = _inputs(7, 2, 8, 8)
    q_pos, k_pos = _positions(8, 8)
    ref = _run("rope", "linear_performer", q, k, v, q_pos, k_pos, True, block_size=3)
    low = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]
    got = _attend(
        *low,
        encoding=encodings.get("rope").bind(DIMS),
        params={},
        q_pos=q_pos,
        k_pos=k_pos,
        causal=True,
        implementation="linear_performer",
        block_size=3,
        layer=LAYER,
        performer_features=M,
    )
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref), atol=5e-2)


# -- FAVOR+: softmax approximation and numerics ----------------------------------------------


def _softmax_attention(q, k, v, scale=DH**-0.5):
    """Causal softmax(q.k / sqrt(d)) v in float64 (scale 0: the uniform average)."""
    t = q.shape[1]
    logits = np.einsum("bthd,bshd->bhts", q, k) * scale
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhts,bshd->bthd", p / p.sum(-1, keepdims=True), v)


def test_favor_approximates_softmax_attention_with_many_features():
    """The statistical claim: positive orthogonal random features estimate exp(q.k / sqrt(d)),
    so the attention output approaches softmax attention, the error falling as 1/sqrt(m).

    Causal, 4 x 16 tokens, 2 heads of 8, inputs N(0, 0.5^2) (|q'|^2 ~ 0.7, where the estimator's
    relative variance ~ exp(|q'|^2 + |k'|^2) / m is small), three independent draws (layers).
    Measured: mean |error| ~0.005 at m = 4096 and ~0.035 at m = 64, against 0.055 for uniform
    attention. Asserted: below 0.01 for every draw at m = 4096 (about 2x margin), at most a
    quarter of uniform attention's, and m = 64 at least 3x worse (1/sqrt(m) predicts 8x).
    """
    q, k, v = _inputs(0, 4, 16, 16, scale=0.5)
    pos = np.arange(16)
    exact = _softmax_attention(q, k, v)
    uniform = np.abs(_softmax_attention(q, k, v, scale=0.0) - exact).mean()

    def error(m, layer):  # chunks of 5: the causal path with carried sums
        got = _run("nope", "linear_performer", q, k, v, pos, pos, True, 5, m, layer)
        return np.abs(np.asarray(got) - exact).mean()

    errors = {m: [error(m, layer) for layer in range(3)] for m in (64, 4096)}
    assert max(errors[4096]) < 0.01, errors
    assert max(errors[4096]) < uniform / 4, (errors, uniform)
    assert np.mean(errors[64]) > 3 * np.mean(errors[4096]), errors


@pytest.mark.parametrize("causal", [True, False])
def test_favor_stays_finite_and_exact_far_outside_floats_range(causal):
    # Query and key norms growing along the window up to 12 x N(0, I): exp(w.x - |x|^2 / 2)
    # reaches e^-250, far below float32's smallest number, and the largest key arrives last, so
    # the carried sums are rescaled as the running maximum grows. float64 holds it exactly.
    t = 10
    q, k, v = _inputs(3, 2, t, t)
    growth = np.geomspace(0.3, 12.0, t)[None, :, None, None]
    q, k = q * growth, k * growth
    pos = np.arange(t)
    w = _projection()
    features = _phi(k, "linear_performer", w)  # float64
    tiny = np.finfo(np.float32).smallest_subnormal
    assert (features.max(-1) < tiny).any(), "some keys' features must all be 0 in float32"
    got = np.asarray(_run("rope", "linear_performer", q, k, v, pos, pos, causal, block_size=3))
    assert np.isfinite(got).all()
    expected = _eq19(q, k, v, pos[None], pos[None], "linear_performer", causal, True, w)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", PATHS)
def test_no_output_depends_on_a_later_key_to_the_bit(impl):
    # Keys and values after position 6 replaced by large ones: outputs 0..6 stay bit-identical,
    # including queries 4..6, which share a chunk of 4 with the changed key 7.
    q, k, v = _inputs(5, 2, 10, 10)
    pos = np.arange(10)
    before = np.asarray(_run("rope", impl, q, k, v, pos, pos, True, block_size=4))
    k2, v2 = k.copy(), v.copy()
    k2[:, 7:], v2[:, 7:] = 8.0 * k[:, 7:] + 3.0, 50.0 * v[:, 7:]
    after = np.asarray(_run("rope", impl, q, k2, v2, pos, pos, True, block_size=4))
    np.testing.assert_array_equal(after[:, :7], before[:, :7])
    assert not np.allclose(after[:, 7:], before[:, 7:])


def test_performer_projection_is_block_orthogonal_gaussian_and_fixed_per_layer():
    w = _projection(m=4096, layer=0)  # [m, Dh]
    assert w.shape == (4096, DH)
    for block in (w[:DH], w[DH : 2 * DH], w[-DH:]):  # rows orthogonal within each block
        gram = block @ block.T
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-4)
    # Each row N(0, I_Dh): E|w|^2 = Dh (std of the mean over 4096 rows: 0.06) and covariance I.
    assert abs((w**2).sum(-1).mean() - DH) < 0.3
    np.testing.assert_allclose(np.cov(w.T), np.eye(DH), atol=0.1)
    assert _projection(M).shape == (M, DH)
    np.testing.assert_array_equal(_projection(layer=2), _projection(layer=2))
    assert not np.allclose(_projection(layer=2), _projection(layer=3))


# -- what the paths accept -------------------------------------------------------------------

_REASONS = {
    "bias": "its bias adds to the attention logits",
    "content_logits": "its content logits add to the attention logits",
    "log_decay": "its decay adds to the attention logits",
    "contextual_logits": "its contextual logits need the attention logits",
    "householder": "its Householder products change q . k per pair",
    "value_term": "its value term needs the attention probabilities",
}
# Checked before any hook: weights without a softmax, which every linear path normalises.
_UNNORMALIZED = "its weights are exp(logits) without a softmax (normalized = False)"


@pytest.mark.parametrize("impl", PATHS)
@pytest.mark.parametrize("name", encodings.names())
def test_encoders_that_cannot_be_linearised_are_refused_with_the_reason(impl, name):
    enc = encodings.get(name).bind(DIMS)
    hooks = enc.hooks
    reasons = [why for hook, why in _REASONS.items() if hook in hooks]
    if not enc.normalized:
        reasons.insert(0, _UNNORMALIZED)
    if "rotate" in hooks and enc.qk_head_dim(DH) != DH:
        reasons.append("its rotate widens q and k (qk_head_dim) rather than rotating them")
    if not reasons:
        check_implementation(enc, impl)  # rotate and input-level terms only: accepted
        assert set(hooks) <= {"rotate", "embed", "embed_tokens", "augment_positions"}
        return
    with pytest.raises(ValueError) as info:
        check_implementation(enc, impl)
    message = str(info.value)
    assert message.startswith(f"model.attention_impl={impl!r} cannot run encoding {name!r}: ")
    assert reasons[0] in message and "\n" not in message


@dataclasses.dataclass(frozen=True)
class ValuesOnly(Encoding):
    """A value term and nothing else (Shaw's has content logits too)."""

    name = "test-values-only"
    paper = "a test"

    def value_term(self, params, probs, q_pos, k_pos):
        return jnp.zeros((probs.shape[0], probs.shape[2], probs.shape[1], DH))


def test_a_value_term_alone_is_refused_and_the_model_refuses_at_construction():
    with pytest.raises(ValueError, match=r"'linear'.*value term needs the attention probab"):
        check_implementation(ValuesOnly().bind(DIMS), "linear")
    config = ModelConfig(
        num_layers=1, model_dim=16, num_heads=2, mlp_dim=32, attention_impl="linear_performer"
    )
    for name, why in [("alibi", "bias adds"), ("pope", "widens q and k"), ("xl", "content")]:
        with pytest.raises(ValueError, match=rf"attention_impl='linear_performer'.*{why}"):
            Transformer(config, encodings.get(name), rngs=nnx.Rngs(0))


@dataclasses.dataclass(frozen=True)
class WidthTiedRotary(Encoding):
    """A rotation with one learned frequency per channel pair of the head: tied to Dh."""

    name = "test-width-tied-rotary"
    paper = "a test"
    relative = True

    def rotate(self, params, q, k, q_pos, k_pos):
        freq = jnp.linspace(0.1, 1.0, DH // 2)  # [Dh/2], as a learned table would be

        def turn(x, pos):
            angle = pos.astype(jnp.float32)[:, :, None, None] * freq  # [B|1, T, 1, Dh/2]
            a, b = jnp.split(x, 2, axis=-1)
            c, s = jnp.cos(angle), jnp.sin(angle)
            return jnp.concatenate([a * c - b * s, a * s + b * c], -1)

        return turn(q, q_pos), turn(k, k_pos)


@dataclasses.dataclass(frozen=True)
class RotatePeeksAhead(Encoding):
    """A "rotation" that adds the next key to each key: linear attention then reads the future."""

    name = "test-rotate-peeks-ahead"
    paper = "a test"
    relative = True

    def rotate(self, params, q, k, q_pos, k_pos):
        return q, k + jnp.roll(k, -1, axis=1)


def test_a_rotate_tied_to_the_head_width_cannot_take_other_feature_counts():
    qkv = [jnp.asarray(x, jnp.float32) for x in _inputs(9, 1, 4, 4)]
    pos = jnp.arange(4)
    args = dict(encoding=WidthTiedRotary().bind(DIMS), params={}, q_pos=pos, k_pos=pos)
    out = _attend(*qkv, implementation="linear", causal=True, **args)  # elu + 1: m = Dh, runs
    assert np.isfinite(np.asarray(out)).all()
    with pytest.raises(
        ValueError, match=r"'test-width-tied-rotary'.*cannot rotate the 12 features"
    ):
        _attend(*qkv, implementation="linear_performer", causal=True, performer_features=M, **args)


def test_the_battery_check_catches_a_path_that_reads_later_keys():
    with pytest.raises(AssertionError, match=r"peeks-ahead.*fails linear: outputs depend on later"):
        testing.check_linear(RotatePeeksAhead())


def test_auto_never_picks_a_linear_path():
    for name in encodings.names():
        enc = encodings.get(name).bind(DIMS)
        for platform in ("cpu", "gpu"):
            for dtype in (jnp.bfloat16, jnp.float32):
                for t in (32, 1024, 32768):
                    path = choose_implementation(enc, t, dtype, 512, platform=platform)
                    assert path not in PATHS, (name, platform, dtype, t, path)


def test_model_config_checks_the_number_of_features():
    with pytest.raises(ValueError, match="model.performer_features must be a positive integer"):
        ModelConfig(performer_features=0)


def test_evaluation_cannot_switch_to_or_from_linear_attention():
    def config(**model):
        base = load_config(f"{pathlib.Path(__file__).parents[1] / 'configs/base.py'}:tiny")
        out = ml_collections.ConfigDict(base.to_dict())
        out.model.update(model)
        return out

    assert config().model.performer_features == 256
    softmax, linear = config(), config(attention_impl="linear")
    assert evaluation_changes(softmax, config(attention_impl="blocked")) == {
        "model.attention_impl": "blocked"
    }
    changes = evaluation_changes(linear, config(attention_impl="linear", attention_block_size=7))
    assert changes == {"model.attention_block_size": 7}
    for trained, requested in [
        (softmax, linear),
        (linear, softmax),
        (linear, config(attention_impl="linear_performer")),
    ]:
        with pytest.raises(ValueError, match=r"cannot change model.attention_impl"):
            evaluation_changes(trained, requested)
    performer = config(attention_impl="linear_performer")
    with pytest.raises(ValueError, match=r"cannot change model.performer_features 256 -> 64"):
        evaluation_changes(
            performer, config(attention_impl="linear_performer", performer_features=64)
        )
