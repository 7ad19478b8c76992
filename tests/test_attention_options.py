"""The attention options (posenc.attention.options) on every path that takes them, against an
independent float64 numpy transcription of their definitions: windows (sliding, banded,
chunked; causal and bidirectional), attention sinks, QK-norm (RMS and L2, before and after the
rotation), Llama 4's query temperature, Scalable-Softmax, logit soft-capping and the logit scale,
composed with a rotation (RoPE), a content-free bias (ALiBi) and content logits
(Transformer-XL).

Paths: ``einsum``; ``blocked`` at one tile (``T = block``, which runs the reference) and at 16
tiles, with windows that are not multiples of the tile, windows wider than a tile, chunk
boundaries inside tiles, keys before the queries (``S > T``, Transformer-XL memory) and invalid
keys; ``xla`` where it takes the options; a cache's query at its slot (``q_index``); and the
one-line refusals of the paths that cannot. Also: the blocked path's cost grows as ``L x W``
under a sliding window (a static count of the traced program's FLOPs, not a timing).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.attention.core import attend, choose_implementation
from posenc.attention.options import AttentionOptions
from posenc.encodings import Dims

H, DH, MODEL_DIM = 2, 8, 16
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=MODEL_DIM)
BLOCK = 8
EPS = 1e-6
# float32 against float64: a few float32 roundings of O(1) numbers per output.
RTOL = ATOL = 1e-5

# Option bundles: each option in at least one bundle accepted by every path it claims.
INSIDE = dict(sinks=True, softcap=1.5, logit_scale=0.5)  # the softmax's own: einsum, blocked
QWEN = dict(  # RMS QK-norm before the rotation, temperature, SSMax, a logit scale: every path
    qk_norm="rms",
    qk_norm_placement="before_rotate",
    temperature_floor=4,
    temperature_scale=0.5,
    ssmax=True,
    logit_scale=0.25,
)
RMS_AFTER = dict(qk_norm="rms", qk_norm_placement="after_rotate", ssmax=True)
LLAMA4 = dict(qk_norm="l2", qk_norm_placement="after_rotate", temperature_floor=3)
# OLMo 2's QK-norm over all heads of a token, before the rotation: every path.
OLMO = dict(qk_norm="rms_all_heads", qk_norm_placement="before_rotate")
BUNDLES = {
    "inside": INSIDE,
    "qwen": QWEN,
    "rms_after": RMS_AFTER,
    "llama4": LLAMA4,
    "olmo": OLMO,
    "none": {},
}

_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@functools.cache
def _encoder(name):
    """The bound encoder and O(1) parameters (numpy, so a cached value holds no tracer)."""
    enc = encodings.get(name).bind(DIMS)
    with jax.ensure_compile_time_eval():
        params = {n: np.asarray(x) for n, x in enc.init(jax.random.key(3), DIMS).items()}
    if name == "xl":  # u and v start at std 0.02: make them matter
        params = {n: x if n == "w_r" else x * 25.0 for n, x in params.items()}
    return enc, params


def _learned(width=DH):
    """Values of every option's learned parameters, away from their initial values (QK-norm's
    scales of ``width``: ``H * DH`` for ``"rms_all_heads"``)."""
    r = np.random.default_rng(7)
    return {
        "q_norm": (1.0 + 0.3 * r.standard_normal(width)).astype(np.float32),
        "k_norm": (1.0 + 0.3 * r.standard_normal(width)).astype(np.float32),
        "sinks": np.array([1.0, -0.5], np.float32),
        "ssmax": np.array([0.6, 0.9], np.float32),
    }


def _qkv(seed, b, t, s):
    r = np.random.default_rng(seed)
    return tuple(r.standard_normal((b, n, H, DH)).astype(np.float32) for n in (t, s, s))


# -- the float64 transcription ------------------------------------------------------------------


def _window_mask(qi, j, causal, window):
    """``[T, S]``: query at key index ``qi[t]`` may see key ``j[s]`` (options' docstring)."""
    a, j = qi[:, None], j[None, :]
    ok = j <= a if causal else np.ones((a.size, j.size), bool)
    if window == "full":
        return ok
    kind, size = window.split(":")
    w = int(size)
    if kind in ("sliding", "banded"):
        ok = ok & (a - w < j)
    if kind == "banded":
        ok = ok & (j - a < w)
    if kind == "chunked":
        ok = ok & (np.floor_divide(a, w) == np.floor_divide(j, w))
    return ok


def _rope(x, pos, base=10000.0):
    """GPT-NeoX / LLaMA RoPE: pair ``(x_m, x_{m + D/2})`` rotated by ``pos * base^(-2m/D)``."""
    d = x.shape[-1]
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    ang = pos[:, :, None, None] * theta  # [B, T, 1, D/2]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    cos, sin = np.cos(ang), np.sin(ang)
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)


