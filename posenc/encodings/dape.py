"""DAPE, data-adaptive positional encoding (Zheng, Gao, Shi, Huang, Li, Xiong, Ren, Ng, Jiang, Li,
Li 2024, "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation", NeurIPS 2024;
official code github.com/chuanyang-Zheng/DAPE, ``megatron/model/positional_embeddings.py``,
``AliBi_C``, ``ParallelKerpleLog_C`` and ``FIRE_C``).

A small MLP reads, at each pair ``(i, j)``, every head's scaled logit and every head's base bias,
and its output is added beside them::

    A_h(i, j) = q_i^h . k_j^h / sqrt(Dh)                    the scaled logits, heads h = 1..H
    B_h(i, j)                                               the base's bias (ALiBi, KERPLE, FIRE)
    logit_h(i, j) = A_h + B_h + f([A_1..A_H, B_1..B_H])_h   f: R^{2H} -> R^H

    f(x) = W_2 LeakyReLU(W_1 x + b_1) + b_2,   W_1: [2H, W], W_2: [W, H]

As in the official code: the MLP input concatenates the heads' logits then their biases along
the head axis; ``W = mlp_width = 32``; LeakyReLU with PyTorch's default slope 0.01; PyTorch's
default ``nn.Linear`` initialisation ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``; one MLP per layer;
``A`` is the logit after the ``1/sqrt(Dh)`` scaling and *before* the causal mask (the official
code adds the mask in its softmax, after ``f``), and ``f`` acts on each pair alone, so the mask
is applied to its output as to any bias. The base is posenc's own encoder (``base``), whose
``bias`` gives ``B`` and whose parameters (KERPLE's ``r1, r2``, FIRE's MLP and ``c, L``) are
created by this encoder's ``init`` beside the MLP's, prefixed ``base_``. The official code's
FIRE inside DAPE swaps FIRE's ReLU for LeakyReLU and halves its threshold; posenc keeps
posenc's FIRE as it is (set ``base_hparams``).

How it enters posenc's contract: ``bias`` is the base's bias ``B`` (added after scaling, as every
bias), and ``f`` is a ``content_logits`` hook: it receives ``q``, ``k`` and the positions of each
tile, recomputes ``A = q . k / sqrt(Dh)`` and ``B`` there (it needs both apart, which the
``contextual_logits`` hook, given only their sum and no positions, cannot separate), and returns
``sqrt(Dh) f`` (content logits are unscaled; attention's ``1/sqrt(Dh)`` leaves ``f``). So ``f``
never sees a masked value (the logits of the whole tile are finite before attention masks
them), every path takes it tile by tile (``einsum``, ``blocked``, and the fused ``xla`` path as
a dense bias), and ``f = 0`` is the base encoder exactly. With the attention option
``logit_scale`` (or a temperature) ``A`` is the plain ``q . k / sqrt(Dh)`` of the (temperature-
scaled) queries, and ``f`` is scaled with the logits.

The official code is causal (GPT-NeoX); ``f`` is defined pair by pair, so posenc also takes it
bidirectionally, over the base's bidirectional bias. DAPE's output reads the base's positions
only through ``B``: it is shift invariant with ALiBi and KERPLE, not with FIRE (whose bias reads
the query's position), so it declares ``relative = False``, the claim that promises nothing.

Cost: the MLP's hidden layer is ``W`` values per pair and head-group; up to ``_HIDDEN_AT_ONCE``
entries it is formed whole, past it one hidden unit at a time (as FIRE's), so a ``blocked`` tile
holds ``[B, H, blk, blk]`` arrays, not ``W`` times that.

DAPE V2 (Zheng et al. 2024, "DAPE V2: Process Attention Score as Feature Map for Length
Extrapolation"; the official ``Alibi_DAPEV2``, ``Kerple_DAPEV2``, ``FIRE_DAPEV2``) replaces the
per-pair MLP by two ``1 x k`` convolutions (``k = 3``) along the key axis over the map ``[A; B]``
with the future zeroed first (``tril``). Not transcribed here: an output pair reads its
neighbours' logits, across key-tile borders (the ``blocked`` path hands a hook one tile at a
time) and, at the diagonal, future keys that must read as zeros, while ``content_logits`` never
sees the mask and ``contextual_logits``, which does, gets ``A + B`` summed and no positions to
recompute ``B``. It needs a contract extension (positions for ``contextual_logits``, and a
declaration that a hook reads whole rows, which would run it on ``einsum`` only).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from posenc.encodings.alibi import ALiBi
from posenc.encodings.base import Dims, Encoding, Params, check_choice, torch_linear_init
from posenc.encodings.fire import FIRE
from posenc.encodings.kerple import KerpleLog, KerplePower
from posenc.encodings.registry import register

# The bias encoders DAPE can sit on, by their registry names.
BASES = {cls.name: cls for cls in (ALiBi, KerpleLog, KerplePower, FIRE)}
# PyTorch's nn.LeakyReLU default.
NEGATIVE_SLOPE = 0.01
# The hidden layer [B, T, S, W] is formed whole up to this many entries; past it one unit at a
# time (a blocked tile of 512 x 512 pairs, 8 rows and 32 units would be 268 MB).
_HIDDEN_AT_ONCE = 1 << 20


@register
@dataclasses.dataclass(frozen=True)
class DAPE(Encoding):
    """A per-layer MLP over the heads' logits and base biases, added to the logits.

    Attributes:
      base: the bias encoder under DAPE: ``"alibi"``, ``"kerple_log"`` (the paper's KERPLE),
        ``"kerple_power"`` or ``"fire"``.
      base_hparams: the base's hyperparameters (a mapping; held as sorted ``(name, value)``
        pairs), e.g. ``{"init_L": 256.0}`` for FIRE.
      mlp_width: hidden units of ``f`` (32 in the official code).
    """

    name = "dape"
    paper = (
        "Zheng et al. 2024, DAPE: Data-Adaptive Positional Encoding for Length Extrapolation "
        "(NeurIPS 2024)"
    )
    relative = False  # FIRE's bias reads the query's position; with ALiBi or KERPLE it is

    base: str = "kerple_log"
    base_hparams: Any = ()
    mlp_width: int = 32

    def __post_init__(self):
        check_choice("encoding.base", self.base, tuple(BASES))
        hparams = self.base_hparams
        if hasattr(hparams, "items"):  # a dict or ConfigDict: held hashable
            hparams = tuple(sorted(hparams.items()))
        elif isinstance(hparams, list):
            hparams = tuple(tuple(pair) for pair in hparams)
        if not (
            isinstance(hparams, tuple)
            and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in hparams)
        ):
            raise ValueError(
                "encoding.base_hparams must be a mapping of the base encoder's hyperparameters, "
                f"got {self.base_hparams!r}"
            )
        object.__setattr__(self, "base_hparams", hparams)
        allowed = [f.name for f in dataclasses.fields(BASES[self.base]) if f.name != "dims"]
        unknown = sorted({name for name, _ in hparams} - set(allowed))
        if unknown:
            raise ValueError(
                f"encoding.base_hparams has {unknown}, which encoding.base={self.base!r} does not "
                f"take; it takes: {', '.join(allowed) or '(none)'}"
            )
        try:
            self.base_encoding()
        except ValueError as err:
            raise ValueError(f"encoding.base_hparams for base {self.base!r}: {err}") from None
        if (
            not isinstance(self.mlp_width, int)
            or isinstance(self.mlp_width, bool)
            or self.mlp_width < 1
        ):
            raise ValueError(
                f"encoding.mlp_width must be a positive integer, got {self.mlp_width!r}"
            )

    def base_encoding(self) -> Encoding:
        """The base bias encoder, bound to this encoder's dims when they are set."""
        enc = BASES[self.base](**dict(self.base_hparams))
        return enc if self.dims is None else enc.bind(self.dims)

    def validate(self, dims: Dims) -> None:
        self.base_encoding().validate(dims)

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        h, w = dims.num_heads, self.mlp_width
        shapes = {f"base_{k}": v for k, v in self.base_encoding().param_shapes(dims).items()}
        shapes.update(mlp_in_w=(2 * h, w), mlp_in_b=(w,), mlp_out_w=(w, h), mlp_out_b=(h,))
        return shapes

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        base_rng, rng = jax.random.split(rng)
        params = {f"base_{k}": v for k, v in self.base_encoding().init(base_rng, dims).items()}
        shapes = self.param_shapes(dims)
        keys = jax.random.split(rng, 4)
        fan_in = {"mlp_in_w": 2 * dims.num_heads, "mlp_in_b": 2 * dims.num_heads}
        for key, name in zip(keys, ("mlp_in_w", "mlp_in_b", "mlp_out_w", "mlp_out_b"), strict=True):
            params[name] = torch_linear_init(key, shapes[name], fan_in.get(name, self.mlp_width))
        return params

    def window_params(self, params: Params) -> Params:
        """The base's :meth:`~posenc.encodings.base.Encoding.window_params` on its share."""
        base = self.base_encoding().window_params(self._base_params(params))
        return {**params, **{f"base_{k}": v for k, v in base.items()}}

    def _base_params(self, params: Params) -> Params:
        return {k[len("base_") :]: v for k, v in params.items() if k.startswith("base_")}

    def bias(self, params: Params, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """The base's bias ``B``: ``[B|1, T]``, ``[B|1, S]`` -> ``[B|1, H, T, S]`` float32."""
        base = self.base_encoding()
        return base.bias(self._base_params(params), q_pos, k_pos).astype(jnp.float32)

    def adaptive(self, params: Params, logits: jax.Array, bias: jax.Array) -> jax.Array:
        """``f([A; B])``: scaled logits ``A [B, H, T, S]`` and bias ``B [B|1, H, T, S]`` ->
        ``[B, H, T, S]`` float32."""
        x = jnp.concatenate([logits, jnp.broadcast_to(bias, logits.shape)], axis=1)  # [B,2H,T,S]
        w_in = jnp.asarray(params["mlp_in_w"], jnp.float32)  # [2H, W]
        b_in = jnp.asarray(params["mlp_in_b"], jnp.float32)
        w_out = jnp.asarray(params["mlp_out_w"], jnp.float32)  # [W, H]
        b_out = jnp.asarray(params["mlp_out_b"], jnp.float32)[None, :, None, None]
        hi = jax.lax.Precision.HIGHEST  # float32 sums, not TF32 (GPUs) or bf16 passes (TPUs)

        def act(z):
            return jax.nn.leaky_relu(z, NEGATIVE_SLOPE)

        b, _, t, s = x.shape
        if b * t * s * self.mlp_width <= _HIDDEN_AT_ONCE:
            hidden = act(jnp.einsum("BCTS,CW->BTSW", x, w_in, precision=hi) + b_in)
            return jnp.einsum("BTSW,WH->BHTS", hidden, w_out, precision=hi) + b_out

        def add_unit(unit, out):  # one hidden unit into every head
            z = jnp.einsum("BCTS,C->BTS", x, w_in[:, unit], precision=hi) + b_in[unit]
            return out + w_out[unit][None, :, None, None] * act(z)[:, None]

        init = jnp.broadcast_to(b_out, (b, w_out.shape[1], t, s))
        return jax.lax.fori_loop(0, self.mlp_width, add_unit, init, unroll=4)

    def content_logits(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> jax.Array:
        """``sqrt(Dh) f(A, B)`` (unscaled units): ``q [B, T, H, Dh]``, ``k [B, S, H, Dh]`` ->
        ``[B, H, T, S]`` float32."""
        scale = math.sqrt(q.shape[-1])
        logits = jnp.einsum("BTHD,BSHD->BHTS", q, k, preferred_element_type=jnp.float32) / scale
        return self.adaptive(params, logits, self.bias(params, q_pos, k_pos)) * scale
