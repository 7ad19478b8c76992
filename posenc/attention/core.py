"""One attention function for every encoder: it applies whichever hooks the encoder has.

There is no dispatch on encoder names. The encoder's hooks (see :mod:`posenc.encodings.base`)
decide what enters the computation and, with the device and the lengths, which path runs:

- ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")``, the fused (flash) kernel on
  NVIDIA GPUs. Content-free biases and content logits enter through the kernel's bias input,
  which cuDNN takes only in the compute dtype: on this path they are rounded to ``q.dtype``.
- ``"xla"``: the same call with XLA's implementation (any device); the bias stays float32 (XLA
  adds it to float32 logits), so large biases such as ALiBi's at long distances keep their
  precision with bfloat16 queries and keys.
- ``"einsum"``: the reference: explicit logits, float32 softmax, explicit probabilities. With
  ``blocked``, the only path for encoders with a ``value_term`` (their output needs the
  probabilities) or ``contextual_logits`` (they need the logits).
- ``"blocked"``: the reference over ``block x block`` tiles of queries *and* keys with an online
  softmax (queries by ``lax.map``, keys by ``lax.scan``, from the last key tile to the first for
  ``contextual_logits``, which carry a running sum), so memory grows as ``T x block`` instead of
  ``T x S``; used for long evaluation windows.
- ``"pallas"``: our flash-attention kernel in Pallas (:mod:`posenc.attention.pallas`), with a
  content-free bias computed inside the kernel per tile (a per-distance table's band, or the
  encoder's ``bias`` on the tile's positions), the causal mask and windows by index, and a
  backward pass that recomputes on ``blocked``; Pallas's interpret mode off a GPU (slow: for
  tests). Explicit only: ``auto`` does not pick it until it is measured faster on a GPU.
- ``"auto"``: :func:`choose_implementation`.
- ``"linear"``, ``"linear_performer"``: linear attention (:mod:`posenc.attention.linear`), a
  different model rather than a faster path, so ``auto`` never picks one: kernel feature maps
  (``elu + 1``; FAVOR+ random features) with an encoder's ``rotate`` applied to the features
  (RoFormer eq. 19); encoders whose hooks enter the logits or need the probabilities are refused.

A ``log_decay`` encoder (the Forgetting Transformer) reads the layer input (``inputs``) and enters
every path as a bias ``c_i - c_j`` built from per-token cumulative sums, computed once per window.
A ``householder`` encoder (PaTH) reads it too and replaces ``q . k`` by the key carried through
the Householder maps up to the query (:mod:`posenc.attention.householder`): ``einsum`` or
``blocked`` only, like contextual logits.
A ``rotate`` that widens ``q`` and ``k`` (PoPE) keeps the ``1/sqrt(Dh)`` scale of the projected
width; the fused kernels, which need one width, get ``v`` padded with zero channels.

An encoder that declares ``normalized = False`` (stick-breaking attention) has weights
``exp(logits)`` with no softmax: ``einsum`` and ``blocked`` form them so (``auto`` picks one of
them); the fused kernels, linear attention and attention sinks refuse it.

Every path masks causally by index (key ``j`` is visible to query ``i`` when
``j <= i + S - T``), computes logits and softmax in float32 (on ``cudnn``, with the bias in the
compute dtype, as the kernel requires), and returns ``q``'s dtype.

Key validity (``k_valid``, the ``einsum`` and ``blocked`` paths): a key/value cache
(:mod:`posenc.decoding`) preallocates its slots and attends over all of them, so attention takes
a ``[B|1, S]`` mask of the keys that exist. An invalid key is removed exactly, as if it were not
in the window: its logit is masked (probability and CoPE gate exactly 0), its ``k``, ``v`` and
layer input are zeroed (garbage, even NaN, never reaches an output through ``0 * x``), its log
decay is zeroed (cumulative sums skip it), and its position is replaced by that of its row's
last valid key, so hooks that read statistics of the window's positions (xPos's centre, dynamic
NTK's span) see those of the valid keys. The causal mask stays by index, so the result equals
attention over the valid keys alone when the queries are the last ``T`` valid keys and no
invalid key follows the first query: a cache's single query (``T = 1``) at its last filled
slot, or invalid keys anywhere before the queries; without the causal mask, at every valid
query (a padded source in an encoder).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from posenc.attention import householder, pallas
from posenc.attention import linear as linear_attention
from posenc.attention.blocked import blocked
from posenc.attention.options import AttentionOptions, Window, qk_normalize, query_factor
from posenc.attention.terms import (
    NEG,
    LayerTerms,
    contextual,
    decay_bias,
    finish_logits,
    plain_terms,
    visibility,
    weights,
    window_bias,
)
from posenc.encodings.base import Encoding, Params

IMPLEMENTATIONS = (
    "auto",
    "einsum",
    "blocked",
    "xla",
    "cudnn",
    "pallas",
    *linear_attention.PATHS,
)
_FUSED = ("xla", "cudnn")
_PLAIN = AttentionOptions()


def cudnn_supports(head_dim: int, dtype: jnp.dtype, q_len: int, k_len: int, bias: bool) -> bool:
    """Whether cuDNN's fused attention takes these shapes (see ``check_is_flash_attention`` in
    ``jax._src.cudnn``): bf16/fp16, a head dimension that is a multiple of 8 and at most 128
    (256 on Hopper; 128 is the portable bound), and even lengths when a bias is trained."""
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    even = q_len % 2 == 0 and k_len % 2 == 0
    return half and head_dim % 8 == 0 and head_dim <= 128 and (even or not bias)


def choose_implementation(
    encoding: Encoding,
    q_len: int,
    dtype: jnp.dtype,
    block_size: int,
    platform: str | None = None,
    head_dim: int | None = None,
    k_len: int | None = None,
    options: AttentionOptions | None = None,
    causal: bool = True,
) -> str:
    """The path ``"auto"`` picks for this encoder, query length, dtype, platform, attention
    options and mask.

    - Encoders with a value term need the probabilities, with contextual logits or Householder
      products the logits: ``einsum``, or ``blocked`` past one block.
    - On an NVIDIA GPU, where cuDNN takes the shapes, encoders without content logits use
      ``cudnn``; with a bias (or a log decay, which enters as one) only up to one block of
      queries, since a dense ``[H, T, S]`` bias would make long windows quadratic in memory.
      Likewise a window the kernel cannot take as its own local window (:func:`_fused`: all but
      a sliding or banded window under the causal mask over as many keys as queries), which
      enters as a dense ``[T, S]`` mask.
    - Otherwise ``xla`` for windows of up to one block and ``blocked`` for longer ones (XLA's
      attention materialises ``[B, H, T, S]`` logits).
    - Attention sinks and soft-capping act inside the softmax, which the fused kernels do not
      expose: ``einsum`` or ``blocked``, as for a value term; so do unnormalised weights
      (``normalized = False``), which the kernels would normalise.
    """
    platform = platform or jax.default_backend()
    hooks = encoding.hooks
    long = q_len > block_size
    has_bias = "bias" in hooks or "log_decay" in hooks
    options = options or _PLAIN
    inside = bool(options.changes_logits())
    logits_needed = {"value_term", "contextual_logits", "householder"} & set(hooks)
    if logits_needed or inside or not encoding.normalized:
        return "blocked" if long else "einsum"
    gpu = platform in ("gpu", "cuda")
    masked = not _kernel_window(options.parsed_window, causal, q_len, k_len or q_len)
    if gpu and "content_logits" not in hooks and (not (has_bias or masked) or not long):
        if not head_dim:  # the width after `rotate`; an unbound encoder has none to check
            head_dim = encoding.qk_head_dim(encoding.dims.head_dim) if encoding.dims else 0
        if cudnn_supports(head_dim, dtype, q_len, k_len or q_len, has_bias):
            return "cudnn"
    return "blocked" if long else "xla"


def _kernel_window(window: Window, causal: bool, t: int, s: int) -> bool:
    """Whether the fused kernels take ``window`` without a ``[T, S]`` mask: no window, or a
    sliding (banded) one as their local window under the causal mask over ``t == s`` keys."""
    return window.full or (causal and t == s and window.kind in ("sliding", "banded"))


def check_implementation(
    encoding: Encoding, implementation: str, options: AttentionOptions | None = None
) -> None:
    """Raises a ``ValueError`` naming ``model.attention_impl`` if the path is unknown or cannot
    run ``encoding`` (a value term needs the probabilities and contextual logits need the logits,
    which the fused kernels never form) or the attention ``options`` (sinks and soft-capping act
    inside the softmax; linear attention has neither a softmax nor a window)."""
    options = options or _PLAIN
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"model.attention_impl must be one of {list(IMPLEMENTATIONS)}, got {implementation!r}"
        )
    if not encoding.normalized:
        _check_unnormalized(encoding, implementation, options)
    if implementation in _FUSED and "value_term" in encoding.hooks:
        raise ValueError(
            f"model.attention_impl={implementation!r} cannot run encoding {encoding.name!r}: "
            "its value term needs the attention probabilities; use 'auto', 'einsum' or 'blocked'"
        )
    if implementation in _FUSED and "contextual_logits" in encoding.hooks:
        raise ValueError(
            f"model.attention_impl={implementation!r} cannot run encoding {encoding.name!r}: "
            "its contextual logits need the attention logits; use 'auto', 'einsum' or 'blocked'"
        )
    if implementation in _FUSED and "householder" in encoding.hooks:
        raise ValueError(
            f"model.attention_impl={implementation!r} cannot run encoding {encoding.name!r}: "
            "its Householder products change q . k per pair; use 'auto', 'einsum' or 'blocked'"
        )
    inside = options.changes_logits()
    if implementation in _FUSED and inside:
        raise ValueError(
            f"model.attention_impl={implementation!r} cannot take {options.prefix}."
            f"{inside[0]}: the fused kernels do not expose the softmax; use 'auto', 'einsum' or "
            "'blocked'"
        )
    if implementation == "pallas":
        _check_pallas(encoding, options)
    if implementation in linear_attention.PATHS:
        reason = linear_attention.refusal(encoding)
        if reason:
            raise ValueError(
                f"model.attention_impl={implementation!r} cannot run encoding {encoding.name!r}: "
                f"{reason}"
            )
        changed = [
            f.name
            for f in dataclasses.fields(AttentionOptions)
            if f.name != "prefix" and getattr(options, f.name) != getattr(_PLAIN, f.name)
        ]
        if changed:
            raise ValueError(
                f"model.attention_impl={implementation!r} takes no attention options (it has no "
                f"softmax over keys); got {options.prefix}.{changed[0]}="
                f"{getattr(options, changed[0])!r}"
            )


def _check_pallas(encoding: Encoding, options: AttentionOptions) -> None:
    """The refusals of the ``pallas`` kernel: hooks it cannot compute from positions
    (:func:`posenc.attention.pallas.refusal`) and attention sinks (soft-capping it takes)."""
    reason = pallas.refusal(encoding)
    if reason:
        raise ValueError(
            f"model.attention_impl='pallas' cannot run encoding {encoding.name!r}: {reason}; "
            "use 'auto', 'einsum' or 'blocked'"
        )
    if options.sinks:
        raise ValueError(
            f"model.attention_impl='pallas' cannot take {options.prefix}.sinks: the kernel has "
            "no sink logit in its softmax; use 'auto', 'einsum' or 'blocked'"
        )


def _check_unnormalized(encoding: Encoding, implementation: str, options: AttentionOptions):
    """The refusals of an encoder whose weights are ``exp(logits)`` without a softmax
    (``normalized = False``): the fused kernels and linear attention normalise inside, and a
    sink is a share of a softmax's denominator."""
    if implementation in (*_FUSED, *linear_attention.PATHS):
        raise ValueError(
            f"model.attention_impl={implementation!r} cannot run encoding {encoding.name!r}: its "
            "weights are exp(logits) without a softmax (normalized = False), which this path "
            "always normalises; use 'auto', 'einsum' or 'blocked'"
        )
    if options.sinks:
        raise ValueError(
            f"{options.prefix}.sinks={options.sinks!r} cannot go with encoding "
            f"{encoding.name!r}: a sink takes a share of a softmax's denominator, and its weights "
            "are exp(logits) without one (normalized = False); use sinks=False"
        )


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    encoding: Encoding,
    params: Params,
    q_pos: jax.Array,
    k_pos: jax.Array,
    causal: bool = True,
    implementation: str = "auto",
    block_size: int = 512,
    inputs: jax.Array | None = None,
    layer: int = 0,
    performer_features: int = 256,
    k_valid: jax.Array | None = None,
    options: AttentionOptions | None = None,
    learned: Params | None = None,
    q_index: jax.Array | int | None = None,
    norm_eps: float = 1e-6,
) -> jax.Array:
    """Multi-head attention with a positional encoder's hooks and a layer's attention options
    applied.

    Args:
      q: ``[B, T, H, Dh]`` queries (already projected).
      k: ``[B, S, H, Dh]`` keys.
      v: ``[B, S, H, Dh]`` values.
      encoding: a bound encoder; only its hooks are used.
      params: the encoder's parameters for this layer (``{}`` if it has none).
      q_pos: ``[B, T]``, ``[1, T]`` or ``[T]`` integer query positions.
      k_pos: ``[B, S]``, ``[1, S]`` or ``[S]`` integer key positions.
      causal: mask keys after the query (aligned so the last query sees the last key).
      implementation: one of ``IMPLEMENTATIONS``.
      block_size: queries per block for the ``blocked`` path (and the ``auto`` threshold);
        tokens per chunk of the linear paths' causal prefix sums.
      inputs: ``[B, S, D]``, the layer input at the keys; read only by a ``log_decay`` or
        ``householder`` hook, which requires it.
      layer: the layer index; ``linear_performer`` draws its fixed random features from it.
      performer_features: ``linear_performer``'s number of random features ``m``.
      k_valid: ``[B|1, S]`` bool, the keys that exist (None: all); invalid keys are removed
        exactly (module docstring). Only on ``einsum`` and ``blocked`` (``auto`` picks one).
      options: the layer's :class:`~posenc.attention.options.AttentionOptions` (window, sinks,
        QK-norm, temperature, Scalable-Softmax, soft cap, logit scale); None: none.
      learned: the options' learned parameters (``q_norm``, ``k_norm``, ``sinks``, ``ssmax``:
        :meth:`AttentionOptions.learned`); ``{}`` or None when they have none.
      q_index: the key index of the first query (the mask's alignment); None: ``S - T``, the
        last query at the last key. A cache's query sits at its slot (``einsum`` only).
      norm_eps: QK-norm's epsilon.

    Returns:
      ``[B, T, H, Dh]`` in ``q.dtype``.
    """
    options = options or _PLAIN
    learned = learned or {}
    check_implementation(encoding, implementation, options)
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"model.attention_block_size must be a positive integer, got {block_size}")
    q_pos = jnp.atleast_2d(q_pos).astype(jnp.int32)  # [B|1, T]
    k_pos = jnp.atleast_2d(k_pos).astype(jnp.int32)  # [B|1, S]
    if k_valid is not None or q_index is not None:
        if implementation not in ("auto", "einsum", "blocked"):
            what = "k_valid" if k_valid is not None else "q_index"
            raise ValueError(
                f"attend({what}=...) runs on 'einsum', 'blocked' or 'auto', not "
                f"implementation={implementation!r}"
            )
    if k_valid is not None:
        k, v, k_pos, inputs, k_valid = _remove_invalid(k, v, k_pos, inputs, k_valid)
    params = encoding.window_params(params)  # once per call, before any path tiles the window
    if implementation in linear_attention.PATHS:  # `rotate` applies to the features there
        return linear_attention.attend_linear(
            q,
            k,
            v,
            encoding=encoding,
            params=params,
            q_pos=q_pos,
            k_pos=k_pos,
            causal=causal,
            implementation=implementation,
            chunk_size=block_size,
            layer=layer,
            performer_features=performer_features,
        )
    t, s = q.shape[1], k.shape[1]
    first = s - t if q_index is None else q_index
    # The logit scale belongs to the projected width, also when `rotate` widens q and k (PoPE).
    head_dim = q.shape[-1]
    q, k = prepare_qk(
        q, k, encoding, params, q_pos, k_pos, options, learned, causal, first, norm_eps, k_valid
    )
    decay = cumulative_decay(encoding, params, inputs, t, s, k_valid)
    moves = householder.factors(encoding, params, inputs, s, k_valid)
    if implementation == "auto":
        implementation = choose_implementation(
            encoding,
            t,
            q.dtype,
            block_size,
            head_dim=q.shape[-1],
            k_len=s,
            options=options,
            causal=causal,
        )
        if (k_valid is not None or q_index is not None) and implementation in _FUSED:
            implementation = "einsum"  # the kernels take no key mask and one alignment
    terms = layer_terms(options, learned, head_dim)
    if q_index is not None and implementation == "blocked":
        implementation = "einsum"  # a cache's single query: one block
    args = (encoding, params, q_pos, k_pos, causal, terms, decay)
    if implementation in _FUSED:
        return _fused(q, k, v, *args, implementation)
    if implementation == "pallas":
        return pallas.flash(q, k, v, encoding, params, q_pos, k_pos, causal, terms, block_size)
    if implementation == "blocked" and t > block_size:
        return blocked(q, k, v, *args, block_size, k_valid, factors=moves)
    return _reference(q, k, v, *args, k_valid, first, moves)


