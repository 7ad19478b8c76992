"""One transformer block: self-attention, optional cross-attention, MLP.

The same block serves every assembly (flaxformer's decoder layer, whose encoder-decoder attention
is optional): the decoder-only LM (causal or bidirectional), the encoder stack (bidirectional)
and the decoder stack of an encoder-decoder (causal, with ``cross=True``). Its options are data
from :class:`~posenc.layers.config.ModelConfig`:

- ``norm_position="pre"`` (default): ``x + f(norm(x))`` per sublayer; ``"post"``:
  ``norm(x + f(x))`` (Vaswani et al., BERT); ``"sandwich"``: ``x + norm_out(f(norm_in(x)))``
  (Gemma 2 and 3; Ding et al. 2021's sandwich LayerNorm); ``"post_branch"``: ``x + norm(f(x))``,
  the sublayer's output normed before the residual add and its input not (OLMo 2's reordered
  norm, Swin V2's res-post-norm). The input norms are ``attn_norm``, ``cross_norm`` and
  ``mlp_norm`` (for ``"post"``, the norms after each sum); the output norms, made after every
  other part, ``attn_out_norm``, ``cross_out_norm`` and ``mlp_out_norm``.
- ``residual="sequential"`` (default): attention, then the MLP on its output;
  ``"parallel"``: ``x + attn(norm1(x)) + mlp(norm2(x))`` (GPT-NeoX);
  ``"parallel_shared_norm"``: ``x + attn(h) + mlp(h)`` with ``h = norm1(x)`` (GPT-J, Cohere): the
  block has no ``mlp_norm``.

The block owns the positional encoder's parameters when they are per layer
(``param_scope="layer"``) and hands the encoder to :func:`posenc.attention.core.attend` through its
self-attention; cross-attention has no positional term (:mod:`posenc.layers.attention`).

Precision: the residual stream is float32; norms in float32; projections and the MLP in the
compute dtype. Dropout takes an explicit key, applied to each residual branch.

Rematerialisation (``ModelConfig.remat``): with ``"full"`` or ``"dots"`` each block's
:meth:`Block.forward` runs under ``jax.checkpoint`` (``nnx.remat``, lifted over the block's
parameters), so the backward pass recomputes what the policy of :data:`REMAT_POLICIES` did not
keep, one block at a time: the training step holds one block's intermediates instead of every
block's. The forward values are the same computation; gradients agree to float rounding.

Segment memory (Transformer-XL, :mod:`posenc.models.memory`): with ``memory [B, M, D]`` the keys
and values come from ``concat(memory, x)`` (both normed by the current norm) and the queries
from ``x``; positions then cover ``M + T``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.attention.options import AttentionOptions
from posenc.devices import sharding
from posenc.encodings.base import Encoding, Params
from posenc.layers.attention import CrossAttention, SelfAttention
from posenc.layers.cache import CrossCache, LayerCache
from posenc.layers.config import ModelConfig
from posenc.layers.mlp import Mlp
from posenc.layers.norms import model_norm
from posenc.layers.params import NORM_SCALES, encoder_params, option_params, values

# ``model.remat`` -> what ``jax.checkpoint`` keeps of a block for the backward pass ("none": no
# checkpoint, every intermediate kept). "full" keeps the block's inputs only (MaxText's "full");
# "dots" keeps the results of matmuls against weights (no batch dimensions: the projections and
# the MLP), recomputing attention's logits and probabilities and the elementwise ops (MaxText's
# "minimal").
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout with an explicit key; identity without one or at rate 0."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


class Block(nnx.Module):
    """A transformer block (module docstring).

    Args:
      config: shape, numerics and architecture options.
      encoding: the bound encoder of this stack.
      rngs: initialisation streams.
      layer: the block's index in its stack (fixes the ``linear_performer`` random features).
      cross: add cross-attention over an encoder output (an encoder-decoder's decoder).
      causal: mask keys after the query; None: ``config.causal``.
      options: this layer's attention options (window, sinks, QK-norm, ...); None: the
        model's (``config.attention_options()``).
      kind: the name of the layer's kind in a pattern (:mod:`posenc.layers.pattern`), None
        without one.
    """

    def __init__(
        self,
        config: ModelConfig,
        encoding: Encoding,
        *,
        rngs: nnx.Rngs,
        layer: int = 0,
        cross: bool = False,
        causal: bool | None = None,
        options: AttentionOptions | None = None,
        kind: str | None = None,
    ):
        if cross and config.residual != "sequential":
            raise ValueError(
                f"model.residual={config.residual!r} has no place for cross-attention; an "
                "encoder-decoder needs model.residual='sequential'"
            )
        dims = config.dims
        dtype = jnp.dtype(config.dtype)
        self.config = config
        self.encoding = encoding
        self.layer = layer
        self.kind = kind
        self.options = config.attention_options() if options is None else options
        self.causal = config.causal if causal is None else causal
        position = config.norm_position
        self.pre_norm = position in ("pre", "sandwich")  # a norm on each sublayer's input
        self.post_norm = position == "post"  # a norm after each residual sum
        out_norms = position in ("sandwich", "post_branch")  # a norm on each sublayer's output
        self.parallel = config.residual != "sequential"
        projections = dict(
            model_dim=config.model_dim,
            num_heads=dims.num_heads,
            head_dim=dims.head_dim,
            num_kv_heads=config.kv_heads,
            qkv_bias=config.qkv_bias,
            out_bias=config.out_bias,
            dtype=dtype,
            rngs=rngs,
        )

        def norm(made: bool = True) -> nnx.Module | None:
            if not made:
                return None
            return model_norm(config, rngs)

        # Construction order fixes the initialisation keys; it is posenc's original order
        # (attention norm, projections, MLP norm, MLP, encoder parameters), the output norms
        # after them.
        self.attn_norm = norm(position != "post_branch")
        self.attn = SelfAttention(**projections)
        self.cross_norm = norm(cross and position != "post_branch")
        self.cross_attn = CrossAttention(**projections) if cross else None
        # One norm for both branches of a parallel block (Cohere's): no MLP norm.
        self.mlp_norm = norm(
            position != "post_branch" and config.residual != "parallel_shared_norm"
        )
        self.mlp = Mlp(
            config.mlp,
            config.model_dim,
            config.mlp_dim,
            use_bias=config.mlp_bias,
            dtype=dtype,
            rngs=rngs,
        )
        self.pos_params = (
            encoder_params(encoding, rngs) if encoding.param_scope == "layer" else None
        )
        # The attention options' own parameters (QK-norm scales, sinks, SSMax's s): constants
        # at initialisation, drawing no key, so the other parameters stay as they were.
        self.attn_params = option_params(
            self.options,
            dims.num_heads,
            dims.head_dim,
            config.kv_heads,
            unit_offset=config.norm_unit_offset,
        )
        self.attn_out_norm = norm(out_norms)
        self.cross_out_norm = norm(out_norms and cross)
        self.mlp_out_norm = norm(out_norms)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        shared_params: Params,
        rng: jax.Array | None = None,
        *,
        memory: jax.Array | None = None,
        cross: CrossCache | None = None,
        k_valid: jax.Array | None = None,
    ) -> jax.Array:
        """``x: [B, T, D]`` float32 residual stream -> same shape (see :meth:`forward`)."""
        return self.forward(
            x, positions, shared_params, rng, memory=memory, cross=cross, k_valid=k_valid
        )[0]

    def forward(
        self,
        x: jax.Array,
        positions: jax.Array,
        shared_params: Params,
        rng: jax.Array | None = None,
        *,
        memory: jax.Array | None = None,
        cross: CrossCache | None = None,
        k_valid: jax.Array | None = None,
    ) -> tuple[jax.Array, LayerCache]:
        """The block over a whole window, and what a key/value cache keeps of it.

        Args:
          x: ``[B, T, D]`` float32 residual stream.
          positions: ``[B|1, T]`` integer positions (``[B|1, M + T]`` with ``memory``).
          shared_params: the stack's shared encoder parameters (``{}`` if none).
          rng: dropout key; None for a deterministic pass.
          memory: ``[B, M, D]`` Transformer-XL memory (already gradient-stopped), read as
            extra keys and values; None: self-attention over ``x`` alone.
          cross: the encoder output's keys and values (a block built with ``cross=True``).
          k_valid: ``[B|1, T]`` bool, the tokens of ``x`` that exist (source padding in an
            encoder); None: all.

        Returns:
          ``x`` after the block, ``[B, T, D]`` float32, and the :class:`LayerCache` of the keys
          (``h``, ``k``, ``v`` at the ``T`` tokens, or ``M + T`` with memory; ``k`` before
          ``rotate``).
        """
        self._check_cross(cross)
        policy = REMAT_POLICIES.get(self.config.remat)
        if policy is None:
            return self._forward(x, positions, shared_params, rng, memory, cross, k_valid)
        run = nnx.remat(Block._forward, policy=policy)
        return run(self, x, positions, shared_params, rng, memory, cross, k_valid)

    def _forward(
        self,
        x: jax.Array,
        positions: jax.Array,
        shared_params: Params,
        rng: jax.Array | None,
        memory: jax.Array | None,
        cross: CrossCache | None,
        k_valid: jax.Array | None,
    ) -> tuple[jax.Array, LayerCache]:
        """:meth:`forward`'s computation (its arguments, positional)."""
        rngs = self._rngs(rng)
        x = sharding.constrain(x, sharding.ACTIVATION)
        stream = x if memory is None else jnp.concatenate([memory, x], axis=1)  # [B, M + T, D]
        h = self._norm_in(self.attn_norm, stream)
        q, k, v = self.attn.qkv(h)
        q_pos = positions
        if memory is not None:  # queries from the segment only
            q, q_pos = q[:, memory.shape[1] :], positions[:, memory.shape[1] :]
        config = self.config
        implementation = config.attention_impl
        if k_valid is not None and implementation in ("xla", "cudnn", "pallas"):
            implementation = "auto"  # the kernels take no key mask; auto picks a path
        attn = self.attn(
            q,
            k,
            v,
            encoding=self.encoding,
            params=self._params(shared_params),
            q_pos=q_pos,
            k_pos=positions,
            causal=self.causal,
            implementation=implementation,
            block_size=config.attention_block_size,
            inputs=h,  # the layer input at the keys, for encoders that read it (log_decay)
            layer=self.layer,
            performer_features=config.performer_features,
            k_valid=k_valid,
            **self._options(),
        )
        out = sharding.constrain(self._finish(x, attn, rngs, cross), sharding.ACTIVATION)
        return out, LayerCache(h=h, k=k, v=v)

    def decode(
        self,
        x: jax.Array,
        cache: LayerCache,
        slot: jax.Array | int,
        positions: jax.Array,
        k_valid: jax.Array,
        shared_params: Params,
        cross: CrossCache | None = None,
    ) -> tuple[jax.Array, LayerCache]:
        """The block for one new token at cache slot ``slot``, attending over the cache
        (deterministic; causal blocks only).

        The new token's ``h``, ``k`` and ``v`` are written into the cache, then its query
        attends over every slot on the ``einsum`` path with ``k_valid`` masking the slots not
        yet filled (exactly, see :func:`posenc.attention.core.attend`): each encoder's hooks see the
        keys' positions and layer inputs as in a full pass over the filled slots.

        Args:
          x: ``[B, 1, D]`` float32 residual stream of the new token.
          cache: this layer's :class:`LayerCache` with ``S`` slots.
          slot: the new token's slot (an int or a traced scalar).
          positions: ``[B|1, S]`` integer positions of every slot.
          k_valid: ``[B|1, S]`` bool, the filled slots, the new one included and last.
          shared_params: the stack's shared encoder parameters (``{}`` if none).
          cross: the encoder output's keys and values (a block built with ``cross=True``).

        Returns:
          ``x`` after the block, ``[B, 1, D]`` float32, and the updated cache.
        """
        if x.shape[1] != 1:
            raise ValueError(f"Block.decode takes one new token, got x of shape {x.shape}")
        if not self.causal:
            raise ValueError("decoding with a key/value cache needs a causal block")
        self._check_cross(cross)
        h = self._norm_in(self.attn_norm, x)
        q, k, v = self.attn.qkv(h)
        cache = LayerCache(
            *(
                jax.lax.dynamic_update_slice_in_dim(old, new.astype(old.dtype), slot, axis=1)
                for old, new in zip(cache, (h, k, v), strict=True)
            )
        )
        attn = self.attn(
            q,
            cache.k,
            cache.v,
            encoding=self.encoding,
            params=self._params(shared_params),
            q_pos=jax.lax.dynamic_slice_in_dim(positions, slot, 1, axis=1),
            k_pos=positions,
            implementation="einsum",
            causal=True,
            inputs=cache.h,
            layer=self.layer,
            k_valid=k_valid,
            q_index=slot,
            **self._options(),
        )
        return self._finish(x, attn, (None, None, None), cross), cache

    def _check_cross(self, cross: CrossCache | None) -> None:
        if (cross is None) != (self.cross_attn is None):
            raise ValueError(
                "a block built with cross=True needs the encoder output (cross=...), and only "
                "such a block takes one"
            )

    def _rngs(self, rng: jax.Array | None) -> tuple[jax.Array | None, ...]:
        """Dropout keys for the attention, MLP and (if any) cross-attention branches."""
        if rng is None:
            return (None, None, None)
        if self.cross_attn is None:  # posenc's original two keys
            attn_rng, mlp_rng = jax.random.split(rng)
            return attn_rng, mlp_rng, None
        return tuple(jax.random.split(rng, 3))

    def _params(self, shared_params: Params) -> Params:
        """This layer's encoder parameters."""
        return shared_params if self.pos_params is None else values(self.pos_params)

    def _options(self) -> dict:
        """:func:`~posenc.attention.core.attend`'s keywords for the layer's attention options
        (none when it has the defaults, so the call is posenc's original one)."""
        if self.options.default:
            return {}
        return dict(options=self.options, learned=self.learned(), norm_eps=self.config.norm_eps)

    def learned(self) -> Params:
        """The attention options' learned parameters as attention reads them: QK-norm's scales
        as ``1 + w`` when the model's norms have a unit offset (stored as ``w``)."""
        learned = values(self.attn_params)
        if self.config.norm_unit_offset:
            learned = {k: 1.0 + v if k in NORM_SCALES else v for k, v in learned.items()}
        return learned

    def _norm_in(self, norm: nnx.Module | None, x: jax.Array) -> jax.Array:
        """A sublayer's input in the compute dtype: ``norm(x)`` (pre-norm, sandwich) or ``x``
        (post, post-branch)."""
        return (norm(x) if self.pre_norm else x).astype(self.config.dtype)

    def _residual(
        self, norm: nnx.Module | None, out_norm: nnx.Module | None, x: jax.Array, y: jax.Array, rng
    ) -> jax.Array:
        """``x + dropout(y)``, ``y`` normed first by ``out_norm`` (sandwich, post-branch) and
        the sum after by ``norm`` in a post-norm block; float32."""
        if out_norm is not None:
            y = out_norm(y)
        x = x + dropout(y, self.config.dropout, rng).astype(jnp.float32)
        return norm(x) if self.post_norm else x

    def _finish(
        self,
        x: jax.Array,
        attn: jax.Array,
        rngs: tuple[jax.Array | None, ...],
        cross: CrossCache | None,
    ) -> jax.Array:
        """Residuals, cross-attention and MLP after self-attention: ``x: [B, T, D]`` float32 (the
        block's input), ``attn: [B, T, D]`` -> ``[B, T, D]`` float32."""
        attn_rng, mlp_rng, cross_rng = rngs
        rate = self.config.dropout
        if self.parallel:  # both branches read the block's input
            norm = self.attn_norm if self.mlp_norm is None else self.mlp_norm
            mlp = self.mlp(self._norm_in(norm, x))
            x = x + dropout(attn, rate, attn_rng).astype(jnp.float32)
            return x + dropout(mlp, rate, mlp_rng).astype(jnp.float32)
        x = self._residual(self.attn_norm, self.attn_out_norm, x, attn, attn_rng)
        if cross is not None:
            config = self.config
            h = self._norm_in(self.cross_norm, x)
            y = self.cross_attn(
                h,
                cross,
                implementation=config.attention_impl,
                block_size=config.attention_block_size,
            )
            x = self._residual(self.cross_norm, self.cross_out_norm, x, y, cross_rng)
        y = self.mlp(self._norm_in(self.mlp_norm, x))
        return self._residual(self.mlp_norm, self.mlp_out_norm, x, y, mlp_rng)