def _qk_norm(x, kind, scale):
    """Over the channels: ``x / sqrt(mean(x^2) + eps)``, times the scale for ``"rms"``
    (Qwen3's RMSNorm; Llama 4's L2Norm has no scale); for ``"rms_all_heads"`` (OLMo 2) the
    token's ``[H, D]`` channels flattened, normed together and scaled by ``[H * D]``."""
    if kind == "rms_all_heads":
        b, n, h, d = x.shape
        flat = x.reshape(b, n, h * d)
        y = flat / np.sqrt(np.mean(flat * flat, axis=-1, keepdims=True) + EPS) * scale
        return y.reshape(b, n, h, d)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)
    return y * scale if kind == "rms" else y


def _xl_content(q, k, q_pos, k_pos, params):
    """Transformer-XL's terms (b) + (c) + (d): ``(q_i + v) . W_r R_{i-j} + u . k_j``."""
    dist = q_pos[:, :, None] - k_pos[:, None, :]  # [B, T, S]
    inv = 10000.0 ** (-np.arange(0, MODEL_DIM, 2) / MODEL_DIM)
    ang = dist[..., None] * inv  # [B, T, S, M/2]
    r = np.stack([np.sin(ang), np.cos(ang)], -1).reshape(*dist.shape, MODEL_DIM)
    rel = np.einsum("btsm,mhd->bthsd", r, params["w_r"].astype(np.float64))  # [B, T, H, S, D]
    u, v = (params[n].astype(np.float64) for n in ("u", "v"))
    position = np.einsum("bthd,bthsd->bhts", q + v[None, None], rel)
    return position + np.einsum("hd,bshd->bhs", u, k)[:, :, None, :]


