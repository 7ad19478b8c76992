"""FoPE, Fourier position embedding (Hua et al. 2024, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", arXiv:2412.17739; official code
github.com/TsinghuaC3I/Fourier-Position-Embedding, ``olmo/model.py``: ``FourierEmbedding``).

RoPE treats pair ``d`` of a head as one complex dimension turning at one frequency ``omega_d``.
FoPE argues that linear layers and activations leak other frequencies into each dimension
(spectral damage), so it makes each dimension a Fourier *series* over the head's frequencies,
and it clips the frequencies too low to complete a period within the training length to zero::

    omega_d = base^(-2d/Dh),   omega_d := 0 where omega_d < 2 pi / L       (L: training length)
    C_d(m) = sum_j A[h, j, d] cos(m omega_j),   S_d(m) = sum_j B[h, j, d] sin(m omega_j)
    x'_a = x_a C_d(m) - x_b S_d(m),   x'_b = x_a S_d(m) + x_b C_d(m)      (pair (a, b) of dim d)

where ``j`` and ``d`` run over the ``D`` unclipped frequencies and the clipped pairs are left
unrotated (frequency 0: ``C = 1``, ``S = 0``). With ``A = B = I`` this is RoPE with the clipped
frequencies (tested as an equality). Queries and keys get the same map; pairs are GPT-NeoX's
``"half"`` layout ``(x_d, x_{d + Dh/2})``, as the official code's ``rotate_half``.

What posenc transcribes from the official code (its released configs): separate coefficient
matrices for the cosine and sine series (``fourier_separate_basis``), one per head
(``fourier_separate_head``) and one set per layer (each block has its own embedding), initialised
as the identity plus Gaussian noise (``eye_xavier_norm``: Xavier-normal with gain 0.3 on a
``[H, D, D]`` tensor, whose standard deviation ``0.3 sqrt(2 / (D^2 + H D))`` is about 0.02 for
its 60M model; posenc takes ``init_std`` directly, default 0.02).

Where posenc departs from the code, and why:

- Learned or fixed. The code creates the coefficients with ``requires_grad=fourier_learnable``,
  False in its configs: fixed random matrices. posenc learns them by default (``learnable``;
  the issue asks for gradients to reach them) and ``learnable=False`` stops their gradient, the
  official setting.
- Which pairs carry a series. The code maps the ``D`` unclipped frequencies onto only
  ``min(D, Dh/4)`` output pairs and pads the others' cosine *and* sine with 1 (a fixed 45-degree
  rotation scaled by sqrt 2, whose logits are twice ``q . k``). posenc gives every unclipped
  pair its series and leaves clipped pairs unrotated, as the paper's formula reads; for the
  official 512-token, 64-channel configs ``D = Dh/4`` and the two agree but for that factor.
- ``train_len`` is the run's training length: a run config that does not set it gets
  ``train.seq_len`` when the model is built (:func:`posenc.models.build.fill_train_len`; 512,
  the dataclass default, only where an encoder is made outside a run).

FoPE is not relative: ``C_d(m) C_d(n)`` mixes frequencies ``omega_j`` and ``omega_k`` into terms
in ``m omega_j - n omega_k``, which depend on ``m`` and ``n`` apart unless ``A = B = I``
(``relative = False``; the shift check holds it to that).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc.encodings.base import Dims, Encoding, Params, check_positive
from posenc.encodings.hope import check_train_len
from posenc.encodings.registry import register


def fope_frequencies(head_dim: int, base: float, train_len: int) -> np.ndarray:
    """float64 ``[Dh/2]``: ``omega_d = base^(-2d/Dh)``, set to 0 below ``2 pi / train_len``."""
    omega = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    return np.where(omega >= 2 * math.pi / train_len, omega, 0.0)


def fourier_pairs(head_dim: int, base: float, train_len: int) -> int:
    """``D``: how many pairs keep a frequency (the fastest ones, ``omega >= 2 pi / L``)."""
    return int(np.count_nonzero(fope_frequencies(head_dim, base, train_len)))


def apply_fope(
    x: jax.Array,
    positions: jax.Array,
    cos_coef: jax.Array,
    sin_coef: jax.Array,
    *,
    train_len: int,
    base: float = 10000.0,
) -> jax.Array:
    """Applies FoPE's per-pair Fourier series to ``x`` (module docstring), in float32.

    Args:
      x: ``[B, T, H, Dh]`` queries or keys.
      positions: ``[B|1, T]`` or ``[T]`` integer positions.
      cos_coef, sin_coef: ``[H, D, D]`` coefficients ``A`` and ``B`` (frequency ``j``, pair
        ``d``) of the ``D`` unclipped pairs.
      train_len: the training length ``L``.
      base: ``omega_d = base^(-2d/Dh)``.

    Returns:
      ``[B, T, H, Dh]``, same dtype as ``x``; the clipped pairs pass through unchanged.
    """
    dh = x.shape[-1]
    n = fourier_pairs(dh, base, train_len)
    omega = jnp.asarray(fope_frequencies(dh, base, train_len)[:n], jnp.float32)  # [D]
    positions = jnp.atleast_2d(positions).astype(jnp.float32)  # [B|1, T]
    angles = positions[..., None] * omega  # [B|1, T, D]
    c = jnp.einsum("BTJ,HJD->BTHD", jnp.cos(angles), cos_coef.astype(jnp.float32))
    s = jnp.einsum("BTJ,HJD->BTHD", jnp.sin(angles), sin_coef.astype(jnp.float32))
    half = dh // 2
    a = x[..., :n].astype(jnp.float32)  # [B, T, H, D]
    b = x[..., half : half + n].astype(jnp.float32)
    a_out, b_out = (a * c - b * s).astype(x.dtype), (a * s + b * c).astype(x.dtype)
    return jnp.concatenate(
        [a_out, x[..., n:half], b_out, x[..., half + n :]], axis=-1
    )  # [B, T, H, Dh]


@register
@dataclasses.dataclass(frozen=True)
class FoPE(Encoding):
    """FoPE (module docstring): each unclipped pair a learned Fourier series over the head's
    unclipped frequencies, per head and per layer; frequencies below ``2 pi / L`` clipped to 0.

    Attributes:
      train_len: the training length ``L`` (a run config that does not set it gets
        ``train.seq_len``; 512 elsewhere).
      base: ``omega_d = base^(-2d/Dh)``.
      init_std: standard deviation of the Gaussian noise added to the identity at ``init``.
      learnable: train the coefficients (False: fixed at their random start, the official
        code's setting).
    """

    name = "fope"
    paper = (
        "Hua et al. 2024, Fourier Position Embedding: Enhancing Attention's Periodic Extension "
        "for Length Generalization"
    )

    train_len: int = 512
    base: float = 10000.0
    init_std: float = 0.02
    learnable: bool = True

    def __post_init__(self):
        check_train_len(self.train_len, "below whose frequency 2 pi / L FoPE clips to 0")
        check_positive("encoding.base", self.base)
        check_positive("encoding.init_std", self.init_std, allow_zero=True)
        if not isinstance(self.learnable, bool):
            raise ValueError(
                f"encoding.learnable must be one of [False, True], got {self.learnable!r}"
            )

    def validate(self, dims: Dims) -> None:
        if dims.head_dim % 2:
            raise ValueError(
                f"FoPE rotates channel pairs and cannot take a head dimension of {dims.head_dim} "
                "(odd); choose model.model_dim / model.num_heads even"
            )
        if fourier_pairs(dims.head_dim, self.base, self.train_len) < 1:
            raise ValueError(
                f"encoding.train_len={self.train_len} clips every frequency of FoPE (the fastest, "
                "1, is below 2 pi / train_len); use a training length of at least 7"
            )

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        n = fourier_pairs(dims.head_dim, self.base, self.train_len)
        return {"cos_coef": (dims.num_heads, n, n), "sin_coef": (dims.num_heads, n, n)}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        """Identity plus ``N(0, init_std^2)`` noise, separately for the cosine and sine series of
        each head."""
        shapes = self.param_shapes(dims)
        eye = jnp.eye(shapes["cos_coef"][-1], dtype=jnp.float32)
        out = {}
        for key, name in zip(jax.random.split(rng), sorted(shapes), strict=True):
            noise = self.init_std * jax.random.normal(key, shapes[name], jnp.float32)
            out[name] = eye + noise
        return out

    def rotate(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> both through the layer's series."""
        cos_coef, sin_coef = params["cos_coef"], params["sin_coef"]
        if not self.learnable:
            cos_coef, sin_coef = jax.lax.stop_gradient(cos_coef), jax.lax.stop_gradient(sin_coef)
        kwargs = dict(train_len=self.train_len, base=self.base)
        return (
            apply_fope(q, q_pos, cos_coef, sin_coef, **kwargs),
            apply_fope(k, k_pos, cos_coef, sin_coef, **kwargs),
        )
