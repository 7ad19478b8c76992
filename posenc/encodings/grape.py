"""GRAPE, group representational position encoding (Zhang, Chen, Liu, Qin, Yuan, Xu, Yuan, Gu,
Yao 2026, "Group Representational Position Encoding", ICLR 2026; official code
github.com/model-architectures/GRAPE, ``model/llama-mha-grape-*.py``).

Positions act on queries and keys through a one-parameter group ``G(n) = exp(n omega L)``, so
``G(i)^T G(j) = G(j - i)`` and attention depends on ``j - i`` only. Three registered forms:

``grape`` — multiplicative GRAPE, GRAPE-M (Sec. 2-3, App. H, I). A rank-2 skew generator
``L(a, b) = a b^T - b a^T`` rotates the plane ``span{a, b}``; its exponential has the closed
(Rodrigues) form ``exp(t L) = I + sin(t s)/s L + (1 - cos(t s))/s^2 L^2``, ``s^2 = |a|^2 |b|^2 -
(a.b)^2``. The multi-subspace form (MS-GRAPE-M, Sec. 3.1) sums ``Dh/2`` such generators on
mutually orthogonal planes, which commute, so ``G(n) = prod_i exp(n theta_i L_i)``::

    q~_i = G(i) q_i,   k~_j = G(j) k_j,   q~_i . k~_j / sqrt(Dh) = q_i^T G(j - i) k_j / sqrt(Dh)

What posenc's transcription chooses:

- planes: ``basis="coordinate"`` (the official code's GRAPE-M-nonctx) takes the canonical
  coordinate pairs, ``(x_i, x_{i + Dh/2})`` in the ``"half"`` layout (the official code's) or
  ``(x_{2i}, x_{2i+1})`` in ``"interleaved"`` (the paper's ``U_i = [e_{2i-1} e_{2i}]``);
  ``basis="learned"`` takes the planes of a learned orthogonal basis ``E`` (the paper's
  "learned orthogonal basis ``B in SO(d)``", Algorithm 1: ``Q E``, rotate coordinate pairs,
  ``(.) E^T``). The paper leaves ``E``'s parametrisation open; posenc uses
  ``E = expm(S - S^T)`` with a learned ``S`` (zeros at init: the coordinate planes). Plane ``i``
  is ``a_i, b_i`` = the two columns of ``E`` that the layout pairs; they are orthonormal (the
  paper's gauge ``|a| = |b| = 1, a . b = 0``, scale absorbed in ``theta``), so ``s = 1`` and the
  Rodrigues form is exactly the 2 x 2 rotation by ``n theta_i`` in that plane;
- orientation: ``exp(t L(a, b))`` maps ``x_a a + x_b b`` to ``(x_a cos t + x_b sin t) a +
  (x_b cos t - x_a sin t) b`` (rotation by ``-t``); the paper writes the RoPE planes both as
  ``U_i J U_i^T`` (rotation by ``+t``) and as ``L(e_{2i-1}, e_{2i})`` (by ``-t``), and the
  official code rotates by ``-t``. posenc takes ``L_i = L(b_i, a_i) = U_i J U_i^T`` (``a_i``
  the first channel of the pair), so the coordinate planes with fixed frequencies are exactly
  posenc's RoPE (tested as an equality); the other orientation is RoPE at negated frequencies;
- frequencies: ``theta_i`` initialised to RoPE's ``base^(-2i/Dh)``, learned through
  ``log_freq = log(theta) * log_freq_scale`` (the official code's parametrisation and its
  ``grape_log_freq_scale = 16``, which divides the parameter's effective learning rate), shared
  by the heads (the official default) or one set per head; ``learn_frequencies=False`` keeps
  RoPE's fixed spectrum (no parameter);
- not transcribed: the contextual GRAPE-M (phases from the layer input, ``rotate`` does not see
  it) and the non-commuting mixtures (App. D; they lose the exact relative law).

``grape_a`` — additive GRAPE, GRAPE-A (Sec. 4.1-4.2): a unipotent lift ``[q; 1; 0]``,
``[k; 0; 1]`` and a rank-1 nilpotent generator turn the action into a logit bias linear in the
offset, with content-gated slopes (eq. 4.6, the official ``QueryKeyGatedAdditiveBias`` and its
query- and key-gated variants)::

    b_h(i, j) = (j - i) omega_h (softplus(v_h . q_i / sqrt(Dh)) + softplus(u_h . k_j / sqrt(Dh)))

with, as in the official code, ``omega_h = softplus(w_h) * m_h`` (``m_h`` ALiBi's slopes, ``w_h``
learned, initialised so ``softplus(w_h) = omega_init = 1``), ``u_h, v_h`` L2-normalised before
use and initialised ``N(0, 1/Dh)``, and the bias added after the ``1/sqrt(Dh)`` scaling (the
paper's eq. 4.6 writes it beside the unscaled ``q . k``, "up to the standard 1/sqrt(d)";
the code adds it to the scaled logits). ``gate="none"`` sets the gate sum to 1: ALiBi exactly
(Sec. 4.2; tested as an equality). Keys after the query (bidirectional) get ``-|j - i|``, as
posenc's ALiBi. The gates read ``q`` and ``k``, so this is a ``content_logits`` hook; it returns
``sqrt(Dh) * b`` so that attention's ``1/sqrt(Dh)`` leaves ``b`` on the scaled logits (exactly
when ``sqrt(Dh)`` is a power of two; an attention ``logit_scale`` option scales it with the
logits).

``grape_a_phase`` — the data-dependent additive form: phase-modulated additive GRAPE (Sec. 5,
"Relation to GRAPE-A") and FoX as GRAPE-A (App. C). Per-token non-negative increments
``omega_l = g(x_l)`` of the layer input and per-head rates ``theta_h`` give
``b_h(i, j) = -theta_h sum_{l=j+1..i} omega_l``, a ``log_decay`` hook (as the Forgetting
Transformer's). posenc takes ``g(x) = softplus(w . x + b)`` (one per head, or one per token
shared by the heads) and ``theta_h`` fixed at 1 or at ALiBi's slopes; with ``theta_h = 1`` and
``(w, b)`` negated this is FoX's ``log sigmoid`` gate exactly (tested as an equality). The paper
writes the phase as ``Phi_u = sum_{l<u} omega_l`` in Sec. 5 and the FoX sum over
``l = j+1 .. i`` in App. C; posenc uses the latter (the ``log_decay`` contract's). Causal only,
as FoX. Not transcribed: the path-integral GRAPE-AP, whose edge potentials read the query's
own projection at every key between ``j`` and ``i``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc.encodings.alibi import alibi_slopes
from posenc.encodings.base import Dims, Encoding, Params, check_choice, check_positive
from posenc.encodings.registry import register
from posenc.encodings.relative import pairwise_offsets
from posenc.encodings.rope import LAYOUTS, rope_frequencies

BASES = ("coordinate", "learned")
GATES = ("query_key", "query", "key", "none")
RATES = ("one", "alibi")


def _is_bool(value) -> bool:
    return isinstance(value, bool)


def softplus_inverse(y: float) -> float:
    """``x`` with ``softplus(x) = y`` (``y > 0``): ``log(expm1(y))``."""
    return math.log(math.expm1(y))


def rotate_planes(x: jax.Array, angles: jax.Array, layout: str) -> jax.Array:
    """Rotates pair ``i`` of the channels of ``x`` by ``angles[..., i]``, as RoPE does.

    Args:
      x: ``[B, T, H, Dh]``.
      angles: ``[B|1, T, H|1, Dh/2]`` float32.
      layout: ``"half"`` pairs ``(x_i, x_{i + Dh/2})``, ``"interleaved"`` ``(x_{2i}, x_{2i+1})``.

    Returns:
      ``[B, T, H, Dh]`` float32.
    """
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x = x.astype(jnp.float32)
    d = x.shape[-1]
    if layout == "interleaved":
        pairs = x.reshape(*x.shape[:-1], d // 2, 2)  # [B, T, H, Dh/2, 2]
        a, b = pairs[..., 0], pairs[..., 1]
        out = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)
        return out.reshape(x.shape)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


@register
@dataclasses.dataclass(frozen=True)
class Grape(Encoding):
    """Multiplicative GRAPE (GRAPE-M): ``Dh/2`` commuting rank-2 rotations per head.

    Attributes:
      base: the initial (or fixed) spectrum ``theta_i = base^(-2i/Dh)``, RoPE's.
      layout: which channels form the coordinate planes, ``"half"`` or ``"interleaved"``.
      basis: ``"coordinate"`` planes, or a ``"learned"`` orthogonal basis ``expm(S - S^T)``.
      learn_frequencies: learn ``theta`` (the official code) or keep RoPE's.
      share_across_heads: one spectrum for all heads (official default) or one per head.
      log_freq_scale: the stored parameter is ``log(theta) * log_freq_scale`` (official 16).
    """

    name = "grape"
    paper = "Zhang et al. 2026, Group Representational Position Encoding (GRAPE-M), ICLR 2026"
    relative = True  # G(i)^T G(j) = G(j - i)

    base: float = 10000.0
    layout: str = "half"
    basis: str = "coordinate"
    learn_frequencies: bool = True
    share_across_heads: bool = True
    log_freq_scale: float = 16.0

    def __post_init__(self):
        check_positive("encoding.base", self.base)
        check_choice("encoding.layout", self.layout, LAYOUTS)
        check_choice("encoding.basis", self.basis, BASES)
        for field in ("learn_frequencies", "share_across_heads"):
            if not _is_bool(getattr(self, field)):
                raise ValueError(
                    f"encoding.{field} must be True or False, got {getattr(self, field)!r}"
                )
        check_positive("encoding.log_freq_scale", self.log_freq_scale)

    def validate(self, dims: Dims) -> None:
        if dims.head_dim % 2:
            raise ValueError(
                f"GRAPE-M rotates planes of two channels and cannot take a head dimension of "
                f"{dims.head_dim} (odd); choose model.model_dim / model.num_heads even"
            )

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        shapes = {}
        if self.learn_frequencies:
            half = dims.head_dim // 2
            shapes["log_freq"] = (half,) if self.share_across_heads else (dims.num_heads, half)
        if self.basis == "learned":
            shapes["basis"] = (dims.head_dim, dims.head_dim)  # S; E = expm(S - S^T)
        return shapes

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        del rng  # RoPE's spectrum and the coordinate planes: nothing random
        shapes = self.param_shapes(dims)
        params = {}
        if "log_freq" in shapes:
            theta = rope_frequencies(dims.head_dim, base=self.base)  # [Dh/2]
            log_freq = jnp.log(theta) * self.log_freq_scale
            params["log_freq"] = jnp.broadcast_to(log_freq, shapes["log_freq"]).astype(jnp.float32)
        if "basis" in shapes:
            params["basis"] = jnp.zeros(shapes["basis"], jnp.float32)
        return params

    def frequencies(self, params: Params) -> jax.Array:
        """``theta``: ``[1, Dh/2]`` (shared) or ``[H, Dh/2]`` float32."""
        head_dim = self.bound_dims.head_dim
        if not self.learn_frequencies:
            return rope_frequencies(head_dim, base=self.base)[None]
        theta = jnp.exp(jnp.asarray(params["log_freq"], jnp.float32) / self.log_freq_scale)
        return jnp.atleast_2d(theta)

    def basis_matrix(self, params: Params) -> jax.Array | None:
        """The learned orthogonal basis ``E = expm(S - S^T)`` ``[Dh, Dh]``, or None."""
        if self.basis != "learned":
            return None
        s = jnp.asarray(params["basis"], jnp.float32)
        return jax.scipy.linalg.expm(s - s.T)

    def apply(self, params: Params, x: jax.Array, positions: jax.Array) -> jax.Array:
        """``G(n) x`` for ``x: [B, T, H, Dh]`` at positions ``[B|1, T]``; same dtype as ``x``."""
        theta = self.frequencies(params)  # [1 | H, Dh/2]
        angles = positions.astype(jnp.float32)[:, :, None, None] * theta  # [B|1, T, 1|H, Dh/2]
        basis = self.basis_matrix(params)
        hi = jax.lax.Precision.HIGHEST
        y = x.astype(jnp.float32)
        if basis is not None:  # coordinates in the learned basis: x E
            y = jnp.einsum("BTHD,DE->BTHE", y, basis, precision=hi)
        y = rotate_planes(y, angles, self.layout)
        if basis is not None:  # back: (.) E^T
            y = jnp.einsum("BTHE,DE->BTHD", y, basis, precision=hi)
        return y.astype(x.dtype)

    def rotate(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> ``G(i) q_i``, ``G(j) k_j``."""
        return self.apply(params, q, q_pos), self.apply(params, k, k_pos)