def reference(
    q, k, v, name, params, q_pos, k_pos, causal, options, learned, q_index=None, k_valid=None
):
    """Attention with the encoder ``name`` (rope, alibi, xl or nope) and the options, in float64.

    Query ``t`` sits at key index ``q_index + t`` (default ``S - T``); ``k_valid [B, S]`` removes
    keys (Scalable-Softmax's ``n`` counts the visible keys that exist)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, h, d = q.shape
    s = k.shape[1]
    q_pos = np.broadcast_to(np.atleast_2d(q_pos), (b, t)).astype(np.float64)
    k_pos = np.broadcast_to(np.atleast_2d(k_pos), (b, s)).astype(np.float64)
    first = s - t if q_index is None else q_index
    vis = _window_mask(first + np.arange(t), np.arange(s), causal, options.window)  # [T, S]
    valid = np.ones((b, s), bool) if k_valid is None else np.asarray(k_valid, bool)
    vis = vis[None] & valid[:, None, :]  # [B, T, S]
    learned = {n: np.asarray(x, np.float64) for n, x in learned.items()}
    norm, placement = options.qk_norm, options.qk_norm_placement
    if norm != "none" and placement == "before_rotate":
        q, k = _qk_norm(q, norm, learned.get("q_norm")), _qk_norm(k, norm, learned.get("k_norm"))
    if name == "rope":
        q, k = _rope(q, q_pos), _rope(k, k_pos)
    if norm != "none" and placement == "after_rotate":
        q, k = _qk_norm(q, norm, learned.get("q_norm")), _qk_norm(k, norm, learned.get("k_norm"))
    if options.temperature_floor:
        temp = np.log(np.floor((q_pos + 1) / options.temperature_floor) + 1)
        q = q * (temp * options.temperature_scale + 1)[:, :, None, None]
    if options.ssmax:
        n = np.maximum(vis.sum(-1), 1)  # [B, T]
        q = q * (np.log(n)[:, :, None] * learned["ssmax"][None, None, :])[..., None]
    logits = np.einsum("bthd,bshd->bhts", q, k)
    if name == "xl":
        logits = logits + _xl_content(q, k, q_pos, k_pos, params)
    logits = logits * (options.logit_scale or 1 / math.sqrt(d))
    if name == "alibi":
        slopes = 2.0 ** (-8.0 * np.arange(1, h + 1) / h)
        dist = np.abs(q_pos[:, :, None] - k_pos[:, None, :])
        logits = logits - slopes[None, :, None, None] * dist[:, None]
    if options.softcap:
        logits = options.softcap * np.tanh(logits / options.softcap)
    logits = np.where(vis[:, None], logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    if options.sinks:
        sink = learned["sinks"][None, :, None, None]
        top = np.maximum(top, sink)
    e = np.exp(logits - top)
    denom = e.sum(-1, keepdims=True)
    if options.sinks:
        denom = denom + np.exp(sink - top)
    return np.einsum("bhts,bshd->bthd", e / denom, v)


# -- attend under jit ---------------------------------------------------------------------------


@functools.cache
def _compiled(name, path, causal, options, block):
    enc, _ = _encoder(name)

    def run(q, k, v, params, learned, q_pos, k_pos, k_valid, q_index):
        return attend(
            q,
            k,
            v,
            encoding=enc,
            params=params,
            q_pos=q_pos,
            k_pos=k_pos,
            causal=causal,
            implementation=path,
            block_size=block,
            options=options,
            learned=learned,
            k_valid=k_valid,
            q_index=q_index,
            norm_eps=EPS,
        )

    return _jit(run)


def _check(name, path, window, causal, bundle, t, s, offset=5, k_valid=None, q_index=None):
    """``attend`` on ``path`` equals the float64 transcription (positions from ``offset``)."""
    options = AttentionOptions(window=window, **BUNDLES[bundle])
    _, params = _encoder(name)
    learned = _learned(H * DH if options.qk_norm == "rms_all_heads" else DH)
    q, k, v = _qkv(t * 1000 + s, 2, t, s)
    k_pos = offset + np.arange(s)[None, :]
    first = s - t if q_index is None else q_index
    q_pos = k_pos[:, first : first + t]
    k_in, v_in = k, v
    if k_valid is not None:  # garbage in the removed keys must not reach an output
        k_in, v_in = (np.where(k_valid[:, :, None, None], x, np.nan) for x in (k, v))
    run = _compiled(name, path, causal, options, BLOCK)
    got = run(q, k_in, v_in, params, learned, q_pos, k_pos, k_valid, q_index)
    want = reference(
        q, k, v, name, params, q_pos, k_pos, causal, options, learned, q_index, k_valid
    )
    where = f"{name} on {path}, {window}, causal={causal}, {bundle}, T={t}, S={s}"
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL, err_msg=where)


# (encoder, window, causal, bundle, T, S)
BLOCKED = [
    # 16 tiles of queries and keys: windows narrower than a tile and not a multiple of it,
    # wider than a tile, chunk boundaries inside tiles, both masks.
    ("rope", "sliding:5", True, "qwen", 128, 128),
    ("alibi", "sliding:20", True, "inside", 128, 128),
    ("xl", "banded:11", False, "inside", 128, 128),
    ("rope", "chunked:12", True, "llama4", 128, 128),
    ("alibi", "chunked:12", False, "qwen", 128, 128),
    ("xl", "sliding:20", False, "llama4", 128, 128),  # bounds the past only
    ("rope", "full", True, "inside", 128, 128),
    ("rope", "banded:11", True, "rms_after", 128, 128),
    # Keys before the queries (Transformer-XL memory), a partial last tile of queries.
    ("xl", "sliding:20", True, "inside", 21, 64),
    ("rope", "chunked:12", True, "qwen", 21, 64),
    ("alibi", "banded:11", False, "llama4", 21, 64),
    ("rope", "sliding:5", False, "inside", 21, 64),
    # One tile: the blocked path runs the reference.
    ("rope", "sliding:5", True, "inside", 8, 8),
    ("rope", "sliding:20", True, "olmo", 21, 64),
]


@pytest.mark.parametrize("name,window,causal,bundle,t,s", BLOCKED)
def test_blocked_path_equals_the_transcription(name, window, causal, bundle, t, s):
    _check(name, "blocked", window, causal, bundle, t, s)


EINSUM = [
    ("rope", "sliding:5", True, "inside", 16, 16),
    ("alibi", "chunked:4", False, "inside", 13, 40),
    ("xl", "banded:11", True, "qwen", 13, 40),
    ("rope", "full", False, "llama4", 16, 16),
    ("xl", "sliding:20", True, "inside", 13, 40),
    ("rope", "chunked:6", True, "rms_after", 13, 40),
    ("rope", "full", True, "olmo", 13, 40),
]


@pytest.mark.parametrize("name,window,causal,bundle,t,s", EINSUM)
def test_einsum_path_equals_the_transcription(name, window, causal, bundle, t, s):
    _check(name, "einsum", window, causal, bundle, t, s)


XLA = [
    ("rope", "sliding:5", True, "qwen", 16, 16),  # the kernel's local window
    ("alibi", "banded:11", True, "llama4", 16, 16),  # likewise
    ("xl", "chunked:4", True, "qwen", 16, 16),  # a mask
    ("rope", "sliding:5", True, "rms_after", 13, 40),  # a mask: keys before the queries
    ("alibi", "banded:11", False, "llama4", 16, 16),
    ("xl", "full", True, "qwen", 16, 16),
    ("rope", "sliding:5", True, "olmo", 16, 16),
]


@pytest.mark.parametrize("name,window,causal,bundle,t,s", XLA)
def test_xla_path_equals_the_transcription(name, window, causal, bundle, t, s):
    _check(name, "xla", window, causal, bundle, t, s)


@pytest.mark.parametrize("path", ["einsum", "blocked"])
def test_invalid_keys_are_removed_under_every_option(path):
    """Padding before the queries in one row, every option on at once; SSMax's ``n`` counts
    the visible keys that exist."""
    valid = np.ones((2, 64), bool)
    valid[1, :23] = False  # row 1: its first 23 keys are padding
    valid[0, 30:33] = False  # row 0: a hole inside a window
    for window, bundle in (("sliding:20", "qwen"), ("chunked:12", "inside")):
        _check("rope", path, window, True, bundle, 21, 64, k_valid=valid)


@pytest.mark.parametrize("q_index,t", [(10, 1), (6, 3)])
def test_a_cache_query_at_its_slot(q_index, t):
    """A cache of 24 slots filled up to the queries' last (``k_valid``), the queries at their
    slot (``q_index``), on einsum (where ``auto`` sends a cache)."""
    valid = (np.arange(24) < q_index + t)[None, :].repeat(2, 0)
    _check("alibi", "einsum", "sliding:5", True, "qwen", t, 24, k_valid=valid, q_index=q_index)
    _check("rope", "einsum", "chunked:4", True, "inside", t, 24, k_valid=valid, q_index=q_index)


def test_padding_is_removed_exactly_under_scalable_softmax():
    """A bidirectional encoder's padded row equals the same row unpadded (a classifier's batch):
    Scalable-Softmax's ``n`` must not count the padding."""
    enc, _ = _encoder("nope")
    options = AttentionOptions(ssmax=True)
    learned = _learned()
    q, k, v = _qkv(0, 1, 12, 12)
    valid = np.arange(12)[None, :] < 9
    pos = np.arange(12)[None, :]

    @_jit
    def run(q, k, v, k_valid, pos):
        return attend(
            q,
            k,
            v,
            encoding=enc,
            params={},
            q_pos=pos,
            k_pos=pos,
            causal=False,
            implementation="einsum",
            options=options,
            learned=learned,
            k_valid=k_valid,
        )

    padded = np.asarray(run(q, k, v, valid, pos))[:, :9]
    alone = np.asarray(run(q[:, :9], k[:, :9], v[:, :9], None, pos[:, :9]))
    np.testing.assert_allclose(padded, alone, rtol=RTOL, atol=ATOL)


