"""The contract checks: one function per promise an encoder makes.

Each check takes a registered name or an unbound :class:`~posenc.encodings.base.Encoding`
(``encodings.get(...)`` or your class's instance) and optional :class:`Settings`, returns None
when the encoder keeps the promise, and raises ``AssertionError`` naming the encoder and what
failed otherwise. Expected values are fixed properties (zero gradient, invariance, declared
shapes, agreement with the reference path), never the code's own earlier output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.attention import core as attention
from posenc.attention import linear as linear_attention
from posenc.attention.options import AttentionOptions
from posenc.encodings.base import Encoding
from posenc.layers.params import EncoderParam
from posenc.testing import context, pallas, tiling
from posenc.testing._harness import (
    NotApplicable,
    Settings,
    build,
    contextual_inputs,
    finite_or_recompiled,
    forward,
    jit,
    label,
    memo,
    resolve,
    tokens,
    train_losses,
)
from posenc.testing._harness import fail as _fail
from posenc.testing._harness import max_error as _max_error

SCOPES = ("layer", "shared")
# Class-level declarations of the contract (never hyperparameters).
DECLARATIONS = (
    "name",
    "paper",
    "param_scope",
    "relative",
    "eval_safe_hparams",
    "causal_only",
    "continuous_positions",
    "cacheable",
    "normalized",
    "bias_by_distance",
    "key_lookback",
)


def _without_contextual_logits(enc: Encoding, settings: Settings) -> str | None:
    if "contextual_logits" not in enc.hooks:
        return "no contextual_logits hook, so nothing is carried across key tiles"
    return None


def _without_householder(enc: Encoding, settings: Settings) -> str | None:
    if "householder" not in enc.hooks:
        return "no householder hook, so no Householder products are carried across key tiles"
    return None


def _without_continuous_positions(enc: Encoding, settings: Settings) -> str | None:
    if not enc.continuous_positions and "augment_positions" not in enc.hooks:
        return "declares neither continuous_positions nor an augment_positions hook"
    return None


def _without_rotate(enc: Encoding, settings: Settings) -> str | None:
    if "rotate" not in enc.hooks:
        return "no rotate hook, so no key reads another"
    return None


def _normalized(enc: Encoding, settings: Settings) -> str | None:
    if enc.normalized:
        return "normalized = True (a softmax over the keys): no unnormalised weights to check"
    return None


def _not_on_cudnn(enc: Encoding, settings: Settings) -> str | None:
    bound = enc.bind(settings.dims)
    try:
        attention.check_implementation(bound, "cudnn")
    except ValueError as err:
        return f"the path refuses it ({err})"
    width = bound.qk_head_dim(settings.dims.head_dim)
    t, s = settings.length, settings.length + settings.extra_keys
    has_bias = bool({"bias", "content_logits", "log_decay"} & set(bound.hooks))
    if not attention.cudnn_supports(width, jnp.bfloat16, t, s, has_bias):
        return f"cuDNN takes no such shapes (head width {width}, {t} queries, {s} keys)"
    return None


# Why a check cannot apply to an encoder on any machine (None: it applies); checks not listed
# apply to every encoder.
_INAPPLICABLE = {
    "carry": _without_contextual_logits,
    "householder": _without_householder,
    "augment": _without_continuous_positions,
    "unnormalized": _normalized,
    "cudnn": _not_on_cudnn,
    "bias_by_distance": tiling.without_distance_bias,
    "reach": tiling.without_reach,
    "carry_limit": tiling.without_carry_limit,
    "context_parallel": context.refused_by_blocked,
    "pallas": pallas.refused_by_pallas,
    "key_lookback": _without_rotate,
}


def inapplicable(
    check: str, encoder: str | Encoding, settings: Settings | None = None
) -> str | None:
    """Why ``check`` does not apply to ``encoder`` (whatever the machine), or None if it does.

    A check that does not apply would assert nothing, so it must not count as a pass: posenc's
    suite leaves these cases out (:func:`posenc.testing.cases`), and the check itself, called
    anyway, raises :class:`NotApplicable` with this reason.
    """
    reason = _INAPPLICABLE.get(check)
    return reason(resolve(encoder), settings or Settings()) if reason else None


def _require(check: str, enc: Encoding, settings: Settings) -> None:
    reason = _INAPPLICABLE[check](enc, settings)
    if reason:
        raise NotApplicable(f"{check} does not apply to {label(enc)}: {reason}")


def check_declarations(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """The class attributes are well formed and the encoder is a frozen, rebuildable dataclass."""
    enc = resolve(encoder)

    def fail(message):
        return _fail(enc, "declarations", message)

    cls = type(enc)
    if not (isinstance(cls.name, str) and cls.name):
        raise fail("`name` must be a non-empty string (it is the registry key)")
    if not (isinstance(cls.paper, str) and cls.paper):
        raise fail("`paper` must cite where the encoding comes from")
    if cls.param_scope not in SCOPES:
        raise fail(f"param_scope must be one of {list(SCOPES)}, got {cls.param_scope!r}")
    if not isinstance(cls.relative, bool):
        raise fail(f"`relative` must be True or False, got {cls.relative!r}")
    if not isinstance(cls.causal_only, bool):
        raise fail(f"`causal_only` must be True or False, got {cls.causal_only!r}")
    if not isinstance(cls.continuous_positions, bool):
        raise fail(
            f"`continuous_positions` must be True or False, got {cls.continuous_positions!r}"
        )
    if cls.continuous_positions and "embed" not in enc.hooks:
        raise fail(
            "continuous_positions = True promises float positions to `embed`, which it lacks"
        )
    if "augment_positions" in enc.hooks and not cls.continuous_positions:
        raise fail("an `augment_positions` hook needs continuous_positions = True")
    if not isinstance(cls.cacheable, bool):
        raise fail(f"`cacheable` must be True or False, got {cls.cacheable!r}")
    if not isinstance(cls.normalized, bool):
        raise fail(f"`normalized` must be True or False, got {cls.normalized!r}")
    if not isinstance(cls.bias_by_distance, bool):
        raise fail(f"`bias_by_distance` must be True or False, got {cls.bias_by_distance!r}")
    if cls.bias_by_distance and "bias" not in enc.hooks:
        raise fail("bias_by_distance = True promises something of `bias`, which it lacks")
    reach = enc.reach
    if reach is not None and (not isinstance(reach, int) or isinstance(reach, bool) or reach < 0):
        raise fail(f"`reach` must be None or an integer >= 0, got {reach!r}")
    lookback = enc.key_lookback
    if not isinstance(lookback, int) or isinstance(lookback, bool) or lookback < 0:
        raise fail(f"`key_lookback` must be an integer >= 0, got {lookback!r}")
    if lookback and "rotate" not in enc.hooks:
        raise fail("key_lookback > 0 promises something of `rotate`, which it lacks")
    hparams = enc.hparams()
    as_fields = sorted(set(hparams) & set(DECLARATIONS))
    if as_fields:
        raise fail(
            f"{as_fields} became hyperparameters (dataclass fields): set them as plain class "
            "attributes, without a type annotation"
        )
    safe = cls.eval_safe_hparams
    if not isinstance(safe, tuple) or not set(safe) <= set(hparams):
        raise fail(f"eval_safe_hparams {safe!r} must be a tuple of hyperparameters {list(hparams)}")
    for hook in ("embed", "embed_tokens"):
        if hook in enc.hooks and cls.param_scope != "shared":
            raise fail(f"an encoder with an `{hook}` hook must set param_scope = 'shared'")
    if not cls.__dataclass_params__.frozen:
        raise fail("must be a frozen dataclass (@dataclasses.dataclass(frozen=True))")
    try:
        rebuilt = cls(**hparams)
    except (TypeError, ValueError) as err:
        rebuilt = err
    if rebuilt != enc:
        raise fail(
            f"cls(**encoder.hparams()) must rebuild an equal encoder (configs rely on it); got "
            f"{rebuilt!r}"
        )


def _nvidia_gpu() -> bool:
    device = jax.devices()[0]
    return device.platform == "gpu" and "nvidia" in device.device_kind.lower()


@memo
def _attend(encoder: Encoding, implementation: str, block_size: int, causal: bool = True):
    run = jit(
        lambda q, k, v, params, q_pos, k_pos, inputs: attention.attend(
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
            inputs=inputs,
        )
    )
    return run


def _position_sets(settings: Settings, s: int, t: int) -> list[tuple[str, jax.Array, jax.Array]]:
    """``(description, q_pos, k_pos)``: contiguous rows at their offsets, and randomized rows
    (a sorted random subset of ``[0, max_position)`` each, non-contiguous)."""
    b = len(settings.offsets)
    contiguous = np.asarray(settings.offsets)[:, None] + np.arange(s)
    rng = np.random.default_rng(settings.seed + 2)
    randomized = np.stack(
        [np.sort(rng.choice(settings.max_position, s, replace=False)) for _ in range(b)]
    )
    out = []
    for text, k_pos in (
        (f"offsets={settings.offsets}", contiguous),
        (f"randomized positions in [0, {settings.max_position})", randomized),
    ):
        k_pos = jnp.asarray(k_pos, jnp.int32)
        out.append((text, k_pos[:, s - t :], k_pos))
    return out


def check_paths_agree(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """Every float32 attention path that accepts the encoder equals the ``einsum`` reference
    (``cudnn``, bfloat16 only and on NVIDIA GPUs only, has its own check, ``check_cudnn``; the
    linear attention paths, another model, theirs: ``testing.check_linear``).

    Causal attention of ``T`` queries (the last ``T`` of ``S = T + extra_keys`` keys), each batch
    row at its own offset and, again, at randomized positions (sorted, with gaps), random layer
    inputs (for hooks that read them), ``blocked`` tiling with a padded last tile. Also
    ``rotate`` returns ``q`` and ``k`` of the width ``qk_head_dim`` declares.
    """
    settings = settings or Settings()
    _agreement(resolve(encoder), settings, "paths_agree", causal=True)


def check_cudnn(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """cuDNN's fused kernel equals the ``einsum`` reference, both in bfloat16 (the kernel's only
    dtypes; within ``2e-2``), on the inputs of ``check_paths_agree``: causal and, for an encoder
    that serves bidirectional attention, without the mask.

    Raises :class:`NotApplicable` where the path refuses the encoder (a value term, contextual
    logits) or cuDNN takes no such shapes, and on a machine without an NVIDIA GPU.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    _require("cudnn", enc, settings)
    if not _nvidia_gpu():
        raise NotApplicable("cudnn needs an NVIDIA GPU (cuDNN's fused attention kernel)")
    _agreement(enc, settings, "cudnn", causal=True, implementations=("cudnn",))
    both_ways = resolve(encoder, bidirectional=True)
    if not _causal_only(both_ways):
        _agreement(both_ways, settings, "cudnn", causal=False, implementations=("cudnn",))


