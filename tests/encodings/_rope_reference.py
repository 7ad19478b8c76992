"""Float64 numpy transcriptions of RoPE's scaling modes and of xPos, written from the papers'
formulas (not from posenc's code), and a naive attention to compare the attention paths with.

Sources:
- RoPE: Su et al. 2021, RoFormer, Sec. 3.4: pair i turns by m * theta_i, theta_i = b^(-2i/d).
- linear: Chen et al. 2023 (position interpolation), Eq. 2: f'(x, m) = f(x, m L / L') = f(x, m / s).
- ntk: bloc97 2023; Peng et al. 2023 (YaRN) Sec. 3.1: b' = b s^(|D| / (|D| - 2)).
- dynamic: YaRN Sec. 3.3 / Hugging Face "dynamic": at length l > L the NTK base with
  alpha = s l / L - (s - 1); nothing changes for l <= L.
- yarn: YaRN Sec. 3.2 (r(d) = L / lambda_d, lambda_d = 2 pi / theta_d; alpha = 1, beta = 32) as
  the authors' code places the ramp (between the pair indices where r = beta and r = alpha), and
  Sec. 3.4, Eq. 22: sqrt(1/t) = 0.1 ln(s) + 1 on queries and keys.
- xPos: Sun et al. 2022, Sec. 3.3: query n times zeta^(n / B), key m times zeta^(-m / B),
  zeta_i = (2i/d + gamma) / (1 + gamma).
"""

from __future__ import annotations

import math

import numpy as np