def test_every_option_changes_the_transcription():
    """Each option moves the reference's output here, so the comparisons above can fail."""
    _, params = _encoder("rope")
    learned = _learned()
    q, k, v = _qkv(1, 2, 13, 40)
    pos = 5 + np.arange(40)[None, :]
    full = dict(INSIDE, **QWEN)

    def out(**fields):
        options = AttentionOptions(**fields)
        return reference(q, k, v, "rope", params, pos[:, 27:], pos, True, options, learned)

    base = out(**full)
    for field in full:
        if field == "qk_norm_placement":  # its default: checked below
            continue
        rest = {f: x for f, x in full.items() if f != field}
        assert np.abs(out(**rest) - base).max() > 1e-2, field
    for window in ("sliding:5", "banded:5", "chunked:8"):
        assert np.abs(out(window=window, **full) - base).max() > 1e-2, window
    after = dict(full, qk_norm_placement="after_rotate")
    assert np.abs(out(**after) - base).max() > 1e-2, "rms placement"
    # Without the causal mask, a band reaches forward and a sliding window does not.
    bi = reference(q, k, v, "rope", params, pos[:, 27:], pos, False, AttentionOptions(), {})
    for window in ("sliding:5", "banded:5"):
        options = AttentionOptions(window=window)
        got = reference(q, k, v, "rope", params, pos[:, 27:], pos, False, options, {})
        assert np.abs(got - bi).max() > 1e-2, window


