"""The contract check of the linear attention paths (``linear``, ``linear_performer``).

Linear attention is another model, not another way to compute softmax attention, so the
``paths_agree`` check leaves these paths out; this check holds them to their own definition,
RoFormer eq. (19) (Su et al. 2021, Sec. 3.3), transcribed below in float64 numpy::

    out_i = sum_j (R_i phi(q_i)) . (R_j phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j)

over the keys ``j`` query ``i`` sees, with ``phi`` the path's feature map (``elu + 1``, or
FAVOR+'s ``exp(W x - |x|^2 / 2) / sqrt(m)`` at ``x = q Dh^(-1/4)``) and ``R`` the encoder's own
``rotate`` hook applied to the features (none without the hook).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc.attention import core as attention
from posenc.attention import linear as linear_attention
from posenc.encodings.base import Encoding
from posenc.testing._harness import Settings, build, jit, label, max_error, memo, resolve
from posenc.testing.checks import _input_jacobian, _position_sets

# The layer whose random features the check draws (any index; not 0, the default).
LAYER = 1


def features(x: np.ndarray, implementation: str, projection: np.ndarray | None) -> np.ndarray:
    """float64 ``phi(x)``: ``[.., Dh]`` -> ``[.., m]``."""
    x = np.asarray(x, np.float64)
    if implementation == "linear":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # elu(x) + 1
    w = np.asarray(projection, np.float64)  # [m, Dh]
    x = x * x.shape[-1] ** -0.25
    return np.exp(x @ w.T - 0.5 * (x * x).sum(-1, keepdims=True)) / np.sqrt(w.shape[0])


def eq19(fq, fk, rq, rk, v, causal: bool) -> np.ndarray:
    """RoFormer eq. (19) in float64, explicitly over every (query, key) pair.

    Args:
      fq, rq: ``[B, T, H, m]`` query features, unrotated and rotated.
      fk, rk: ``[B, S, H, m]`` key features, unrotated and rotated.
      v: ``[B, S, H, Dv]`` values.
      causal: query ``i`` (the last ``T`` of ``S``) sees keys ``j <= i + S - T``.

    Returns:
      ``[B, T, H, Dv]`` float64.
    """
    fq, fk, rq, rk, v = (np.asarray(a, np.float64) for a in (fq, fk, rq, rk, v))
    t, s = fq.shape[1], fk.shape[1]
    numerator = np.einsum("bthm,bshm->bhts", rq, rk)
    denominator = np.einsum("bthm,bshm->bhts", fq, fk)
    if causal:
        visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)  # [T, S]
        numerator, denominator = numerator * visible, denominator * visible
    out = np.einsum("bhts,bshd->bthd", numerator, v)
    return out / denominator.sum(-1).transpose(0, 2, 1)[..., None]


def _fail(encoder: Encoding, message: str) -> AssertionError:
    return AssertionError(f"{label(encoder)} fails linear: {message}")


@memo
def _attend(encoder: Encoding, implementation: str, block_size: int, causal: bool, m: int):
    return jit(
        lambda q, k, v, params, q_pos, k_pos: attention.attend(
            q,
            k,
            v,
            encoding=encoder,
            params=params,
            q_pos=q_pos,
            k_pos=k_pos,
            causal=causal,
            implementation=implementation,
            block_size=block_size,
            layer=LAYER,
            performer_features=m,
        )
    )


def _bidirectional(encoder: Encoding) -> bool:
    """Whether the encoder also serves bidirectional attention (its ``check_causal(False)``)."""
    try:
        encoder.check_causal(False)
    except ValueError:
        return False
    return True


def check_linear(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """Each linear attention path keeps RoFormer eq. (19) for the encoder, or refuses it.

    A path that refuses the encoder (``attention.check_implementation``; biases, content
    logits and the like) must make the model refuse it at construction with a one-line
    ``ValueError`` naming ``model.attention_impl``. A path that takes it must equal the float64
    transcription of eq. (19) (:func:`eq19`, ``m = Dh`` features, the encoder's ``rotate`` on the
    features) within ``10 x tolerance``: the last ``T`` of ``S = T + extra_keys`` keys, each
    batch row at its own offset and again at randomized positions, causal in chunks of
    ``block_size`` (not dividing ``T``) and, unless the encoder is causal only, bidirectional;
    and through the model on that path no output may depend on a later input, while every
    output depends on some input at or before it and some on an earlier one.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    dims = settings.dims
    bound = enc.bind(dims)
    for impl in linear_attention.PATHS:
        try:
            attention.check_implementation(bound, impl)
        except ValueError:
            _check_refused(enc, settings, impl)
            continue
        _check_causal(enc, settings, impl)
        _check_eq19(enc, bound, settings, impl)