def layer_terms(options: AttentionOptions, learned: Params, head_dim: int) -> LayerTerms:
    """The :class:`~posenc.attention.terms.LayerTerms` of a layer's options: its window, the
    logits' divisor (``sqrt(head_dim)``, or ``1 / logit_scale``), soft cap and sink logits."""
    if options is _PLAIN or options.default:
        return plain_terms(head_dim)
    denom = 1.0 / options.logit_scale if options.logit_scale else math.sqrt(head_dim)
    sinks = learned["sinks"].astype(jnp.float32) if options.sinks else None
    return LayerTerms(options.parsed_window, denom, float(options.softcap), sinks)


def prepare_qk(
    q: jax.Array,
    k: jax.Array,
    encoding: Encoding,
    params: Params,
    q_pos: jax.Array,
    k_pos: jax.Array,
    options: AttentionOptions,
    learned: Params,
    causal: bool,
    first: jax.Array | int,
    norm_eps: float,
    k_valid: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The queries and keys that meet in the logits: QK-norm before or after the encoder's
    ``rotate`` (as the options place it), then the query factor of the temperature and
    Scalable-Softmax (:func:`~posenc.attention.options.query_factor`).

    ``first``: the key index of the first query (the alignment of the mask); ``k_valid``:
    ``[B|1, S]`` bool, the keys that exist (None: all), the only ones Scalable-Softmax counts."""
    norm = options.qk_norm
    if norm != "none" and options.qk_norm_placement == "before_rotate":
        q, k = _qk_norm(q, k, norm, learned, norm_eps)
    if "rotate" in encoding.hooks:
        q, k = encoding.rotate(params, q, k, q_pos, k_pos)
    if norm != "none" and options.qk_norm_placement == "after_rotate":
        q, k = _qk_norm(q, k, norm, learned, norm_eps)
    q_index = first + jnp.arange(q.shape[1])
    factor = query_factor(options, learned, q_pos, q_index, k.shape[1], causal, k_valid)
    if factor is not None:
        q = (q.astype(jnp.float32) * factor).astype(q.dtype)
    return q, k


def _qk_norm(q, k, norm, learned, eps):
    """QK-norm of ``q`` and ``k`` over their channels (the RMSNorms with the learned scales)."""
    width = q.shape[-1] * (q.shape[-2] if norm == "rms_all_heads" else 1)
    if norm in ("rms", "rms_all_heads") and learned["q_norm"].shape[-1] != width:
        raise ValueError(
            f"qk_norm={norm!r} has scales of width {learned['q_norm'].shape[-1]}, but the "
            f"queries have {width} channels here (an encoder whose rotate widens them needs "
            "qk_norm_placement='before_rotate')"
        )
    return (
        qk_normalize(q, norm, learned.get("q_norm"), eps),
        qk_normalize(k, norm, learned.get("k_norm"), eps),
    )


def _remove_invalid(k, v, k_pos, inputs, k_valid):
    """Zeroes invalid keys' ``k``, ``v`` and layer input and moves them to the position of their
    row's last valid key (module docstring); returns those and ``k_valid`` as ``[B|1, S]``
    bool."""
    k_valid = jnp.atleast_2d(k_valid).astype(bool)  # [B|1, S]
    if k_valid.shape[-1] != k.shape[1]:
        raise ValueError(f"attend: k_valid has {k_valid.shape[-1]} keys, k has {k.shape[1]}")
    mask = k_valid[:, :, None, None]  # [B|1, S, 1, 1]
    k = jnp.where(mask, k, jnp.zeros((), k.dtype))
    v = jnp.where(mask, v, jnp.zeros((), v.dtype))
    if inputs is not None:
        inputs = jnp.where(k_valid[:, :, None], inputs, jnp.zeros((), inputs.dtype))
    # Invalid keys take the position of their row's last valid key (the cache's newest token,
    # a padded window's last real one), so statistics of the positions are the valid keys'.
    rows = max(k_pos.shape[0], k_valid.shape[0])
    last = k_valid.shape[1] - 1 - jnp.argmax(k_valid[:, ::-1], axis=1)  # [B|1]
    last = jnp.broadcast_to(last, (rows,))[:, None]  # [B, 1]
    last_pos = jnp.take_along_axis(jnp.broadcast_to(k_pos, (rows, k_pos.shape[1])), last, 1)
    k_pos = jnp.where(k_valid, k_pos, last_pos)  # [B|1, S]
    return k, v, k_pos, inputs, k_valid


def cumulative_decay(
    encoding: Encoding,
    params: Params,
    inputs: jax.Array | None,
    t: int,
    s: int,
    k_valid: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array] | None:
    """``(c at the queries [B, T, H], c at the keys [B, S, H])``, float32, where
    ``c_j = sum_{l <= j} log_decay_l`` over the window's valid keys (``k_valid [B|1, S]``, None:
    all), the queries being the last ``T`` of the ``S`` keys; None for an encoder without the
    hook. ``inputs``: ``[B, S, D]``, the layer input at the keys."""
    if "log_decay" not in encoding.hooks:
        return None
    if inputs is None or inputs.ndim != 3 or inputs.shape[1] != s:
        got = None if inputs is None else tuple(inputs.shape)
        raise ValueError(
            f"encoding {encoding.name!r} reads the layer input (its log_decay hook): attend needs "
            f"inputs=[B, S={s}, D], got {got}"
        )
    log_decay = encoding.log_decay(params, inputs).astype(jnp.float32)  # [B, S, H]
    if k_valid is not None:
        log_decay = jnp.where(k_valid[:, :, None], log_decay, 0.0)
    c = jnp.cumsum(log_decay, axis=1)  # [B, S, H]
    return c[:, s - t :], c


def _logits(q, k, encoding, params, q_pos, k_pos, terms, decay, moves=None, first=0):
    """Float32 logits ``[B, H, T, S]`` with the encoder's content logits, bias and decay, and
    the layer's soft cap, unmasked; ``moves``: the ``householder`` factors (the queries at key
    indices from ``first``), or None."""
    hooks = encoding.hooks
    if moves is not None:
        index = first + jnp.arange(q.shape[1])
        logits, _ = householder.transported_logits(q, k, *moves, index)
    else:
        logits = jnp.einsum("BTHD,BSHD->BHTS", q, k, preferred_element_type=jnp.float32)
    if "content_logits" in hooks:
        logits = logits + encoding.content_logits(params, q, k, q_pos, k_pos).astype(jnp.float32)
    logits = logits / terms.denom
    if "bias" in hooks:
        logits = logits + encoding.bias(params, q_pos, k_pos).astype(jnp.float32)
    if decay is not None:
        logits = logits + decay_bias(decay)
    return finish_logits(logits, terms)


def reference_logits(
    q: jax.Array,
    k: jax.Array,
    *,
    encoding: Encoding,
    params: Params,
    q_pos: jax.Array,
    k_pos: jax.Array,
    causal: bool,
    head_dim: int,
    decay: tuple[jax.Array, jax.Array] | None = None,
    k_valid: jax.Array | None = None,
    q_start: int | jax.Array = 0,
    total_t: int | None = None,
    terms: LayerTerms | None = None,
    q_index: int | jax.Array | None = None,
    moves: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The logits the reference path's softmax reads, for some or all of a window's queries.

    Scaled, with the encoder's content logits, bias, decay and contextual logits and the layer's
    soft cap, masked pairs (the causal mask, the window, invalid keys) at ``-1e30``; the queries'
    rows are independent, so a block of them gives the rows of the whole window exactly
    (:mod:`posenc.analysis` reads long windows so, in query blocks). A layer's sinks enter the
    softmax (:func:`posenc.attention.terms.softmax`), not the logits.

    Args:
      q: ``[B, t, H, Dh']`` queries ``q_start .. q_start + t - 1`` of the window's ``total_t``,
        after :func:`prepare_qk` (applied to the whole window: some rotations read all its
        positions).
      k: ``[B, S, H, Dh']`` keys after :func:`prepare_qk`.
      encoding, params: the bound encoder and its parameters.
      q_pos: ``[B|1, t]`` the queries' positions; k_pos: ``[B|1, S]``.
      causal: mask keys after the query (the window's last query sees the last key).
      head_dim: the projected width (the logit scale is ``1/sqrt(head_dim)`` unless ``terms``
        say otherwise).
      decay: :func:`cumulative_decay` sliced to these queries, or None.
      k_valid: ``[B|1, S]`` bool, the keys that exist (None: all).
      q_start: the first query's index in the window (an int or a traced scalar).
      total_t: the window's queries (default ``t``).
      terms: the layer's :class:`~posenc.attention.terms.LayerTerms` (None: no options).
      q_index: the key index of the window's first query (None: ``S - total_t``).
      moves: :func:`posenc.attention.householder.factors` of the window (required by an
        encoder with a ``householder`` hook).

    Returns:
      ``[B, H, t, S]`` float32 logits and the ``[B|1, 1, t, S]`` bool mask of visible pairs.
    """
    t, s = q.shape[1], k.shape[1]
    total_t = t if total_t is None else total_t
    terms = plain_terms(head_dim) if terms is None else terms
    first = (s - total_t if q_index is None else q_index) + q_start
    if moves is None and "householder" in encoding.hooks:
        raise ValueError(
            f"reference_logits: encoding {encoding.name!r} has a householder hook; pass "
            "moves=posenc.attention.householder.factors(...) of the window"
        )
    logits = _logits(q, k, encoding, params, q_pos, k_pos, terms, decay, moves, first)
    pairs = visibility(t, s, first, causal, terms.window)
    visible = jnp.ones((1, 1, t, s), bool) if pairs is None else pairs[None, None]
    if k_valid is not None:
        visible = visible & k_valid[:, None, None, :]  # [B|1, 1, t, S]
    if pairs is not None or k_valid is not None:
        logits = jnp.where(visible, logits, NEG)
    if "contextual_logits" in encoding.hooks:
        carry = jnp.zeros((q.shape[0], q.shape[2], t), jnp.float32)  # [B, H, t]
        logits, _ = contextual(q, k, logits, visible, carry, encoding, params)
    return logits, visible


