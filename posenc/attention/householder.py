"""Logits transported by products of per-token Householder-like maps, for an encoder with a
``householder`` hook (PaTH, :mod:`posenc.encodings.path`): the logit of query ``i`` and key
``j <= i`` is ``q_i^T H_i H_{i-1} ... H_{j+1} k_j`` (nothing between a key and itself) with
``H_t = I - beta_t w_t w_t^T`` from the hook, in place of ``q_i . k_j``.

No ``Dh x Dh`` matrix is formed per pair. The keys are cut into chunks of ``C`` and each
chunk's product is written in the compact form of products of Householder matrices (the "UT
transform" the PaTH paper takes from Joffrain et al. 2006): with ``A[s, r] = beta_s w_s . w_r``
for ``r < s`` (zero elsewhere) and ``T = (I + A)^-1``, unit lower triangular,

    H_p ... H_{j+1} = I - sum_{j < r <= s <= p} w_s T[s, r] beta_r w_r^T       (j < p in the chunk)

and a diagonal block of ``T`` is the inverse of that block of ``I + A``, so one ``T`` per chunk
serves every range inside it. From it, once per chunk (:func:`prepare`; ``T`` itself is never
formed, two triangular solves give what it multiplies):

- ``u_s = sum_r T[s, r] beta_r w_r``: a query vector ``x`` carried across the chunk's tokens
  ``start .. p`` becomes ``x - sum_{s <= p} (x . w_s) u_s``;
- ``kt[s, j] = sum_{r > j} T[s, r] beta_r (w_r . k_j)``: the logit of a query that enters the
  chunk at ``p`` with vector ``x`` (its own ``q`` if it lies in the chunk, ``p`` its index; else
  its vector carried to the chunk's end) is ``x . k_j - sum_{s <= p} (x . w_s) kt[s, j]``;
- ``k_hat_j = k_j - sum_s w_s kt[s, j]``: the key carried to the chunk's end, so a query past
  the chunk has logit ``x . k_hat_j``, NoPE's cost;
- ``P = I - sum_s w_s u_s^T``: the chunk's whole product, which carries such a query across it
  (``x P``, ``Dh x Dh`` per query).

Chunks are visited from the last to the first with every query's vector carried (``[B, T, H,
Dh]``, a vector per query where CoPE carries a scalar), as in the paper's blockwise algorithm:
:func:`transported_logits` does so over a whole row in chunks of :data:`CHUNK` (the ``einsum``
path). The ``blocked`` path calls :func:`tile_logits` per key tile: once per window
(:func:`prepare_tiles`) each tile's keys are carried to its end and its chunks' products
multiplied into the tile's, so a tile wholly before its queries costs NoPE's logits and one
``Dh x Dh`` product per query; a tile holding queries runs the chunks inside it. Memory is
linear in the window. All of it is float32.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from posenc.encodings.base import Encoding, Params

# Keys per chunk on the `einsum` path (and in a cache's steps).
CHUNK = 64


def factors(
    encoding: Encoding,
    params: Params,
    inputs: jax.Array | None,
    s: int,
    k_valid: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array] | None:
    """``(w [B, S, H, Dh], beta [B, S, H])`` float32 from the encoder's ``householder`` hook on
    the layer input ``inputs [B, S, D]``, or None for an encoder without the hook.

    Invalid keys (``k_valid [B|1, S]`` False) are removed exactly, as if absent: the hook runs on
    each row's valid inputs packed in order at its front (an entry may read the inputs before it,
    PaTH's short convolution), its results go back to their slots, and an invalid key gets
    ``beta = 0`` and ``w = 0`` (``H = I``). A cache's rows, valid slots first, are unmoved."""
    if "householder" not in encoding.hooks:
        return None
    if inputs is None or inputs.ndim != 3 or inputs.shape[1] != s:
        got = None if inputs is None else tuple(inputs.shape)
        raise ValueError(
            f"encoding {encoding.name!r} reads the layer input (its householder hook): attend "
            f"needs inputs=[B, S={s}, D], got {got}"
        )
    if k_valid is None:
        w, beta = encoding.householder(params, inputs)
    else:
        valid = jnp.broadcast_to(k_valid, inputs.shape[:2])  # [B, S]
        order = jnp.argsort(~valid, axis=1, stable=True)  # the valid keys first, in order
        packed = jnp.take_along_axis(inputs, order[:, :, None], axis=1)
        w, beta = encoding.householder(params, packed)
        back = jnp.argsort(order, axis=1)[:, :, None]
        w = jnp.take_along_axis(w, back[..., None], axis=1)
        beta = jnp.take_along_axis(beta, back, axis=1)
    w, beta = w.astype(jnp.float32), beta.astype(jnp.float32)
    if k_valid is not None:
        beta = jnp.where(k_valid[:, :, None], beta, 0.0)
        w = jnp.where(k_valid[:, :, None, None], w, 0.0)
    return w, beta