def _causal_only(enc: Encoding) -> bool:
    """Whether the encoder refuses bidirectional attention (``causal_only`` or its
    ``check_causal``)."""
    try:
        enc.check_causal(False)
    except ValueError:
        return True
    return enc.causal_only


# The float32 paths ``paths_agree`` compares with the reference (``auto`` last, so that a
# failure names the path itself); cudnn, pallas (slow in interpret mode: posenc.testing.pallas)
# and the linear paths have checks of their own.
_FLOAT32_PATHS = tuple(
    sorted(
        (
            impl
            for impl in attention.IMPLEMENTATIONS
            if impl not in ("einsum", "cudnn", "pallas", *linear_attention.PATHS)
        ),
        key=lambda impl: impl == "auto",
    )
)


def _agreement(
    enc: Encoding,
    settings: Settings,
    check: str,
    causal: bool,
    implementations: tuple[str, ...] = _FLOAT32_PATHS,
) -> None:
    """The paths' comparison with the reference, with or without the causal mask."""
    dims = settings.dims
    bound = enc.bind(dims)
    params = bound.init(jax.random.key(settings.seed), dims)
    b, t, s = len(settings.offsets), settings.length, settings.length + settings.extra_keys
    rng = np.random.default_rng(settings.seed)
    q, k, v = (
        jnp.asarray(rng.standard_normal((b, n, dims.num_heads, dims.head_dim)), jnp.float32)
        for n in (t, s, s)
    )
    inputs = jnp.asarray(rng.standard_normal((b, s, dims.model_dim)), jnp.float32)
    position_sets = _position_sets(settings, s, t)
    if "rotate" in bound.hooks:
        width = bound.qk_head_dim(dims.head_dim)
        _, q_pos, k_pos = position_sets[0]
        shapes = [tuple(x.shape) for x in bound.rotate(params, q, k, q_pos, k_pos)]
        promised = [(b, n, dims.num_heads, width) for n in (t, s)]
        if shapes != promised:
            raise _fail(
                enc,
                check,
                f"rotate returns q, k of shapes {shapes}, but qk_head_dim({dims.head_dim}) = "
                f"{width} promises {promised}",
            )
    for positions, q_pos, k_pos in position_sets:

        def run(impl, dtype=jnp.float32, q_pos=q_pos, k_pos=k_pos):
            x = [a.astype(dtype) for a in (q, k, v, inputs)]
            attend = _attend(bound, impl, settings.block_size, causal)
            out = attend(*x[:3], params, q_pos, k_pos, x[3])
            return np.asarray(out, np.float32)

        where = positions if causal else f"causal=False, {positions}"
        _compare_paths(enc, bound, settings, run, where, t, s, check, implementations)


