"""FIRE, functional interpolation for relative positions (Li, You, Guruganesh, Ainslie, Ontanon,
Zaheer, Sanghai, Yang, Kumar, Bhojanapalli 2023, "Functional Interpolation for Relative Positions
Improves Long Context Transformers", ICLR 2024).

A small MLP ``f`` maps the *progressively interpolated* distance of query ``i`` and key ``j`` to
one scaled-logit bias per head (the paper's method: functional encoding, log transform,
progressive interpolation with a learned threshold)::

    b(i, j) = f( psi(i - j) / psi(max(L, i)) ),      psi(x) = log(c x + 1)

``psi`` spreads out small distances; dividing by ``psi`` of the query position maps every
distance a causal query sees into ``[0, 1]``, whatever the length, so a model trained on short
windows meets no new inputs of ``f`` on long ones; the threshold ``L`` keeps the normaliser from
shrinking on the first positions (below ``L`` the input is ``psi(i - j) / psi(L)``, a fixed
function of the distance). Note ``max(L, i)``: one public re-implementation has ``min``.

Details as in the PyTorch implementation given in the paper's appendix, with its defaults (the
same code and defaults are in public re-implementations, e.g. mcleish7/arithmetic,
``cramming/architectures/embeddings.py``, class ``FIRE``):

- ``f``: ``Linear(1, mlp_width=32) -> ReLU -> Linear(mlp_width, H)``, one MLP per layer, heads
  as its outputs; PyTorch's default ``nn.Linear`` initialisation,
  ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for weights and biases (``fan_in`` 1, then
  ``mlp_width``);
- ``c``: learned, initialised to ``init_c = 0.1``; ``psi`` uses ``log(|c x| + 1)``, so its sign
  does not matter;
- ``L``: learned as a multiplier of a fixed ``init_L = 512``, ``L = |m * init_L|`` with ``m``
  initialised to 1, which keeps ``L`` positive and its learned scalar of order one (the scale an
  optimiser's step suits);
- ``eps = 1e-6`` added to the normaliser (``psi(max(L, i))`` is 0 at ``i = 0`` if ``L = 0``).

FIRE is defined for causal attention (``j <= i``). Without a causal mask, keys after the query get
the implementation's ``|i - j|`` over the same query normaliser.

The normaliser depends on the query's absolute position ``i`` (not only on ``i - j``) once
``i > L``, so FIRE is not shift invariant: ``relative = False``.

Shapes: ``q_pos [B|1, T]``, ``k_pos [B|1, S]`` -> bias ``[B|1, H, T, S]`` float32, computed per
call from the positions (the MLP one hidden unit at a time, at tile size on the blocked path);
nothing ``L x L`` is stored.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_positive, torch_linear_init
from posenc.encodings.registry import register
from posenc.encodings.relative import pairwise_offsets

# The MLP's hidden layer ``[B|1, T, S, W]`` is formed whole up to this many entries (a training
# window: 128 x 128 pairs x 32 units); past it (a 512 x 512 tile of the blocked path), one hidden
# unit at a time, four per loop step, summed into the heads, each step one elementwise pass over
# the pairs. Measured on XLA:CPU (this VM, 4 heads): at 128 x 128 the whole layer and its
# W x H matmul take 0.7 ms forward and 8 ms for the gradient of attention, the loop 1.1 ms and
# 34 ms (its scan's backward pass); on a 4k blocked window the whole layer costs 27-46 ms a
# tile, all 32 units unrolled 4.7x NoPE's window, the loop of four units per step 1.5-2.6x.
_HIDDEN_AT_ONCE = 1 << 20


@register
@dataclasses.dataclass(frozen=True)
class FIRE(Encoding):
    """A per-layer MLP of the progressively interpolated log distance, one output per head.

    Attributes:
      mlp_width: hidden units of ``f`` (32 in the paper).
      init_c: initial value of the learned log-transform scale ``c`` (0.1).
      init_L: the fixed threshold that the learned multiplier scales (512).
      eps: added to the normaliser ``psi(max(L, i))`` (1e-6).
    """

    name = "fire"
    paper = "Li et al. 2023, Functional Interpolation for Relative Positions (FIRE), ICLR 2024"
    relative = False  # psi(max(L, i)) reads the query's absolute position past the threshold

    mlp_width: int = 32
    init_c: float = 0.1
    init_L: float = 512.0
    eps: float = 1e-6

    def __post_init__(self):
        if not isinstance(self.mlp_width, int) or self.mlp_width < 1:
            raise ValueError(
                f"encoding.mlp_width must be a positive integer, got {self.mlp_width!r}"
            )
        check_positive("encoding.init_c", self.init_c)
        check_positive("encoding.init_L", self.init_L)
        check_positive("encoding.eps", self.eps)

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        w, h = self.mlp_width, dims.num_heads
        return {
            "c": (),
            "L_multiplier": (),
            "mlp_in_w": (w,),  # Linear(1, W): one input
            "mlp_in_b": (w,),
            "mlp_out_w": (w, h),
            "mlp_out_b": (h,),
        }

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        shapes = self.param_shapes(dims)
        keys = jax.random.split(rng, 4)
        return {
            "c": jnp.asarray(self.init_c, jnp.float32),
            "L_multiplier": jnp.asarray(1.0, jnp.float32),
            "mlp_in_w": torch_linear_init(keys[0], shapes["mlp_in_w"], 1),
            "mlp_in_b": torch_linear_init(keys[1], shapes["mlp_in_b"], 1),
            "mlp_out_w": torch_linear_init(keys[2], shapes["mlp_out_w"], self.mlp_width),
            "mlp_out_b": torch_linear_init(keys[3], shapes["mlp_out_b"], self.mlp_width),
        }

    def interpolated_distance(self, params: Params, q_pos: jax.Array, k_pos: jax.Array):
        """``psi(i - j) / (psi(max(L, i)) + eps)``: ``[B|1, T]``, ``[B|1, S]`` -> ``[B|1, T, S]``
        float32, in ``[0, 1]`` for every key a causal query sees."""
        c = jnp.asarray(params["c"], jnp.float32)
        threshold = jnp.abs(jnp.asarray(params["L_multiplier"], jnp.float32) * self.init_L)
        back = -pairwise_offsets(q_pos, k_pos).astype(jnp.float32)  # i - j, [B|1, T, S]
        query = q_pos.astype(jnp.float32)[:, :, None]  # i, [B|1, T, 1]
        distance = jnp.log(jnp.abs(c * back) + 1.0)
        normaliser = jnp.log(jnp.abs(c * jnp.maximum(query, threshold)) + 1.0) + self.eps
        return distance / normaliser

    def bias(self, params: Params, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """``[B|1, T]``, ``[B|1, S]`` positions -> ``[B|1, H, T, S]`` float32 logits."""
        x = self.interpolated_distance(params, q_pos, k_pos)[:, None]  # [B|1, 1, T, S]
        w_in = jnp.asarray(params["mlp_in_w"], jnp.float32)
        b_in = jnp.asarray(params["mlp_in_b"], jnp.float32)
        w_out = jnp.asarray(params["mlp_out_w"], jnp.float32)[:, None, :, None, None]  # [W,1,H,1,1]
        b_out = jnp.asarray(params["mlp_out_b"], jnp.float32)[None, :, None, None]  # [1, H, 1, 1]

        if x.shape[0] * x.shape[2] * x.shape[3] * w_in.shape[0] <= _HIDDEN_AT_ONCE:
            hidden = jax.nn.relu(x[:, 0, ..., None] * w_in + b_in)  # [B|1, T, S, W]
            return jnp.einsum("BTSW,WH->BHTS", hidden, w_out[:, 0, :, 0, 0]) + b_out

        def add_unit(unit, out):  # one hidden unit's ReLU, into every head
            return out + w_out[unit] * jax.nn.relu(x * w_in[unit] + b_in[unit])

        init = jnp.broadcast_to(b_out, (x.shape[0], w_out.shape[2], *x.shape[2:]))
        return jax.lax.fori_loop(0, w_in.shape[0], add_unit, init, unroll=4)
