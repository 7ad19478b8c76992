"""posenc.decoding.lm: cached greedy generation equals full recomputation for every registered
encoder, unfilled cache slots never reach an output, and what cannot be cached is refused.

Also ``attend(k_valid=...)``, the mask the cache relies on, against attention over the valid
keys alone.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.attention.core import attend
from posenc.decoding import lm as generate
from posenc.encodings.base import Dims
from posenc.layers.config import ModelConfig
from posenc.layers.params import EncoderParam
from posenc.models.lm import Transformer

VOCAB, P, NEW = 257, 6, 3
ATOL = 1e-4

# Every registered encoder (so a new one is tested the day it is registered), and RoPE with
# YaRN scaling (frequencies by parts and a temperature on queries and keys) past its
# original_max_len.
CASES = [(name, {}) for name in encodings.names()] + [
    ("rope", {"scaling": "yarn", "factor": 2.0, "original_max_len": 4}),
]
# Dynamic NTK takes one length for the whole window, CAPE's normalize its mean position: not
# cacheable (tested below).
DYNAMIC = ("rope", {"scaling": "dynamic", "factor": 2.0, "original_max_len": 4})
NOT_CACHEABLE = [DYNAMIC, ("cape", {"normalize": True})]


def _ids(cases):
    return [name + ("-" + "-".join(map(str, h.values())) if h else "") for name, h in cases]


# Compiling dominates these tiny models' run time; LLVM at -O0 compiles about twice as fast and
# computes the same program (as in tests/test_model.py).
_O0 = {"xla_backend_optimization_level": 0}
_GENERATE = jax.jit(generate._generate_impl, static_argnums=generate._STATIC, compiler_options=_O0)
_LAST_LOGITS = jax.jit(generate._last_logits_impl, compiler_options=_O0)
_FORWARD = jax.jit(
    lambda graphdef, state, tokens, positions: nnx.merge(graphdef, state)(tokens, positions),
    static_argnums=0,
    compiler_options=_O0,
)


@pytest.fixture(autouse=True)
def _nan_cache_and_fast_compile(monkeypatch):
    """Every cached generation in this file starts from a cache whose unfilled slots hold NaN:
    a slot that leaked into any output (through 0 * NaN, a cumulative sum, a count) would turn
    its logits to NaN and fail the comparisons with the reference."""

    def nan_filled(graphdef, state, prompts, positions, num_new, fill, return_logits, window=True):
        del fill
        args = (prompts, positions, num_new, jnp.nan, return_logits, window)
        return _GENERATE(graphdef, state, *args)

    monkeypatch.setattr(generate, "_generate", nan_filled)
    monkeypatch.setattr(generate, "_last_logits", _LAST_LOGITS)


def _config(**overrides) -> ModelConfig:
    base = dict(
        vocab_size=VOCAB, num_layers=2, model_dim=32, num_heads=4, mlp_dim=64, dtype="float32"
    )
    return ModelConfig(**{**base, **overrides})


def _perturb(params: dict, rng: np.random.Generator) -> dict:
    """Adds noise to an encoder's parameters, so that tables initialised at zero or near it
    (CoPE's embeddings, the dynamic bias's output layer, Shaw's tables) change the logits."""
    return {
        n: jnp.asarray(x) + 0.3 * rng.standard_normal(np.shape(x)).astype(np.float32)
        for n, x in params.items()
    }


def _model(name: str, hparams: dict, seed: int = 0, **overrides) -> Transformer:
    model = Transformer(_config(**overrides), encodings.get(name, **hparams), rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(model):
        if isinstance(param, EncoderParam):
            param[...] = _perturb({"p": param[...]}, rng)["p"]
    return model


def _prompts(seed: int, b: int = 2) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, (b, P)), jnp.int32)


def _assert_same_generation(cached, reference):
    """Cached and reference tokens are identical and their logits close.

    A random model may, rarely, put two logits within float error of each other, where the
    two computations could pick different tokens legitimately. So each row is compared up to
    its first step whose reference top-2 gap is below ``10 * ATOL`` (logits included, token
    excluded), and the test asserts that such near-ties leave most steps compared.
    """
    tokens, logits = map(np.asarray, cached)
    ref_tokens, ref_logits = map(np.asarray, reference)
    assert tokens.shape == ref_tokens.shape and tokens.dtype == np.int32
    assert np.isfinite(ref_logits).all()
    top2 = np.sort(ref_logits, axis=-1)[..., -2:]
    near_tie = top2[..., 1] - top2[..., 0] < 10 * ATOL  # [B, NEW]
    compared = 0
    for row in range(tokens.shape[0]):
        ties = np.flatnonzero(near_tie[row])
        stop = int(ties[0]) if ties.size else tokens.shape[1]
        np.testing.assert_allclose(
            logits[row, : stop + 1], ref_logits[row, : stop + 1], atol=ATOL, rtol=0
        )
        np.testing.assert_array_equal(tokens[row, :stop], ref_tokens[row, :stop])
        compared += stop
    assert compared >= tokens.size - 1, "near-ties left too few steps compared; change seeds"