def thetas(d: int, base: float) -> np.ndarray:
    """RoFormer: theta_i = base^(-2i/d), i = 0 .. d/2 - 1."""
    return np.array([base ** (-2.0 * i / d) for i in range(d // 2)])


def yarn_gamma(d: int, base: float, L: int, beta_fast: float = 32, beta_slow: float = 1):
    """YaRN's extrapolation weight per pair (1: keep theta_i, 0: theta_i / s).

    Pair i turns r_i = L / lambda_i = L theta_i / (2 pi) times over the training window. Solving
    r_i = beta for i: base^(2i/d) = L / (2 pi beta), i = (d/2) log_base(L / (2 pi beta)). The ramp
    runs over whole pairs from floor(i(beta_fast)) to ceil(i(beta_slow)) (at least 0, at most
    d - 1, as the authors' code clamps).
    """
    at = lambda beta: (d / 2) * math.log(L / (2 * math.pi * beta), base)  # noqa: E731
    lo, hi = max(math.floor(at(beta_fast)), 0), min(math.ceil(at(beta_slow)), d - 1)
    hi = hi + 0.001 if hi == lo else hi
    gamma = []
    for i in range(d // 2):
        weight_of_interpolation = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        gamma.append(1.0 - weight_of_interpolation)
    return np.array(gamma)


def scaled_thetas(d, base, scaling=None, s=1.0, L=None, length=None, beta_fast=32, beta_slow=1):
    """The frequencies each mode uses, float64 ``[d/2]`` (``length``: the dynamic window)."""
    if scaling in (None, "linear"):
        # linear divides the positions by s; callers divide the positions, not theta.
        return thetas(d, base)
    if scaling == "ntk":
        return thetas(d, base * s ** (d / (d - 2)))
    if scaling == "dynamic":
        if length <= L:
            return thetas(d, base)
        return thetas(d, base * (s * length / L - (s - 1)) ** (d / (d - 2)))
    if scaling == "yarn":
        gamma = yarn_gamma(d, base, L, beta_fast, beta_slow)
        th = thetas(d, base)
        return gamma * th + (1 - gamma) * th / s
    raise ValueError(scaling)


def yarn_sqrt_inv_t(s: float) -> float:
    """YaRN Eq. 22: sqrt(1/t) = 0.1 ln(s) + 1."""
    return 0.1 * math.log(s) + 1.0


def pair_channels(i: int, d: int, layout: str) -> tuple[int, int]:
    return (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + d // 2)


def rotate(x, positions, theta_rows, layout="half", d=None, magnitude=None, scale=1.0):
    """Rotates pair i of the first d channels of x by positions * theta_i (the 2x2 rotation of
    RoFormer Eq. 13-14), multiplies it by magnitude[b, t, i] and the whole head by ``scale``.

    x: [B, T, H, Dh]; positions: [B, T] (floats allowed); theta_rows: [B, d/2] or [d/2];
    magnitude: [B, T, d/2] or None.
    """
    x = np.asarray(x, np.float64)
    b, t, _, dh = x.shape
    d = dh if d is None else d
    theta_rows = np.broadcast_to(np.asarray(theta_rows, np.float64), (b, d // 2))
    positions = np.broadcast_to(np.asarray(positions, np.float64), (b, t))
    out = x.copy()
    for bb in range(b):
        for i in range(d // 2):
            angle = positions[bb] * theta_rows[bb, i]  # [T]
            c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]  # [T, 1] (over heads)
            m = 1.0 if magnitude is None else np.asarray(magnitude)[bb, :, i][:, None]
            a_idx, b_idx = pair_channels(i, d, layout)
            xa, xb = x[bb, :, :, a_idx], x[bb, :, :, b_idx]
            out[bb, :, :, a_idx] = m * (c * xa - s * xb)
            out[bb, :, :, b_idx] = m * (s * xa + c * xb)
    return out * scale


# float32's unit roundoff, and bfloat16's (8 significant bits).
F32_EPS, BF16_EPS = 2.0**-24, 2.0**-8


def float32_bound(x, positions, theta_rows, layout="half", d=None, scale=1.0, ulps=8.0):
    """An analytic bound on ``|float32 rotation - rotate(...)|`` per channel, ``[B, T, H, Dh]``.

    Pair ``i`` at position ``m`` turns by ``a = m theta_i``. In float32, theta_i (a power, and a
    scaling mode's few more operations), the product ``m theta_i`` and the argument reduction
    of ``sin`` and ``cos`` each cost a few roundings relative to ``a``, the 2x2 product and the
    ``scale`` a few relative to the output: together at most ``ulps * eps * (1 + |a|)`` times the
    pair's norm ``|(x_a, x_b)| * scale`` (``ulps = 8`` leaves about three times what XLA's CPU
    float32 loses). Channels past ``d`` are not rotated: bound 0, they must be exact.
    """
    x = np.asarray(x, np.float64)
    b, t, _, dh = x.shape
    d = dh if d is None else d
    theta_rows = np.broadcast_to(np.asarray(theta_rows, np.float64), (b, d // 2))
    positions = np.broadcast_to(np.asarray(positions, np.float64), (b, t))
    bound = np.zeros_like(x)
    for i in range(d // 2):
        angle = np.abs(positions * theta_rows[:, i : i + 1])[..., None]  # [B, T, 1]
        a_idx, b_idx = pair_channels(i, d, layout)
        norm = np.hypot(x[..., a_idx], x[..., b_idx]) * scale  # [B, T, H]
        bound[..., a_idx] = bound[..., b_idx] = ulps * F32_EPS * (1.0 + angle) * norm
    return bound


def assert_within(got, want, bound, what: str = "") -> None:
    """Every entry of ``got`` within ``bound`` of ``want`` (entries with bound 0: exactly)."""
    err = np.abs(np.asarray(got, np.float64) - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (
        f"{what}: |error| {err[worst]:.3g} > bound {bound[worst]:.3g} at {tuple(map(int, worst))}"
    )


def xpos_zeta(d: int, gamma: float = 0.4) -> np.ndarray:
    """Sun et al. 2022: zeta_i = (2i/d + gamma) / (1 + gamma)."""
    return np.array([(2.0 * i / d + gamma) / (1.0 + gamma) for i in range(d // 2)])


def xpos_magnitude(positions, d, scale_base=512.0, gamma=0.4, keys=False):
    """[B, T, d/2]: zeta_i^(n / B) for queries, zeta_i^(-m / B) for keys (absolute positions)."""
    positions = np.asarray(positions, np.float64)[..., None]
    sign = -1.0 if keys else 1.0
    return xpos_zeta(d, gamma)[None, None, :] ** (sign * positions / scale_base)


def attention(q, k, v, causal=True):
    """softmax(q.k / sqrt(Dh)) v in float64, causal aligned so the last query sees every key."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    t, s = q.shape[1], k.shape[1]
    if causal:
        visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        logits = np.where(visible, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


# -- the attention paths against the naive attention -------------------------------------------

# Attention shape of the path checks: 2 rows at different offsets, 2 heads of 16 channels.
HEADS, HEAD_DIM, OFFSETS = 2, 16, (0, 7)
IMPLEMENTATIONS = ("einsum", "blocked", "xla", "auto")


def expected_attention(name, hparams, q, k, v, q_pos, k_pos):
    """The float64 attention output of encoder ``name`` ("rope" or "xpos") with ``hparams``,
    from the formulas above: per-row frequencies of the scaling mode (dynamic: at the row's key
    span), PI's positions / s, YaRN's temperature, xPos's zeta^(+-p / B) from absolute positions.
    """
    d = q.shape[-1]
    mode, s = hparams.get("scaling"), hparams.get("factor", 1.0)
    base, layout = hparams.get("base", 10000.0), hparams.get("layout", "half")
    L = hparams.get("original_max_len")
    rows = [scaled_thetas(d, base, mode, s, L, length=int(kp.max() - kp.min() + 1)) for kp in k_pos]
    stretch = s if mode == "linear" else 1.0
    temperature = yarn_sqrt_inv_t(s) if mode == "yarn" else 1.0
    q_mag = k_mag = None
    if name == "xpos":
        scale_base, gamma = hparams.get("scale_base", 512.0), hparams.get("gamma", 0.4)
        q_mag = xpos_magnitude(q_pos, d, scale_base, gamma)
        k_mag = xpos_magnitude(k_pos, d, scale_base, gamma, keys=True)
    qr = rotate(q, q_pos / stretch, rows, layout, magnitude=q_mag, scale=temperature)
    kr = rotate(k, k_pos / stretch, rows, layout, magnitude=k_mag, scale=temperature)
    return attention(qr, kr, v)


def inputs(num_keys: int, num_queries: int, seed: int = 0):
    """Random float32 q [B, T, H, Dh], k and v [B, S, H, Dh]; row b's keys at offsets[b] + j,
    the queries the last T of them."""
    rng = np.random.default_rng(seed)
    b = len(OFFSETS)
    q = rng.standard_normal((b, num_queries, HEADS, HEAD_DIM)).astype(np.float32)
    k, v = (rng.standard_normal((b, num_keys, HEADS, HEAD_DIM)).astype(np.float32) for _ in "kv")
    k_pos = np.asarray(OFFSETS)[:, None] + np.arange(num_keys)[None, :]
    return q, k, v, k_pos[:, num_keys - num_queries :], k_pos


def path_outputs(name, hparams, q, k, v, q_pos, k_pos, block_size):
    """``{implementation: float32 output}`` of :func:`posenc.attention.core.attend` on every
    path."""
    import jax

    from posenc import encodings
    from posenc.attention import core as attention
    from posenc.encodings import Dims

    enc = encodings.get(name, **hparams).bind(Dims(HEADS, HEAD_DIM, HEADS * HEAD_DIM))
    out = {}
    for impl in IMPLEMENTATIONS:
        run = jax.jit(
            lambda q, k, v, qp, kp, impl=impl: attention.attend(
                q,
                k,
                v,
                encoding=enc,
                params={},
                q_pos=qp,
                k_pos=kp,
                implementation=impl,
                block_size=block_size,
            )
        )
        out[impl] = np.asarray(run(q, k, v, q_pos, k_pos), np.float64)
    return out