class Chunks(NamedTuple):
    """Per chunk of ``C`` keys (module docstring), ``[N, B, ...]``: ``w`` and ``u`` ``[N, B, C,
    H, Dh]``, ``kt`` ``[N, B, H, C(s), C(j)]``, ``k_hat`` ``[N, B, C, H, Dh]``, ``p`` ``[N, B, H,
    Dh, Dh]``."""

    w: jax.Array
    u: jax.Array
    kt: jax.Array
    k_hat: jax.Array
    p: jax.Array


def prepare(k: jax.Array, w: jax.Array, beta: jax.Array, chunk: int) -> Chunks:
    """The chunks' compact products (module docstring) for keys ``k [B, S, H, Dh]`` and factors
    ``w [B, S, H, Dh]``, ``beta [B, S, H]``, ``S`` a multiple of ``chunk``."""
    b, s, h, d = k.shape
    n = s // chunk
    k, w = (x.astype(jnp.float32).reshape(b, n, chunk, h, d) for x in (k, w))
    beta = beta.astype(jnp.float32).reshape(b, n, chunk, h)
    bw = beta[..., None] * w  # [B, N, C, H, Dh]
    below = jnp.tril(jnp.ones((chunk, chunk), bool), k=-1)  # [s, r]: r < s
    a = jnp.einsum("BNSHD,BNRHD->BNHSR", bw, w, precision=_EXACT)
    lower = jnp.where(below, a, 0.0) + jnp.eye(chunk, dtype=jnp.float32)  # I + A
    u = _unit_lower_solve(lower, bw.transpose(0, 1, 3, 2, 4))  # [B, N, H, C, Dh]
    m = jnp.einsum("BNRHD,BNJHD->BNHRJ", bw, k, precision=_EXACT)
    m = jnp.where(below, m, 0.0)  # r > j only
    kt = _unit_lower_solve(lower, m)  # [B, N, H, C(s), C(j)]
    k_hat = k - jnp.einsum("BNHSJ,BNSHD->BNJHD", kt, w, precision=_EXACT)
    p = jnp.eye(d, dtype=jnp.float32) - jnp.einsum("BNSHD,BNHSE->BNHDE", w, u, precision=_EXACT)
    u = u.transpose(0, 1, 3, 2, 4)  # [B, N, C, H, Dh]
    return Chunks(*(x.swapaxes(0, 1) for x in (w, u, kt, k_hat, p)))


_EXACT = jax.lax.Precision.HIGHEST  # float32 products, not TF32 or bfloat16 passes


@jax.custom_vjp
def _unit_lower_solve(lower: jax.Array, rhs: jax.Array) -> jax.Array:
    """``X`` with ``lower @ X = rhs``: ``lower [..., C, C]`` unit lower triangular (its upper
    triangle and diagonal are not read), ``rhs [..., C, R]``.

    Forward substitution, one row at a time, in plain XLA operations rather than
    ``jax.scipy.linalg.solve_triangular``: its LAPACK call, batched inside the blocked path's
    loops, left XLA:CPU's thread pool waiting forever on this VM (a process that had run NoPE's
    attention before hung in PaTH's, every time). The gradient is written by hand (a backward
    substitution), so reverse mode keeps no row-by-row copies."""
    return _forward_substitution(lower, rhs)


def _forward_substitution(lower, rhs):
    c = lower.shape[-1]
    below = jnp.tril(jnp.ones((c, c), bool), k=-1)
    strict = jnp.where(below, lower, 0.0)

    def row(i, x):  # rows < i solved, rows >= i still zero
        known = jnp.einsum("...c,...cr->...r", strict[..., i, :], x, precision=_EXACT)
        return x.at[..., i, :].set(rhs[..., i, :] - known)

    return jax.lax.fori_loop(0, c, row, jnp.zeros_like(rhs))


