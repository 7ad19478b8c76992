"""Polar coordinate position embeddings, PoPE (Gopalakrishnan, Csordás, Schmidhuber, Mozer 2025,
"Decoupling the "What" and "Where" With Polar Coordinate Positional Embeddings").

Each of the ``Dh`` channels of a query or key becomes a complex number whose magnitude comes from
the content alone and whose phase from the position alone, ``theta_c = base^(-c/Dh)`` for
``c = 0 .. Dh-1`` (``Dh`` frequencies, not RoPE's ``Dh/2`` pairs)::

    q~_tc = softplus(q_tc) exp(i t theta_c)
    k~_sc = softplus(k_sc) exp(i (s theta_c + delta_hc))
    a_ts  = Re[q~_t^H k~_s] / sqrt(Dh)
          = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_hc) / sqrt(Dh)

with a learned phase bias ``delta`` per head and frequency, clamped to ``[-2 pi, 0]``. As in
x-transformers' ``PolarEmbedding``/``apply_polar_pos_emb`` and lucidrains' PoPE-pytorch, the
complex product is computed as a real one by writing each channel as its (cos, sin) pair, so the
queries and keys ``rotate`` returns are ``2 * Dh`` wide (``[mu cos | mu sin]``, concatenated, not
interleaved: the dot product is the same), while the softmax scale stays ``1/sqrt(Dh)`` of the
projected width and the values keep ``Dh`` (:mod:`posenc.encodings.base`, "Widths"). Angles are
computed in float32 from the integer positions; the logits depend on positions only through
``s - t`` (``relative = True``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_choice, check_positive
from posenc.encodings.registry import register

BIAS_INITS = ("zeros", "uniform")


def _polar(x: jax.Array, angles: jax.Array) -> jax.Array:
    """``[.., Dh]`` content and ``[.., Dh]`` phases -> ``[.., 2 Dh]`` (``mu cos | mu sin``)."""
    magnitude = jax.nn.softplus(x.astype(jnp.float32))
    out = jnp.concatenate([magnitude * jnp.cos(angles), magnitude * jnp.sin(angles)], axis=-1)
    return out.astype(x.dtype)


@register
@dataclasses.dataclass(frozen=True)
class PoPE(Encoding):
    """Magnitudes from ``softplus`` of the content, phases from the position, per layer.

    Attributes:
      base: ``theta_c = base^(-c/Dh)``, ``c = 0 .. Dh-1`` (10000 in the paper).
      phase_bias: learn the per-head, per-frequency key phase ``delta`` (the paper's optional
        bias; one ``[H, Dh]`` table per layer); False leaves it out.
      bias_init: ``"zeros"`` (the default of x-transformers and PoPE-pytorch) or ``"uniform"`` in
        ``[-2 pi, 0]`` (their ``bias_uniform_init``).
    """

    name = "pope"
    paper = (
        'Gopalakrishnan, Csordás, Schmidhuber, Mozer 2025, Decoupling the "What" and "Where" With '
        "Polar Coordinate Positional Embeddings"
    )
    relative = True

    base: float = 10000.0
    phase_bias: bool = True
    bias_init: str = "zeros"

    def __post_init__(self):
        check_positive("encoding.base", self.base)
        if not isinstance(self.phase_bias, bool):
            raise ValueError(f"encoding.phase_bias must be True or False, got {self.phase_bias!r}")
        check_choice("encoding.bias_init", self.bias_init, BIAS_INITS)

    def qk_head_dim(self, head_dim: int) -> int:
        return 2 * head_dim  # a (cos, sin) pair per channel

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        return {"phase_bias": (dims.num_heads, dims.head_dim)} if self.phase_bias else {}

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"phase_bias": ("heads", "head_dim")}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        if not self.phase_bias:
            return {}
        shape = (dims.num_heads, dims.head_dim)  # delta: [H, Dh]
        if self.bias_init == "uniform":
            delta = jax.random.uniform(rng, shape, jnp.float32, -2 * math.pi, 0.0)
        else:
            delta = jnp.zeros(shape, jnp.float32)
        return {"phase_bias": delta}

    def rotate(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> ``[B, T, H, 2Dh]``, ``[B, S, H, 2Dh]``.

        Positions ``[B|1, T]``, ``[B|1, S]``; outputs in the input dtype.
        """
        head_dim = q.shape[-1]
        theta = self.base ** (-jnp.arange(head_dim, dtype=jnp.float32) / head_dim)  # [Dh]
        q_angles = q_pos.astype(jnp.float32)[:, :, None, None] * theta  # [B|1, T, 1, Dh]
        k_angles = k_pos.astype(jnp.float32)[:, :, None, None] * theta  # [B|1, S, 1, Dh]
        if self.phase_bias:
            delta = jnp.clip(params["phase_bias"], -2 * math.pi, 0.0)  # [H, Dh]
            k_angles = k_angles + delta  # [B|1, S, H, Dh]
        return _polar(q, q_angles), _polar(k, k_angles)
