"""Long-window evaluation memory: the blocked attention path grows linearly with the window.

XLA's compiled memory analysis of a forward pass (per-token losses of one window, batch 1) of a
tiny model (1 layer, width 32, 2 heads, float32) for every encoder. The blocked path holds
``[B, H, block, S]`` logits at a time, so its memory is linear in the window; the einsum path
holds ``[B, H, T, S]``, so it is quadratic; both paths compute the same losses. The linear
attention paths (another model) hold ``[B, T, H, m]`` features, ``[B, H, chunk, chunk]`` products
and ``[B, H, m, Dh]`` running sums, so they are linear too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.attention import linear as linear_attention
from posenc.attention.core import choose_implementation
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer
from posenc.models.losses import token_loss

NAMES = encodings.names()
LENGTHS = (2048, 4096, 8192)
BLOCK = 512
# The learned table must cover the longest window. CoPE's position embeddings start at zero (the
# paper's), where its terms are all zero and the model is NoPE's: random ones put them to work.
HPARAMS = {"learned": {"max_len": max(LENGTHS)}, "cope": {"init_std": 0.5}}


def _model(name: str, impl: str) -> Transformer:
    config = ModelConfig(
        num_layers=1,
        model_dim=32,
        num_heads=2,
        mlp_dim=64,
        dtype="float32",
        attention_impl=impl,
        attention_block_size=BLOCK,
    )
    return Transformer(config, encodings.get(name, **HPARAMS.get(name, {})), rngs=nnx.Rngs(0))


@functools.cache
def _compiled(name: str, impl: str, length: int):
    """The compiled per-token loss of one window of ``length`` tokens, and the model state."""
    graphdef, state = nnx.split(_model(name, impl))

    def losses(state, tokens):  # tokens: [1, length + 1]
        model = nnx.merge(graphdef, state)
        return token_loss(model(tokens[:, :-1]), tokens[:, 1:])  # [1, length]

    tokens = jax.ShapeDtypeStruct((1, length + 1), jnp.int32)
    # LLVM at -O0 compiles about 40% faster; XLA assigns buffers before LLVM runs, so the memory
    # analysis is byte-for-byte the same as at the default level.
    options = {"xla_backend_optimization_level": 0}
    return jax.jit(losses).lower(state, tokens).compile(compiler_options=options), state


def _bytes(name: str, impl: str, length: int) -> int:
    """Temporaries plus outputs: what the pass allocates beyond its parameters and tokens."""
    analysis = _compiled(name, impl, length)[0].memory_analysis()
    return analysis.temp_size_in_bytes + analysis.output_size_in_bytes


def _tokens(length: int) -> jax.Array:
    return jax.random.randint(jax.random.key(1), (1, length + 1), 0, 257, dtype=jnp.int32)


@pytest.mark.parametrize("name", NAMES)
def test_blocked_memory_grows_linearly(name):
    m2k, m4k, m8k = (_bytes(name, "blocked", n) for n in LENGTHS)
    assert m2k < m4k < m8k, (m2k, m4k, m8k)
    # Linear: x2 from 4k to 8k and at most x4 from 2k to 8k (a quadratic path gives x4 and
    # x16). At 2k XLA keeps a few small blocks alive at once, so 2k -> 8k is below x4.
    assert m8k / m4k < 2.5, (m2k, m4k, m8k)
    assert m8k / m2k < 5.0, (m2k, m4k, m8k)
    # 8k tokens: a block's [2, 512, 8192] float32 logits are 32 MiB and the whole pass stays
    # within a few of them, far from the 512 MiB of the full [2, 8192, 8192] logits.
    assert m8k < 160 * 2**20, m8k


@pytest.mark.parametrize("name", NAMES)
def test_einsum_memory_grows_quadratically_and_matches_blocked(name):
    m2k, m8k = _bytes(name, "einsum", 2048), _bytes(name, "einsum", 8192)
    # The contrast that makes the linear test meaningful: full logits, x16 for x4 tokens.
    assert m8k / m2k > 12.0, (m2k, m8k)
    assert m8k > 4 * _bytes(name, "blocked", 8192)

    tokens = _tokens(2048)
    einsum_fn, einsum_state = _compiled(name, "einsum", 2048)
    blocked_fn, blocked_state = _compiled(name, "blocked", 2048)
    reference = np.asarray(einsum_fn(einsum_state, tokens))
    blocked = np.asarray(blocked_fn(blocked_state, tokens))
    assert np.isfinite(reference).all()
    np.testing.assert_allclose(blocked, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(blocked.mean(), reference.mean(), rtol=1e-6)


def test_copes_case_is_not_nopes():
    # The blocked-against-einsum comparison above is CoPE's only if its terms are not all zero.
    tokens = _tokens(2048)
    cope, nope = (_compiled(name, "einsum", 2048) for name in ("cope", "nope"))
    assert (
        np.abs(np.asarray(cope[0](cope[1], tokens)) - np.asarray(nope[0](nope[1], tokens))).max()
        > 1e-3
    )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_auto_path_for_long_windows_is_never_quadratic(name, dtype, platform):
    """What ``attention_impl="auto"`` picks for a 32k window, at the reference model's shape.

    ``einsum`` and ``xla`` hold ``[B, H, T, S]`` logits; ``cudnn`` is linear (flash attention)
    only without a dense bias or content logits.
    """
    encoding = encodings.get(name).bind(ModelConfig(model_dim=512, num_heads=8).dims)
    path = choose_implementation(encoding, 32768, jnp.dtype(dtype), 512, platform)
    hooks = encoding.hooks
    if path == "cudnn":
        assert platform == "gpu" and "bias" not in hooks and "content_logits" not in hooks
    else:
        assert path == "blocked"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_tiny_model_evaluates_an_8k_window(name):
    fn, state = _compiled(name, "blocked", 8192)
    losses = np.asarray(fn(state, _tokens(8192)))
    assert losses.shape == (1, 8192)
    assert np.isfinite(losses).all()
    # An untrained model predicts roughly uniformly over the 257 byte ids.
    assert abs(losses.mean() - np.log(257)) < 1.0


@pytest.mark.parametrize("impl", linear_attention.PATHS)
def test_linear_attention_memory_grows_linearly(impl):
    # RoPE, so the rotated features are held beside the plain ones (eq. 19); FAVOR+ with the
    # default 256 features, elu + 1 with Dh = 16.
    m2k, m4k, m8k = (_bytes("rope", impl, n) for n in LENGTHS)
    assert m2k < m4k < m8k, (m2k, m4k, m8k)
    assert m8k / m4k < 2.5, (m2k, m4k, m8k)
    assert m8k / m2k < 5.0, (m2k, m4k, m8k)
    # FAVOR+'s [1, 8192, 2, 256] float32 features are 16 MiB each; nowhere near the 512 MiB of
    # [2, 8192, 8192] logits.
    assert m8k < 160 * 2**20, m8k
    fn, state = _compiled("rope", impl, 2048)
    losses = np.asarray(fn(state, _tokens(2048)))
    assert losses.shape == (1, 2048) and np.isfinite(losses).all()
