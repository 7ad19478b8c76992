"""Greedy generation from pattern models with local layers (sliding and chunked windows), and
the per-layer checks of generation (every layer kind's encoder is asked, not only the model's).

The definition is :func:`greedy_generate_reference` (the whole model run again at every step);
the cache must give its tokens, and its logits to float32 rounding, including the steps past
the window where the local layer sees only its last keys (the window matters: without it the
same parameters give other logits).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings, testing
from posenc.decoding import window as window_lib
from posenc.decoding.lm import greedy_generate, greedy_generate_reference, layer_encodings
from posenc.encodings.rope import RoPE
from posenc.kinds.stream import evaluate
from posenc.layers.config import ModelConfig
from posenc.layers.pattern import LayerKind
from posenc.models.lm import Transformer
from posenc.testing import _harness, patterns

SETTINGS = testing.Settings()
PROMPT, NEW = 5, 6
_O0 = {"xla_backend_optimization_level": 0}  # compiles about twice as fast, same program


@pytest.fixture(autouse=True)
def _nan_cache_and_fast_compile(monkeypatch):
    """Unfilled cache slots (and the masked slots of a previous chunk) start as NaN, so a slot
    that leaked into an output would show; LLVM at -O0 for the generation and the reference."""
    import jax

    from posenc.decoding import lm as decoding

    run = jax.jit(decoding._generate_impl, static_argnums=decoding._STATIC, compiler_options=_O0)

    def nan_filled(graphdef, state, prompts, positions, num_new, fill, return_logits, window=True):
        del fill
        return run(graphdef, state, prompts, positions, num_new, jnp.nan, return_logits, window)

    monkeypatch.setattr(decoding, "_generate", nan_filled)
    last = jax.jit(decoding._last_logits_impl, compiler_options=_O0)
    monkeypatch.setattr(decoding, "_last_logits", last)


@pytest.mark.parametrize(
    "window, prompt", [("sliding:3", PROMPT), ("sliding:4", 2), ("chunked:4", PROMPT)]
)
def test_a_local_layer_generates_what_full_recomputation_gives(window, prompt):
    """The local layer's cache holds its window (a prompt longer and shorter than it)."""
    model = patterns.build_pattern(encodings.get("rope"), SETTINGS, "beside_itself", "auto", window)
    assert [b.options.window for b in model.blocks] == ["full", window]
    size = int(window.split(":")[1])
    kind = window.split(":")[0]
    assert window_lib.layouts(model, prompt + NEW) == (
        window_lib.Layout("full", prompt + NEW),
        window_lib.Layout(kind, size),
    )
    prompts = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, prompt)), jnp.int32)
    tokens, logits = greedy_generate(model, prompts, NEW, return_logits=True)
    want_tokens, want = greedy_generate_reference(model, prompts, NEW, return_logits=True)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
    # The window matters: the same parameters with full attention in every layer differ.
    full = patterns.build_pattern(encodings.get("rope"), SETTINGS, "beside_itself", "auto", "full")
    _, unwindowed = greedy_generate(full, prompts, NEW, return_logits=True)
    assert np.abs(np.asarray(unwindowed) - np.asarray(logits)).max() > 1e-4


@pytest.mark.parametrize("window", ["sliding:3", pytest.param("chunked:4", marks=pytest.mark.slow)])
def test_a_local_layer_with_every_option_generates_what_full_recomputation_gives(window):
    """Sinks, Scalable-Softmax (whose count of visible keys the window cache must keep), the
    query temperature, QK-norm and soft-capping on the local layer, ALiBi as its encoder."""
    cfg = _harness.model_config(SETTINGS, num_layers=2, attention_impl="auto")
    options = dict(sinks=True, ssmax=True, temperature_floor=2, qk_norm="rms", softcap=5.0)
    kinds = (
        LayerKind("global", None, cfg.attention_options(prefix="layers.kinds.global")),
        LayerKind("local", None, cfg.attention_options(window=window, **options)),
    )
    model = Transformer(cfg, encodings.get("alibi"), rngs=nnx.Rngs(0), layers=kinds)
    prompts = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, PROMPT)), jnp.int32)
    tokens, logits = greedy_generate(model, prompts, NEW, return_logits=True)
    want_tokens, want = greedy_generate_reference(model, prompts, NEW, return_logits=True)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)


