"""KERPLE, kernelized relative positional embedding (Chi, Fan, Ramadge, Rudnicky 2022, "KERPLE:
Kernelized Relative Positional Embedding for Length Extrapolation", NeurIPS 2022).

Each head ``h`` adds a conditionally positive definite kernel of the distance ``|i - j|`` to the
scaled logit of query ``i`` and key ``j`` (the two variants of the paper's experiments)::

    logarithmic:  b_h(i, j) = -r1_h * log(1 + r2_h * |i - j|)      r1, r2 > 0
    power:        b_h(i, j) = -r1_h * |i - j| ** r2_h               r1 > 0, 0 < r2 <= 2

with ``r1, r2`` learned, one pair per head. ``r2 <= 2`` is where ``-|x|^p`` is a CPD kernel.
For a causal model this is the paper's ``i - j >= 0`` on every visible key; without a causal mask
keys after the query are penalised alike (``|i - j|``).

What follows the authors' code (github.com/chijames/KERPLE, ``megatron/mpu/layers.py``,
``ParallelKerpleLog`` and ``ParallelKerplePower`` with ``pos_emb = "kerple_power_ap_"`` and
``"kerple_log"`` as in ``generate_ymls.py``; ``megatron/model/gpt2_model.py``):

- initialisation, ``torch.rand`` per head: logarithmic ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``; power
  ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``;
- positivity and ``r2 <= 2`` by clamping, not by a reparameterisation: before every forward pass
  the authors clamp the stored parameters in place to ``[eps, inf)`` (``r2`` of the power variant
  to ``[eps, 2]``), ``eps = 1e-2``. A pure function cannot write its parameters back, so here the
  forward pass uses the clamped values (the same bias) and :func:`project` passes the gradient to
  the stored value only where it is inside the interval or points back into it: like the
  authors' projected updates, a parameter pushed against a bound stays there rather than
  drifting away from it;
- one ``(r1, r2)`` per head *and layer*, as the paper's method states it (a kernel per attention
  layer). The authors' ``gpt2_model.py`` builds a single kernel module and hands that one
  instance to every layer, so their runs share it across layers; posenc keeps the per-layer form
  (``param_scope = "layer"``), which has ``num_layers`` times the (tiny) parameter count;
- the bias is added after the ``1/sqrt(Dh)`` scaling of ``q . k`` (``transformer.py``).

The bias is computed on the fly from the positions of each tile, never stored as an ``L x L``
array.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_positive
from posenc.encodings.registry import register
from posenc.encodings.relative import pairwise_offsets


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def project(x: jax.Array, low: float, high: float) -> jax.Array:
    """``clip(x, low, high)`` whose gradient acts like a projected update.

    Forward: the clamped value. Backward: the incoming gradient where ``low <= x <= high``, and
    outside the interval only where a descent step would move ``x`` back towards it (``g < 0``
    below ``low``, ``g > 0`` above ``high``); zero where it would push ``x`` further out. (A
    plain ``clip`` would freeze a parameter that once left the interval; a straight-through
    ``clip`` would let it drift arbitrarily far out, so that it needed as many steps back.)

    Args:
      x: any float array.
      low, high: the interval (``high`` may be ``inf``).

    Returns:
      ``x`` clamped to ``[low, high]``, same shape and dtype.
    """
    return jnp.clip(x, low, high)


def _project_fwd(x, low, high):
    return jnp.clip(x, low, high), x


def _project_bwd(low, high, x, g):
    inside = (x >= low) & (x <= high)
    inward = ((x < low) & (g < 0)) | ((x > high) & (g > 0))
    return (jnp.where(inside | inward, g, jnp.zeros_like(g)),)


project.defvjp(_project_fwd, _project_bwd)


@dataclasses.dataclass(frozen=True)
class _Kerple(Encoding):
    """The two KERPLE variants: a learned kernel of ``|i - j|`` per head and layer.

    Attributes:
      eps: the lower bound of ``r1`` and ``r2`` (1e-2 in the authors' code).
    """

    relative = True
    param_scope = "layer"
    bias_by_distance = True  # a kernel of |i - j|

    eps: float = 1e-2

    # Upper ends of the uniform initialisations, and the upper bound of r2 (authors' code).
    _r1_init = 1.0
    _r2_init = 1.0
    _r2_max = math.inf

    def __post_init__(self):
        check_positive("encoding.eps", self.eps)
        if self.eps >= self._r2_max:
            raise ValueError(f"encoding.eps must be below {self._r2_max:g}, got {self.eps!r}")

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        return {"r1": (dims.num_heads,), "r2": (dims.num_heads,)}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        rng_r1, rng_r2 = jax.random.split(rng)
        h = dims.num_heads
        return {
            "r1": self._r1_init * jax.random.uniform(rng_r1, (h,), jnp.float32),
            "r2": self._r2_init * jax.random.uniform(rng_r2, (h,), jnp.float32),
        }

    def window_params(self, params: Params) -> Params:
        """``r1`` and ``r2`` projected once per attention call: the per-tile calls of ``bias``
        then project values already inside the interval (an identity, gradient included), so
        the projection's sign rule sees the window's whole gradient on every path."""
        r1, r2 = self.coefficients(params)
        return {**params, "r1": r1, "r2": r2}

    def coefficients(self, params: Params) -> tuple[jax.Array, jax.Array]:
        """The clamped ``(r1, r2)`` the bias uses, ``[H]`` float32 each."""
        r1 = project(jnp.asarray(params["r1"], jnp.float32), self.eps, math.inf)
        r2 = project(jnp.asarray(params["r2"], jnp.float32), self.eps, self._r2_max)
        return r1, r2

    def _kernel(self, distance: jax.Array, r2: jax.Array) -> jax.Array:
        raise NotImplementedError

    def bias(self, params: Params, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """``[B|1, T]``, ``[B|1, S]`` positions -> ``[B|1, H, T, S]`` float32 logits."""
        r1, r2 = self.coefficients(params)  # [H] each
        distance = jnp.abs(pairwise_offsets(q_pos, k_pos)).astype(jnp.float32)  # [B|1, T, S]
        kernel = self._kernel(distance[:, None], r2[None, :, None, None])  # [B|1, H, T, S]
        return -r1[None, :, None, None] * kernel


@register
@dataclasses.dataclass(frozen=True)
class KerpleLog(_Kerple):
    """``-r1_h * log(1 + r2_h * |i - j|)``; ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``, both ``>= eps``."""

    name = "kerple_log"
    paper = "Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding (logarithmic)"

    _r1_init = 2.0
    _r2_init = 1.0

    def _kernel(self, distance: jax.Array, r2: jax.Array) -> jax.Array:
        return jnp.log1p(r2 * distance)


@register
@dataclasses.dataclass(frozen=True)
class KerplePower(_Kerple):
    """``-r1_h * |i - j| ** r2_h``; ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``; ``r1 >= eps``,
    ``eps <= r2 <= 2``."""

    name = "kerple_power"
    paper = "Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding (power)"

    _r1_init = 1.0
    _r2_init = 2.0
    _r2_max = 2.0

    def _kernel(self, distance: jax.Array, r2: jax.Array) -> jax.Array:
        # 0 ** r2 = 0 for r2 > 0; jnp.power's gradient in r2 at 0 is 0 (not 0 * log 0 = nan).
        return jnp.power(distance, r2)
