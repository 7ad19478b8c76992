"""Linear attention: the ``linear`` and ``linear_performer`` attention paths.

Softmax attention weighs key ``j`` for query ``i`` by ``exp(q_i . k_j / sqrt(Dh))``. Kernelised
attention replaces that weight by ``phi(q_i) . phi(k_j)`` for a feature map ``phi`` into ``m``
non-negative features, so the sums over keys factor through ``[m, Dh]`` states and cost
``O(T m Dh)`` instead of ``O(T^2 Dh)``::

    out_i = sum_j (phi(q_i) . phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j)
          = phi(q_i) . (sum_j phi(k_j) v_j^T) / phi(q_i) . (sum_j phi(k_j))

Two feature maps:

- ``"linear"`` — Katharopoulos, Vyas, Pappas, Fleuret 2020, *Transformers are RNNs: Fast
  Autoregressive Transformers with Linear Attention* (Sec. 3.2.1): ``phi(x) = elu(x) + 1``,
  ``m = Dh``, deterministic, no ``1/sqrt(Dh)`` scale (as the authors' ``fast-transformers``
  ``LinearAttention``).
- ``"linear_performer"`` — FAVOR+, Choromanski et al. 2021, *Rethinking Attention with
  Performers* (Lemma 1, positive random features; Sec. 2.4, orthogonal ones):
  ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)`` at ``x = q Dh^(-1/4)`` and at ``x = k Dh^(-1/4)``,
  so that ``E[phi(q') . phi(k')] = exp(q . k / sqrt(Dh))``, the softmax kernel. The ``m`` rows
  of ``W`` (``model.performer_features``, 256 by default as ``make_fast_softmax_attention`` in
  the authors' ``google-research/performer``) are drawn in blocks of ``Dh`` orthonormal rows (QR
  of a Gaussian matrix, signs fixed by ``diag(R)`` so each block is Haar distributed; Mezzadri
  2007), each row rescaled to the norm of an independent ``N(0, I_Dh)`` vector (the authors'
  ``GaussianOrthogonalRandomMatrix`` with ``scaling=0``), so each ``w_i`` is ``N(0, I)``.

Random features are fixed, not redrawn: layer ``l`` draws ``W`` from
``fold_in(key(FEATURE_SEED), l)`` (:func:`layer_projection`), the same in training, evaluation
and on every device, independent of ``config.seed`` (so the seeds of a sweep share one draw). They
are not stored: evaluation draws them again, so it needs a JAX whose ``jax.random`` stream is the
training one's (the signs fixed by ``diag(R)`` make the QR itself unique). The Performer's
optional redrawing (its code redraws on every call; lucidrains' ``performer-pytorch`` every
``feature_redraw_interval`` steps) is not implemented.

Positions (RoFormer, Su et al. 2021, Sec. 3.3, eq. 19): an encoder that only rotates (RoPE,
xPos) has its ``rotate`` hook applied to the *feature-mapped* queries and keys in the numerator,
while the denominator keeps the unrotated features::

    out_i = sum_j (R_i phi(q_i)) . (R_j phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j)

so ``rotate`` receives ``[.., m]`` features (``m = Dh`` for ``linear``), and must rotate any
width (RoPE and xPos take their frequencies from it). Encoders with only ``embed`` (sinusoidal,
learned) and NoPE run unchanged. Everything else is refused (:func:`refusal`): biases, content
logits, decays and contextual logits add to logits that linear attention never forms, a value
term needs the probabilities, and a ``rotate`` that widens ``q`` and ``k`` (PoPE) is not a
rotation of its input, so eq. (19)'s unrotated denominator would not normalise its numerator.

Causal attention (key ``j`` visible to query ``i`` when ``j <= i + S - T``) runs in chunks of
``chunk_size`` tokens: inside a chunk the explicit masked ``[chunk, chunk]`` products, across
chunks the running sums ``sum_j R_j phi(k_j) v_j^T`` and ``sum_j phi(k_j)`` carried by
``lax.scan``, so memory grows linearly with the window. Bidirectional attention uses the global
sums. Everything is float32; the output has ``q``'s dtype.

Numerical stability of FAVOR+ (the exponentials overflow float32 for large ``|x|``): the
authors' code subtracts a maximum before ``exp``, per query for queries and over all keys *and
positions* for keys, which makes a causal query's features depend on later keys. Here the
shifts are exact and causal. A query's features are shifted by their own maximum (a factor per
query, which cancels between numerator and denominator). A key's features are shifted by their
own maximum ``c_j`` too, and ``c_j`` is kept as a log weight: key ``j`` weighs
``exp(c_j) phi~(q_i) . phi~(k_j)``, and the sums over keys are kept relative to the running
maximum of ``c`` over the keys a query sees (rescaled as it grows, like the online softmax of the
``blocked`` path), so every exponent is ``<= 0`` and the largest visible key weighs 1. The shifts
are excluded from differentiation (they cancel exactly, so their true derivative is zero).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from posenc.encodings.base import Encoding, Params

PATHS = ("linear", "linear_performer")
# Layer l draws its random features from fold_in(key(FEATURE_SEED), l).
FEATURE_SEED = 0

# Hooks that enter the logits or need the probabilities, and why linear attention cannot take them.
_REFUSED = {
    "bias": "its bias adds to the attention logits",
    "content_logits": "its content logits add to the attention logits",
    "log_decay": "its decay adds to the attention logits",
    "householder": "its Householder products change q . k per pair",
    "contextual_logits": "its contextual logits need the attention logits",
    "value_term": "its value term needs the attention probabilities",
}


def refusal(encoding: Encoding) -> str | None:
    """Why the linear paths cannot run ``encoding``, or None when they can (input-level terms:
    ``embed``, ``embed_tokens``, ``augment_positions``; and a width-preserving ``rotate``)."""
    for hook, why in _REFUSED.items():
        if hook in encoding.hooks:
            return f"{why}, which linear attention never forms; use a softmax path (e.g. 'auto')"
    width = encoding.dims.head_dim if encoding.dims else 64
    if "rotate" in encoding.hooks and encoding.qk_head_dim(width) != width:
        return (
            "its rotate widens q and k (qk_head_dim) rather than rotating them, so RoFormer eq. "
            "(19)'s unrotated denominator would not normalise its numerator; use a softmax path"
        )
    if "rotate" in encoding.hooks and encoding.key_lookback:
        return (
            f"its rotate mixes each key with the {encoding.key_lookback} before it "
            "(key_lookback), which is not a rotation of the features, so RoFormer eq. (19)'s "
            "unrotated denominator would not normalise its numerator; use a softmax path"
        )
    return None


# -- feature maps -----------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(1, 2))
def performer_projection(key: jax.Array, num_features: int, dim: int) -> jax.Array:
    """FAVOR+'s block-orthogonal Gaussian projection (module docstring).

    Args:
      key: a JAX PRNG key.
      num_features: ``m`` rows.
      dim: ``Dh`` columns (the per-head width of ``q`` and ``k``).

    Returns:
      ``[m, Dh]`` float32: blocks of ``Dh`` orthogonal rows (the last block cut to ``m``), each
      row with the norm of an independent standard Gaussian vector.
    """
    blocks = -(-num_features // dim)
    block_keys = jax.random.split(jax.random.fold_in(key, 0), blocks)
    gaussian = jax.vmap(lambda k: jax.random.normal(k, (dim, dim), jnp.float32))(block_keys)
    q, r = jnp.linalg.qr(gaussian)  # [N, Dh, Dh] each
    # Q diag(sign(diag R)) is Haar distributed (the plain QR output is not); rows of Q^T.
    signs = jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))  # [N, Dh]
    rows = (q * signs[:, None, :]).swapaxes(-1, -2).reshape(blocks * dim, dim)[:num_features]
    norms = jax.random.normal(jax.random.fold_in(key, 1), (num_features, dim), jnp.float32)
    return rows * jnp.linalg.norm(norms, axis=-1, keepdims=True)


def layer_projection(layer: int, num_features: int, dim: int) -> jax.Array:
    """Layer ``layer``'s fixed FAVOR+ projection ``[m, Dh]``: :func:`performer_projection` of
    ``fold_in(key(FEATURE_SEED), layer)``, evaluated once when traced (a constant of the
    compiled program)."""
    with jax.ensure_compile_time_eval():
        key = jax.random.fold_in(jax.random.key(FEATURE_SEED), layer)
        return performer_projection(key, num_features, dim)


def elu_features(x: jax.Array) -> jax.Array:
    """Katharopoulos et al.'s ``elu(x) + 1``, float32, same shape."""
    return jax.nn.elu(x.astype(jnp.float32)) + 1.0