def _kinds_model(local: object, **config) -> Transformer:
    """NoPE as the model's encoder; a NoPE layer and a layer of kind ``local`` with ``local``."""
    cfg = ModelConfig(
        vocab_size=64, num_layers=2, model_dim=32, num_heads=2, mlp_dim=64, dtype="float32"
    )
    options = cfg.attention_options(window="sliding:3", prefix="layers.kinds.local")
    kinds = (
        LayerKind("global", None, cfg.attention_options(prefix="layers.kinds.global")),
        LayerKind("local", local, options),
    )
    return Transformer(cfg, encodings.get("nope"), rngs=nnx.Rngs(0), layers=kinds)


def test_a_layer_kind_that_cannot_be_cached_is_refused_naming_its_field():
    """The model's encoder (NoPE) caches; the local kind's dynamic NTK RoPE does not, and
    generation must say so, naming the kind's field (not run and return wrong tokens)."""
    model = _kinds_model(encodings.get("rope", scaling="dynamic", factor=2.0, original_max_len=8))
    assert [kind for kind, _ in layer_encodings(model)] == [None, "local"]
    prompts = jnp.zeros((1, 3), jnp.int32)
    with pytest.raises(ValueError, match=r"layers\.kinds\.local\.hparams\.scaling='dynamic'"):
        greedy_generate(model, prompts, 2)
    greedy_generate_reference(model, prompts, 2)  # full recomputation takes it


@dataclasses.dataclass(frozen=True)
class _ShortRoPE(RoPE):
    """RoPE that represents 10 positions only (as a finite table would)."""

    def check_length(self, length: int) -> None:
        if length > 10:
            raise ValueError(f"short rope represents 10 positions, not {length}")


def test_every_layer_kinds_check_length_is_asked():
    model = _kinds_model(_ShortRoPE())
    prompts = jnp.zeros((1, 6), jnp.int32)
    with pytest.raises(ValueError, match="short rope represents 10 positions, not 12"):
        greedy_generate(model, prompts, 6)
    stream = np.zeros(60, np.int32)
    assert evaluate(model, stream, [12])[0]["error"].startswith("short rope")


def test_retrieval_asks_every_layer_kinds_encoder_whether_it_caches():
    from posenc.retrieval.rundir import _check_model
    from posenc.runs.config import load_config

    config = load_config("configs/base.py:tiny")
    config.unlock()
    config.layers.pattern = ("full", "local")
    config.layers.kinds.full = dict(window="full")
    config.layers.kinds.local = dict(
        encoding="rope",
        hparams=dict(scaling="dynamic", factor=2.0, original_max_len=64),
        window="sliding:16",
    )
    with pytest.raises(ValueError, match=r"retrieval: layers\.kinds\.local\.hparams\.scaling"):
        _check_model(config, ["passkey"], [420])


def test_the_window_cache_holds_the_window_not_the_output():
    """A model of sliding layers only (W = 8) generating 1000 tokens: the compiled program's
    temporary memory (where the caches live) with window-sized caches is a fraction of that
    with one slot per token per layer (XLA:CPU measured 165 kB against 941 kB; what remains
    grows with the output through the token buffer's input terms, ``[S, D]``)."""
    import jax

    from posenc.decoding import lm as decoding

    cfg = ModelConfig(
        vocab_size=64, num_layers=2, model_dim=32, num_heads=2, mlp_dim=64, dtype="float32"
    )
    local = cfg.attention_options(window="sliding:8", prefix="layers.kinds.local")
    kinds = (LayerKind("local", encodings.get("rope"), local),)
    model = Transformer(cfg, encodings.get("nope"), rngs=nnx.Rngs(0), layers=kinds)
    graphdef, state = nnx.split(model)
    prompts, num_new = jnp.zeros((1, 8), jnp.int32), 1000
    positions = jnp.arange(8 + num_new)[None]
    generate = jax.jit(decoding._generate_impl, static_argnums=decoding._STATIC)
    temp = {}
    for window_cache in (True, False):
        args = (graphdef, state, prompts, positions, num_new, 0.0, False, window_cache)
        temp[window_cache] = generate.lower(*args).compile().memory_analysis().temp_size_in_bytes
    # One slot per token: 2 layers x (h, k, v) x 1008 tokens x 32 channels x 4 bytes = 774 kB.
    assert temp[False] > 2 * 3 * 1008 * 32 * 4
    assert temp[True] < temp[False] / 4
