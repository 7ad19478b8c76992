"""The ``pallas`` attention path: a flash-attention kernel written in Pallas that computes a
bias encoder's terms inside the kernel, tile by tile, so neither the ``[H, T, S]`` bias nor the
logits are ever formed in memory (cuDNN's fused kernel takes a bias only as a dense tensor).

The kernel follows the structure of the Triton-lowered flash attention that JAX ships
(``jax/experimental/pallas/ops/gpu/attention.py``): ``pl.pallas_call`` over a grid of
``(batch, head, query tile)``, each program holding its queries and walking the key tiles with
``lax.fori_loop`` and an online softmax (running maximum ``m``, sum ``l`` and unnormalised output;
FlashAttention, Dao et al. 2022). It is our own code, and it adds what posenc's contract needs:

- **The encoder's bias inside the kernel.** An encoder that declares ``bias_by_distance`` (T5,
  ALiBi, KERPLE, dynamic position bias) at contiguous positions hands the kernel its
  per-distance table (:func:`~posenc.attention.terms.distance_table`, ``[B|1, H, T + S]``,
  computed once per window outside: ``T + S`` calls of the bias instead of ``T x S``); each tile
  reads its band by index (the bias of query ``i``, key ``j`` sits at column ``j - i + T - 1``),
  the same band the ``blocked`` path reads; at non-contiguous positions (randomized positions,
  ``lax.cond`` per window) such an encoder runs on the ``blocked`` path instead, since the
  hooks' own per-pair code (T5's bucket gather, KERPLE's ``custom_vjp``, slices) does not lower
  to Triton. Any other ``bias`` (FIRE, whose normaliser reads the query's position) is traced
  into the kernel as a jaxpr of the parameters and the tile's positions (its constants passed
  in as inputs) and called on each tile, the program's head picked from its ``[1, H, tq, tk]``
  result.
- **Masks by index**: the causal mask (key ``j`` visible to query ``i`` when
  ``j <= i + S - T``) and the layer's window (sliding, banded, chunked:
  :func:`~posenc.attention.options.visible`); key tiles wholly outside them are not visited
  (the loop runs from the first tile the window reaches to the last the mask allows). Positions
  as the other paths take them: ``q_pos [B|1, T]``, ``k_pos [B|1, S]``, any offsets.
- Logit soft-capping (``cap * tanh(z / cap)``) inside the kernel.

The backward pass (``jax.custom_vjp``) is **not** a Pallas kernel: it recomputes the window on
the ``blocked`` path (:mod:`posenc.attention.blocked`, whose query blocks are rematerialised) and
takes that path's gradient, so it is exact and memory-linear (``T x block``) in the window,
with the gradients of ``q``, ``k``, ``v`` and the encoder's parameters; it costs the ``blocked``
path's forward and backward, not a fused kernel's.

What the kernel refuses (:func:`refusal`, from the encoder's declarations, never its name):
``content_logits``, ``value_term``, ``contextual_logits``, ``log_decay``, ``householder``
hooks, unnormalised weights (``normalized = False``), and attention sinks; ``attend`` takes no
``k_valid`` or ``q_index`` on it. ``rotate`` is applied before the kernel like on every path
(RoPE, or RoPE with a bias), and a ``rotate`` that widens ``q`` and ``k`` (PoPE) gets ``v`` padded
with zero channels. Grouped-query attention arrives with its keys repeated, as on every path.

Where it runs: on a GPU through Pallas's Triton lowering (tiles of 16 to 64 rows, channels
padded to a power of two, as Triton's ``dot`` wants); on every other backend, TPUs included (the
Mosaic TPU lowering has not been tried), in Pallas's interpret mode (``interpret=True``), which
runs the same kernel body as ordinary JAX operations, one program at a time: slow, and meant for
tests.

**Verified in interpret mode only**: on CPU it equals the ``einsum`` path (forward and gradients)
for every bias encoder, causal and bidirectional, with windows (``tests/test_attention_pallas.py``
and the battery's ``pallas`` check). Without a GPU, ``jax.export`` for ``cuda`` runs Pallas's Triton
lowering: NoPE/RoPE and every ``bias_by_distance`` encoder lower to XLA's Triton custom call (a
test); FIRE's hook (a 4-D einsum) does not lower today. Triton's compilation, the numerics on a GPU
and the speed have not been run; ``attention_impl="auto"`` never picks the kernel until the device
check (``experiments/device_check.py``) has measured it faster.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.extend as jex
import jax.numpy as jnp
from jax.experimental import pallas as pl

from posenc.attention.blocked import blocked
from posenc.attention.options import visible
from posenc.attention.terms import NEG, LayerTerms, distance_table, finish_logits
from posenc.encodings.base import Encoding, Params
from posenc.encodings.relative import is_contiguous

# Hooks whose terms the kernel cannot compute from positions alone (they read q, k, the
# probabilities, the logits or the layer input).
_REFUSED_HOOKS = {
    "content_logits": "its content logits read q and k per pair",
    "value_term": "its value term needs the attention probabilities",
    "contextual_logits": "its contextual logits need the attention logits",
    "log_decay": "its log decay reads the layer input",
    "householder": "its Householder products change q . k per pair",
}
# Tile rows on a GPU: Triton's dot takes at least 16, and 64 keeps a tile of float32 logits
# and the bias in registers at head widths up to 128.
_GPU_TILE = (16, 64)


def refusal(encoding: Encoding) -> str | None:
    """Why the kernel cannot run ``encoding`` (a reason for a one-line error), or None."""
    for hook, reason in _REFUSED_HOOKS.items():
        if hook in encoding.hooks:
            return reason
    if not encoding.normalized:
        return (
            "its weights are exp(logits) without a softmax (normalized = False), which this "
            "path always normalises"
        )
    return None


def on_accelerator() -> bool:
    """Whether the default backend compiles Pallas kernels (else interpret mode)."""
    return jax.default_backend() in ("gpu", "cuda", "rocm")


def tile_for(block_size: int, gpu: bool) -> int:
    """The kernel's tile (query and key rows): the largest power of two at most
    ``block_size``, within ``_GPU_TILE`` on a GPU (Triton wants powers of two, at least 16)."""
    tile = 1 << max(0, int(block_size).bit_length() - 1)
    if gpu:
        tile = min(max(tile, _GPU_TILE[0]), _GPU_TILE[1])
    return tile


def flash(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    encoding: Encoding,
    params: Params,
    q_pos: jax.Array,
    k_pos: jax.Array,
    causal: bool,
    terms: LayerTerms,
    block_size: int,
    interpret: bool | None = None,
) -> jax.Array:
    """Attention through the kernel (module docstring).

    Args:
      q: ``[B, T, H, Dq]`` queries after ``rotate`` and the query factors.
      k: ``[B, S, H, Dq]`` keys after ``rotate``.
      v: ``[B, S, H, Dv]`` values.
      encoding, params: the bound encoder (no refused hook: :func:`refusal`) and its parameters.
      q_pos: ``[B|1, T]`` int32 query positions; k_pos: ``[B|1, S]``.
      causal: mask keys after the query (the last query sees the last key).
      terms: the layer's :class:`~posenc.attention.terms.LayerTerms` (window, scale, soft cap;
        no sinks).
      block_size: the tile, rounded by :func:`tile_for`; also the ``blocked`` path's block for
        the backward pass.
      interpret: run in Pallas's interpret mode; None: unless on a GPU.

    Returns:
      ``[B, T, H, Dv]`` in ``q.dtype``.
    """
    if terms.sinks is not None:
        raise ValueError("the pallas attention path takes no attention sinks")
    interpret = (not on_accelerator()) if interpret is None else interpret
    tile = tile_for(block_size, not interpret)
    static = _Static(encoding, causal, terms, tile, interpret, max(block_size, 1))
    return _attention(static, q, k, v, params, q_pos, k_pos)


class _Static(NamedTuple):
    """The call's facts that are not arrays."""

    encoding: Encoding
    causal: bool
    terms: LayerTerms
    tile: int
    interpret: bool
    block_size: int


