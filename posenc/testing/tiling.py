"""Checks of the declarations that let the ``blocked`` path do less work per tile
(:mod:`posenc.attention.blocked`): ``bias_by_distance``, ``reach`` and ``carry_limit``.

Attention trusts them without looking: a bias declared a function of the distance is read from
a per-distance table; hooks declared alike past a reach, and contextual terms past the carry
limit, are taken from a probe key. So each check calls the hooks directly (at non-contiguous
positions with distances of both signs, or at carries past the limit) and compares every pair
with what the declaration promises; ``paths_agree`` then compares the tiled path that relies on
them with the reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc.attention.terms import NEG
from posenc.encodings.base import Encoding
from posenc.testing._harness import (
    NotApplicable,
    Settings,
    contextual_inputs,
    fail,
    jit,
    label,
    max_error,
    resolve,
)


def without_distance_bias(enc: Encoding, settings: Settings) -> str | None:
    """Why ``bias_by_distance`` does not apply to ``enc`` (None: it does)."""
    if not enc.bias_by_distance:
        return "does not declare bias_by_distance"
    return None


def without_reach(enc: Encoding, settings: Settings) -> str | None:
    """Why ``reach`` does not apply to ``enc`` (None: it does)."""
    if enc.reach is None:
        return "declares no reach"
    return None


def without_carry_limit(enc: Encoding, settings: Settings) -> str | None:
    """Why ``carry_limit`` does not apply to ``enc`` (None: it does)."""
    if enc.carry_limit is None:
        return "declares no carry_limit"
    return None


def _setup(enc: Encoding, settings: Settings):
    dims = settings.dims
    bound = enc.bind(dims)
    return bound, bound.init(jax.random.key(settings.seed), dims)


def _sorted_rows(rng, rows: int, size: int, low: int, high: int) -> np.ndarray:
    """``[rows, size]`` int32: each row a sorted random subset of ``[low, high)``."""
    return np.stack(
        [np.sort(rng.choice(np.arange(low, high), size, replace=False)) for _ in range(rows)]
    ).astype(np.int32)


def check_bias_by_distance(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """``bias_by_distance`` holds: ``bias`` of every pair equals ``bias`` of one query against
    a key at the same distance ``k_pos - q_pos``.

    Queries and keys are independent sorted random subsets of ``[0, max_position)`` per row (so
    distances of both signs, gaps, nothing contiguous); the per-distance values come from one
    call with one query at ``max_position`` against keys at ``max_position + distance``.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    reason = without_distance_bias(enc, settings)
    if reason:
        raise NotApplicable(f"bias_by_distance does not apply to {label(enc)}: {reason}")
    if "bias" not in enc.hooks:
        raise fail(enc, "bias_by_distance", "declares bias_by_distance without a bias hook")
    bound, params = _setup(enc, settings)
    rng = np.random.default_rng(settings.seed + 5)
    b, t, s = len(settings.offsets), settings.length, settings.length + settings.extra_keys
    q_pos = _sorted_rows(rng, b, t, 0, settings.max_position)
    k_pos = _sorted_rows(rng, b, s, 0, settings.max_position)
    bias = jit(bound.bias)  # compiled: op by op, each shape's dispatch costs more
    per_pair = np.asarray(bias(params, jnp.asarray(q_pos), jnp.asarray(k_pos)))
    distance = k_pos[:, None, :] - q_pos[:, :, None]  # [B, T, S]
    base = settings.max_position
    query = np.full((b, 1), base, np.int32)
    keys = (base + distance).reshape(b, t * s)
    per_distance = np.asarray(bias(params, jnp.asarray(query), jnp.asarray(keys)))
    h = per_pair.shape[1]
    per_distance = per_distance.reshape(b, h, t, s)
    per_pair = np.broadcast_to(per_pair, per_distance.shape)
    tol = settings.tolerance
    if not np.allclose(per_pair, per_distance, rtol=tol, atol=tol):
        raise fail(
            enc,
            "bias_by_distance",
            "declares bias_by_distance, but bias at random positions differs from bias of one "
            f"query at {base} against keys at the same distances "
            f"({max_error(per_pair, per_distance)}): it reads more than k_pos - q_pos",
        )