def _gapped_positions(seed: int, n: int) -> np.ndarray:
    """A sorted random subset of ``range(4 * n)``: increasing, with gaps."""
    return np.sort(np.random.default_rng(seed).choice(4 * n, n, replace=False))


# -- cached generation equals full recomputation ----------------------------------------------


@pytest.mark.parametrize("name,hparams", CASES, ids=_ids(CASES))
def test_cached_generation_equals_full_recomputation(name, hparams):
    """Every encoder: the cached tokens are the argmax of the full model's logits at each step.

    The full pass runs once over the prompt and the cached tokens (one compilation per encoder
    instead of one per length): with causal attention and an encoder whose hooks read only the
    positions they are given (what ``cacheable`` declares), its logits at step ``n`` are those
    of :func:`greedy_generate_reference`'s pass of length ``P + n``, which the tests below
    compare directly. Two rows in one batch, one at contiguous positions (offset by 3) and one
    at a sorted random subset with gaps (randomized positions, Ruoss et al. 2023).
    """
    model = _model(name, hparams)
    s = P + NEW
    positions = jnp.asarray(np.stack([3 + np.arange(s), _gapped_positions(1, s)]), jnp.int32)
    prompts = _prompts(2)
    tokens, logits = generate.greedy_generate(
        model, prompts, NEW, positions=positions, return_logits=True
    )
    graphdef, state = nnx.split(model)
    sequence = jnp.concatenate([prompts, tokens[:, :-1]], axis=1)  # [B, S - 1]
    full = _FORWARD(graphdef, state, sequence, positions[:, :-1])[:, P - 1 :]  # [B, NEW, V]
    _assert_same_generation((tokens, logits), (full.argmax(-1), full))


_DEFAULT_POSITION_CASES = [("xpos", {}), ("shaw", {"max_distance": 3})]


@pytest.mark.parametrize("name,hparams", _DEFAULT_POSITION_CASES, ids=_ids(_DEFAULT_POSITION_CASES))
def test_default_positions_against_the_reference(name, hparams):
    """:func:`greedy_generate_reference` itself, one pass per length, with ``positions=None``
    (``arange(P + num_new)``): xPos's centre moves with each window, and Shaw (clipping at 3)
    takes its rel-shift paths on the reference's contiguous windows."""
    model = _model(name, hparams, seed=3)
    prompts = _prompts(4)
    cached = generate.greedy_generate(model, prompts, NEW, return_logits=True)
    reference = generate.greedy_generate_reference(model, prompts, NEW, return_logits=True)
    _assert_same_generation(cached, reference)
    explicit = generate.greedy_generate(
        model, prompts, NEW, positions=jnp.arange(P + NEW), return_logits=True
    )
    np.testing.assert_array_equal(explicit[0], cached[0])


def test_tokens_only_and_reference_by_hand():
    """Without ``return_logits`` both functions return the tokens alone; and the reference is
    greedy decoding as written here: the argmax of the last logits of the model's full pass,
    appended, repeated."""
    model = _model("alibi", {}, seed=5, num_layers=1)
    prompts = _prompts(6)
    sequence = np.asarray(prompts)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x), compiler_options=_O0)
    for _ in range(2):
        logits = np.asarray(forward(state, jnp.asarray(sequence)))
        sequence = np.concatenate([sequence, logits[:, -1].argmax(-1)[:, None]], axis=1)
    reference = generate.greedy_generate_reference(model, prompts, 2)
    cached = generate.greedy_generate(model, prompts, 2)
    for tokens in (reference, cached):
        assert isinstance(tokens, jax.Array) and tokens.dtype == jnp.int32
        np.testing.assert_array_equal(tokens, sequence[:, P:])


# -- what cannot be cached, bad arguments -----------------------------------------------------


@pytest.mark.parametrize("name,hparams", NOT_CACHEABLE, ids=_ids(NOT_CACHEABLE))
def test_not_cacheable_is_refused_and_would_differ(name, hparams):
    """The declaration is honest: decoding through the cache anyway (the private program,
    without the check) gives logits visibly different from full recomputation once the window
    grows (dynamic NTK past original_max_len; CAPE's mean position), while the reference runs."""
    model = _model(name, hparams)
    prompts = _prompts(2)
    with pytest.raises(
        ValueError, match=rf"^encoding\.hparams\.\w+=[^:]+: '{name}' cannot .*cache"
    ):
        generate.greedy_generate(model, prompts, NEW)
    _, ref_logits = generate.greedy_generate_reference(model, prompts, NEW, return_logits=True)
    graphdef, state = nnx.split(model)
    positions = jnp.arange(P + NEW)[None]
    _, logits = _GENERATE(graphdef, state, prompts, positions, NEW, 0.0, True)
    np.testing.assert_allclose(logits[:, 0], ref_logits[:, 0], atol=ATOL, rtol=0)  # prefill
    assert np.abs(np.asarray(logits[:, 1:]) - np.asarray(ref_logits[:, 1:])).max() > 1e-3