def _compare_paths(
    enc, bound, settings: Settings, run, positions: str, t: int, s: int, check, implementations
) -> None:
    """Runs each of ``implementations`` that takes ``bound`` (``run(impl, dtype)``) against the
    einsum one: in float32, ``cudnn`` in bfloat16 against the reference in bfloat16."""
    reference = run("einsum")
    if not np.isfinite(reference).all():
        raise _fail(enc, check, f"the einsum reference gives non-finite outputs ({positions})")
    for impl in implementations:
        try:
            attention.check_implementation(bound, impl)
        except ValueError:
            continue  # this path does not take the encoder (e.g. a value term on a fused kernel)
        dtype, expected, tol = jnp.float32, reference, settings.tolerance
        if impl == "cudnn":
            dtype, expected, tol = jnp.bfloat16, run("einsum", jnp.bfloat16), 2e-2
        got = run(impl, dtype)
        if not np.allclose(got, expected, rtol=tol, atol=tol):
            raise _fail(
                enc,
                check,
                f"attention path {impl!r} differs from the einsum reference "
                f"({_max_error(got, expected)}, tolerance {tol:g}; T={t}, S={s}, "
                f"block_size={settings.block_size}, {positions})",
            )


def check_carry(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """``contextual_logits`` keeps its carry promise (:class:`NotApplicable` without the hook).

    On random queries, keys and causally masked logits (``T`` queries, the last of ``S = T +
    extra_keys`` keys), calling the hook on key tiles of ``block_size`` from the last to the first,
    each with the carry the later tile returned, gives the terms (on the visible pairs) and the
    final carry of one call on the whole row: what the ``blocked`` path relies on.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    dims = settings.dims
    _require("carry", enc, settings)
    bound = enc.bind(dims)
    params = bound.init(jax.random.key(settings.seed), dims)
    b, t, s = len(settings.offsets), settings.length, settings.length + settings.extra_keys
    rng = np.random.default_rng(settings.seed + 1)
    q, k, visible, logits = contextual_inputs(settings, rng)
    zeros = jnp.zeros((b, dims.num_heads, t), jnp.float32)
    whole, whole_carry = bound.contextual_logits(params, q, k, logits, zeros)
    carry, tiles = zeros, []
    for start in reversed(range(0, s, settings.block_size)):
        cols = slice(start, start + settings.block_size)
        terms, carry = bound.contextual_logits(params, q, k[:, cols], logits[..., cols], carry)
        tiles.insert(0, np.asarray(terms, np.float32))
    got, expected = np.concatenate(tiles, axis=-1), np.asarray(whole, np.float32)
    shape = (b, dims.num_heads, t, s)
    if got.shape != shape or expected.shape != shape:
        raise _fail(
            enc,
            "carry",
            f"contextual_logits must return [B, H, T, S] = {shape} terms, got "
            f"{expected.shape} for the whole row and {got.shape} from tiles",
        )
    tol = settings.tolerance
    got, expected = np.where(visible, got, 0.0), np.where(visible, expected, 0.0)
    if not np.allclose(got, expected, rtol=tol, atol=tol):
        raise _fail(
            enc,
            "carry",
            f"contextual_logits on key tiles of {settings.block_size}, last to first with the "
            f"carry, differ from one call on the whole row ({_max_error(got, expected)}; T={t}, "
            f"S={s})",
        )
    got, expected = np.asarray(carry), np.asarray(whole_carry)
    if got.shape != zeros.shape or not np.allclose(got, expected, rtol=tol, atol=tol):
        raise _fail(
            enc,
            "carry",
            f"the carry after the first key tile ({got.shape}) differs from the whole row's "
            f"({expected.shape}); it must be the [B, H, T] float32 running sum",
        )


def check_unnormalized(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """An encoder that declares ``normalized = False`` keeps its promise (:class:`NotApplicable`
    for one that normalises): its weights ``exp(logits)`` sum to at most 1 over each row, so no
    path that forms them unnormalised overflows, and masked pairs weigh exactly 0.

    The reference path's logits (:func:`~posenc.attention.core.reference_logits`, after
    ``rotate``, with the encoder's every hook) of random queries and keys at scales 1 and 4
    (``T`` queries, the last of ``S`` keys), causal and, for an encoder that serves it, without
    the mask.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    _require("unnormalized", enc, settings)
    dims = settings.dims
    bound = enc.bind(dims)
    params = bound.init(jax.random.key(settings.seed), dims)
    b, t, s = len(settings.offsets), settings.length, settings.length + settings.extra_keys
    rng = np.random.default_rng(settings.seed + 9)
    _, q_pos, k_pos = _position_sets(settings, s, t)[0]
    inputs = jnp.asarray(rng.standard_normal((b, s, dims.model_dim)), jnp.float32)
    options, heads = AttentionOptions(), (dims.num_heads, dims.head_dim)
    for causal in (True,) if _causal_only(enc) else (True, False):
        for scale in (1.0, 4.0):
            q, k = (
                jnp.asarray(scale * rng.standard_normal((b, n, *heads)), jnp.float32)
                for n in (t, s)
            )
            q, k = attention.prepare_qk(
                q, k, bound, params, q_pos, k_pos, options, {}, causal, s - t, 1e-6
            )
            logits, visible = attention.reference_logits(
                q,
                k,
                encoding=bound,
                params=params,
                q_pos=q_pos,
                k_pos=k_pos,
                causal=causal,
                head_dim=dims.head_dim,
                decay=attention.cumulative_decay(bound, params, inputs, t, s),
            )
            w = np.exp(np.asarray(logits, np.float64))  # [B, H, T, S]
            where = f"causal={causal}, q and k {scale:g} x standard normal"
            masked = ~np.broadcast_to(np.asarray(visible), w.shape)
            if not np.isfinite(w).all() or np.any(w[masked] != 0.0):
                raise _fail(
                    enc,
                    "unnormalized",
                    f"weights exp(logits) must be finite and exactly 0 at masked pairs ({where})",
                )
            most = float(w.sum(-1).max())
            if most > 1.0 + settings.tolerance:
                raise _fail(
                    enc,
                    "unnormalized",
                    f"declares normalized = False, but a row's weights exp(logits) sum to {most:g} "
                    f"({where}): they must sum to at most 1 (log weights, no softmax)",
                )


def check_householder(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """``householder`` keeps its promise (:class:`NotApplicable` without the hook).

    On a random layer input ``[B, S, D]`` (``S = T + extra_keys``) the hook returns float32
    ``w [B, S, H, Dh]`` and ``beta [B, S, H]``, finite; split the window ``[left | right]`` at
    every tile boundary of ``block_size``, and the hook on ``left`` alone gives the first part of
    one call on the whole: entry ``t`` reads the inputs up to ``t`` only, what the causal mask and
    a key/value cache (which calls the hook on the filled slots) rely on. The encoder declares
    ``causal_only``: the products run from a key forward to its query.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    dims = settings.dims
    _require("householder", enc, settings)

    def fail(message):
        return _fail(enc, "householder", message)

    if not enc.causal_only:
        raise fail("has a householder hook but does not declare causal_only = True")
    bound = enc.bind(dims)
    params = bound.init(jax.random.key(settings.seed), dims)
    b, s = len(settings.offsets), settings.length + settings.extra_keys
    rng = np.random.default_rng(settings.seed + 2)
    inputs = jnp.asarray(rng.standard_normal((b, s, dims.model_dim)), jnp.float32)
    hook = jit(bound.householder)
    w, beta = hook(params, inputs)
    shapes = ((b, s, dims.num_heads, dims.head_dim), (b, s, dims.num_heads))
    if (w.shape, beta.shape) != shapes or {w.dtype, beta.dtype} != {jnp.dtype(jnp.float32)}:
        raise fail(
            f"householder must return float32 w {shapes[0]} and beta {shapes[1]}, got "
            f"{w.dtype}{tuple(w.shape)} and {beta.dtype}{tuple(beta.shape)}"
        )
    if not (np.isfinite(np.asarray(w)).all() and np.isfinite(np.asarray(beta)).all()):
        raise fail("householder returned non-finite w or beta on a random layer input")
    tol = settings.tolerance
    for n in range(settings.block_size, s, settings.block_size):
        left_w, left_beta = hook(params, inputs[:, :n])
        for got, whole, what in ((left_w, w, "w"), (left_beta, beta, "beta")):
            got, expected = np.asarray(got), np.asarray(whole[:, :n])
            if not np.allclose(got, expected, rtol=tol, atol=tol):
                raise fail(
                    f"householder on the first {n} of {s} tokens gives another {what} there "
                    f"than one call on the whole window ({_max_error(got, expected)}): an entry "
                    "reads later inputs"
                )


@memo
def _input_jacobian(
    encoder: Encoding, settings: Settings, implementation: str, causal: bool = True
) -> np.ndarray:
    """``[T, T, D]``: d (sum of logits[t]) / d (input embedding at s), for one window of
    distinct tokens (a causal model, or with ``causal=False`` a bidirectional one).

    With distinct tokens and an untied output layer, row ``tokens[s]`` of the embedding table is
    used only at input position ``s``, so the Jacobian with respect to that row is the dependence
    of every output on input ``s``.
    """
    t = settings.length
    model = build(encoder, settings, attention_impl=implementation, causal=causal)
    ids = np.random.default_rng(settings.seed).permutation(settings.vocab_size)[:t]
    window = jnp.asarray(ids[None], jnp.int32)  # [1, T]
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def per_position(embedding, params, rest):
        params = jax.tree.map(lambda x: x, params)  # a copy to edit
        params["embed"]["embedding"] = nnx.Param(embedding)
        return nnx.merge(graphdef, params, rest)(window)[0].sum(-1)  # [T]

    args = (params["embed"]["embedding"][...], params, rest)
    jac = finite_or_recompiled(
        lambda jit: np.asarray(jit(jax.jacrev(per_position))(*args)),  # [T, V, D]
        f"the input Jacobian of {label(encoder)} on the {implementation!r} path",
    )
    return jac[:, ids]  # [t_out, s_in, D]


def check_causal(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """No output sees a later input: ``d logits[t] / d input[s]`` is exactly 0 for ``s > t``.

    Through the whole model, on the ``einsum`` path and on the ``blocked`` path with tiles of
    ``block_size < length``. Also every output depends on some input at or before it, some
    output on an earlier input (attention really mixes positions), and the two paths' Jacobians
    agree (the tiled path trains like the reference).
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    later = np.triu(np.ones((settings.length,) * 2, bool), k=1)
    jacobians = {}
    for impl in ("einsum", "blocked"):
        jac = jacobians[impl] = _input_jacobian(enc, settings, impl)
        where = f"on the {impl!r} path (block_size={settings.block_size})"
        if not np.isfinite(jac).all():
            raise _fail(enc, "causal", f"non-finite gradients {where}")
        dep = np.abs(jac).sum(-1)  # [t_out, s_in]
        if (dep[later] != 0).any():
            pairs = [tuple(map(int, p)) for p in np.argwhere(dep * later)[:5]]
            raise _fail(enc, "causal", f"outputs depend on later inputs {where}: (t, s) {pairs}")
        if not (dep * ~later > 0).any(axis=1).all() or not np.tril(dep, k=-1).any():
            raise _fail(enc, "causal", f"outputs do not depend on earlier inputs {where}")
    ref, got = jacobians["einsum"], jacobians["blocked"]
    if not np.allclose(got, ref, rtol=1e-4, atol=1e-5):
        error = _max_error(got, ref)
        raise _fail(enc, "causal", f"input gradients of 'blocked' and 'einsum' differ ({error})")


def check_bidirectional(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """Bidirectional attention (``model.causal=False``) works, or is refused as declared.

    An encoder that declares ``causal_only`` (or whose hyperparameters refuse through
    ``check_causal``, e.g. T5 with causal buckets) must make the model refuse ``causal=False`` at
    construction, with a one-line ``ValueError`` naming ``model.causal``. Any other: every
    attention path that takes it equals the ``einsum`` reference without the causal mask (as
    ``paths_agree``: offsets, randomized positions, ``blocked`` tiles, each tile's hooks seeing
    keys after its queries), and through the whole model every output but the last depends on
    some later input (``d logits[t] / d input[s] != 0`` for some ``s > t``), every output but
    the first on some earlier one. Registered names get :data:`BIDIRECTIONAL_HPARAMS`.
    """
    settings = settings or Settings()
    enc = resolve(encoder, bidirectional=True)
    if _causal_only(enc):
        try:
            build(enc, settings, causal=False)
        except ValueError as err:
            if "model.causal" not in str(err) or "\n" in str(err):
                raise _fail(
                    enc,
                    "bidirectional",
                    f"refuses model.causal=False without one line naming the field: {str(err)!r}",
                ) from err
            return
        raise _fail(
            enc,
            "bidirectional",
            "is causal only (causal_only or check_causal) but the model was built with "
            "model.causal=False",
        )
    _agreement(enc, settings, "bidirectional", causal=False)
    dep = np.abs(_input_jacobian(enc, settings, "einsum", causal=False)).sum(-1)  # [t, s]
    if not np.isfinite(dep).all():
        raise _fail(enc, "bidirectional", "non-finite input gradients with model.causal=False")
    sees_later = np.triu(dep, k=1).any(axis=1)[:-1]
    sees_earlier = np.tril(dep, k=-1).any(axis=1)[1:]
    if not sees_later.all():
        blind = [int(t) for t in np.flatnonzero(~sees_later)[:5]]
        raise _fail(
            enc,
            "bidirectional",
            f"with model.causal=False outputs {blind} depend on no later input: keys after "
            "the query are still masked or have no effect",
        )
    if not sees_earlier.all():
        raise _fail(enc, "bidirectional", "with model.causal=False outputs ignore earlier inputs")


def check_shift(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """The ``relative`` declaration holds: logits at positions ``p + c`` equal those at ``p``
    if and only if the encoder declares ``relative = True``.

    Row ``b`` moves by ``offsets[b]``. A relative encoder must agree within ``tolerance``; an
    absolute one (``relative = False``) must change, so a wrong declaration fails either way.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    run, state = forward(enc, settings, True)
    window = tokens(settings, settings.length)
    base = jnp.broadcast_to(jnp.arange(settings.length), window.shape)
    shifted = base + jnp.asarray(settings.offsets)[:, None]
    at_base = np.asarray(run(state, window, base))
    at_shift = np.asarray(run(state, window, shifted))
    if not (np.isfinite(at_base).all() and np.isfinite(at_shift).all()):
        raise _fail(enc, "shift", f"non-finite logits at positions shifted by {settings.offsets}")
    same = np.allclose(at_shift, at_base, rtol=settings.tolerance, atol=settings.tolerance)
    if enc.relative and not same:
        raise _fail(
            enc,
            "shift",
            f"declares relative = True but shifting positions by {settings.offsets} changes "
            f"the logits ({_max_error(at_shift, at_base)}, tolerance {settings.tolerance:g})",
        )
    if not enc.relative and same:
        raise _fail(
            enc,
            "shift",
            f"declares relative = False but shifting positions by {settings.offsets} leaves the "
            "logits unchanged; declare relative = True",
        )


def _encoder_params(model: nnx.Module) -> dict[str, tuple[type, tuple[int, ...], jnp.dtype]]:
    """``'blocks/0/pos_params/table' -> (variable type, shape, dtype)`` of encoder variables."""
    out = {}
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Variable) and (
            isinstance(var, EncoderParam) or "pos_params" in "/".join(map(str, path))
        ):
            value = var[...]
            out["/".join(map(str, path))] = (type(var), tuple(value.shape), value.dtype)
    return out


def check_param_shapes(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """``init`` returns exactly what ``param_shapes`` promises, in float32, and a two-layer model
    holds them as :class:`~posenc.layers.params.EncoderParam` where ``param_scope`` says: one copy
    per block (``blocks/<i>/pos_params/<name>``) or one at the model
    (``shared_pos_params/<name>``); ``window_params`` keeps names and shapes and is idempotent.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    dims = settings.dims
    promised = {n: tuple(s) for n, s in enc.param_shapes(dims).items()}
    params = enc.bind(dims).init(jax.random.key(settings.seed), dims)
    got = {n: tuple(jnp.shape(x)) for n, x in params.items()}
    if got != promised:
        raise _fail(enc, "param_shapes", f"init returns {got} but param_shapes promises {promised}")
    wrong = {n: str(jnp.asarray(x).dtype) for n, x in params.items() if x.dtype != jnp.float32}
    if wrong:
        raise _fail(enc, "param_shapes", f"init must return float32 arrays, got {wrong}")
    window = enc.bind(dims).window_params(params)
    if {n: tuple(jnp.shape(x)) for n, x in window.items()} != promised:
        raise _fail(enc, "param_shapes", "window_params must keep the parameters' names and shapes")
    again = enc.bind(dims).window_params(window)
    if any(not np.array_equal(np.asarray(again[n]), np.asarray(window[n])) for n in window):
        raise _fail(enc, "param_shapes", "window_params must be idempotent (docstring of base.py)")

    layers = 2
    model = build(enc, settings, num_layers=layers)
    if enc.param_scope == "layer":
        places = [f"blocks/{i}/pos_params" for i in range(layers)]
    else:
        places = ["shared_pos_params"]
    expected = {
        f"{place}/{n}": (EncoderParam, shape, jnp.dtype(jnp.float32))
        for place in places
        for n, shape in promised.items()
    }
    held = _encoder_params(model)
    if held != expected:
        raise _fail(
            enc,
            "param_shapes",
            f"with param_scope={enc.param_scope!r} a {layers}-layer model should hold "
            f"{ {p: s for p, (_, s, _) in expected.items()} } as EncoderParam, but holds "
            f"{ {p: (t.__name__, s, str(d)) for p, (t, s, d) in held.items()} }",
        )


def _longest_accepted(encoder: Encoding, settings: Settings) -> int:
    """``extrapolation * length`` tokens, or the longest multiple of ``length`` the encoder's
    ``check_length`` accepts."""
    bound = encoder.bind(settings.dims)
    for factor in range(settings.extrapolation, 1, -1):
        try:
            bound.check_length(factor * settings.length)
        except ValueError:
            continue
        return factor * settings.length
    return settings.length


def check_bf16(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """bfloat16 compute stays finite and close to float32.

    At ``extrapolation * length`` tokens, or the longest multiple of ``length`` the encoder
    accepts (several ``block_size`` tiles, so ``auto`` tiles on CPU), with the same float32
    parameters: bfloat16 logits are finite, float32, and within ``bf16_tolerance`` times the
    largest float32 logit of the float32 model's.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    length = _longest_accepted(enc, settings)
    window = tokens(settings, length, seed=2)
    run32, state = forward(enc, settings, False)
    run16, _ = forward(enc, settings, False, dtype="bfloat16")  # same float32 parameters
    ref = np.asarray(run32(state, window))
    low = np.asarray(run16(state, window))
    where = f"at {length} tokens (block_size={settings.block_size})"
    if low.dtype != np.float32:
        raise _fail(enc, "bf16", f"bfloat16 compute must still return float32 logits {where}")
    if not np.isfinite(low).all():
        raise _fail(enc, "bf16", f"non-finite logits in bfloat16 {where}")
    if np.array_equal(low, ref):
        raise _fail(enc, "bf16", f"bfloat16 logits equal float32's exactly {where}: no bf16 ran")
    scale = np.abs(ref).max()
    if not np.abs(low - ref).max() <= settings.bf16_tolerance * scale:
        raise _fail(
            enc,
            "bf16",
            f"bfloat16 logits are far from float32 {where}: {_max_error(low, ref)} against "
            f"{settings.bf16_tolerance:g} x {scale:.3g}",
        )


def check_trains(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """A few Adam steps on one fixed batch lower the loss by at least 10 %, with finite losses,
    and every one of the encoder's own parameters gets a finite gradient at every step and a
    non-zero one at some step (the other layers learning alone would lower the loss too)."""
    settings = settings or Settings()
    enc = resolve(encoder)
    losses, grads = train_losses(enc, settings)
    if not np.isfinite(losses).all():
        raise _fail(enc, "trains", f"non-finite training loss: {losses}")
    if not losses[-1] < 0.9 * losses[0]:
        raise _fail(
            enc, "trains", f"{len(losses)} Adam steps did not lower the loss by 10 %: {losses}"
        )
    broken = {name: sizes for name, sizes in grads.items() if not np.isfinite(sizes).all()}
    if broken:
        raise _fail(
            enc, "trains", f"non-finite gradients of encoder parameters (max |g|): {broken}"
        )
    still = sorted(name for name, sizes in grads.items() if not any(sizes))
    if still:
        raise _fail(
            enc,
            "trains",
            f"encoder parameters {still} get a zero gradient at every one of {len(losses)} "
            "steps: the encoder does not learn",
        )


def check_extrapolates(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """A model built for ``length`` tokens runs at ``extrapolation * length`` with its default
    positions and gives finite logits; or, if the encoder's ``check_length`` refuses that
    length, the model call raises the same ``ValueError`` before computing anything."""
    settings = settings or Settings()
    enc = resolve(encoder)
    length = settings.extrapolation * settings.length
    try:
        enc.bind(settings.dims).check_length(length)
    except ValueError as err:
        model = build(enc, settings)
        try:
            model(tokens(settings, length, seed=2))
        except ValueError as raised:
            if str(raised) != str(err):
                raise _fail(
                    enc, "extrapolates", f"the model raised {raised!r}, not check_length's {err!r}"
                ) from raised
            return
        raise _fail(
            enc, "extrapolates", f"check_length({length}) refuses but the model ran anyway"
        ) from err
    run, state = forward(enc, settings, False)
    logits = np.asarray(run(state, tokens(settings, length, seed=2)))
    if logits.shape != (len(settings.offsets), length, settings.vocab_size):
        raise _fail(enc, "extrapolates", f"logits of shape {logits.shape} at {length} tokens")
    if not np.isfinite(logits).all():
        raise _fail(
            enc,
            "extrapolates",
            f"built for {settings.length} tokens, non-finite logits at {length}",
        )


def check_augment(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """Continuous and augmented positions do what the declarations say (:class:`NotApplicable`
    for an encoder that declares neither ``continuous_positions`` nor ``augment_positions``: the
    model never hands it float positions or a key of its own).

    With ``augment_positions`` (and dropout 0): the hook returns float32 ``[B, T]`` positions,
    the same for the same key and, without a key (evaluation), twice the same; through the
    model the same training key gives the same logits, another key and the deterministic pass
    other logits. With ``continuous_positions``: integral float positions give the logits of
    the integer ones and fractional ones (``p + 0.5``) change them.
    """
    settings = settings or Settings()
    enc = resolve(encoder)
    _require("augment", enc, settings)
    plain, state = forward(enc, settings, True)
    window = tokens(settings, settings.length, seed=3)
    pos = jnp.broadcast_to(jnp.arange(settings.length), window.shape)
    evaluation = np.asarray(plain(state, window, pos))
    tol = dict(rtol=settings.tolerance, atol=settings.tolerance)
    if enc.continuous_positions:
        as_float = np.asarray(plain(state, window, pos.astype(jnp.float32)))
        half = np.asarray(plain(state, window, pos.astype(jnp.float32) + 0.5))
        if not np.allclose(as_float, evaluation, **tol):
            raise _fail(enc, "augment", "integral float positions differ from the integers")
        if np.allclose(half, evaluation, **tol):
            raise _fail(
                enc, "augment", "declares continuous_positions but ignores fractional positions"
            )
    if "augment_positions" not in enc.hooks:
        return
    bound = enc.bind(settings.dims)
    params = bound.init(jax.random.key(settings.seed), settings.dims)
    keys = [jax.random.key(settings.seed + i) for i in (10, 10, 11)]
    floats = pos.astype(jnp.float32)
    draws = [np.asarray(bound.augment_positions(params, floats, k)) for k in keys]
    fixed = [np.asarray(bound.augment_positions(params, floats, None)) for _ in range(2)]
    if any(d.shape != tuple(pos.shape) or d.dtype != np.float32 for d in draws + fixed):
        raise _fail(enc, "augment", f"augment_positions must return float32 {tuple(pos.shape)}")
    if not np.array_equal(draws[0], draws[1]) or np.array_equal(draws[0], draws[2]):
        raise _fail(enc, "augment", "augment_positions is not a function of its key")
    if not np.array_equal(fixed[0], fixed[1]):
        raise _fail(enc, "augment", "augment_positions without a key is not deterministic")
    graphdef = nnx.graphdef(build(enc, settings))
    run = jit(lambda state, tokens, pos, rng: nnx.merge(graphdef, state)(tokens, pos, rng=rng))
    trained = [np.asarray(run(state, window, pos, key)) for key in keys]
    if not np.array_equal(trained[0], trained[1]):
        raise _fail(enc, "augment", "the same training key gave different logits")
    if np.allclose(trained[0], trained[2], **tol) or np.allclose(trained[0], evaluation, **tol):
        raise _fail(enc, "augment", "training keys do not change the logits: nothing is augmented")


def check_key_lookback(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """``rotate`` reads no more keys than ``key_lookback`` declares: changing the content of one
    key changes the rotated keys from it to ``key_lookback`` after it and nothing else (not the
    queries, not the keys before it or further after), and, where ``key_lookback > 0``, the
    last of those does change (the declaration is not larger than what ``rotate`` reads).
    Window-sized caches keep exactly the keys this promises ``rotate`` needs."""
    settings = settings or Settings()
    enc = resolve(encoder)
    _require("key_lookback", enc, settings)
    dims = settings.dims
    bound = enc.bind(dims)
    params = bound.init(jax.random.key(settings.seed), dims)
    b, s = len(settings.offsets), settings.length
    rng = np.random.default_rng(settings.seed)
    q, k = (
        jnp.asarray(rng.standard_normal((b, s, dims.num_heads, dims.head_dim)), jnp.float32)
        for _ in "qk"
    )
    pos = jnp.asarray(settings.offsets)[:, None] + jnp.arange(s)[None, :]  # [B, S]
    changed = s // 3
    lookback = bound.key_lookback
    k2 = k.at[:, changed].add(jnp.asarray(rng.standard_normal(k.shape[2:]), jnp.float32))
    rq, rk = (np.asarray(x) for x in bound.rotate(params, q, k, pos, pos))
    rq2, rk2 = (np.asarray(x) for x in bound.rotate(params, q, k2, pos, pos))
    tol = dict(rtol=settings.tolerance, atol=settings.tolerance)
    if not np.allclose(rq2, rq, **tol):
        raise _fail(enc, "key_lookback", "changing a key's content changed the rotated queries")
    moved = [j for j in range(s) if not np.allclose(rk2[:, j], rk[:, j], **tol)]
    allowed = set(range(changed, changed + lookback + 1))
    if not set(moved) <= allowed:
        raise _fail(
            enc,
            "key_lookback",
            f"changing key {changed} changed rotated keys {moved}, but key_lookback = "
            f"{lookback} allows only {sorted(allowed)}",
        )
    if lookback and changed + lookback not in moved:
        raise _fail(
            enc,
            "key_lookback",
            f"declares key_lookback = {lookback}, but key {changed + lookback} does not read key "
            f"{changed} (declare the smallest true value: caches keep that many slots more)",
        )
