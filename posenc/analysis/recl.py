"""Relative effective context length (RECL; Dai et al. 2019, *Transformer-XL: Attentive Language
Models Beyond a Fixed-Length Context*, Appendix C).

RECL is defined over a *group* of models scored on the same target tokens. With ``l_i(c, t)`` the
loss of model ``i`` on target ``t`` given ``c`` tokens of context and ``b(c, t) = min_i l_i(c, t)``
the group's best loss there, the relative loss of model ``i`` when its context grows from ``c``
to ``c'`` is::

    f_i(c, c') = mean over t in T_r(c) of min(b(c, t), l_i(c', t))

where ``T_r(c)`` holds the top ``r`` share of the targets by loss, the hardest ones. (Our reading:
hardest under the group's best loss at the shorter context ``b(c, .)``, so that every model of the
group is measured on the same tokens; ``ceil(r N)`` of the ``N`` targets, ties broken by index.)
Only improvements over the group's best short-context loss count. The relative gain of
extending the context from ``c`` to ``c + Delta`` is::

    g_i(c) = (exp f_i(c, c) - exp f_i(c, c + Delta)) / exp f_i(c, c)

(``f_i(c, c)`` is the mean of ``b(c, .)`` over ``T_r(c)``, the same for every model). Starting from
the shortest context evaluated, ``c`` steps by ``Delta`` while the gain is at least the
threshold (0.01 in the paper); RECL is the largest ``c`` so reached.

:func:`context_losses` provides ``l_i(c, t)``: each target is scored with exactly ``c`` tokens
of context, by one window of ``c`` tokens for a model without memory, or, for a model with
Transformer-XL memory, by reading those ``c`` tokens as consecutive segments of the training
length with the memory carried (long enough to hold all of them), as it was trained to read.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.models import memory as memory_lib
from posenc.models.lm import Transformer
from posenc.models.losses import token_loss

THRESHOLD = 0.01  # the paper's gain threshold


def _check(losses: Mapping[str, np.ndarray], r: float, delta: int) -> tuple[int, int]:
    if not losses:
        raise ValueError("RECL needs a group of at least one model's losses")
    shapes = {np.shape(v) for v in losses.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"every model's losses must be one [K, N] array, got shapes {shapes}")
    if not 0 < r <= 1:
        raise ValueError(f"RECL's r (the share of hardest targets) must be in (0, 1], got {r!r}")
    if not isinstance(delta, int) or delta < 1:
        raise ValueError(f"RECL's delta (the context step) must be a positive integer, got {delta}")
    return next(iter(shapes))


def relative_gains(losses: Mapping[str, np.ndarray], r: float) -> dict[str, np.ndarray]:
    """``g_i`` of every step: ``{model: float64 [K - 1]}``, entry ``k`` the gain of extending the
    context from ``contexts[k]`` to ``contexts[k + 1]``.

    Args:
      losses: ``{model: [K, N]}``, row ``k`` the losses of the same ``N`` targets with the
        ``k``-th context length (increasing).
      r: the share of hardest targets, in ``(0, 1]``.
    """
    k_count, n = _check(losses, r, 1)
    group = {name: np.asarray(v, np.float64) for name, v in losses.items()}
    best = np.min(np.stack(list(group.values())), axis=0)  # b(c, t): [K, N]
    hardest = max(1, math.ceil(r * n))
    gains = {name: np.zeros(k_count - 1) for name in group}
    for k in range(k_count - 1):
        chosen = np.argsort(-best[k], kind="stable")[:hardest]  # T_r(c): [ceil(r N)]
        base = math.exp(best[k, chosen].mean())  # exp f_i(c, c)
        for name, l in group.items():
            extended = math.exp(np.minimum(best[k, chosen], l[k + 1, chosen]).mean())
            gains[name][k] = (base - extended) / base
    return gains


def recl(
    losses: Mapping[str, np.ndarray],
    *,
    start: int,
    delta: int,
    r: float,
    threshold: float = THRESHOLD,
) -> dict[str, int]:
    """The relative effective context length of every model in a group.

    Args:
      losses: ``{model: [K, N]}`` per-target losses at contexts ``start + k * delta``,
        ``k = 0 .. K - 1`` (the same targets for every model and context).
      start: the shortest context evaluated.
      delta: the step ``Delta`` between contexts.
      r: the share of hardest targets, in ``(0, 1]`` (the paper: 0.1, 0.5, 1.0).
      threshold: the least relative gain that counts (the paper: 0.01).

    Returns:
      ``{model: RECL}`` in tokens, between ``start`` and ``start + (K - 1) * delta``.
    """
    _check(losses, r, delta)
    out = {}
    for name, gain in relative_gains(losses, r).items():
        steps = 0
        while steps < len(gain) and gain[steps] >= threshold:
            steps += 1
        out[name] = start + steps * delta
    return out


def context_losses(
    model: Transformer,
    stream: np.ndarray,
    targets: Sequence[int],
    contexts: Sequence[int],
    *,
    segment_len: int | None = None,
    max_context: int | None = None,
    batch_tokens: int = 32_768,
) -> np.ndarray:
    """``l(c, t)``: the loss of the token at ``stream[t]`` given exactly the ``c`` tokens
    ``stream[t - c : t]`` before it, for each context ``c`` and target ``t``.

    Args:
      model: the model.
      stream: the token stream ``[N]``.
      targets: stream indices of the scored tokens, each ``>= max(contexts)``.
      contexts: context lengths ``c``.
      segment_len: None: one window of ``c`` tokens per target. Otherwise (a model with memory)
        the ``c`` tokens are read as consecutive segments of this length (the first one shorter
        when ``segment_len`` does not divide ``c``), each with the memory of all the tokens
        before it in the context.
      max_context: a model with a fixed context (the paper's vanilla Transformer reads its
        training length and no more): contexts beyond it are scored with ``max_context``
        tokens. None: every context as asked.
      batch_tokens: input tokens per batch (targets per batch: ``batch_tokens // c``).

    Returns:
      float64 ``[len(contexts), len(targets)]`` losses in nats.
    """
    targets = np.asarray(targets, np.int64)
    if targets.min() < max(contexts) or targets.max() >= len(stream):
        raise ValueError(
            f"targets must be stream indices in [{max(contexts)}, {len(stream)}) so that every one "
            "has the longest context before it"
        )
    graphdef, state = nnx.split(model)
    out = np.zeros((len(contexts), len(targets)), np.float64)
    for i, c in enumerate(contexts):
        c = c if max_context is None else min(c, max_context)
        rows = max(1, batch_tokens // c)
        for first in range(0, len(targets), rows):
            chunk = targets[first : first + rows]
            pad = rows - len(chunk)  # fixed shapes: one compilation per context
            index = np.concatenate([chunk, np.full(pad, chunk[-1])])
            windows = np.asarray(stream[index[:, None] + np.arange(-c, 1)], np.int32)  # [b, c+1]
            losses = _last_losses(graphdef, state, jnp.asarray(windows), segment_len, max(contexts))
            out[i, first : first + len(chunk)] = np.asarray(losses, np.float64)[: len(chunk)]
    return out


def _last_losses(
    graphdef, state, windows: jax.Array, segment_len: int | None, mem_len: int
) -> jax.Array:
    """The loss of each row's last token given the rest: ``[b, c + 1]`` -> ``[b]``; with
    ``segment_len``, read in segments with a memory of up to ``mem_len >= c`` tokens (one
    value for every context, so that contexts share compilations)."""
    inputs, target = windows[:, :-1], windows[:, -1]
    c = inputs.shape[1]
    if segment_len is None:
        logits = _forward(graphdef, state, inputs)
        return token_loss(logits[:, -1:], target[:, None])[:, 0]
    first = c - (math.ceil(c / segment_len) - 1) * segment_len
    memory = memory_lib.empty_memory(nnx.merge(graphdef, state), inputs.shape[0])
    start = 0
    for end in range(first, c + 1, segment_len):
        logits, memory = _forward_memory(graphdef, state, inputs[:, start:end], memory, mem_len)
        start = end
    return token_loss(logits[:, -1:], target[:, None])[:, 0]


@jax.jit
def _forward(graphdef, state, inputs):
    """The logits of each row's last position only ``[b, 1, V]`` (the others are not read)."""
    model = nnx.merge(graphdef, state)
    return model.head(model.hidden_states(inputs)[:, -1:])


@functools.partial(jax.jit, static_argnums=(4,))
def _forward_memory(graphdef, state, inputs, memory, mem_len):
    """The last position's logits ``[b, 1, V]`` and the new memory."""
    model = nnx.merge(graphdef, state)
    hidden, memory = memory_lib.hidden_states(model, inputs, memory, mem_len=mem_len)
    return model.head(hidden[:, -1:]), memory