# -- refusals -----------------------------------------------------------------------------------


def _attend_on(path, options, name="rope"):
    enc, params = _encoder(name)
    q, k, v = _qkv(0, 1, 4, 4)
    return attend(
        q,
        k,
        v,
        encoding=enc,
        params=params,
        q_pos=np.arange(4),
        k_pos=np.arange(4),
        implementation=path,
        options=options,
        learned=_learned(),
    )


@pytest.mark.parametrize("path", ["xla", "cudnn"])
@pytest.mark.parametrize("field,value", [("sinks", True), ("softcap", 30.0)])
def test_fused_paths_refuse_the_softmax_options(path, field, value):
    options = AttentionOptions(**{field: value}, prefix="layers.kinds.local")
    with pytest.raises(ValueError, match=rf"layers\.kinds\.local\.{field}") as e:
        _attend_on(path, options)
    assert "\n" not in str(e.value) and "model.attention_impl" in str(e.value)


LINEAR_REFUSED = [
    ("window", "sliding:4"),
    ("sinks", True),
    ("qk_norm", "l2"),
    ("softcap", 30.0),
    ("logit_scale", 0.5),
    ("temperature_floor", 8),
    ("ssmax", True),
]


@pytest.mark.parametrize("path", ["linear", "linear_performer"])
def test_linear_paths_refuse_every_option(path):
    for field, value in LINEAR_REFUSED:
        with pytest.raises(ValueError, match=rf"model\.{field}=") as e:
            _attend_on(path, AttentionOptions(**{field: value}))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("path", ["xla", "cudnn"])
