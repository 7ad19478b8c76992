"""Attention statistics of one layer, and of every layer of a model, computed in query blocks.

For queries ``q`` and keys ``k`` the probabilities are the reference path's, formed as
:func:`posenc.attention.core.attend` forms them: the layer's queries and keys through
:func:`~posenc.attention.core.prepare_qk` (QK-norm, the encoder's ``rotate`` over the whole
window, the query temperature and Scalable-Softmax), the logits of
:func:`~posenc.attention.core.reference_logits` with the layer's
:func:`~posenc.attention.core.layer_terms` (its window, logit scale and soft cap; the encoder's
``bias``, ``content_logits``, ``log_decay`` and ``contextual_logits``), and
:func:`posenc.attention.terms.weights` with the layer's sinks (a softmax, or ``exp(logits)`` for an
encoder that declares ``normalized = False``, stick-breaking, whose rows sum to at most one). So
the weights are those of every
path the model runs (the fused and blocked paths compute the same softmax), layer by layer, each
with its own encoder and options when the model has a pattern of layer kinds
(:mod:`posenc.layers.pattern`). With sinks a row's probabilities over the keys sum to less than
one (the sink takes the rest): the sums below are over the keys, and the entropy is
``-sum_j p_ij log p_ij`` over the keys alone.

They are formed ``block`` queries at a time against all ``S`` keys, so memory grows as
``S x block``, never ``T x S``, and reduced on the device to sums:

- by relative distance ``d = i - j`` (query minus key index, in tokens: position values, which
  differ under randomized positions, do not enter): the summed probability and logit over the
  visible pairs at ``d``, and how many pairs there were;
- by query row: the entropy ``-sum_j p_ij log p_ij`` (nats) of each row, and its visible keys.

Sums are over the windows of a batch (weighted, so that padding windows count 0), in float32;
the host adds batches in float64 (:mod:`posenc.analysis.run`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.attention import householder
from posenc.attention.core import cumulative_decay, layer_terms, prepare_qk, reference_logits
from posenc.attention.options import AttentionOptions
from posenc.attention.terms import weights as attention_weights
from posenc.encodings.base import Encoding, Params
from posenc.layers.params import values
from posenc.models.lm import Transformer, default_positions


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionSums:
    """Sums over the (weighted) windows of a batch; arrays may carry a leading layer axis.

    Distances run from ``d_min`` (0 for causal attention, ``-(S - 1)`` without the mask) to
    ``S - 1``: column ``c`` is distance ``d_min + c``.

    Attributes:
      weight: ``[H, n_d]`` summed probability of the visible pairs at each distance.
      logit: ``[H, n_d]`` summed logit (what the softmax reads) of those pairs.
      pairs: ``[n_d]`` visible pairs at each distance (times the windows' weights).
      entropy: ``[H, T]`` summed entropy of each query row, nats.
      keys: ``[T]`` visible keys of each query row (the same in every window).
      windows: ``[]`` summed window weights.
    """

    weight: jax.Array
    logit: jax.Array
    pairs: jax.Array
    entropy: jax.Array
    keys: jax.Array
    windows: jax.Array


def attention_sums(
    q: jax.Array,
    k: jax.Array,
    *,
    encoding: Encoding,
    params: Params,
    q_pos: jax.Array,
    k_pos: jax.Array,
    causal: bool = True,
    inputs: jax.Array | None = None,
    weights: jax.Array | None = None,
    block_size: int = 128,
    options: AttentionOptions | None = None,
    learned: Params | None = None,
    norm_eps: float = 1e-6,
) -> AttentionSums:
    """The statistics of one attention layer (module docstring), ``block_size`` queries at a time.

    Args:
      q: ``[B, T, H, Dh]`` projected queries, before QK-norm and ``rotate``.
      k: ``[B, S, H, Dh]`` projected keys before QK-norm and ``rotate``, one per query head
        (grouped key/value heads repeated); the queries are the last ``T`` of them.
      encoding, params: the bound encoder and this layer's parameters.
      q_pos: ``[B|1, T]`` integer positions; k_pos: ``[B|1, S]``.
      causal: mask keys after the query.
      inputs: ``[B, S, D]`` the layer input at the keys (read by a ``log_decay`` hook).
      weights: ``[B]`` float32 weight of each window (0: a padding window); None: all 1.
      block_size: queries per block (at most ``T``).
      options: the layer's attention options (window, sinks, QK-norm, ...); None: none.
      learned: the options' learned parameters (the block's ``attn_params``); None: none.
      norm_eps: QK-norm's epsilon (the model's ``norm_eps``).

    Returns:
      The :class:`AttentionSums` (float32).
    """
    b, t, h, head_dim = q.shape
    s = k.shape[1]
    options = options or AttentionOptions()
    learned = learned or {}
    q_pos = jnp.atleast_2d(q_pos).astype(jnp.int32)
    k_pos = jnp.atleast_2d(k_pos).astype(jnp.int32)
    weights = jnp.ones((b,), jnp.float32) if weights is None else weights.astype(jnp.float32)
    # Over the whole window, as attend does: xPos and dynamic NTK read its span, the query
    # temperature and Scalable-Softmax each query's index in it.
    q, k = prepare_qk(
        q, k, encoding, params, q_pos, k_pos, options, learned, causal, s - t, norm_eps
    )
    terms = layer_terms(options, learned, head_dim)
    decay = cumulative_decay(encoding, params, inputs, t, s)
    moves = householder.factors(encoding, params, inputs, s)
    blk = min(block_size, t)
    d_min = 0 if causal else -(s - 1)
    n_d = s - d_min
    rows = jnp.arange(blk)
    columns = d_min + jnp.arange(n_d)  # the distance of each column

    def block(carry, number):
        weight_sum, logit_sum, pair_sum, entropy_sum, keys = carry
        # The last block ends at the last query, overlapping the one before it; its rows
        # before `number * blk` were counted there and weigh 0 here.
        start = jnp.minimum(number * blk, t - blk)
        fresh = (start + rows >= number * blk).astype(jnp.float32)  # [blk]
        q_blk = jax.lax.dynamic_slice_in_dim(q, start, blk, axis=1)  # [B, blk, H, Dh']
        pos_blk = jax.lax.dynamic_slice_in_dim(q_pos, start, blk, axis=1)  # [B|1, blk]
        decay_blk = None
        if decay is not None:
            decay_blk = (jax.lax.dynamic_slice_in_dim(decay[0], start, blk, axis=1), decay[1])
        logits, visible = reference_logits(
            q_blk,
            k,
            encoding=encoding,
            params=params,
            q_pos=pos_blk,
            k_pos=k_pos,
            causal=causal,
            head_dim=head_dim,
            decay=decay_blk,
            q_start=start,
            total_t=t,
            terms=terms,
            moves=moves,
        )  # [B, H, blk, S], [1, 1, blk, S]
        visible = jnp.broadcast_to(visible[0, 0], (blk, s))  # [blk, S]
        # [B, H, blk, S], the model's weights (a softmax, or exp(logits) unnormalised)
        p = attention_weights(logits, terms.sinks, encoding.normalized)
        log_p = _log_probs(logits, terms.sinks, encoding.normalized)  # finite where p is 0
        row_weight = weights[:, None, None] * fresh[None, None, :]  # [B, 1, blk]
        entropy = -jnp.where(visible, p * log_p, 0.0).sum(-1)  # [B, H, blk]
        # Key index of each (row, distance): i + (S - T) - d; the pair exists if it is visible.
        j = start + rows[:, None] + (s - t) - columns[None, :]  # [blk, n_d]
        inside = (j >= 0) & (j < s)
        j = jnp.clip(j, 0, s - 1)
        at = jnp.take_along_axis(visible, j, axis=1) & inside  # [blk, n_d]
        by_distance = jnp.broadcast_to(j, (b, h, blk, n_d))
        p_d = jnp.where(at, jnp.take_along_axis(p, by_distance, axis=-1), 0.0)
        logit_d = jnp.where(at, jnp.take_along_axis(logits, by_distance, axis=-1), 0.0)
        # R: the block's rows, D: distances.
        weight_sum += jnp.einsum("BHRD,BR->HD", p_d, row_weight[:, 0])
        logit_sum += jnp.einsum("BHRD,BR->HD", logit_d, row_weight[:, 0])
        pair_sum += jnp.einsum("RD,R->D", at.astype(jnp.float32), fresh) * weights.sum()
        rows_at = start + rows
        entropy_sum = entropy_sum.at[:, rows_at].add((entropy * row_weight).sum(0))
        keys = keys.at[rows_at].add(visible.sum(-1).astype(jnp.float32) * fresh)
        return (weight_sum, logit_sum, pair_sum, entropy_sum, keys), None

    init = (
        jnp.zeros((h, n_d), jnp.float32),
        jnp.zeros((h, n_d), jnp.float32),
        jnp.zeros((n_d,), jnp.float32),
        jnp.zeros((h, t), jnp.float32),
        jnp.zeros((t,), jnp.float32),
    )
    n_blocks = -(-t // blk)
    (weight, logit, pairs, entropy, keys), _ = jax.lax.scan(block, init, jnp.arange(n_blocks))
    return AttentionSums(weight, logit, pairs, entropy, keys, weights.sum())


def _log_probs(logits: jax.Array, sinks: jax.Array | None, normalized: bool = True) -> jax.Array:
    """``log p`` of :func:`posenc.attention.terms.weights`' probabilities, computed from the
    logits (finite where ``p`` underflows): ``[B, H, T, S]`` and ``sinks [H]`` or None; the
    logits themselves for an encoder whose weights are ``exp(logits)`` (``normalized=False``)."""
    if not normalized:
        return logits
    norm = jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # [B, H, T, 1]
    if sinks is not None:
        norm = jnp.logaddexp(norm, sinks.astype(logits.dtype)[None, :, None, None])
    return logits - norm


def model_attention_sums(
    model: Transformer,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    weights: jax.Array | None = None,
    block_size: int = 128,
) -> AttentionSums:
    """:func:`attention_sums` of every self-attention layer of a decoder-only model over a batch
    of windows (deterministic: no dropout, no position augmentation).

    Each layer's queries and keys are those its block computes (:meth:`Block.forward`'s cache
    holds the layer input ``h``; the projections are applied to it again), with the block's own
    encoder (``block.encoding``: its kind's, in a pattern) and encoder parameters (its own, its
    kind's shared ones, or the model's: :meth:`~posenc.models.lm.Stack.layer_shared`), its
    attention options and their parameters (``block.options``, ``block.attn_params``) and its
    mask.

    Args:
      model: a :class:`~posenc.models.lm.Transformer` (without Transformer-XL memory).
      tokens: ``[B, T]`` token ids.
      positions: ``[B|1, T]`` or ``[T]`` positions; default ``0 .. T - 1``.
      weights: ``[B]`` window weights (0: padding); None: all 1.
      block_size: queries per block.

    Returns:
      :class:`AttentionSums` with a leading layer axis on every field.
    """
    given = default_positions(model.encoding, positions, tokens.shape[1])  # [B|1, T]
    positions = given.astype(jnp.int32)
    shared = model.layer_shared()
    x = model.embed_inputs(tokens, given)  # [B, T, D] float32
    layers = []
    for block, own in zip(model.blocks, shared, strict=True):
        x_next, cache = block.forward(x, positions, own)
        q, _, _ = block.attn.qkv(cache.h)  # [B, T, H, Dh], as the block computed it
        params = own if block.pos_params is None else values(block.pos_params)
        layers.append(
            attention_sums(
                q,
                block.attn.repeat_kv(cache.k),
                encoding=block.encoding,
                params=params,
                q_pos=positions,
                k_pos=positions,
                causal=block.causal,
                inputs=cache.h,
                weights=weights,
                block_size=block_size,
                options=block.options,
                learned=block.learned(),
                norm_eps=block.config.norm_eps,
            )
        )
        x = x_next
    return jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
