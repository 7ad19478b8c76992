"""The ``blocked`` attention path: ``block x block`` tiles of queries and keys with an online
softmax, so memory grows as ``T x block`` instead of ``T x S``; long evaluation windows run here
on every device (the fused kernels take no per-pair term without an ``[H, T, S]`` tensor).

For each block of queries, key blocks are visited in order, keeping the running maximum ``m``,
normaliser ``l`` and unnormalised output (FlashAttention, Dao et al. 2022); an encoder's value
term, linear in the probabilities, is accumulated the same way. Key blocks wholly in a query
block's future are skipped, which halves the work of a causal window.

What a tile costs beyond NoPE's is chosen from the encoder's declarations
(:mod:`posenc.encodings.base`), never from its name:

- by default the hooks run on each tile with the tile's positions;
- ``bias_by_distance``: the bias of each of the window's ``T + S`` distances is computed once and
  each tile reads its band by index arithmetic (:mod:`posenc.attention.terms`), where the
  window's positions are contiguous (one ``lax.cond`` per window picks this or the default);
- ``reach``: ``bias``, ``content_logits`` and ``value_term`` run once per query block on a probe
  key just past the reach on each side, and a tile whose every pair lies past it adds those
  per-query constants instead of calling the hooks (Shaw's clipped distances, T5's last bucket):
  NoPE's cost on all but the tiles near the diagonal.

An encoder with contextual logits has the key blocks visited from the last to the first instead,
its running sum over the later keys carried along (the online softmax gives the same result in
any order). If it declares a ``carry_limit``, a tile reached once every query's carry is at the
limit (CoPE's count at ``max_pos - 1``) adds the hook's terms for one probe key (a masked logit)
instead of calling it on the tile: NoPE's cost, decided per tile from the carry (``lax.switch``).
The cumulative decays of a ``log_decay`` encoder are tiled with the queries and keys. An encoder
whose weights are ``exp(logits)`` without a softmax (``normalized = False``, stick-breaking) has
them formed directly on each tile and summed with the values, without the online softmax's running
maximum and sum: its log weights are at most 0, so nothing overflows.

An encoder with a ``householder`` hook (PaTH) has its key tiles visited from the last to the
first too, each query's vector carried across the tiles passed (``[B, blk, H, Dh]``); each key
tile's compact product is prepared once per window (:mod:`posenc.attention.householder`), so a
tile wholly before its queries costs NoPE's logits plus one ``Dh x Dh`` product per query.

Under a gradient each query block is recomputed in the backward pass (``jax.checkpoint``, as
FlashAttention recomputes its tiles), so a training step on this path also holds ``T x block``
of attention per layer rather than every tile's probabilities.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from posenc.attention import householder
from posenc.attention.options import visible as visible_pairs
from posenc.attention.terms import (
    NEG,
    LayerTerms,
    bias_from_table,
    contextual,
    decay_bias,
    distance_table,
    finish_logits,
)
from posenc.encodings.base import Encoding, Params
from posenc.encodings.relative import is_contiguous

# What a key tile is for a query block: wholly in its (causal) future, near (the hooks run),
# wholly past the encoder's reach before the queries, or after them.
_SKIP, _NEAR, _FAR_BEFORE, _FAR_AFTER = range(4)


class _Probes(NamedTuple):
    """The hooks' terms for every key past the reach on one side of a query block: ``content``
    ``[B, H, blk, 1]`` (unscaled), ``bias`` ``[B|1, H, blk, 1]``, ``value`` ``[B, blk, H, Dh]``
    per unit of probability; None for a hook the encoder lacks."""

    content: jax.Array | None
    bias: jax.Array | None
    value: jax.Array | None


def blocked(
    q,
    k,
    v,
    encoding,
    params,
    q_pos,
    k_pos,
    causal,
    terms,
    decay,
    block_size,
    k_valid=None,
    factors=None,
):
    """Attention over ``block_size x block_size`` tiles (module docstring); the arguments are
    :func:`posenc.attention.core.attend`'s after ``rotate``, ``terms`` the layer's
    :class:`~posenc.attention.terms.LayerTerms`, ``decay`` the cumulative decays
    ``([B, T, H], [B, S, H])`` or None, ``factors`` the ``householder`` factors
    ``(w [B, S, H, Dh], beta [B, S, H])`` or None. Returns ``[B, T, H, Dh]`` in ``q.dtype``."""
    t, s = q.shape[1], k.shape[1]
    n_q, n_k = -(-t // block_size), -(-s // block_size)
    q, q_pos = _pad_rows(q, q_pos, n_q * block_size)
    k, k_pos = _pad_rows(k, k_pos, n_k * block_size)
    v = _pad_to(v, n_k * block_size)
    window = _Window(
        encoding, params, causal, terms, block_size, t, s, q_pos.shape[1], v.dtype, n_k
    )
    tiles = _tiles(q, k, v, q_pos, k_pos, decay, k_valid, block_size)
    if factors is not None:  # padded keys get beta = 0: H = I
        w, beta = (_pad_to(x, n_k * block_size) for x in factors)
        tiles = tiles._replace(moves=householder.prepare_tiles(k, w, beta, block_size))
    if not (encoding.bias_by_distance and "bias" in encoding.hooks):
        out = window.attend(tiles, table=None)
    else:
        # Contiguous positions (every evaluation window): the bias of each distance, once.
        out = jax.lax.cond(
            is_contiguous(q_pos, k_pos),
            lambda: window.attend(tiles, distance_table(encoding, params, q_pos, k_pos)),
            lambda: window.attend(tiles, table=None),
        )
    b, h, d = out.shape[1], out.shape[3], out.shape[4]
    return out.swapaxes(0, 1).reshape(b, n_q * block_size, h, d)[:, :t]


class _Tiles(NamedTuple):
    """The padded window cut into blocks: ``[N, B, blk, ...]`` for queries (``q``, ``q_pos``,
    ``q_start``, ``decay_q``) and keys (the rest); the decays and key validity are None without
    a ``log_decay`` hook or a ``k_valid`` mask."""

    q: jax.Array
    q_pos: jax.Array
    q_start: jax.Array
    decay_q: jax.Array | None
    k: jax.Array
    v: jax.Array
    k_pos: jax.Array
    k_start: jax.Array
    decay_k: jax.Array | None
    valid_k: jax.Array | None
    # Each key tile's Householder factors and products (householder.Tiles, [N, B, ...]) or None.
    moves: householder.Tiles | None = None


def _tiles(q, k, v, q_pos, k_pos, decay, k_valid, block) -> _Tiles:
    n_q, n_k = q.shape[1] // block, k.shape[1] // block
    decay_q = decay_k = valid_k = None
    if decay is not None:
        decay_q = _to_blocks(_pad_to(decay[0], n_q * block), block)  # [N, B, blk, H]
        decay_k = _to_blocks(_pad_to(decay[1], n_k * block), block)
    if k_valid is not None:
        valid_k = _to_blocks(_pad_to(k_valid, n_k * block), block)  # [N, B|1, blk]
    return _Tiles(
        _to_blocks(q, block),
        _to_blocks(q_pos, block),
        jnp.arange(n_q) * block,
        decay_q,
        _to_blocks(k, block),
        _to_blocks(v, block),
        _to_blocks(k_pos, block),
        jnp.arange(n_k) * block,
        decay_k,
        valid_k,
    )


class _Window(NamedTuple):
    """The static facts of one call: the encoder, its parameters, the mask, the scale, the
    tile size, the unpadded numbers of queries ``t`` and keys ``s``, the padded number of
    queries ``padded_t`` (the distance table's layout) and the output dtype."""

    encoding: Encoding
    params: Params
    causal: bool
    terms: LayerTerms
    block: int
    t: int
    s: int
    padded_t: int
    out_dtype: jnp.dtype
    n_k: int

    def band(self) -> int:
        """How many key tiles a query block can see under the window (all of them without
        one): its keys span at most ``block - 1`` plus the window's reach on each side, so at
        most ``(block - 1 + before + after) // block + 2`` tiles."""
        window = self.terms.window
        before = window.size - 1 if window.kind != "full" else None
        after = window.reach_after(self.causal)
        if before is None or after is None:
            return self.n_k
        return min(self.n_k, (self.block - 1 + before + after) // self.block + 2)

    def attend(self, tiles: _Tiles, table: jax.Array | None) -> jax.Array:
        """``[N, B, blk, H, Dh]``: each query block (``lax.map``) over the key blocks
        (``lax.scan``); ``table`` is the window's distance table or None."""
        contextual_hook = "contextual_logits" in self.encoding.hooks
        moving = tiles.moves is not None

        def query_block(xs):
            q_blk, qpos_blk, q_start, decay_q_blk = xs
            b, blk, h, _ = q_blk.shape
            d = tiles.v.shape[-1]
            # One branch per kind of tile that can occur (_SKIP, _NEAR, then any probes').
            branches = [
                lambda carry, ys: carry,
                lambda carry, ys: self._step(carry, xs, ys, table, None),
            ]
            for probe in self._probes(q_blk, qpos_blk):
                branches.append(
                    lambda carry, ys, probe=probe: self._step(carry, xs, ys, table, probe)
                )

            limit = self.encoding.carry_limit if contextual_hook else None
            if limit is not None:
                saturated = len(branches)
                branches.append(lambda carry, ys: self._step(carry, xs, ys, table, None, True))

            def key_block(carry, ys):
                kind = self._kind(q_start, qpos_blk, ys[2], ys[3])
                if limit is not None:  # every query's carry at the limit: the probe's terms
                    kind = jnp.where((kind == _NEAR) & jnp.all(carry[4] >= limit), saturated, kind)
                return jax.lax.switch(kind, branches, carry, ys), None

            sinks = self.terms.sinks
            if sinks is None:
                m0, l0 = jnp.full((b, h, blk), NEG, jnp.float32), jnp.zeros((b, h, blk))
            else:  # the sink logit enters as one key of value zero: m = s_h, l = exp(0)
                m0 = jnp.broadcast_to(sinks[None, :, None], (b, h, blk)).astype(jnp.float32)
                l0 = jnp.ones((b, h, blk), jnp.float32)
            init = (
                m0,  # running maximum m
                l0.astype(jnp.float32),  # normaliser l
                jnp.zeros((b, blk, h, d), jnp.float32),  # unnormalised output
                jnp.zeros((b, blk, h, d), jnp.float32),  # unnormalised value term
                # The contextual sum over the keys after the current block, per query and head.
                jnp.zeros((b, h, blk), jnp.float32) if contextual_hook else None,
                # Each query carried through the Householder maps of the keys after the block.
                q_blk.astype(jnp.float32) if moving else None,
            )
            keys = (
                tiles.k,
                tiles.v,
                tiles.k_pos,
                tiles.k_start,
                tiles.decay_k,
                tiles.valid_k,
                tiles.moves,
            )
            band = self.band()
            if band < self.n_k:  # only the key tiles the window can reach: cost L x W, not L^2
                lowest = q_start + (self.s - self.t) - (self.terms.window.size - 1)
                start = jnp.clip(jnp.maximum(lowest, 0) // self.block, 0, self.n_k - band)
                keys = jax.tree.map(
                    lambda x: jax.lax.dynamic_slice_in_dim(x, start, band, axis=0), keys
                )
            reverse = contextual_hook or moving
            (_, l, acc, extra, _, _), _ = jax.lax.scan(key_block, init, keys, reverse=reverse)
            return self._finish(l, acc + extra).astype(self.out_dtype)

        # Differentiated (training), each query block is recomputed in the backward pass from
        # its inputs (FlashAttention's recomputation) rather than keeping every tile's
        # probabilities: training memory grows as T x block too, not T x S. No change without
        # a gradient. Inside lax.map (a scan) there is no common subexpression to prevent.
        query_block = jax.checkpoint(query_block, prevent_cse=False)
        return jax.lax.map(query_block, (tiles.q, tiles.q_pos, tiles.q_start, tiles.decay_q))

    def _finish(self, l: jax.Array, acc: jax.Array) -> jax.Array:
        """The output from the online softmax's sum ``l`` (``[B, H, blk]``) and unnormalised
        output ``acc`` (``[B, blk, H, Dh]``): ``acc / l``; for an encoder whose weights are
        ``exp(logits)`` as they are (``normalized = False``), ``acc`` itself,
        ``sum_j exp(logit_j) v_j`` (:func:`_accumulate_unnormalized`)."""
        if self.encoding.normalized:
            return acc / l.transpose(0, 2, 1)[..., None]
        return acc

    def _kind(self, q_start, qpos_blk, kpos_blk, k_start) -> jax.Array:
        """The branch for a key tile: ``_SKIP`` (no pair visible under the mask and the
        window), ``_NEAR``, ``_FAR_BEFORE`` (every key more than the reach before every query,
        in every row), ``_FAR_AFTER`` (bidirectional)."""
        last_visible = q_start + self.block - 1 + (self.s - self.t) if self.causal else self.s - 1
        seen = k_start <= last_visible
        window = self.terms.window
        if not window.full:
            first = q_start + (self.s - self.t)  # the key index of the block's first query
            last_key = k_start + self.block - 1
            if window.kind == "chunked":
                seen = seen & (last_key >= (first // window.size) * window.size)
                if not self.causal:
                    end = ((first + self.block - 1) // window.size + 1) * window.size
                    seen = seen & (k_start < end)
            else:
                seen = seen & (last_key > first - window.size)
                if window.kind == "banded":
                    seen = seen & (k_start < first + self.block - 1 + window.size)
        kind = jnp.where(seen, _NEAR, _SKIP)
        reach = self.encoding.reach
        if reach is None:
            return kind
        before = jnp.max(kpos_blk.max(axis=1) - qpos_blk.min(axis=1)) < -reach  # per row
        kind = jnp.where((kind == _NEAR) & before, _FAR_BEFORE, kind)
        if self.causal:
            return kind
        after = jnp.min(kpos_blk.min(axis=1) - qpos_blk.max(axis=1)) > reach
        return jnp.where((kind == _NEAR) & after, _FAR_AFTER, kind)

    def _probes(self, q_blk, qpos_blk) -> list[_Probes]:
        """The hooks on one key past the reach before every query of the block and, without
        the causal mask, one after (none without a ``reach``)."""
        reach = self.encoding.reach
        if reach is None:
            return []
        first = jnp.min(qpos_blk, axis=1, keepdims=True)  # [B|1, 1]
        probes = [_probe(self, q_blk, qpos_blk, first - reach - 1)]
        if not self.causal:
            last = jnp.max(qpos_blk, axis=1, keepdims=True)
            probes.append(_probe(self, q_blk, qpos_blk, last + reach + 1))
        return probes

    def _step(self, carry, xs, ys, table, probe: _Probes | None, saturated: bool = False):
        """One tile of the online softmax: the hooks (or, past the reach, ``probe``) on it;
        ``saturated``: every query's contextual carry is at the encoder's ``carry_limit``."""
        q_blk, qpos_blk, q_start, decay_q_blk = xs
        k_blk, v_blk, kpos_blk, k_start, decay_k_blk, valid_k_blk, moves_blk = ys
        m, l, acc, extra, count, moved = carry
        enc, params = self.encoding, self.params
        hooks = enc.hooks
        rows = jnp.arange(self.block)
        i = q_start + rows[:, None] + (self.s - self.t)  # the queries' key indices [blk, 1]
        if moved is not None:  # Householder products: the queries carried to this tile's end
            logits, moved = householder.tile_logits(moved, i[:, 0], k_blk, moves_blk, k_start)
        else:
            logits = jnp.einsum("BTHD,BSHD->BHTS", q_blk, k_blk, preferred_element_type=jnp.float32)
        if "content_logits" in hooks:
            content = (
                enc.content_logits(params, q_blk, k_blk, qpos_blk, kpos_blk)
                if probe is None
                else probe.content
            )
            logits = logits + content.astype(jnp.float32)
        logits = logits / self.terms.denom
        if "bias" in hooks:
            if probe is not None:
                bias = probe.bias
            elif table is not None:
                bias = bias_from_table(table, self.padded_t, q_start, k_start, *logits.shape[2:])
            else:
                bias = enc.bias(params, qpos_blk, kpos_blk)
            logits = logits + bias.astype(jnp.float32)
        if decay_q_blk is not None:
            logits = logits + decay_bias((decay_q_blk, decay_k_blk))
        logits = finish_logits(logits, self.terms)
        j = k_start + rows[None, :]  # key indices [1, blk]
        visible = (j < self.s) & visible_pairs(i, j, self.causal, self.terms.window)
        visible = visible[None, None]  # [1, 1, blk, blk]
        if valid_k_blk is not None:
            visible = visible & valid_k_blk[:, None, None, :]  # [B|1, 1, blk, blk]
        logits = jnp.where(visible, logits, NEG)  # [B, H, blk, blk]
        if count is not None and saturated:
            # One key with a masked logit stands for every key of the tile (``carry_limit``).
            masked = jnp.full((*logits.shape[:3], 1), NEG, jnp.float32)
            key = jnp.zeros_like(k_blk[:, :1])
            terms, _ = enc.contextual_logits(params, q_blk, key, masked, count)
            logits = jnp.where(visible, logits + terms.astype(jnp.float32), NEG)
        elif count is not None:
            logits, count = contextual(q_blk, k_blk, logits, visible, count, enc, params)
        if not enc.normalized:
            acc, extra = _accumulate_unnormalized(
                enc, params, logits, v_blk, acc, extra, xs, ys, probe
            )
            return m, l, acc, extra, count, moved
        m_new = jnp.maximum(m, logits.max(axis=-1))  # [B, H, blk]
        p = jnp.exp(logits - m_new[..., None])
        scale = jnp.exp(m - m_new)
        rowsum = p.sum(axis=-1)
        l = l * scale + rowsum
        to_rows = scale.transpose(0, 2, 1)[..., None]  # [B, blk, H, 1]
        acc = acc * to_rows + jnp.einsum("BHTS,BSHD->BTHD", p.astype(v_blk.dtype), v_blk)
        if "value_term" in hooks:
            if probe is None:
                term = enc.value_term(params, p, qpos_blk, kpos_blk).astype(jnp.float32)
            else:  # every key of the tile adds its probability times the same vector
                term = rowsum.transpose(0, 2, 1)[..., None] * probe.value
            extra = extra * to_rows + term
        return m_new, l, acc, extra, count, moved


def _accumulate_unnormalized(enc, params, logits, v_blk, acc, extra, xs, ys, probe):
    """One tile for an encoder whose weights are ``exp(logits)`` as they are
    (``normalized = False``): its log weights are at most 0, so the weights are formed directly,
    with no running maximum to subtract and no sum to keep (weights below float32's range, under
    ``1e-38``, are 0: an absolute error, negligible as the weights are not divided by a sum).
    Three passes over the tile fewer than the online softmax's, which matter on XLA:CPU, where a
    ``512 x 512`` tile's passes are memory-bound."""
    p = jnp.exp(logits)  # [B, H, blk, blk]
    acc = acc + jnp.einsum("BHTS,BSHD->BTHD", p.astype(v_blk.dtype), v_blk)
    if "value_term" in enc.hooks:
        if probe is None:
            term = enc.value_term(params, p, xs[1], ys[2]).astype(jnp.float32)
        else:  # every key of the tile adds its weight times the same vector
            term = p.sum(axis=-1).transpose(0, 2, 1)[..., None] * probe.value
        extra = extra + term
    return acc, extra


def _probe(window: _Window, q_blk, qpos_blk, key_pos) -> _Probes:
    """The hooks' terms for a block of queries and one key at ``key_pos [B|1, 1]``: a key of
    zeros, since past the reach no hook reads the key's content, and probability one."""
    enc, params = window.encoding, window.params
    hooks = enc.hooks
    content = bias = value = None
    if "content_logits" in hooks:
        key = jnp.zeros((q_blk.shape[0], 1, *q_blk.shape[2:]), q_blk.dtype)  # [B, 1, H, Dh]
        content = enc.content_logits(params, q_blk, key, qpos_blk, key_pos).astype(jnp.float32)
    if "bias" in hooks:
        bias = enc.bias(params, qpos_blk, key_pos).astype(jnp.float32)
    if "value_term" in hooks:
        b, blk, h, _ = q_blk.shape
        ones = jnp.ones((b, h, blk, 1), jnp.float32)
        value = enc.value_term(params, ones, qpos_blk, key_pos).astype(jnp.float32)
    return _Probes(content, bias, value)


def _pad_to(x: jax.Array, size: int) -> jax.Array:
    """Pads axis 1 of ``x`` with zeros to ``size``."""
    pad = size - x.shape[1]
    return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)) if pad else x


def _pad_rows(x: jax.Array, pos: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
    """Pads axis 1 of ``x`` and ``pos`` to ``size``; padded positions continue contiguously
    (relative encoders rely on it), and padded rows are masked or dropped by the caller."""
    pad = size - x.shape[1]
    if not pad:
        return x, pos
    x = _pad_to(x, size)
    extra = pos[:, -1:] + jnp.arange(1, pad + 1, dtype=pos.dtype)[None, :]
    return x, jnp.concatenate([pos, extra], axis=1)


def _to_blocks(x: jax.Array, block: int) -> jax.Array:
    """``[B, N * block, ...]`` -> ``[N, B, block, ...]``."""
    return x.reshape(x.shape[0], x.shape[1] // block, block, *x.shape[2:]).swapaxes(0, 1)
