"""Relative position representations (Shaw, Uszkoreit, Vaswani 2018, "Self-Attention with
Relative Position Representations").

Each clipped relative distance ``clip(j - i, -k, k)`` has two learned vectors, ``a^K`` and
``a^V`` (shared across heads, as in the paper, Sec. 3.3), entering attention as (Eqs. 3-4)::

    e_ij = q_i . (k_j + a^K_{clip(j-i)}) / sqrt(Dh)
    z_i  = sum_j alpha_ij (v_j + a^V_{clip(j-i)})

The ``L x L x Dh`` tensor ``a_ij`` is never built. Keys: ``q_i . a^K_r`` is computed against the
``2k + 1`` embeddings (``[B, H, T, 2k+1]``), spread to the ``T + S`` offsets of the relative
table, and skewed into ``[B, H, T, S]`` by :func:`rel_shift`. The offsets of the table count up
by one, so the spread is a band (:func:`_spread`): the ``2k - 1`` unclipped distances are a
slice of the embeddings' scores at a shifted start, and the columns past ``+-k`` repeat the end
scores (a select); no ``(2k+1)``-wide one-hot matmul per pair. Values: the probabilities are
summed per clipped distance without un-skewing them (the clipped ends as masked sums, the
inner distances as diagonals read from the flattened rows; :func:`_sum_per_clip`), and
multiplied by ``a^V``. Neither direction gathers or scatters, so the backward pass stays
dense (a gather here turns into a slow scatter on GPUs). Batch rows whose windows start at
different key-minus-query offsets take a one-hot matmul over the table instead.

That relative table needs contiguous positions. For any others (randomized positions, Ruoss et
al. 2023: sorted random subsets of a longer range) the same quantities go through a one-hot of
each pair's clipped distance, ``[B|1, T, S, 2k+1]``, still dense matmuls and never ``L x L x Dh``;
``jax.lax.cond`` picks the path at run time (:func:`~posenc.encodings.relative.is_contiguous`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params
from posenc.encodings.registry import register
from posenc.encodings.relative import is_contiguous, rel_shift, rel_unshift, relative_offsets


def clipped_relative_index(q_pos: jax.Array, k_pos: jax.Array, max_distance: int) -> jax.Array:
    """Row of the Shaw tables used by each (query, key) pair: ``clip(j - i, -k, k) + k``.

    Args:
      q_pos: ``[..., T]`` integer query positions ``i``.
      k_pos: ``[..., S]`` integer key positions ``j``.
      max_distance: the clip distance ``k >= 0``.

    Returns:
      ``[..., T, S]`` int32 indices into ``[2k + 1]`` tables.
    """
    if not isinstance(max_distance, int) or max_distance < 0:
        raise ValueError(f"encoding.max_distance must be an integer >= 0, got {max_distance!r}")
    offsets = k_pos[..., None, :].astype(jnp.int32) - q_pos[..., :, None].astype(jnp.int32)
    return jnp.clip(offsets, -max_distance, max_distance) + max_distance


def _offset_one_hot(q_pos: jax.Array, k_pos: jax.Array, max_distance: int, dtype) -> jax.Array:
    """``[B|1, T + S, 2k + 1]``: which clipped distance each column of the relative table uses."""
    offsets = relative_offsets(q_pos, k_pos)  # [B|1, T + S]
    index = jnp.clip(offsets, -max_distance, max_distance) + max_distance
    return jax.nn.one_hot(index, 2 * max_distance + 1, dtype=dtype)


def _spread(per_distance: jax.Array, first_offset: jax.Array, max_distance: int, r: int):
    """Scores per clipped distance -> scores per column of a relative table of ``r`` columns
    whose offsets are ``first_offset + arange(r)`` (shared by every row).

    ``out[..., c] = per_distance[..., clip(first_offset + c, -k, k) + k]``, as a band: the
    ``2k - 1`` inner scores (distances ``-k + 1 .. k - 1``) written into zeros at the table's
    column of distance ``-k + 1``, the clipped ends by a select.

    Args:
      per_distance: ``[..., 2k + 1]``.
      first_offset: scalar int32, the key-minus-query offset of column 0.
      max_distance: the clip distance ``k``.
      r: the number of columns.

    Returns:
      ``[..., r]``.
    """
    k = max_distance
    offsets = first_offset + jnp.arange(r, dtype=jnp.int32)  # [R]
    left, right = per_distance[..., :1], per_distance[..., 2 * k :]
    if k == 0:  # one embedding for every distance
        return jnp.broadcast_to(left, (*per_distance.shape[:-1], r))
    inner = per_distance[..., 1 : 2 * k]  # [..., 2k - 1]
    # Distance -k + 1 sits at column -k + 1 - first_offset; the table gets 2k - 1 columns of
    # margin on each side, so that wherever the inner scores fall, wholly or partly outside it,
    # they are written at their true place (the start clamped only where none of them shows).
    width = 2 * k - 1
    zeros = jnp.zeros((*per_distance.shape[:-1], r + 2 * width), per_distance.dtype)
    start = jnp.clip(1 - k - first_offset + width, 0, r + width)
    middle = jax.lax.dynamic_update_slice_in_dim(zeros, inner, start, axis=-1)[..., width:-width]
    return jnp.where(offsets <= -k, left, jnp.where(offsets >= k, right, middle))


def _sum_per_clip(probs: jax.Array, offset: jax.Array, max_distance: int) -> jax.Array:
    """Probabilities summed per clipped distance, for a window whose pair ``(i, j)`` is at
    distance ``j - i + offset`` (contiguous positions, one ``offset = k0 - q0`` for every row).

    The two clipped ends are masked sums over the keys; each inner distance ``e`` (``|e| < k``)
    is the diagonal ``probs[i, i + e - offset]``, read from the flattened rows: element
    ``(i, i + c)`` sits at ``i * (S + 1) + c``, so rows of ``S + 1`` from flat index ``c`` hold
    the diagonals ``c, c + 1, ...`` in their first columns (reads only: un-skewing the whole
    ``[T, S]`` into the ``[T, T + S]`` relative table costs ten times a tile's ``q . k`` on
    XLA:CPU).

    Args:
      probs: ``[..., T, S]``.
      offset: scalar int32, ``k0 - q0``.
      max_distance: the clip distance ``k``.

    Returns:
      ``[..., T, 2k + 1]``: ``out[..., i, e + k] = sum_{j: clip(j - i + offset) = e} probs[i, j]``.
    """
    k = max_distance
    *lead, t, s = probs.shape
    distance = jnp.arange(s)[None, :] - jnp.arange(t)[:, None] + offset  # [T, S]
    if k == 0:  # one embedding for every distance
        return probs.sum(-1, keepdims=True)
    zero = jnp.zeros((), probs.dtype)
    left = jnp.where(distance <= -k, probs, zero).sum(-1, keepdims=True)  # [..., T, 1]
    right = jnp.where(distance >= k, probs, zero).sum(-1, keepdims=True)
    width = 2 * k - 1
    first = 1 - k - offset  # the diagonal c = j - i of distance -k + 1
    # Margins such that rows of S + 1 from flat index `first` stay in the buffer wherever a
    # diagonal of the band touches the window (-T < c < S); elsewhere all are masked below.
    margin = t + width
    if s < width:  # rows of at least `width` keys (zeros, which add nothing)
        probs = jnp.pad(probs, [(0, 0)] * len(lead) + [(0, 0), (0, width - s)])
    n = probs.shape[-1]  # keys per row, from here on
    flat = jnp.pad(probs.reshape(*lead, t * n), [(0, 0)] * len(lead) + [(margin, n + t + margin)])
    start = jnp.clip(margin + first, 0, flat.shape[-1] - t * (n + 1))
    rows = jax.lax.dynamic_slice_in_dim(flat, start, t * (n + 1), axis=-1)
    inner = rows.reshape(*lead, t, n + 1)[..., :width]  # [..., T, 2k - 1]
    key = jnp.arange(t)[:, None] + first + jnp.arange(width)[None, :]  # the key each reads
    inner = jnp.where((key >= 0) & (key < s), inner, zero)
    return jnp.concatenate([left, inner, right], axis=-1)


def _shared_offset(q_pos: jax.Array, k_pos: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The relative table's first offset (row 0's) and whether every row shares it."""
    first = relative_offsets(q_pos, k_pos)[:, 0]  # [B|1]
    return first[0], jnp.all(first == first[0])