def _attention(static: _Static, q, k, v, params, q_pos, k_pos):
    @jax.custom_vjp
    def run(q, k, v, params, q_pos, k_pos):
        return _forward(static, q, k, v, params, q_pos, k_pos)

    def fwd(q, k, v, params, q_pos, k_pos):
        return run(q, k, v, params, q_pos, k_pos), (q, k, v, params, q_pos, k_pos)

    def bwd(residuals, g):
        q, k, v, params, q_pos, k_pos = residuals

        def recompute(q, k, v, params):  # the blocked path: exact, memory-linear, remat'd
            return _blocked(static, q, k, v, params, q_pos, k_pos)

        _, vjp = jax.vjp(recompute, q, k, v, params)
        return (*vjp(g), None, None)

    run.defvjp(fwd, bwd)
    return run(q, k, v, params, q_pos, k_pos)


def _forward(static: _Static, q, k, v, params, q_pos, k_pos):
    """The kernel's output ``[B, T, H, Dv]``: pads rows to whole tiles and channels to a power
    of two, and picks the distance-table kernel or the per-pair one."""
    enc = static.encoding
    b, t, h, _ = q.shape
    s, dv = k.shape[1], v.shape[-1]
    tile = static.tile
    tp, sp = -(-t // tile) * tile, -(-s // tile) * tile
    q_in, k_in, v_in, q_pos_in, k_pos_in = q, k, v, q_pos, k_pos
    width = pl.next_power_of_2(max(q.shape[-1], dv))
    q = _pad(q, tp, width)
    k, v = _pad(k, sp, width), _pad(v, sp, width)
    q_pos, k_pos = _pad_positions(q_pos, tp), _pad_positions(k_pos, sp)
    call = functools.partial(_call, static, q, k, v, t, s)
    if "bias" not in enc.hooks:
        out = call(q_pos, k_pos, None, None)
    elif not enc.bias_by_distance:
        out = call(q_pos, k_pos, None, params)
    else:
        # Elsewhere (randomized positions) the blocked path: the hooks' own per-pair code
        # (T5's bucket gather, KERPLE's custom_vjp, slices) does not lower to Triton.
        return jax.lax.cond(
            is_contiguous(q_pos, k_pos),
            lambda: call(q_pos, k_pos, distance_table(enc, params, q_pos, k_pos), None)[
                :, :t, :, :dv
            ],
            lambda: _blocked(static, q_in, k_in, v_in, params, q_pos_in, k_pos_in),
        )
    return out[:, :t, :, :dv]


def _blocked(static: _Static, q, k, v, params, q_pos, k_pos):
    """The window on the ``blocked`` path (the backward pass's recomputation, and a
    ``bias_by_distance`` encoder at non-contiguous positions)."""
    return blocked(
        q,
        k,
        v,
        static.encoding,
        params,
        q_pos,
        k_pos,
        static.causal,
        static.terms,
        None,
        static.block_size,
    )


def _call(static: _Static, q, k, v, t, s, q_pos, k_pos, table, params):
    """One ``pallas_call`` over the grid ``(B, H, query tiles)``; ``table``: the window's
    per-distance bias ``[B|1, H, Tp + Sp]`` or None; ``params``: the encoder's parameters for
    a bias computed per pair inside the kernel, or None."""
    b, tp, h, width = q.shape
    sp = k.shape[1]
    tile = static.tile
    q_rows, k_rows = q_pos.shape[0], k_pos.shape[0]
    per_pair = params is not None
    leaves, n_params, bias_jaxpr = [], 0, None
    if per_pair:
        # The bias as a jaxpr of (parameters, tile positions): its constants (ALiBi's slopes)
        # become kernel inputs like the parameters, which Pallas requires.
        flat, treedef = jax.tree.flatten(params)
        tile_pos = jax.ShapeDtypeStruct((1, tile), jnp.int32)
        bias_jaxpr = jax.make_jaxpr(
            lambda flat, qp, kp: _enc_bias(static.encoding, treedef, flat, qp, kp)
        )(flat, tile_pos, tile_pos)
        leaves = [*flat, *bias_jaxpr.consts]
        n_params = len(flat)
    in_specs = [
        pl.BlockSpec((None, tile, None, width), lambda bi, hi, qi: (bi, qi, hi, 0)),
        pl.BlockSpec((None, sp, None, width), lambda bi, hi, qi: (bi, 0, hi, 0)),
        pl.BlockSpec((None, sp, None, width), lambda bi, hi, qi: (bi, 0, hi, 0)),
        pl.BlockSpec((None, tile), _row(q_rows, lambda bi, hi, qi, r: (r, qi))),
        pl.BlockSpec((None, sp), _row(k_rows, lambda bi, hi, qi, r: (r, 0))),
    ]
    args = [q, k, v, q_pos, k_pos]
    if table is not None:
        rows, width_t = table.shape[0], table.shape[-1]
        index = _row(rows, lambda bi, hi, qi, r: (r, hi, 0))
        in_specs.append(pl.BlockSpec((None, None, width_t), index))
        args.append(table)
    shapes = tuple(jnp.shape(leaf) for leaf in leaves)
    for leaf in leaves:  # each parameter and constant whole, in every program
        leaf = jnp.atleast_1d(jnp.asarray(leaf))
        in_specs.append(pl.BlockSpec(leaf.shape, lambda bi, hi, qi, n=leaf.ndim: (0,) * n))
        args.append(leaf)
    kernel = functools.partial(
        _kernel,
        static=static,
        t=t,
        s=s,
        heads=h,
        has_table=table is not None,
        bias_jaxpr=bias_jaxpr,
        n_params=n_params,
        leaf_shapes=shapes,
    )
    extra = {}
    if not static.interpret:
        from jax.experimental.pallas import triton as plgpu

        extra["compiler_params"] = plgpu.CompilerParams(num_warps=4, num_stages=2)
    return pl.pallas_call(
        kernel,
        grid=(b, h, tp // tile),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, tile, None, width), lambda bi, hi, qi: (bi, qi, hi, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=static.interpret,
        name="posenc_bias_flash_attention",
        **extra,
    )(*args)


def _enc_bias(encoding: Encoding, treedef, flat, q_pos, k_pos) -> jax.Array:
    """The encoder's ``bias`` on its parameters as a flat list of leaves."""
    return encoding.bias(jax.tree.unflatten(treedef, flat), q_pos, k_pos)


def _row(rows: int, index_map):
    """An index map reading row ``bi`` of an array with ``B`` rows, row 0 of one with 1."""
    if rows == 1:
        return lambda bi, hi, qi: index_map(bi, hi, qi, 0)
    return lambda bi, hi, qi: index_map(bi, hi, qi, bi)


def _kernel(
    q_ref,
    k_ref,
    v_ref,
    q_pos_ref,
    k_pos_ref,
    *refs,
    static: _Static,
    t: int,
    s: int,
    heads: int,
    has_table: bool,
    bias_jaxpr,
    n_params: int,
    leaf_shapes: tuple,
):
    """One program: query tile ``qi`` of head ``hi`` of batch row ``bi`` over its key tiles."""
    out_ref = refs[-1]
    table_ref = refs[0] if has_table else None
    leaf_refs = refs[int(has_table) : len(refs) - 1]
    terms, tile, causal = static.terms, static.tile, static.causal
    window = terms.window
    head, qi = pl.program_id(1), pl.program_id(2)
    sp = k_ref.shape[0]
    tp_window = t if not has_table else table_ref.shape[-1] - sp  # the table's T (padded)
    q_start = qi * tile
    q_blk = q_ref[...]  # [tile, width]
    q_pos = q_pos_ref[...]  # [tile]
    rows = q_start + jnp.arange(tile)  # query indices in the window
    i = rows[:, None] + (s - t)  # the queries' key indices [tile, 1]
    per_pair = bias_jaxpr is not None
    leaves = [ref[...].reshape(shape) for ref, shape in zip(leaf_refs, leaf_shapes, strict=True)]

    def body(kj, carry):
        m, l, acc = carry
        k_start = kj * tile
        keys = pl.ds(k_start, tile)
        k_blk = k_ref[keys, :]
        logits = jax.lax.dot_general(
            q_blk, k_blk, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        )  # [tile, tile]
        logits = logits / terms.denom
        if has_table:
            # Query i, key j: column (j - i) + T - 1 of the window's table.
            column = (k_start + jnp.arange(tile))[None, :] - rows[:, None] + (tp_window - 1)
            logits = logits + table_ref[column].astype(jnp.float32)
        elif per_pair:
            k_pos = k_pos_ref[keys]
            closed = jex.core.ClosedJaxpr(bias_jaxpr.jaxpr, leaves[n_params:])
            bias = jex.core.jaxpr_as_fun(closed)(*leaves[:n_params], q_pos[None], k_pos[None])
            bias = bias[0][0].astype(jnp.float32)  # [H, tile, tile]
            pick = (jnp.arange(heads) == head)[:, None, None]  # this program's head
            logits = logits + jnp.sum(jnp.where(pick, bias, 0.0), axis=0)
        logits = finish_logits(logits, terms)
        j = (k_start + jnp.arange(tile))[None, :]  # key indices [1, tile]
        seen = (j < s) & visible(i, j, causal, window)
        logits = jnp.where(seen, logits, NEG)
        m_new = jnp.maximum(m, logits.max(axis=-1))
        p = jnp.exp(logits - m_new[:, None])
        scale = jnp.exp(m - m_new)
        l = l * scale + p.sum(axis=-1)
        v_blk = v_ref[keys, :]
        acc = acc * scale[:, None] + jax.lax.dot_general(
            p.astype(v_blk.dtype),
            v_blk,
            (((1,), (0,)), ((), ())),
            preferred_element_type=jnp.float32,
        )
        return m_new, l, acc

    lo, hi = _key_tiles(q_start, tile, t, s, sp, causal, window)
    width = q_ref.shape[-1]
    init = (
        jnp.full((tile,), NEG, jnp.float32),
        jnp.zeros((tile,), jnp.float32),
        jnp.zeros((tile, width), jnp.float32),
    )
    _, l, acc = jax.lax.fori_loop(lo, hi, body, init)
    out_ref[...] = (acc / l[:, None]).astype(out_ref.dtype)


def _key_tiles(q_start, tile, t, s, sp, causal, window):
    """``(first, end)``: the key tiles a query tile can see under the mask and the window."""
    n_k = sp // tile
    first_i = q_start + (s - t)  # the tile's first query's key index
    last_i = first_i + tile - 1
    lo = 0
    if window.kind in ("sliding", "banded"):
        lo = jnp.maximum(first_i - (window.size - 1), 0) // tile
    elif window.kind == "chunked":
        lo = (first_i // window.size) * window.size // tile
    end = n_k
    if causal:
        end = jnp.minimum(end, last_i // tile + 1)
    elif window.kind == "banded":
        end = jnp.minimum(end, (last_i + window.size - 1) // tile + 1)
    elif window.kind == "chunked":
        end = jnp.minimum(end, ((last_i // window.size + 1) * window.size - 1) // tile + 1)
    end = jnp.maximum(end, lo + 1)  # at least one tile, so no row divides by zero
    return jnp.asarray(lo, jnp.int32), jnp.minimum(jnp.asarray(end, jnp.int32), n_k)


def _pad(x: jax.Array, rows: int, width: int) -> jax.Array:
    """``x [B, N, H, D]`` padded with zeros to ``rows`` and ``width``."""
    return jnp.pad(x, ((0, 0), (0, rows - x.shape[1]), (0, 0), (0, width - x.shape[-1])))


def _pad_positions(pos: jax.Array, size: int) -> jax.Array:
    """``[B|1, N]`` positions continued contiguously to ``size`` (padded rows are masked or
    cut; contiguity keeps the distance table valid)."""
    pad = size - pos.shape[1]
    if not pad:
        return pos
    extra = pos[:, -1:] + jnp.arange(1, pad + 1, dtype=pos.dtype)[None, :]
    return jnp.concatenate([pos, extra], axis=1)
