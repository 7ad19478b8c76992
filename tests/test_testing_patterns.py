"""The battery's pattern checks (posenc.testing.patterns) have teeth: a path that drops a
layer's window, a window cache that keeps the wrong keys, and windows that mask nothing each
fail ``patterns`` with a message naming the pattern and what differs; a kind's parameter that
never learns fails ``pattern_trains``. (The checks themselves run
over the registry in test_testing.py.)"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from posenc import encodings, testing
from posenc.attention import core
from posenc.attention import options as options_lib
from posenc.attention.options import Window
from posenc.decoding import window as window_lib
from posenc.encodings.alibi import ALiBi
from posenc.testing import patterns

# A seed of its own: the checks memoise their logits per settings, and these runs are patched.
SETTINGS = testing.Settings(seed=11)


@pytest.fixture(autouse=True)
def _fresh_traces():
    """The patches act while a function is traced: a compiled function an earlier test of the
    same process left in JAX's caches (the battery's own pattern checks, same shapes) would run
    without them. Cleared before and after each test here."""
    jax.clear_caches()
    yield
    jax.clear_caches()


def _without_window(fn):
    def patched(q, k, v, encoding, params, q_pos, k_pos, causal, terms, *rest):
        terms = terms._replace(window=Window())
        return fn(q, k, v, encoding, params, q_pos, k_pos, causal, terms, *rest)

    return patched


def test_a_path_that_drops_the_window_fails(monkeypatch):
    monkeypatch.setattr(core, "_fused", _without_window(core._fused))
    with pytest.raises(AssertionError, match="pattern beside_itself .*path 'xla' differs"):
        patterns.check_patterns("rope", SETTINGS)


@pytest.mark.slow
def test_a_window_cache_that_keeps_the_wrong_keys_fails(monkeypatch):
    """A sliding layer's cache that never drops its oldest key (each new token overwrites the
    newest slot instead): the forward paths agree, decoding must not."""
    original = window_lib.Layout.step

    def never_shifts(self, cache, t, positions):
        if self.kind != "sliding":
            return original(self, cache, t, positions)
        slot = jnp.minimum(t, self.slots - 1)
        start = jnp.maximum(t - self.slots + 1, 0)
        slots = jax.lax.dynamic_slice_in_dim(positions, start, self.slots, axis=1)
        return cache, slot, slots, jnp.arange(self.slots)[None, :] <= slot

    monkeypatch.setattr(window_lib.Layout, "step", never_shifts)
    with pytest.raises(AssertionError, match="cached decoding of 5 tokens after 8 differs"):
        patterns.check_patterns("alibi", testing.Settings(seed=12))


@pytest.mark.slow
def test_windows_that_mask_nothing_fail(monkeypatch):
    """Every path reads each layer's window as full: they agree, but the window must matter."""
    monkeypatch.setattr(options_lib.AttentionOptions, "parsed_window", property(lambda _: Window()))
    with pytest.raises(AssertionError, match="window sliding:3 changes nothing"):
        patterns.check_patterns("rope", testing.Settings(seed=13))


def test_an_input_term_encoder_is_the_models_and_the_kinds_name_none():
    enc = encodings.get("sinusoidal")
    model_enc, kinds = patterns.pattern(enc, "beside_itself")
    assert model_enc is enc and [k.encoding for k in kinds] == [None, None]
    assert [k.options.window for k in kinds] == ["full", "sliding:3"]
    model_enc, kinds = patterns.pattern(encodings.get("alibi"), "beside_nope")
    assert model_enc.name == "nope" and [k.encoding.name for k in kinds] == ["alibi", "nope"]


@dataclasses.dataclass(frozen=True)
class _DeadSlopes(ALiBi):
    """ALiBi with a learned scale per head that never reaches the logits."""

    def init(self, rng, dims):
        return {"scale": jnp.ones((dims.num_heads,), jnp.float32)}

    def param_shapes(self, dims):
        return {"scale": (dims.num_heads,)}

    def bias(self, params, q_pos, k_pos):
        return (
            super().bias(params, q_pos, k_pos)
            + 0.0 * jax.lax.stop_gradient(params["scale"])[None, :, None, None]
        )


def test_a_kinds_parameter_that_never_learns_fails_pattern_training():
    with pytest.raises(AssertionError, match=r"pattern beside_nope: encoder parameters .*scale"):
        patterns.check_pattern_trains(_DeadSlopes(), testing.Settings(seed=14))