def _pair_one_hot(q_pos: jax.Array, k_pos: jax.Array, max_distance: int, dtype) -> jax.Array:
    """``[B|1, T, S, 2k + 1]``: which clipped distance each (query, key) pair uses."""
    index = clipped_relative_index(q_pos, k_pos, max_distance)  # [B|1, T, S]
    return jax.nn.one_hot(index, 2 * max_distance + 1, dtype=dtype)


def _path(q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """Which way to lay the distances out: 0 per pair (any positions), 1 the relative table by
    a one-hot (contiguous rows at different offsets), 2 the table as a band (one offset)."""
    _, shared = _shared_offset(q_pos, k_pos)
    contiguous = is_contiguous(q_pos, k_pos)
    return jnp.where(contiguous, jnp.where(shared, 2, 1), 0)


def _einsum_batch1(spec: str, x: jax.Array, one_hot: jax.Array) -> jax.Array:
    """``jnp.einsum`` where ``one_hot``'s leading ``B`` may be 1 (positions shared by the batch)."""
    if one_hot.shape[0] == 1:
        lhs, out = spec.split("->")
        x_spec, oh_spec = lhs.split(",")
        return jnp.einsum(f"{x_spec},{oh_spec[1:]}->{out}", x, one_hot[0])
    return jnp.einsum(spec, x, one_hot)


@register
@dataclasses.dataclass(frozen=True)
class Shaw(Encoding):
    """Clipped relative key and value embeddings, one pair of tables per layer.

    Any integer positions: contiguous rows take the rel-shift path, others the pairwise one.

    Attributes:
      max_distance: the clip distance ``k`` (the paper uses 16 for translation; any ``k >= 0``).
      keys: add the ``a^K`` key term (the paper's full method); False keeps only values (Table
        3's "values only"; with ``values=False`` too, no position information: "neither").
      values: add the ``a^V`` value term (the paper's full method); False keeps only keys.
      init_std: standard deviation of the normal initialiser of both tables.
    """

    name = "shaw"
    paper = "Shaw, Uszkoreit, Vaswani 2018, Self-Attention with Relative Position Representations"
    relative = True

    max_distance: int = 16
    keys: bool = True
    values: bool = True
    init_std: float = 0.02

    def __post_init__(self):
        if not isinstance(self.max_distance, int) or self.max_distance < 0:
            raise ValueError(
                f"encoding.max_distance (Shaw's clip distance k) must be an integer >= 0, "
                f"got {self.max_distance!r}"
            )
        for field in ("keys", "values"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(
                    f"encoding.{field} must be True or False, got {getattr(self, field)!r}"
                )

    @property
    def reach(self) -> int:
        """Keys more than ``k`` positions away use the clipped embeddings ``a_{+-k}``."""
        return self.max_distance

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        shape = (2 * self.max_distance + 1, dims.head_dim)  # [2k+1, Dh], shared by heads
        tables = (("key_table", self.keys), ("value_table", self.values))
        return {name: shape for name, used in tables if used}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        rngs = dict(zip(("key_table", "value_table"), jax.random.split(rng), strict=True))
        return {
            name: (self.init_std * jax.random.normal(rngs[name], shape)).astype(jnp.float32)
            for name, shape in self.param_shapes(dims).items()
        }

    @property
    def content_logits(self):
        # Only with the key term: attention checks for the hook.
        return self._content_logits if self.keys else None

    def _content_logits(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> jax.Array:
        """``q . a^K_{clip(j-i)}`` for every pair: ``q: [B, T, H, Dh]`` -> ``[B, H, T, S]``."""
        del k
        table = params["key_table"].astype(q.dtype)
        per_distance = jnp.einsum("BTHD,KD->BHTK", q, table)  # [B, H, T, 2k+1]
        branches = (self._keys_by_pair, self._keys_by_offset, self._keys_by_band)
        return jax.lax.switch(_path(q_pos, k_pos), branches, per_distance, q_pos, k_pos)

    def _keys_by_band(self, per_distance, q_pos, k_pos):
        """Contiguous positions at one offset for every row: spread as a band, then skew."""
        first, _ = _shared_offset(q_pos, k_pos)
        r = q_pos.shape[-1] + k_pos.shape[-1]
        per_offset = _spread(per_distance, first, self.max_distance, r)  # [B, H, T, T+S]
        return rel_shift(per_offset)  # [B, H, T, S]

    def _keys_by_offset(self, per_distance, q_pos, k_pos):
        """Contiguous positions, rows at different offsets: spread by a one-hot, then skew."""
        one_hot = _offset_one_hot(q_pos, k_pos, self.max_distance, per_distance.dtype)
        per_offset = _einsum_batch1("BHTK,BRK->BHTR", per_distance, one_hot)  # [B, H, T, T+S]
        return rel_shift(per_offset)  # [B, H, T, S]

    def _keys_by_pair(self, per_distance, q_pos, k_pos):
        """Any positions: each pair picks its clipped distance through a one-hot."""
        one_hot = _pair_one_hot(q_pos, k_pos, self.max_distance, per_distance.dtype)
        if one_hot.shape[0] == 1:
            return jnp.einsum("BHTK,TSK->BHTS", per_distance, one_hot[0])
        return jnp.einsum("BHTK,BTSK->BHTS", per_distance, one_hot)  # [B, H, T, S]

    def _value_term(
        self, params: Params, probs: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> jax.Array:
        """``sum_j p_ij a^V_{clip(j-i)}``: ``probs: [B, H, T, S]`` -> ``[B, T, H, Dh]``."""
        branches = (self._probs_by_pair, self._probs_by_offset, self._probs_by_band)
        per_distance = jax.lax.switch(_path(q_pos, k_pos), branches, probs, q_pos, k_pos)
        table = params["value_table"].astype(probs.dtype)
        return jnp.einsum("BHTK,KD->BTHD", per_distance, table)  # per_distance: [B, H, T, 2k+1]

    def _probs_by_band(self, probs, q_pos, k_pos):
        """Contiguous positions at one offset for every row: the clipped ends as masked sums,
        the inner distances as diagonals (:func:`_sum_per_clip`)."""
        first, _ = _shared_offset(q_pos, k_pos)
        return _sum_per_clip(probs, first + (probs.shape[-2] - 1), self.max_distance)

    def _probs_by_offset(self, probs, q_pos, k_pos):
        """Contiguous positions, rows at different offsets: un-skew, then sum per clipped
        distance by a one-hot."""
        per_offset = rel_unshift(probs)  # [B, H, T, T+S]
        one_hot = _offset_one_hot(q_pos, k_pos, self.max_distance, probs.dtype)
        return _einsum_batch1("BHTR,BRK->BHTK", per_offset, one_hot)  # [B, H, T, 2k+1]

    def _probs_by_pair(self, probs, q_pos, k_pos):
        """Any positions: sum each pair's probability into its clipped distance."""
        one_hot = _pair_one_hot(q_pos, k_pos, self.max_distance, probs.dtype)
        if one_hot.shape[0] == 1:
            return jnp.einsum("BHTS,TSK->BHTK", probs, one_hot[0])
        return jnp.einsum("BHTS,BTSK->BHTK", probs, one_hot)  # [B, H, T, 2k+1]

    @property
    def value_term(self):
        # Only the full method has the hook; attention checks for it to choose a path.
        return self._value_term if self.values else None
