"""CAPE: continuous augmented positional embeddings (Likhomanenko, Xu, Synnaeve, Collobert,
Rogozhnikov 2021, "CAPE: Encoding Relative Positions with Continuous Augmented Positional
Embeddings", Sec. 3).

Sinusoidal absolute embeddings (Vaswani et al. 2017) of *continuous* positions, which training
augments so that the model cannot rely on absolute values and learns relative ones. For row
``b`` of a batch, with positions ``x_n = pos_scale * n`` (``n = 0 .. T-1``)::

    x_n  <- x_n - mean_n x_n                                 (only with normalize=True)
    x'_n  = (x_n + Delta + eps_n) * lambda                   (training only)
    Delta ~ U[-max_global_shift, max_global_shift]           one per row   (global shift)
    eps_n ~ U[-eps/2, eps/2],  eps = pos_scale * max_local_shift   per position (local shift)
    log lambda ~ U[-log max_global_scaling, log max_global_scaling]   one per row (global scaling)

    E(x)_{2i}   = sin(x * freq_scale * 10000^(-2i/D))
    E(x)_{2i+1} = cos(x * freq_scale * 10000^(-2i/D))

added to the token embeddings (which posenc scales by ``sqrt(D)``, as the reference code does).
At evaluation nothing is drawn: ``E(pos_scale * n)``, centred with ``normalize``. The order of
operations (centre, shift, then scale), the local shift of half-width ``eps/2`` (neighbours
keep their order for ``max_local_shift <= 1``), the ``pos_scale`` of the positions and of the
local shift, and the frequencies are those of the authors' reference implementation
(``CAPE1d`` in github.com/gcambara/cape, linked from facebookresearch/CAPE); the names of the
hyperparameters too. Positions here are the model's positions (any values, e.g. randomized
ones) times ``pos_scale``, rather than ``arange(T)``.

The contract: ``continuous_positions = True`` makes the model pass float32 positions to
``embed``; ``augment_positions`` is called by the model on every pass, with a key in training
(folded from the model's ``rng``: in :mod:`posenc.runs.train` a pure function of the seed and the
step, also with dropout 0) and None at evaluation. Each draw is float32. Absolute
(``relative = False``): at evaluation the embeddings are Vaswani's sinusoids.

Defaults (not the paper's, whose values are per task: speech, images, translation): a global
shift of up to 5 positions, local shifts of up to half a position each way (``max_local_shift
= 1``), global scaling up to 1.1; ``normalize=False`` (a causal language model's positions stay
``0 .. T-1``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_positive
from posenc.encodings.registry import register


def cape_table(positions: jax.Array, dim: int, freq_scale: float = 1.0) -> jax.Array:
    """Sinusoids at continuous positions: ``[...]`` float -> ``[..., dim]`` float32, channel
    ``2i`` ``sin(x f_i)`` and ``2i + 1`` ``cos(x f_i)``, ``f_i = freq_scale * 10000^(-2i/dim)``."""
    freq = freq_scale * jnp.exp(jnp.arange(0, dim, 2, dtype=jnp.float32) * (-math.log(1e4) / dim))
    angles = positions.astype(jnp.float32)[..., None] * freq  # [..., dim/2]
    table = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., dim/2, 2]
    return table.reshape(*positions.shape, dim)


@register
@dataclasses.dataclass(frozen=True)
class CAPE(Encoding):
    """Sinusoids of continuous positions, shifted and scaled at random in training.

    Attributes:
      max_global_shift: ``Delta``'s bound, one uniform shift per row (in positions).
      max_local_shift: local shifts are uniform in ``+- pos_scale * max_local_shift / 2``, one
        per position.
      max_global_scaling: ``lambda``'s bound (``>= 1``), log-uniform per row.
      normalize: subtract each row's mean position first (in training and evaluation).
      pos_scale: the distance between neighbouring positions (the reference code's
        ``pos_scale``; e.g. seconds per frame in speech).
      freq_scale: multiplies every frequency.
    """

    name = "cape"
    paper = (
        "Likhomanenko et al. 2021, CAPE: Encoding Relative Positions with Continuous Augmented "
        "Positional Embeddings"
    )
    relative = False  # Vaswani's sinusoids at evaluation
    param_scope = "shared"
    continuous_positions = True

    max_global_shift: float = 5.0
    max_local_shift: float = 1.0
    max_global_scaling: float = 1.1
    normalize: bool = False
    pos_scale: float = 1.0
    freq_scale: float = 1.0

    def __post_init__(self):
        check_positive("encoding.max_global_shift", self.max_global_shift, allow_zero=True)
        check_positive("encoding.max_local_shift", self.max_local_shift, allow_zero=True)
        check_positive("encoding.pos_scale", self.pos_scale)
        check_positive("encoding.freq_scale", self.freq_scale)
        scaling = self.max_global_scaling
        if not (
            isinstance(scaling, int | float) and not isinstance(scaling, bool) and scaling >= 1
        ):
            raise ValueError(f"encoding.max_global_scaling must be a number >= 1, got {scaling!r}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"encoding.normalize must be True or False, got {self.normalize!r}")

    def check_cacheable(self) -> None:
        # Centring on the window's mean moves every token's position as the window grows.
        if self.normalize:
            raise ValueError(
                "encoding.normalize=True: 'cape' cannot be decoded with a key/value cache (the "
                "window's mean position changes every token's embedding); use "
                "posenc.decoding.lm.greedy_generate_reference or normalize=False"
            )

    def validate(self, dims: Dims) -> None:
        if dims.model_dim % 2:
            raise ValueError(f"cape needs an even model.model_dim, got {dims.model_dim}")

    def augment_positions(
        self, params: Params, positions: jax.Array, rng: jax.Array | None
    ) -> jax.Array:
        """``[B, T]`` float32 positions -> the positions ``embed`` receives, ``[B, T]`` float32:
        scaled by ``pos_scale``, centred with ``normalize``, and with ``rng`` (training) shifted
        and scaled at random."""
        del params
        x = positions.astype(jnp.float32) * self.pos_scale
        if self.normalize:
            x = x - x.mean(axis=-1, keepdims=True)
        if rng is None:
            return x
        b, t = x.shape
        r_global, r_local, r_scale = jax.random.split(rng, 3)
        g = self.max_global_shift
        delta = jax.random.uniform(r_global, (b, 1), jnp.float32, -g, g)
        eps = self.pos_scale * self.max_local_shift
        delta_local = jax.random.uniform(r_local, (b, t), jnp.float32, -eps / 2, eps / 2)
        log_scale = math.log(self.max_global_scaling)
        log_lambda = jax.random.uniform(r_scale, (b, 1), jnp.float32, -log_scale, log_scale)
        return (x + delta + delta_local) * jnp.exp(log_lambda)

    def embed(self, params: Params, positions: jax.Array) -> jax.Array:
        """``[B|1, T]`` float positions (already augmented) -> ``[B|1, T, D]`` float32."""
        del params
        return cape_table(positions, self.bound_dims.model_dim, self.freq_scale)