def test_fused_paths_refuse_a_cache_alignment(path):
    enc, params = _encoder("rope")
    q, k, v = _qkv(0, 1, 1, 4)
    with pytest.raises(ValueError, match="q_index"):
        attend(
            q,
            k,
            v,
            encoding=enc,
            params=params,
            q_pos=np.arange(3, 4),
            k_pos=np.arange(4),
            implementation=path,
            q_index=3,
        )


def test_auto_never_sends_a_long_window_to_a_dense_mask():
    """On a GPU, ``auto`` gives cuDNN a sliding window it takes as its own local window at any
    length, but a window that would enter as a dense ``[T, S]`` mask (chunked; any window
    without the causal mask or with keys before the queries) only up to one block: longer, the
    mask would make memory quadratic (a 16k window: 512 MiB of bf16 bias), so ``blocked``."""
    enc = encodings.get("rope").bind(Dims(num_heads=2, head_dim=64, model_dim=128))

    def path(window, t, s=None, causal=True):
        options = AttentionOptions(window=window)
        return choose_implementation(
            enc, t, jnp.bfloat16, 512, "gpu", 64, s or t, options, causal=causal
        )

    assert path("sliding:4096", 16384) == path("banded:128", 16384) == "cudnn"
    assert path("full", 16384) == "cudnn"
    assert path("chunked:8192", 16384) == "blocked"
    assert path("sliding:4096", 16384, causal=False) == "blocked"
    assert path("sliding:4096", 16384, 20480) == "blocked"  # memory before the queries
    assert path("chunked:256", 512) == path("sliding:256", 512, causal=False) == "cudnn"
    assert path("chunked:8192", 16384, causal=False) == "blocked"


# -- cost: L x W -------------------------------------------------------------------------------


def _flops(jaxpr) -> int:
    """Multiply-adds of every ``dot_general`` in a traced program, times 2, each multiplied by
    the trip count of every ``scan`` around it (``lax.map`` is a scan); a ``cond`` or ``switch``
    counts its costliest branch (so tiles skipped at run time still count). XLA's own
    ``cost_analysis`` counts a loop's body once, whatever its trip count."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            size = math.prod(lhs[a] for a in contract)
            total += 2 * size * math.prod(eqn.outvars[0].aval.shape)
            continue
        if eqn.primitive.name == "while":
            raise AssertionError("a while loop of unknown trip count in the attention")
        inner = []
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    inner.append(_flops(sub.jaxpr))
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    inner.append(_flops(sub))
        if not inner:
            continue
        if eqn.primitive.name == "cond":
            total += max(inner)
        elif eqn.primitive.name == "scan":
            total += eqn.params["length"] * sum(inner)
        else:
            total += sum(inner)
    return total


def _blocked_flops(t: int, window: str) -> int:
    enc, _ = _encoder("nope")
    x = jax.ShapeDtypeStruct((1, t, 1, DH), jnp.float32)
    pos = jax.ShapeDtypeStruct((1, t), jnp.int32)

    def run(q, k, v, pos):
        return attend(
            q,
            k,
            v,
            encoding=enc,
            params={},
            q_pos=pos,
            k_pos=pos,
            implementation="blocked",
            block_size=128,
            options=AttentionOptions(window=window),
        )

    return _flops(jax.make_jaxpr(run)(x, x, x, pos).jaxpr)


def test_blocked_cost_grows_as_length_times_window():
    """Four times the length: about four times the work under a sliding window of 128 (the
    key tiles a query block can reach), sixteen times without one."""
    sliding = _blocked_flops(4096, "sliding:128") / _blocked_flops(1024, "sliding:128")
    full = _blocked_flops(4096, "full") / _blocked_flops(1024, "full")
    assert 3.9 < sliding < 4.1, sliding
    assert 15.5 < full < 16.5, full
    # And a window of 128 at 4096 tokens costs what 3 key tiles per query block cost.
    per_tile = _blocked_flops(128, "full")
    assert _blocked_flops(4096, "sliding:128") == 32 * 3 * per_tile