def _reference(
    q,
    k,
    v,
    encoding,
    params,
    q_pos,
    k_pos,
    causal,
    terms,
    decay,
    k_valid=None,
    first=None,
    moves=None,
):
    """Explicit logits and probabilities; the definition every other path is tested against."""
    logits, _ = reference_logits(
        q,
        k,
        encoding=encoding,
        params=params,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        head_dim=q.shape[-1],
        decay=decay,
        k_valid=k_valid,
        terms=terms,
        q_index=first,
        moves=moves,
    )
    probs = weights(logits, terms.sinks, encoding.normalized)  # [B, H, T, S] float32
    out = jnp.einsum("BHTS,BSHD->BTHD", probs.astype(v.dtype), v)
    if "value_term" in encoding.hooks:
        out = out + encoding.value_term(params, probs, q_pos, k_pos).astype(out.dtype)
    return out.astype(q.dtype)


def _fused(q, k, v, encoding, params, q_pos, k_pos, causal, terms, decay, implementation):
    """``jax.nn.dot_product_attention`` with the encoder's logits as its bias input.

    The bias is summed in float32. XLA's implementation adds it to its float32 logits as it is;
    cuDNN requires the bias in the compute dtype, so only that path rounds it to ``q.dtype``.
    The kernels take one width for ``q``, ``k`` and ``v``: when ``rotate`` changed the width of
    ``q`` and ``k``, the narrower side is padded with zero channels, which change neither
    ``q . k`` nor ``p . v``, and the output is cut back to ``v``'s width.

    A window enters as the kernel's local window where it has one (a sliding window over a
    square causal window: cuDNN's sliding-window attention) and as a mask otherwise.
    """
    hooks = encoding.hooks
    t, s = q.shape[1], k.shape[1]
    bias = None
    if "content_logits" in hooks:
        content = encoding.content_logits(params, q, k, q_pos, k_pos).astype(jnp.float32)
        bias = content / terms.denom
    if "bias" in hooks:
        extra = window_bias(encoding, params, q_pos, k_pos)
        bias = extra if bias is None else bias + extra
    if decay is not None:
        extra = decay_bias(decay)
        bias = extra if bias is None else bias + extra
    if bias is not None and implementation == "cudnn":
        bias = bias.astype(q.dtype)
    window = terms.window
    mask, local, is_causal = None, None, causal and t == s
    if not window.full and _kernel_window(window, causal, t, s):
        local = (window.size - 1, 0)  # the kernel's own local window
    elif (causal and t != s) or not window.full:
        mask = visibility(t, s, s - t, causal, window)[None, None]  # [1, 1, T, S]
        is_causal = False
    width, v_width = max(q.shape[-1], v.shape[-1]), v.shape[-1]
    q, k, v = (_pad_channels(x, width) for x in (q, k, v))
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias=bias,
        mask=mask,
        scale=1.0 / terms.denom,
        is_causal=is_causal,
        local_window_size=local,
        implementation=implementation,
    )
    return out if width == v_width else out[..., :v_width]


def _pad_channels(x: jax.Array, width: int) -> jax.Array:
    """Pads the last axis of ``x`` with zeros to ``width``."""
    pad = width - x.shape[-1]
    return jnp.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, pad),)) if pad else x
