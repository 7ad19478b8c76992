"""posenc.models.lm.Transformer: where encoders' parameters live, positions, dropout and
configuration errors.

What every registered encoder must do in the model (causality, training, running past its
training length, bf16, shift invariance of relative encoders) is the contract battery's
(posenc.testing, run by tests/test_testing.py)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.attention.core import attend
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer

HPARAMS = {"learned": {"max_len": 16}, "shaw": {"max_distance": 4}}
VOCAB, T = 64, 16

# Compiling dominates these tiny models' run time; LLVM at -O0 compiles about twice as fast and
# computes the same program (XLA's graph passes still run).
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def _config(**overrides) -> ModelConfig:
    base = dict(
        vocab_size=VOCAB, num_layers=1, model_dim=32, num_heads=2, mlp_dim=64, dtype="float32"
    )
    return ModelConfig(**{**base, **overrides})


def _model(name, seed=0, hparams=None, **overrides) -> Transformer:
    enc = encodings.get(name, **(HPARAMS.get(name, {}) if hparams is None else hparams))
    return Transformer(_config(**overrides), enc, rngs=nnx.Rngs(seed))


def _param_shapes(model) -> dict[str, tuple[int, ...]]:
    """'blocks/0/pos_params/key_table' -> shape, for every nnx.Param of the model."""
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    out = {}
    for path, leaf in leaves:
        keys = [str(getattr(p, "key", getattr(p, "name", p))) for p in path]
        out["/".join(k for k in keys if k != "value")] = tuple(leaf.shape)
    return out


def _tokens(seed, b, t):
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, (b, t)), jnp.int32)


@functools.cache
def _forward(graphdef):
    """A jitted forward for one model structure: (state, tokens, positions) -> logits."""

    @_jit
    def run(state, tokens, positions):
        return nnx.merge(graphdef, state)(tokens, positions)

    return run


def _logits(model, tokens, positions=None):
    """Logits from a jitted forward; positions default to arange(T) for every row, passed
    explicitly so that calls with and without offsets share one compiled program."""
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef)(state, tokens, positions))


# -- where the encoder's parameters live ----------------------------------------------------


def test_t5_has_one_table_shared_by_all_layers():
    model = _model("t5", num_layers=2)
    shapes = _param_shapes(model)
    tables = [p for p in shapes if p.endswith("table")]
    assert tables == ["shared_pos_params/table"]
    assert shapes["shared_pos_params/table"] == (32, 2)  # [num_buckets, H]
    assert not any("pos_params" in p for p in shapes if p.startswith("blocks"))


@pytest.mark.parametrize(
    "name,per_layer",
    [
        ("shaw", {"key_table": (9, 16), "value_table": (9, 16)}),  # [2k+1, Dh]: shared by heads
        ("xl", {"u": (2, 16), "v": (2, 16), "w_r": (32, 2, 16)}),
    ],
)
def test_shaw_and_xl_have_parameters_per_layer(name, per_layer):
    model = _model(name, num_layers=2)
    shapes = _param_shapes(model)
    encoder_params = {p: s for p, s in shapes.items() if "pos_params" in p}
    expected = {f"blocks/{i}/pos_params/{n}": s for i in range(2) for n, s in per_layer.items()}
    assert encoder_params == expected
    state = nnx.state(model, nnx.Param)
    first = state["blocks"][0]["pos_params"]
    second = state["blocks"][1]["pos_params"]
    for n in per_layer:  # separately initialised, not one array referenced twice
        assert not np.array_equal(np.asarray(first[n][...]), np.asarray(second[n][...]))


def test_absolute_encoders_keep_one_table_at_the_input():
    shapes = _param_shapes(_model("learned", num_layers=2))
    assert {p: s for p, s in shapes.items() if "pos_params" in p} == {
        "shared_pos_params/table": (16, 32)
    }
    shapes = _param_shapes(_model("sinusoidal", num_layers=2))
    assert not any("pos_params" in p for p in shapes)
    model = _model("learned", num_layers=2)
    assert model.num_params() == sum(int(np.prod(s)) for s in _param_shapes(model).values())


# -- positions -------------------------------------------------------------------------------


def test_learned_positions_past_the_table_give_nan_not_a_silent_answer():
    model = _model("learned")
    tokens = _tokens(3, 2, T)
    assert np.isfinite(_logits(model, tokens)).all()
    # Row 0 at positions 8..23 (rows 16..23 do not exist), row 1 at -1..14. The NaN keys also
    # reach earlier queries of their row (masked probabilities are 0, and 0 * NaN = NaN);
    # either way nothing silently wrong comes out.
    positions = jnp.asarray([[8], [-1]]) + jnp.arange(T)
    out = _logits(model, tokens, positions)
    assert np.isnan(out[0, 8:]).all() and np.isnan(out[1, 0]).all()


# -- dropout, default positions -----------------------------------------------------------


def test_dropout_needs_an_rng_and_changes_outputs():
    tokens = _tokens(6, 2, T)

    def with_rng(model):
        graphdef, state = nnx.split(model)
        run = _jit(lambda state, rng: nnx.merge(graphdef, state)(tokens, rng=rng))
        return lambda rng: np.asarray(run(state, rng))

    model = _model("rope", dropout=0.2)
    det = _logits(model, tokens)
    np.testing.assert_array_equal(_logits(model, tokens), det)  # no rng: deterministic
    dropped = with_rng(model)
    drop_1, drop_2 = dropped(jax.random.key(1)), dropped(jax.random.key(2))
    np.testing.assert_array_equal(dropped(jax.random.key(1)), drop_1)  # same key, same mask
    assert np.abs(drop_1 - det).max() > 1e-3
    assert np.abs(drop_1 - drop_2).max() > 1e-3
    # Without an rng the rate-0.2 model is the rate-0 model (same seed, same parameters), and
    # at rate 0 an rng changes nothing.
    model = _model("rope", dropout=0.0)
    np.testing.assert_allclose(det, _logits(model, tokens), atol=1e-6)
    np.testing.assert_allclose(with_rng(model)(jax.random.key(1)), det, atol=1e-6)


def test_default_positions_are_arange():
    model = _model("sinusoidal")
    tokens = _tokens(8, 2, T)
    graphdef, state = nnx.split(model)
    run = _jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
    # Different compiled programs: equal up to float32 rounding.
    default = _logits(model, tokens)
    np.testing.assert_allclose(np.asarray(run(state, tokens)), default, rtol=1e-5, atol=1e-5)
    # [T] positions are broadcast over the batch.
    np.testing.assert_allclose(_logits(model, tokens, jnp.arange(T)), default, atol=1e-5)


# -- configuration errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"attention_impl": "flash"}, "model.attention_impl"),
        ({"dtype": "float64"}, "model.dtype"),
        ({"norm": "batchnorm"}, "model.norm"),
        ({"model_dim": 30, "num_heads": 4}, "model.num_heads"),
        ({"dropout": 1.0}, "model.dropout"),
        ({"num_layers": 0}, "model.num_layers"),
        ({"causal": "no"}, "model.causal"),
    ],
)
def test_bad_model_config_is_rejected(overrides, field):
    with pytest.raises(ValueError, match=field):
        _config(**overrides)


def test_rope_with_odd_head_dimension_is_rejected_at_construction():
    with pytest.raises(ValueError, match="head dimension of 9"):
        _model("rope", model_dim=18, num_heads=2)


def test_value_term_encoder_forced_onto_the_fused_path_is_rejected():
    # Rejected when the model is built, before anything is traced.
    for impl in ("xla", "cudnn"):
        with pytest.raises(ValueError, match=f"attention_impl='{impl}'.*'shaw'"):
            _model("shaw", attention_impl=impl)


def test_encoder_with_an_input_embedding_must_share_its_parameters():
    class PerLayerEmbed(encodings.Sinusoidal):
        param_scope = "layer"

    with pytest.raises(ValueError, match="param_scope='shared'"):
        Transformer(_config(), PerLayerEmbed(), rngs=nnx.Rngs(0))


@pytest.mark.parametrize(
    "name,hparams,match",
    [
        ("forgetting", {}, r"model.causal=False: encoding 'forgetting' is causal only"),
        ("cope", {}, r"model.causal=False: encoding 'cope' is causal only"),
        ("t5", {}, r"model.causal=False needs encoding.hparams.bidirectional=True for t5"),
    ],
)
def test_causal_only_encoders_are_refused_by_a_bidirectional_model(name, hparams, match):
    with pytest.raises(ValueError, match=match) as info:
        _model(name, hparams=hparams, causal=False)
    assert "\n" not in str(info.value)  # one line
    # (that they run causally, and T5 with bidirectional buckets without the mask: the battery)


def test_contextual_encoder_forced_onto_the_fused_path_is_rejected():
    for impl in ("xla", "cudnn"):
        with pytest.raises(ValueError, match=f"attention_impl='{impl}'.*'cope'.*'blocked'"):
            _model("cope", attention_impl=impl)


@dataclasses.dataclass(frozen=True)
class _DecaysUnlessNormed(encodings.Encoding):
    """``log_decay`` is 0 when its input has mean 0 and variance 1 per token (a LayerNorm's
    output) and strongly negative otherwise."""

    name = "test-decays-unless-normed"
    paper = "a test"
    relative = True

    def log_decay(self, params, inputs):
        x = inputs.astype(jnp.float32)
        mean, var = x.mean(-1), x.var(-1)
        off = -1e3 * (mean**2 + (var - 1.0) ** 2)  # [B, S]
        return jnp.broadcast_to(off[..., None], (*off.shape, self.bound_dims.num_heads))


def test_log_decay_reads_each_layers_normed_input():
    # Two layers: the second's input is the residual stream after a block, far from normed; the
    # model must hand each layer's attention its normed input, where this decay is 0 (NoPE).
    tokens = _tokens(5, 2, T)
    for impl in ("einsum", "blocked", "xla"):
        overrides = dict(num_layers=2, attention_impl=impl, attention_block_size=5)
        model = Transformer(_config(**overrides), _DecaysUnlessNormed(), rngs=nnx.Rngs(3))
        nope = Transformer(_config(**overrides), encodings.get("nope"), rngs=nnx.Rngs(3))
        got, expected = np.asarray(model(tokens)), np.asarray(nope(tokens))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # The control: un-normed inputs decay, and attention changes.
    enc = _DecaysUnlessNormed().bind(_config().dims)
    q, k, v = (
        jnp.asarray(np.random.default_rng(i).standard_normal((1, 6, 2, 16))) for i in (1, 2, 3)
    )
    x = jnp.asarray(np.random.default_rng(4).standard_normal((1, 6, 32)) * 3.0 + 1.0)
    kw = dict(encoding=enc, params={}, q_pos=jnp.arange(6), k_pos=jnp.arange(6), inputs=x)
    plain = attend(
        q,
        k,
        v,
        encoding=encodings.get("nope").bind(enc.dims),
        params={},
        q_pos=jnp.arange(6),
        k_pos=jnp.arange(6),
    )
    assert np.abs(np.asarray(attend(q, k, v, **kw)) - np.asarray(plain)).max() > 0.1