@register
@dataclasses.dataclass(frozen=True)
class GrapeA(Encoding):
    """Additive GRAPE (GRAPE-A): a linear penalty of the distance with content-gated slopes.

    Attributes:
      gate: ``"query_key"`` (GRAPE-A-QK), ``"query"`` (GRAPE-A-Q), ``"key"`` (GRAPE-A-K), or
        ``"none"`` (gate sum 1: ALiBi with learned per-head multipliers).
      omega_init: the initial ``softplus(w_h)`` multiplying ALiBi's slopes (official 1).
      gate_init_std: std of the normal initialiser of ``u``, ``v`` (None: ``1/sqrt(Dh)``).
      normalize_gates: L2-normalise ``u_h`` and ``v_h`` before use (official True).
    """

    name = "grape_a"
    paper = "Zhang et al. 2026, Group Representational Position Encoding (GRAPE-A), ICLR 2026"
    relative = True  # the distance and the content; never an absolute position

    gate: str = "query_key"
    omega_init: float = 1.0
    gate_init_std: float | None = None
    normalize_gates: bool = True

    def __post_init__(self):
        check_choice("encoding.gate", self.gate, GATES)
        check_positive("encoding.omega_init", self.omega_init)
        if self.gate_init_std is not None:
            check_positive("encoding.gate_init_std", self.gate_init_std)
        if not _is_bool(self.normalize_gates):
            raise ValueError(
                f"encoding.normalize_gates must be True or False, got {self.normalize_gates!r}"
            )

    def _gated(self) -> tuple[str, ...]:
        return {"query_key": ("v", "u"), "query": ("v",), "key": ("u",), "none": ()}[self.gate]

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        shapes = {"omega": (dims.num_heads,)}
        shapes.update((name, (dims.num_heads, dims.head_dim)) for name in self._gated())
        return shapes

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        shapes = self.param_shapes(dims)
        std = self.gate_init_std or 1.0 / math.sqrt(dims.head_dim)
        omega = softplus_inverse(self.omega_init)  # softplus(w) = omega_init
        params = {"omega": jnp.full(shapes["omega"], omega, jnp.float32)}
        for name, key in zip(self._gated(), jax.random.split(rng, 2), strict=False):
            params[name] = (std * jax.random.normal(key, shapes[name])).astype(jnp.float32)
        return params

    def _gate(self, params: Params, name: str, x: jax.Array) -> jax.Array:
        """``softplus(w_h . x / sqrt(Dh))``: ``x [B, N, H, Dh]`` -> ``[B, H, N]`` float32."""
        w = jnp.asarray(params[name], jnp.float32)  # [H, Dh]
        if self.normalize_gates:  # torch's F.normalize: w / max(|w|, eps)
            w = w / jnp.maximum(jnp.linalg.norm(w, axis=-1, keepdims=True), 1e-6)
        logits = jnp.einsum("BNHD,HD->BHN", x.astype(jnp.float32), w) / math.sqrt(x.shape[-1])
        return jax.nn.softplus(logits)

    def slopes(self, params: Params) -> jax.Array:
        """``omega_h = softplus(w_h) m_h``: ``[H]`` float32."""
        m = jnp.asarray(alibi_slopes(self.bound_dims.num_heads))
        return jax.nn.softplus(jnp.asarray(params["omega"], jnp.float32)) * m

    def penalty(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> jax.Array:
        """``b_h(i, j) = -|j - i| omega_h (gates)``: ``[B, H, T, S]`` float32 scaled-logit units."""
        distance = jnp.abs(pairwise_offsets(q_pos, k_pos)).astype(jnp.float32)[:, None]
        rate = self.slopes(params)[None, :, None, None]  # [1, H, 1, 1]
        if self.gate != "none":
            gates = 0.0
            if "v" in self._gated():
                gates = gates + self._gate(params, "v", q)[..., :, None]  # [B, H, T, 1]
            if "u" in self._gated():
                gates = gates + self._gate(params, "u", k)[..., None, :]  # [B, H, 1, S]
            rate = rate * gates
        bias = -distance * rate
        return jnp.broadcast_to(bias, (q.shape[0], *bias.shape[1:3], k.shape[1]))

    def content_logits(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> jax.Array:
        """``sqrt(Dh) b_h(i, j)`` (unscaled units: attention divides by ``sqrt(Dh)``):
        ``q [B, T, H, Dh]``, ``k [B, S, H, Dh]`` -> ``[B, H, T, S]`` float32."""
        return self.penalty(params, q, k, q_pos, k_pos) * math.sqrt(q.shape[-1])


@register
@dataclasses.dataclass(frozen=True)
class GrapeAPhase(Encoding):
    """Phase-modulated additive GRAPE: ``-theta_h sum_{l=j+1..i} softplus(w . x_l + b)``.

    Attributes:
      per_head: one increment per token and head (FoX's gates) or one per token for all heads.
      rates: ``theta_h``: ``"one"`` (FoX) or ALiBi's slopes ``"alibi"``.
      init_std: std of the normal initialiser of ``w`` (FoX's 0.02).
      bias_init: initial ``b`` (0: increments ``log 2`` at first, FoX's ``f = 1/2``).
    """

    name = "grape_a_phase"
    paper = (
        "Zhang et al. 2026, Group Representational Position Encoding (phase-modulated GRAPE-A), "
        "ICLR 2026"
    )
    relative = True  # the decay depends on the content between j and i, never on positions
    causal_only = True  # no phase is defined for keys after the query

    per_head: bool = True
    rates: str = "one"
    init_std: float = 0.02
    bias_init: float = 0.0

    def __post_init__(self):
        if not _is_bool(self.per_head):
            raise ValueError(f"encoding.per_head must be True or False, got {self.per_head!r}")
        check_choice("encoding.rates", self.rates, RATES)
        check_positive("encoding.init_std", self.init_std, allow_zero=True)
        if not isinstance(self.bias_init, int | float) or _is_bool(self.bias_init):
            raise ValueError(f"encoding.bias_init must be a number, got {self.bias_init!r}")

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        out = dims.num_heads if self.per_head else 1
        return {"w": (dims.model_dim, out), "b": (out,)}

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"w": ("embed", "heads"), "b": ("heads",)} if self.per_head else {}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        shapes = self.param_shapes(dims)
        w = self.init_std * jax.random.normal(rng, shapes["w"])
        return {"w": w.astype(jnp.float32), "b": jnp.full(shapes["b"], self.bias_init, jnp.float32)}

    def theta(self) -> jax.Array:
        h = self.bound_dims.num_heads
        if self.rates == "alibi":
            return jnp.asarray(alibi_slopes(h))
        return jnp.asarray(np.ones(h, np.float32))

    def log_decay(self, params: Params, inputs: jax.Array) -> jax.Array:
        """``-theta_h omega_l``: ``inputs [B, S, D]`` -> ``[B, S, H]`` float32."""
        x = inputs.astype(jnp.float32)
        omega = jax.nn.softplus(jnp.einsum("BSD,DH->BSH", x, params["w"]) + params["b"])
        return -(self.theta() * omega)  # [B, S, 1 | H] * [H]