def _solve_forward(lower, rhs):
    x = _forward_substitution(lower, rhs)
    return x, (lower, x)


def _solve_backward(saved, grad):
    lower, x = saved
    c = lower.shape[-1]
    # d rhs = L^-T grad: the transposed (upper) system, solved from the last row up.
    upper = jnp.swapaxes(jnp.where(jnp.tril(jnp.ones((c, c), bool), k=-1), lower, 0.0), -1, -2)
    flipped = jnp.flip(upper, axis=(-1, -2))  # lower triangular in reversed order
    d_rhs = jnp.flip(_forward_substitution(flipped, jnp.flip(grad, -2)), -2)
    # d L = -d_rhs x^T on the strict lower triangle (the only entries read).
    d_lower = -jnp.einsum("...ir,...jr->...ij", d_rhs, x, precision=_EXACT)
    d_lower = jnp.where(jnp.tril(jnp.ones((c, c), bool), k=-1), d_lower, 0.0)
    return d_lower, d_rhs


_unit_lower_solve.defvjp(_solve_forward, _solve_backward)


def chunk_logits(
    x: jax.Array,
    index: jax.Array,
    k: jax.Array,
    chunk: Chunks,
    k_start: jax.Array | int,
) -> tuple[jax.Array, jax.Array]:
    """The transported (unscaled) logits of queries against one chunk of keys, and the queries'
    vectors carried to the chunk's start.

    Args:
      x: ``[B, T, H, Dh]`` float32, each query's vector carried to the end of this chunk (its
        ``q`` while it lies in or before the chunk).
      index: ``[T]`` the queries' key indices (in the frame of ``k_start``).
      k: ``[B, C, H, Dh]`` the chunk's keys.
      chunk: the chunk's :class:`Chunks` entries (no leading ``N``).
      k_start: the key index of the chunk's first key.

    Returns:
      ``[B, H, T, C]`` float32 logits (meaningful for keys at or before each query) and ``x``
      carried across the chunk's tokens up to each query (``[B, T, H, Dh]``).
    """
    c = k.shape[1]

    def far(x):  # every query after the chunk: keys carried to its end, the whole product
        logits = jnp.einsum("BTHD,BSHD->BHTS", x, chunk.k_hat, precision=_EXACT)
        return logits, jnp.einsum("BTHD,BHDE->BTHE", x, chunk.p, precision=_EXACT)

    def near(x):  # some query in the chunk: it enters at its own index
        xw = jnp.einsum("BTHD,BSHD->BHTS", x, chunk.w, precision=_EXACT)
        entered = (k_start + jnp.arange(c))[None, :] <= index[:, None]  # [T, C]: s <= p
        g = jnp.where(entered, xw, 0.0)
        logits = jnp.einsum("BTHD,BSHD->BHTS", x, k.astype(jnp.float32), precision=_EXACT)
        logits = logits - jnp.einsum("BHTS,BHSJ->BHTJ", g, chunk.kt, precision=_EXACT)
        return logits, x - jnp.einsum("BHTS,BSHD->BTHD", g, chunk.u, precision=_EXACT)

    return jax.lax.cond(jnp.min(index) >= k_start + c, far, near, x)


def _pad_keys(x: jax.Array, pad: int) -> jax.Array:
    """Pads axis 1 of ``x`` with ``pad`` zeros."""
    return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))