def _check_refused(enc: Encoding, settings: Settings, impl: str) -> None:
    try:
        build(enc, settings, attention_impl=impl)
    except ValueError as err:
        message = str(err)
        if "model.attention_impl" not in message or "\n" in message:
            raise _fail(
                enc,
                f"refusing {impl!r}, the model must raise one line naming "
                f"model.attention_impl, not {message!r}",
            ) from err
        return
    raise _fail(enc, f"check_implementation refuses {impl!r} but the model was built with it")


def _check_eq19(enc: Encoding, bound: Encoding, settings: Settings, impl: str) -> None:
    dims = settings.dims
    m = dims.head_dim
    params = bound.init(jax.random.key(settings.seed), dims)
    b, t, s = len(settings.offsets), settings.length, settings.length + settings.extra_keys
    rng = np.random.default_rng(settings.seed + 3)
    q, k, v = (rng.standard_normal((b, n, dims.num_heads, dims.head_dim)) for n in (t, s, s))
    projection = None
    if impl == "linear_performer":
        projection = np.asarray(linear_attention.layer_projection(LAYER, m, dims.head_dim))
    fq, fk = features(q, impl, projection), features(k, impl, projection)
    tol = 10 * settings.tolerance
    for causal in (True, False) if _bidirectional(bound) else (True,):
        run = _attend(bound, impl, settings.block_size, causal, m)
        for positions, q_pos, k_pos in _position_sets(settings, s, t):
            rq, rk = fq, fk
            if "rotate" in bound.hooks:
                f32 = [jnp.asarray(f, jnp.float32) for f in (fq, fk)]
                rotated = bound.rotate(params, *f32, q_pos, k_pos)
                rq, rk = (np.asarray(r, np.float64) for r in rotated)
            expected = eq19(fq, fk, rq, rk, v, causal)
            qkv = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
            got = np.asarray(run(*qkv, params, q_pos, k_pos), np.float64)
            if not np.allclose(got, expected, rtol=tol, atol=tol):
                raise _fail(
                    enc,
                    f"attention path {impl!r} differs from RoFormer eq. (19) "
                    f"({max_error(got, expected)}, tolerance {tol:g}; T={t}, S={s}, "
                    f"chunks of {settings.block_size}, causal={causal}, {positions})",
                )


def _check_causal(enc: Encoding, settings: Settings, impl: str) -> None:
    jac = _input_jacobian(enc, settings, impl)
    where = f"on the {impl!r} path (chunks of {settings.block_size})"
    if not np.isfinite(jac).all():
        raise _fail(enc, f"non-finite gradients {where}")
    dep = np.abs(jac).sum(-1)  # [t_out, s_in]
    later = np.triu(np.ones(dep.shape, bool), k=1)
    if (dep[later] != 0).any():
        pairs = [tuple(map(int, p)) for p in np.argwhere(dep * later)[:5]]
        raise _fail(enc, f"outputs depend on later inputs {where}: (t, s) {pairs}")
    if not (dep * ~later > 0).any(axis=1).all() or not np.tril(dep, k=-1).any():
        raise _fail(enc, f"outputs do not depend on earlier inputs {where}")