def favor_logits(x: jax.Array, projection: jax.Array) -> jax.Array:
    """``log(sqrt(m) phi(x)) = W x' - |x'|^2 / 2`` with ``x' = x Dh^(-1/4)``: ``[.., Dh]`` ->
    ``[.., m]`` float32."""
    x = x.astype(jnp.float32) * x.shape[-1] ** -0.25
    wx = jnp.einsum("...D,MD->...M", x, projection, precision=jax.lax.Precision.HIGHEST)
    return wx - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)


def _shifted(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``exp(u - max u) / sqrt(m)`` over the last axis and the (undifferentiated) maximum."""
    top = jax.lax.stop_gradient(logits.max(axis=-1))
    return jnp.exp(logits - top[..., None]) / math.sqrt(logits.shape[-1]), top


# -- the path ---------------------------------------------------------------------------------


def attend_linear(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    encoding: Encoding,
    params: Params,
    q_pos: jax.Array,
    k_pos: jax.Array,
    causal: bool,
    implementation: str,
    chunk_size: int,
    layer: int = 0,
    performer_features: int = 256,
) -> jax.Array:
    """Linear attention with RoFormer eq. (19) for a rotating encoder (module docstring).

    Args:
      q: ``[B, T, H, Dh]`` queries, the last ``T`` of the ``S`` keys.
      k: ``[B, S, H, Dh]`` keys.
      v: ``[B, S, H, Dv]`` values.
      encoding: a bound encoder the path accepts (:func:`refusal` is None).
      params: its parameters for this layer.
      q_pos, k_pos: ``[B|1, T]``, ``[B|1, S]`` integer positions.
      causal: mask keys after the query.
      implementation: ``"linear"`` or ``"linear_performer"``.
      chunk_size: tokens per chunk of the causal prefix sums.
      layer: the layer index, which fixes ``linear_performer``'s random features.
      performer_features: ``m``, ``linear_performer``'s number of random features.

    Returns:
      ``[B, T, H, Dv]`` in ``q.dtype``.
    """
    if implementation == "linear":
        fq, fk = elu_features(q), elu_features(k)
        key_log_weight = jnp.zeros(k.shape[:3], jnp.float32)  # [B, S, H]
    elif implementation == "linear_performer":
        if not isinstance(performer_features, int) or performer_features < 1:
            raise ValueError(
                f"model.performer_features must be a positive integer, got {performer_features!r}"
            )
        projection = layer_projection(layer, performer_features, q.shape[-1])  # [m, Dh]
        fq, _ = _shifted(favor_logits(q, projection))  # [B, T, H, m]
        fk, key_log_weight = _shifted(favor_logits(k, projection))  # [B, S, H, m], [B, S, H]
    else:
        raise ValueError(f"not a linear attention path: {implementation!r}")
    rq, rk = fq, fk
    if "rotate" in encoding.hooks:
        rq, rk = _rotate_features(encoding, params, fq, fk, q_pos, k_pos, implementation)
    v = v.astype(jnp.float32)
    if causal:
        out = _causal(fq, fk, rq, rk, v, key_log_weight, chunk_size)
    else:
        out = _bidirectional(fq, fk, rq, rk, v, key_log_weight)
    return out.astype(q.dtype)


def _rotate_features(encoding, params, fq, fk, q_pos, k_pos, implementation):
    """The encoder's ``rotate`` on the features, with a clear error if it cannot take them."""
    width = fq.shape[-1]
    try:
        rq, rk = encoding.rotate(params, fq, fk, q_pos, k_pos)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"model.attention_impl={implementation!r}: encoding {encoding.name!r}'s rotate "
            f"cannot rotate the {width} features per head of this path ({err}); with "
            "'linear_performer' set model.performer_features to the head width"
        ) from err
    if rq.shape != fq.shape or rk.shape != fk.shape:
        raise ValueError(
            f"model.attention_impl={implementation!r}: encoding {encoding.name!r}'s rotate "
            f"changed the feature shapes {fq.shape}, {fk.shape} to {rq.shape}, {rk.shape}"
        )
    return rq.astype(jnp.float32), rk.astype(jnp.float32)