def transported_logits(
    x: jax.Array,
    k: jax.Array,
    w: jax.Array,
    beta: jax.Array,
    index: jax.Array,
    chunk: int = CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """``q_i^T H_i ... H_{j+1} k_j`` for queries against a run of keys, unscaled, float32
    ``[B, H, T, S]`` (pairs with ``j > i`` hold meaningless values for the mask to drop), and
    each query's vector carried to the run's first key.

    Args:
      x: ``[B, T, H, Dh]`` the queries' vectors carried to the end of the run (``q`` for a query
        in or before it).
      k: ``[B, S, H, Dh]`` keys; ``w [B, S, H, Dh]``, ``beta [B, S, H]`` their factors.
      index: ``[T]`` the queries' key indices, counted from the run's first key.
      chunk: keys per chunk (the run is visited chunk by chunk, last to first).
    """
    s = k.shape[1]
    chunk = min(chunk, s)
    pad = -s % chunk
    if pad:  # padded keys: zeros, beta = 0 (H = I)
        k, w, beta = (_pad_keys(a, pad) for a in (k, w, beta))
    chunks = prepare(k, w, beta, chunk)
    keys = k.reshape(k.shape[0], -1, chunk, *k.shape[2:]).swapaxes(0, 1)  # [N, B, C, H, Dh]
    starts = jnp.arange(keys.shape[0]) * chunk

    def step(x, ys):
        k_blk, part, start = ys
        logits, x = chunk_logits(x, index, k_blk, part, start)
        return x, logits

    x, logits = jax.lax.scan(step, x.astype(jnp.float32), (keys, chunks, starts), reverse=True)
    b, h, t = logits.shape[1:4]
    logits = logits.transpose(1, 2, 3, 0, 4).reshape(b, h, t, -1)  # [B, H, T, N * C]
    return logits[..., :s], x


class Tiles(NamedTuple):
    """Per key tile of the ``blocked`` path, ``[N, B, ...]``: the factors ``w [N, B, blk, H,
    Dh]`` and ``beta [N, B, blk, H]``, the keys carried to the tile's end ``k_hat [N, B, blk, H,
    Dh]`` and the tile's whole product ``p [N, B, H, Dh, Dh]`` (``x -> x p`` carries a query
    vector across it)."""

    w: jax.Array
    beta: jax.Array
    k_hat: jax.Array
    p: jax.Array


def prepare_tiles(k: jax.Array, w: jax.Array, beta: jax.Array, block: int) -> Tiles:
    """:class:`Tiles` for keys ``k [B, S, H, Dh]`` (``S`` a multiple of ``block``): chunks of
    :data:`CHUNK` inside each tile (:func:`prepare`), then each chunk's keys carried across the
    later chunks of its tile and the chunks' products multiplied, last to first."""
    b, s, h, d = k.shape
    n = s // block
    chunk = CHUNK if block % CHUNK == 0 else block
    per = block // chunk  # chunks per tile
    parts = prepare(k, w, beta, chunk)  # [n * per, B, ...]
    k_hat = parts.k_hat.reshape(n, per, b, chunk, h, d).swapaxes(0, 1)  # [per, n, B, C, H, Dh]
    p = parts.p.reshape(n, per, b, h, d, d).swapaxes(0, 1)

    def step(acc, ys):  # acc: the product of the later chunks of each tile, [n, B, H, Dh, Dh]
        k_c, p_c = ys
        carried = jnp.einsum("NBHDE,NBCHE->NBCHD", acc, k_c, precision=_EXACT)
        return jnp.einsum("NBHDE,NBHEF->NBHDF", acc, p_c, precision=_EXACT), carried

    eye = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (n, b, h, d, d))
    whole, k_hat = jax.lax.scan(step, eye, (k_hat, p), reverse=True)
    k_hat = k_hat.transpose(1, 2, 0, 3, 4, 5).reshape(n, b, block, h, d)  # from [per, n, B, C]
    to_tiles = lambda a: a.reshape(b, n, block, *a.shape[2:]).swapaxes(0, 1)  # noqa: E731
    return Tiles(to_tiles(w.astype(jnp.float32)), to_tiles(beta.astype(jnp.float32)), k_hat, whole)


def tile_logits(
    x: jax.Array,
    index: jax.Array,
    k: jax.Array,
    tile: Tiles,
    k_start: jax.Array | int,
) -> tuple[jax.Array, jax.Array]:
    """:func:`chunk_logits` for a key tile of the ``blocked`` path (``tile``: its
    :class:`Tiles` entries): a tile wholly before the queries reads the prepared keys and
    product; one holding queries runs :func:`transported_logits` over its chunks."""
    blk = k.shape[1]

    def far(x):
        logits = jnp.einsum("BTHD,BSHD->BHTS", x, tile.k_hat, precision=_EXACT)
        return logits, jnp.einsum("BTHD,BHDE->BTHE", x, tile.p, precision=_EXACT)

    def near(x):
        return transported_logits(x, k, tile.w, tile.beta, index - k_start)

    return jax.lax.cond(jnp.min(index) >= k_start + blk, far, near, x)
