"""T5 relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning
with a Unified Text-to-Text Transformer", Sec. 2.1).

Each head adds a learned scalar to the logit of query ``i`` and key ``j``, looked up by a bucket
of the relative position ``j - i``. Half of the buckets hold exact small distances; the rest
cover distances up to ``max_distance`` on a logarithmic scale, and everything further shares the
last bucket. One table is shared by all layers, as in T5.

``bidirectional`` must match the model: a bidirectional model (``model.causal=False``, T5's
encoder) needs ``bidirectional=True``, or every key after the query would share bucket 0 with
the query itself; the model refuses that combination at construction (:meth:`check_causal`).
A causal model may use either (with ``bidirectional=True`` half of the buckets go unused).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from posenc.encodings.base import Dims, Encoding, Params
from posenc.encodings.registry import register
from posenc.encodings.relative import pairwise_offsets


def relative_position_bucket(
    relative_position: jax.Array,
    *,
    bidirectional: bool = False,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> jax.Array:
    """Maps key-minus-query offsets ``j - i`` to T5's buckets.

    With ``n = i - j`` (how far back the key is) and, for a causal model, all ``num_buckets``
    buckets spent on ``n >= 0`` (future keys, ``n < 0``, fall in bucket 0 and are masked anyway):

    - ``n < num_buckets / 2`` gets its own bucket ``n`` ("exact");
    - larger ``n`` gets ``nb/2 + floor(log(n / (nb/2)) / log(max_distance / (nb/2)) * nb/2)``,
      capped at ``nb - 1``.

    Bidirectional (encoder) attention gives half of the buckets to each direction, the second
    half to keys after the query. Worked example, causal, ``num_buckets=8``, ``max_distance=16``
    (exact below 4; then ``4 + floor(log2(n/4) * 2)``)::

        n:       0 1 2 3 4 5 6 7 8 ... 11 12 ... 15 16 ... 1000
        bucket:  0 1 2 3 4 4 5 5 6 ...  6  7 ...  7  7 ...    7

    Args:
      relative_position: integer array of ``j - i`` (memory position minus query position).
      bidirectional: whether keys after the query get buckets of their own.
      num_buckets: total number of buckets (even when bidirectional).
      max_distance: distance from which every offset shares the last bucket.

    Returns:
      int32 array of the same shape, values in ``[0, num_buckets)``.
    """
    n = -relative_position.astype(jnp.int32)
    bucket = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    # log of n / max_exact, only meaningful where n >= max_exact; max(n, 1) keeps log finite.
    scaled = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / np.log(
        max_distance / max_exact
    )
    large = max_exact + (scaled * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(n < max_exact, n, large)


@register
@dataclasses.dataclass(frozen=True)
class T5Bias(Encoding):
    """Bucketed relative position bias, one learned scalar per (bucket, head), shared by layers.

    Attributes:
      num_buckets: number of buckets (32 in T5).
      max_distance: distance where the last bucket starts (128 in T5).
      bidirectional: spend half the buckets on keys after the query (False for a decoder).
      init_std: standard deviation of the normal initialiser of the table.
    """

    name = "t5"
    paper = "Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5)"
    relative = True
    param_scope = "shared"
    bias_by_distance = True  # one bucket per distance

    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = False
    init_std: float = 0.02

    def __post_init__(self):
        if not isinstance(self.num_buckets, int) or self.num_buckets < 2:
            raise ValueError(
                f"encoding.num_buckets must be an integer >= 2, got {self.num_buckets!r}"
            )
        if self.bidirectional and self.num_buckets % 4:
            raise ValueError(
                "encoding.num_buckets must be a multiple of 4 when encoding.bidirectional "
                f"(half per direction, half of that exact), got {self.num_buckets}"
            )
        exact = self.num_buckets // (4 if self.bidirectional else 2)
        if not isinstance(self.max_distance, int) or self.max_distance <= exact:
            raise ValueError(
                f"encoding.max_distance must be an integer > {exact} (the exact buckets), "
                f"got {self.max_distance!r}"
            )

    def for_direction(self, causal: bool) -> T5Bias:
        """T5's encoder buckets keys on both sides (``bidirectional=True``), its decoder only
        those before the query."""
        return dataclasses.replace(self, bidirectional=not causal)

    def check_causal(self, causal: bool) -> None:
        if not causal and not self.bidirectional:
            raise ValueError(
                "model.causal=False needs encoding.hparams.bidirectional=True for t5: causal "
                "buckets put every key after the query in bucket 0, with the query itself"
            )

    @property
    def reach(self) -> int:
        """Keys ``max_distance`` or more positions away share their side's last bucket."""
        return self.max_distance - 1

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        return {"table": (self.num_buckets, dims.num_heads)}

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"table": (None, "heads")}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        table = self.init_std * jax.random.normal(rng, self.param_shapes(dims)["table"])
        return {"table": table.astype(jnp.float32)}

    def bias(self, params: Params, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """``[B|1, T]``, ``[B|1, S]`` positions -> ``[B|1, H, T, S]`` learned logits."""
        buckets = relative_position_bucket(
            pairwise_offsets(q_pos, k_pos),
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )  # [B|1, T, S]
        # Gather rows of the [num_buckets, H] table; its gradient sums into the small table.
        return jnp.moveaxis(jnp.asarray(params["table"])[buckets], -1, 1)  # [B|1, H, T, S]
