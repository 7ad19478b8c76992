"""Transformer-XL segment-level recurrence over the decoder-only model's parts.

Dai et al. 2019, *Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context*,
Sec. 3.2. ``memory: [L, B, M, D]`` holds, per layer, the hidden states that entered that layer
for the ``M`` tokens before the segment (the paper's ``h^{n-1}_{tau}``); layer ``l`` computes its
keys and values from ``concat(stop_gradient(mem_l), h_l)`` and its queries from the segment, and
the paper's ``SG`` is ``jax.lax.stop_gradient``. With pre-norm blocks the cache is the residual
stream *before* the layer's norm, and the current norm is applied to memory and segment
together: the norm acts per token, so this equals caching the normed states, except that the
norm's parameters are the current ones, as the paper applies the current ``W_k, W_v`` to the
cached states. Positions span memory and segment (``[M + T]``, the memory's first); attention's
queries are the last ``T`` of the ``M + T`` keys (:func:`posenc.attention.core.attend`), so every
encoder that takes positions runs with memory unchanged; input terms (``embed``) are computed
for the segment's positions. An encoder with ``embed_tokens`` (a term read from neighbouring
token embeddings, which the memory does not keep) is refused. The new memory is the last
``mem_len`` states of ``concat(mem_l, h_l)`` per layer, gradient stopped.

Attention windows (:mod:`posenc.attention.options`) count key indices from the memory's first
state, as a single pass over memory and segment does. A sliding window of ``W`` needs at most
``W - 1`` states of memory per layer for the result of one pass over the whole stream (each
layer's memory holds exact inputs of that layer). A chunked window (chunks of ``C`` counted
from key index 0) is refused unless the memory holds a multiple of ``C`` states: otherwise its
chunks would not be the stream's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc.layers.block import dropout
from posenc.models.lm import Transformer, default_positions


def empty_memory(model: Transformer, batch: int) -> jax.Array:
    """The memory before a stream's first segment: ``[L, batch, 0, D]`` float32."""
    c = model.config
    return jnp.zeros((c.num_layers, batch, 0, c.model_dim), jnp.float32)


def forward(
    model: Transformer,
    tokens: jax.Array,
    memory: jax.Array,
    positions: jax.Array | None = None,
    *,
    rng: jax.Array | None = None,
    mem_len: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """:func:`hidden_states` through the model's head: ``[B, T, V]`` float32 logits and the new
    memory; arguments as for :func:`hidden_states`."""
    x, new_memory = hidden_states(model, tokens, memory, positions, rng=rng, mem_len=mem_len)
    return model.head(x), new_memory


def hidden_states(
    model: Transformer,
    tokens: jax.Array,
    memory: jax.Array,
    positions: jax.Array | None = None,
    *,
    rng: jax.Array | None = None,
    mem_len: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The model over one segment with the memory of the tokens before it.

    Args:
      model: a causal decoder-only model.
      tokens: ``[B, T]`` integer token ids of the segment.
      memory: ``[L, B, M, D]`` float32 (``M`` may be 0: :func:`empty_memory`), as the
        previous call returned it.
      positions: the positions of memory and segment, ``[B|1, M + T]`` or ``[M + T]``;
        default ``arange(M + T)``.
      rng: the training key (dropout); None for a deterministic pass.
      mem_len: states kept in the returned memory; default ``model.config.mem_len``.
        Evaluation may keep more than training did.

    Returns:
      The last block's output ``[B, T, D]`` float32 (before the head: ``model.head`` gives
      the logits, ``model.token_losses`` the losses) and the new memory
      ``[L, B, min(mem_len, M + T), D]``, the last ``mem_len`` states of
      ``concat(memory_l, input_l)`` per layer, gradient stopped.
    """
    config, encoding = model.config, model.encoding
    t = tokens.shape[1]
    m = memory.shape[2]
    if positions is None:  # every layer's encoder must take positions 0 .. M + T - 1
        for block in model.blocks:
            block.encoding.check_length(m + t)
    given = default_positions(encoding, positions, m + t)  # [B|1, M + T]
    positions = given.astype(jnp.int32)
    expected = (config.num_layers, tokens.shape[0], m, config.model_dim)
    if memory.shape != expected or positions.shape[1] != m + t:
        raise ValueError(
            f"memory must be [L, B, M, D] = {expected[:2]} + [M, {config.model_dim}] "
            f"with positions [B|1, M + T = {m + t}], got memory {tuple(memory.shape)} "
            f"and positions {tuple(positions.shape)}"
        )
    for block in model.blocks:  # chunks are counted from the memory's first token
        window = block.options.parsed_window
        if window.kind == "chunked" and m % window.size:
            field = "model.window" if block.kind is None else f"layers.kinds.{block.kind}.window"
            raise ValueError(
                f"{field}={str(window)!r} with Transformer-XL memory needs a memory of a "
                f"multiple of {window.size} states, got {m}: chunks are counted from the "
                "memory's first token, so they would not be the stream's; make model.mem_len "
                f"and the segment length multiples of {window.size}"
            )
    if "embed_tokens" in encoding.hooks:
        raise ValueError(
            f"encoding {encoding.name!r} reads neighbouring token embeddings "
            "(embed_tokens), which Transformer-XL memory does not keep; use "
            "model.mem_len=0 with it"
        )
    memory = jax.lax.stop_gradient(memory)  # the paper's SG(h^{n-1}_tau)
    shared = model.layer_shared()

    x = model.embed_inputs(tokens, given[:, m:], rng=rng)  # the segment's input terms
    rngs = jax.random.split(rng, config.num_layers + 1) if rng is not None else None
    x = dropout(x, config.dropout, None if rngs is None else rngs[-1])
    inputs = []  # the residual stream entering each layer, for the next memory
    for i, block in enumerate(model.blocks):
        inputs.append(x)
        x = block(x, positions, shared[i], None if rngs is None else rngs[i], memory=memory[i])
    keep = config.mem_len if mem_len is None else mem_len
    states = jnp.concatenate([memory, jnp.stack(inputs)], axis=2)  # [L, B, M + T, D]
    new_memory = states[:, :, max(0, m + t - keep) :]
    return x, jax.lax.stop_gradient(new_memory)