def test_bidirectional_model_is_refused():
    model = _model("nope", {}, causal=False)
    for fn in (generate.greedy_generate, generate.greedy_generate_reference):
        with pytest.raises(ValueError, match=r"^model.causal=False: .*causal model$"):
            fn(model, _prompts(0), 2)


@pytest.mark.parametrize("impl", ["linear", "linear_performer"])
def test_linear_attention_paths_are_refused(impl):
    """Refused by the cache; the reference, which only reruns the model, runs them."""
    model = _model("nope", {}, attention_impl=impl, performer_features=8)
    with pytest.raises(ValueError, match=f"model.attention_impl='{impl}'"):
        generate.greedy_generate(model, _prompts(0), 2)
    assert generate.greedy_generate_reference(model, _prompts(0), 1).shape == (2, 1)


def test_bad_arguments_are_refused():
    model = _model("nope", {})
    prompts = _prompts(0)
    bad = [
        (dict(prompts=prompts, num_new=0), "num_new"),
        (dict(prompts=prompts[0], num_new=2), r"prompts must be \[B, P\]"),
        (dict(prompts=prompts.astype(jnp.float32), num_new=2), "integer token ids"),
        (dict(prompts=prompts, num_new=2, positions=jnp.arange(P + 3)), "positions must be"),
        (dict(prompts=prompts, num_new=2, positions=jnp.zeros((3, P + 2), int)), "positions"),
        (dict(prompts=prompts.at[0, 1].set(9999), num_new=2), r"token id 9999, outside \[0, "),
        (dict(prompts=prompts.at[1, 0].set(-1), num_new=2), r"token id -1, outside \[0, "),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            generate.greedy_generate(model, **kwargs)


def test_learned_table_too_short_is_refused():
    model = _model("learned", {"max_len": P + 2})
    with pytest.raises(ValueError, match="encoding.hparams.max_len=8"):
        generate.greedy_generate(model, _prompts(0), 3)


# -- attend(k_valid=...) --------------------------------------------------------------------

_B, _H, _DH, _D = 2, 2, 8, 16


def _bound(name, hparams):
    dims = Dims(num_heads=_H, head_dim=_DH, model_dim=_D)
    enc = encodings.get(name, **hparams).bind(dims)
    params = _perturb(enc.init(jax.random.key(0), dims), np.random.default_rng(1))
    return enc, params


def _masked_window(seed: int):
    """``q`` (T = 3), ``k``, ``v`` (S = 8), layer inputs ``h``, key positions (sorted, with
    gaps) and key validity: invalid keys among the keys before the queries."""
    rng = np.random.default_rng(seed)
    k, v = (jnp.asarray(rng.standard_normal((_B, 8, _H, _DH)), jnp.float32) for _ in range(2))
    q = jnp.asarray(rng.standard_normal((_B, 3, _H, _DH)), jnp.float32)
    h = jnp.asarray(rng.standard_normal((_B, 8, _D)), jnp.float32)
    valid = np.asarray([0, 1, 0, 1, 1, 1, 1, 1], bool)
    return q, k, v, h, _gapped_positions(3, 8), valid


def _with_garbage(k, v, h, pos, valid):
    """NaN in the invalid keys' ``k``, ``v`` and ``h``, and a position far from the others."""
    rows = jnp.asarray(valid)[None, :]
    k, v = (jnp.where(rows[..., None, None], x, jnp.nan) for x in (k, v))
    return k, v, jnp.where(rows[..., None], h, jnp.nan), jnp.where(jnp.asarray(valid), pos, 10**6)


@functools.partial(jax.jit, static_argnums=0, compiler_options=_O0)
def _valid_keys_three_ways(enc, params, q, k, v, h, pos, valid, keep):
    """Attention over the valid keys alone (``keep``, einsum), and over all keys with
    ``k_valid`` on the ``einsum`` and ``blocked`` paths (block 2: the queries span two blocks,
    the keys four tiles)."""
    q_pos = pos[keep[-q.shape[1] :]]
    common = dict(encoding=enc, params=params, q_pos=q_pos, block_size=2)
    alone = attend(
        q, k[:, keep], v[:, keep], k_pos=pos[keep], inputs=h[:, keep], implementation="einsum",
        **common,
    )  # fmt: skip
    k, v, h, pos = _with_garbage(k, v, h, pos, valid)
    masked = [
        attend(q, k, v, k_pos=pos, inputs=h, implementation=impl, k_valid=valid, **common)
        for impl in ("einsum", "blocked")
    ]
    return alone, masked


# One encoder per kind of hook in the default suite (counting, cumulative decay, value term and
# pairwise content, window statistics of positions); the rest of the registry in the slow step.
_ATTEND_FAST = ("cope", "forgetting", "shaw", "xpos")
_ATTEND_CASES = [
    pytest.param(*case, id=ident, marks=() if case[0] in _ATTEND_FAST else pytest.mark.slow)
    for case, ident in zip([*CASES, DYNAMIC], _ids([*CASES, DYNAMIC]), strict=True)
]


@pytest.mark.parametrize("name,hparams", _ATTEND_CASES)
def test_attend_k_valid_equals_attention_over_the_valid_keys(name, hparams):
    """Invalid keys before the queries (the cache's trailing unfilled slots are covered by the
    generation tests above) hold NaN (``k``, ``v``, layer input) and absurd positions; the
    output must equal attention over the valid keys alone, at their positions."""
    enc, params = _bound(name, hparams)
    q, k, v, h, pos, valid = _masked_window(seed=2)
    keep = np.flatnonzero(valid)
    alone, masked = _valid_keys_three_ways(enc, params, q, k, v, h, pos, valid, keep)
    for impl, got in zip(("einsum", "blocked"), masked, strict=True):
        np.testing.assert_allclose(got, alone, atol=1e-5, rtol=1e-5, err_msg=impl)


def test_attend_k_valid_garbage_is_real_and_auto_resolves():
    """Without the mask the garbage reaches the output (so the test above can fail); ``auto``
    with a mask runs a path that takes it."""
    enc, params = _bound("forgetting", {})
    q, k, v, h, pos, valid = _masked_window(seed=4)
    k, v, h, pos = _with_garbage(k, v, h, pos, valid)
    kwargs = dict(encoding=enc, params=params, q_pos=pos[-3:], k_pos=pos, inputs=h)
    assert np.isnan(np.asarray(attend(q, k, v, **kwargs, implementation="einsum"))).all()
    masked = attend(q, k, v, **kwargs, implementation="einsum", k_valid=valid)
    auto = attend(q, k, v, **kwargs, implementation="auto", k_valid=valid)
    assert np.isfinite(np.asarray(masked)).all()
    np.testing.assert_array_equal(auto, masked)


def test_attend_k_valid_is_refused_on_the_fused_and_linear_paths():
    enc, params = _bound("nope", {})
    x = jnp.zeros((1, 4, _H, _DH))
    for impl in ("xla", "cudnn", "linear"):
        with pytest.raises(ValueError, match="k_valid"):
            attend(
                x, x, x, encoding=enc, params=params, q_pos=jnp.arange(4), k_pos=jnp.arange(4),
                implementation=impl, k_valid=jnp.ones((1, 4), bool),
            )  # fmt: skip


def test_the_prefill_never_forms_every_prompt_positions_logits():
    """A long prompt of a large vocabulary: the prefill's head runs on the last position alone
    (XLA's buffer assignment of the compiled program; nothing runs). The whole [B, P, V] logits
    are 2 x 512 x 8192 float32 = 33.6 MB, which the programs held before (34.2 and 33.7 MB);
    their temporaries must stay under half of that (9.2 and 12.8 MB now),
    in the cached path and in the uncached reference's last-logits program."""
    from posenc.devices import fits

    b, p, v = 2, 512, 8192
    logits_bytes = b * p * v * 4
    config = ModelConfig(
        vocab_size=v, num_layers=1, model_dim=32, num_heads=2, mlp_dim=64, dtype="float32"
    )
    model = Transformer(config, encodings.get("rope"), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    prompts = jax.ShapeDtypeStruct((b, p), jnp.int32)
    positions = jax.ShapeDtypeStruct((1, p + 2), jnp.int32)
    options = fits.compiler_options()
    cached_fn = jax.jit(generate._generate_impl, static_argnums=generate._STATIC)
    cached = cached_fn.lower(graphdef, state, prompts, positions, 2, 0.0, False, True)
    last_fn = jax.jit(generate._last_logits_impl, static_argnums=0)
    last = last_fn.lower(graphdef, state, prompts, jax.ShapeDtypeStruct((1, p), jnp.int32))
    cached, last = cached.compile(options), last.compile(options)
    for compiled in (cached, last):
        assert compiled.memory_analysis().temp_size_in_bytes < logits_bytes / 2