def _bidirectional(fq, fk, rq, rk, v, key_log_weight):
    """Every query sees every key: global sums, relative to the largest key log weight."""
    top = key_log_weight.max(axis=1)  # [B, H]
    weight = jnp.exp(key_log_weight - top[:, None, :])  # [B, S, H]
    state = jnp.einsum("BSHM,BSH,BSHD->BHMD", rk, weight, v)  # sum_j w_j R_j phi(k_j) v_j^T
    norm = jnp.einsum("BSHM,BSH->BHM", fk, weight)  # sum_j w_j phi(k_j)
    num = jnp.einsum("BTHM,BHMD->BTHD", rq, state)
    den = jnp.einsum("BTHM,BHM->BTH", fq, norm)
    return num / den[..., None]


def _to_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """``[B, N * chunk, ...]`` -> ``[N, B, chunk, ...]``."""
    return x.reshape(x.shape[0], x.shape[1] // chunk, chunk, *x.shape[2:]).swapaxes(0, 1)


def _pad(x: jax.Array, size: int, value: float = 0.0) -> jax.Array:
    """Pads axis 1 of ``x`` with ``value`` to ``size``."""
    pad = ((0, 0), (0, size - x.shape[1])) + ((0, 0),) * (x.ndim - 2)
    return jnp.pad(x, pad, constant_values=value)


# A log weight far below any real one for padded keys (they have zero features as well).
_NEG = -1e30


def _causal(fq, fk, rq, rk, v, key_log_weight, chunk_size):
    """Causal prefix sums in chunks of ``chunk_size`` queries and their keys.

    The queries are the last ``T`` of the ``S`` keys, so query ``i`` sees keys ``j <= i + P``
    with ``P = S - T``: the first ``P`` keys, seen by every query, start the running sums, and the
    last ``T`` keys are chunked with the queries. The sums carried across chunks are kept relative
    to ``top``, the largest key log weight so far (rescaled when it grows); inside a chunk each
    query row uses its own running maximum, so nothing in a query's output depends on later keys.
    """
    b, t, h, m = fq.shape
    s, d = fk.shape[1], v.shape[-1]
    p = s - t
    if p:  # keys before the first query: every query sees all of them
        top = key_log_weight[:, :p].max(axis=1)  # [B, H]
        weight = jnp.exp(key_log_weight[:, :p] - top[:, None, :])  # [B, P, H]
        state = jnp.einsum("BSHM,BSH,BSHD->BHMD", rk[:, :p], weight, v[:, :p])
        norm = jnp.einsum("BSHM,BSH->BHM", fk[:, :p], weight)
    else:
        top = jnp.full((b, h), _NEG, jnp.float32)
        state = jnp.zeros((b, h, rk.shape[-1], d), jnp.float32)
        norm = jnp.zeros((b, h, m), jnp.float32)

    chunk = min(chunk_size, t)
    n = -(-t // chunk)
    size = n * chunk
    xs = (
        _to_chunks(_pad(fq, size), chunk),  # [N, B, C, H, m]
        _to_chunks(_pad(rq, size), chunk),
        _to_chunks(_pad(fk[:, p:], size), chunk),
        _to_chunks(_pad(rk[:, p:], size), chunk),
        _to_chunks(_pad(v[:, p:], size), chunk),  # [N, B, C, H, Dv]
        _to_chunks(_pad(key_log_weight[:, p:], size, _NEG), chunk),  # [N, B, C, H]
    )
    visible = jnp.tril(jnp.ones((chunk, chunk), bool))  # [C queries, C keys]

    def step(carry, x):
        state, norm, top = carry  # [B, H, m', Dv], [B, H, m], [B, H]
        fq_c, rq_c, fk_c, rk_c, v_c, lw_c = x
        # Each query row's maximum over the key log weights it sees: [B, C, H].
        row_top = jnp.maximum(top[:, None, :], jax.lax.cummax(lw_c, axis=1))
        log_w = lw_c[:, None, :, :] - row_top[:, :, None, :]  # [B, C queries, C keys, H]
        w = jnp.exp(jnp.where(visible[None, :, :, None], log_w, -jnp.inf))
        w = w.transpose(0, 3, 1, 2)  # [B, H, C, C]
        scores = jnp.einsum("BTHM,BSHM->BHTS", rq_c, rk_c) * w
        num = jnp.einsum("BHTS,BSHD->BTHD", scores, v_c)
        den = (jnp.einsum("BTHM,BSHM->BHTS", fq_c, fk_c) * w).sum(-1)  # [B, H, C]
        old = jnp.exp(top[:, None, :] - row_top)  # [B, C, H]: the carried sums' rescaling
        num = num + old[..., None] * jnp.einsum("BTHM,BHMD->BTHD", rq_c, state)
        den = den + old.transpose(0, 2, 1) * jnp.einsum("BTHM,BHM->BHT", fq_c, norm)
        new_top = row_top[:, -1]  # [B, H]: the maximum over every key so far
        rescale = jnp.exp(top - new_top)  # [B, H]
        key_w = jnp.exp(lw_c - new_top[:, None, :])  # [B, C, H]
        state = state * rescale[..., None, None] + jnp.einsum(
            "BSHM,BSH,BSHD->BHMD", rk_c, key_w, v_c
        )
        norm = norm * rescale[..., None] + jnp.einsum("BSHM,BSH->BHM", fk_c, key_w)
        return (state, norm, new_top), (num, den.transpose(0, 2, 1))

    _, (num, den) = jax.lax.scan(step, (state, norm, top), xs)
    num = num.swapaxes(0, 1).reshape(b, size, h, d)[:, :t]  # [B, T, H, Dv]
    den = den.swapaxes(0, 1).reshape(b, size, h)[:, :t]  # [B, T, H]
    return num / den[..., None]