def check_reach(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """``reach`` holds: past it, every key before a query (and, unless the encoder is causal
    only, every key after it) gets the same ``bias`` and ``content_logits`` whatever its
    position and content, and ``value_term`` gives its probability the same vector.

    Each row's queries are a sorted random subset of ``[r, r + max_position)``; its keys lie
    more than the reach before the first query or after the last, at random distances, with
    random content. Every pair is compared with the hooks on the probe key the ``blocked`` path
    uses (first query's position ``- reach - 1``, or last ``+ reach + 1``, content zero).
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    reason = without_reach(enc, settings)
    if reason:
        raise NotApplicable(f"reach does not apply to {label(enc)}: {reason}")
    reach = enc.reach
    if not isinstance(reach, int) or isinstance(reach, bool) or reach < 0:
        raise fail(enc, "reach", f"reach must be None or an integer >= 0, got {reach!r}")
    bound, params = _setup(enc, settings)
    dims = settings.dims
    rng = np.random.default_rng(settings.seed + 6)
    b, t, n = len(settings.offsets), settings.length, settings.extra_keys + 2
    start = reach + 2 * settings.max_position
    q_pos = _sorted_rows(rng, b, t, start, start + settings.max_position)
    first, last = q_pos[:, :1], q_pos[:, -1:]
    sides = [("before", first - reach - 1, -1)]
    try:
        enc.check_causal(False)
        bidirectional = not enc.causal_only
    except ValueError:
        bidirectional = False
    if bidirectional:
        sides.append(("after", last + reach + 1, 1))
    q = jnp.asarray(rng.standard_normal((b, t, dims.num_heads, dims.head_dim)), jnp.float32)
    qp = jnp.asarray(q_pos)
    # Compiled: op by op, each shape's dispatch costs more than compiling the hook.
    hooks = {name: jit(getattr(bound, name)) for name in bound.hooks}
    for side, probe_pos, sign in sides:
        # Keys past the reach on this side, up to max_position further, in random order.
        far = probe_pos + sign * rng.integers(0, settings.max_position, (b, n))
        k = jnp.asarray(rng.standard_normal((b, n, dims.num_heads, dims.head_dim)), jnp.float32)
        zero = jnp.zeros((b, 1, dims.num_heads, dims.head_dim), jnp.float32)
        kp, probe = jnp.asarray(far.astype(np.int32)), jnp.asarray(probe_pos.astype(np.int32))
        where = f"keys more than reach={reach} {side} the queries"
        if "bias" in enc.hooks:
            _same(
                enc,
                "bias",
                where,
                hooks["bias"](params, qp, kp),
                hooks["bias"](params, qp, probe),
                settings,
            )
        if "content_logits" in enc.hooks:
            got = hooks["content_logits"](params, q, k, qp, kp)
            _same(
                enc,
                "content_logits",
                where,
                got,
                hooks["content_logits"](params, q, zero, qp, probe),
                settings,
            )
        if "value_term" in enc.hooks:
            probs = jnp.asarray(rng.random((b, dims.num_heads, t, n)), jnp.float32)
            got = hooks["value_term"](params, probs, qp, kp)  # [B, T, H, Dh]
            unit = hooks["value_term"](params, jnp.ones((b, dims.num_heads, t, 1)), qp, probe)
            expected = probs.sum(-1).transpose(0, 2, 1)[..., None] * unit
            _same(enc, "value_term", where, got, expected, settings)


def _same(enc, hook, where, got, expected, settings) -> None:
    """``got`` (every far key) equals ``expected`` (the probe, broadcast over the keys)."""
    got = np.asarray(got, np.float64)
    expected = np.broadcast_to(np.asarray(expected, np.float64), got.shape)
    tol = settings.tolerance
    if not np.allclose(got, expected, rtol=tol, atol=tol):
        raise fail(
            enc,
            "reach",
            f"{hook} differs between {where} and the probe key just past the reach "
            f"({max_error(got, expected)}): those keys are not all alike",
        )


def check_carry_limit(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """``carry_limit`` holds: with every carry at or past it, ``contextual_logits`` gives every
    visible key the terms of the probe key the ``blocked`` path uses (content zero, a masked
    logit), whatever the keys' logits and content, and returns carries still at or past it.

    Random queries, keys and causally masked logits (``T`` queries, the last of ``S`` keys), with
    carries drawn from ``[limit, limit + 4)``.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    reason = without_carry_limit(enc, settings)
    if reason:
        raise NotApplicable(f"carry_limit does not apply to {label(enc)}: {reason}")
    if "contextual_logits" not in enc.hooks:
        raise fail(enc, "carry_limit", "declares carry_limit without a contextual_logits hook")
    limit = float(enc.carry_limit)
    bound, params = _setup(enc, settings)
    dims = settings.dims
    rng = np.random.default_rng(settings.seed + 7)
    b, h, t = len(settings.offsets), dims.num_heads, settings.length
    q, k, visible, logits = contextual_inputs(settings, rng, scale=3.0)
    carry = jnp.asarray(limit + 4 * rng.random((b, h, t)), jnp.float32)
    hook = jit(bound.contextual_logits)
    terms, after = hook(params, q, k, logits, carry)
    zero = jnp.zeros((b, 1, h, dims.head_dim), jnp.float32)
    probe, _ = hook(params, q, zero, jnp.full((b, h, t, 1), NEG, jnp.float32), carry)
    got = np.where(visible, np.asarray(terms, np.float64), 0.0)
    expected = np.where(visible, np.broadcast_to(np.asarray(probe, np.float64), got.shape), 0.0)
    tol = settings.tolerance
    if not np.allclose(got, expected, rtol=tol, atol=tol):
        raise fail(
            enc,
            "carry_limit",
            f"with every carry at or past carry_limit={limit:g}, contextual_logits differ "
            f"between the keys and the probe key ({max_error(got, expected)}): they still read "
            "the tile",
        )
    if not np.all(np.asarray(after) >= limit - tol):
        raise fail(
            enc,
            "carry_limit",
            f"a carry at or past carry_limit={limit:g} came back below it "
            f"(min {float(np.min(np.asarray(after))):g}): earlier tiles would be taken as "
            "saturated",
        )
