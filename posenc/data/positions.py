"""Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers", Sec. 3).

A window of ``T`` tokens is given the positions of a random ordered subset of
``[0, max_position)`` (the paper: ``max_position = 2048``) instead of ``0 .. T - 1``, so that a
model trained on short windows has seen the position values (and distances) of long ones. As in
the paper's code (``noisy_fixed_positional_encodings``: ``jax.random.choice`` without
replacement, then ``jnp.sort``), one subset is drawn per batch and shared by its rows.

The draw is a pure function of ``(seed, index, purpose)``: training uses the step as index,
evaluation the batch number, so a resumed run and every process of a multi-process run draw
the same positions. The subset is sorted, so the positions still increase along the window and
causal attention sees them in order.
"""

from __future__ import annotations

import numpy as np

MODES = ("contiguous", "randomized")
# Streams of random numbers, kept apart so training and evaluation draws never coincide.
_PURPOSES = {"train": 0, "eval": 1}


def random_positions(
    seed: int, index: int | tuple[int, ...], length: int, max_position: int, purpose: str = "train"
) -> np.ndarray:
    """A sorted random subset of ``[0, max_position)`` of size ``length``.

    Args:
      seed: the run's seed (``config.seed``).
      index: training step, or ``(window length, batch number)`` for evaluation.
      length: positions to draw, ``<= max_position``.
      max_position: the range the positions are drawn from.
      purpose: ``"train"`` or ``"eval"`` (independent draws).

    Returns:
      ``[length]`` int32, strictly increasing.
    """
    if length > max_position:
        raise ValueError(
            f"randomized positions draw {length} distinct positions from [0, max_position="
            f"{max_position}); raise train.max_position to at least {length}"
        )
    index = index if isinstance(index, tuple) else (index,)
    rng = np.random.default_rng([seed, _PURPOSES[purpose], *index])
    return np.sort(rng.choice(max_position, size=length, replace=False)).astype(np.int32)


def batch_positions(
    seed: int,
    index: int | tuple[int, ...],
    rows: int,
    length: int,
    max_position: int,
    purpose: str = "train",
) -> np.ndarray:
    """:func:`random_positions` broadcast to ``rows`` (one draw shared by a batch), ``[rows, T]``
    int32, so that positions shard over devices like the tokens."""
    draw = random_positions(seed, index, length, max_position, purpose)
    return np.ascontiguousarray(np.broadcast_to(draw, (rows, length)))
