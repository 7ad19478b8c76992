"""What a layer's attention does besides its positional encoder: its window, attention sinks,
QK-norm, a query temperature by position, Scalable-Softmax, logit soft-capping and its logit
scale. Each is data (a field of :class:`AttentionOptions`), applied by
:func:`posenc.attention.core.attend` on every path that can take it and refused in one line on
one that cannot.

Windows (index-based, like the causal mask: query ``i`` of ``T`` over ``S`` keys sits at key
index ``a_i = q_index + i``, ``q_index = S - T`` unless a cache says otherwise):

- ``"full"``: every key (the causal mask still applies).
- ``"sliding:W"``: the keys of the last ``W`` indices, ``a_i - W < j`` (Mistral, Gemma 2's and
  Gemma 3's local layers, Cohere2, SWAN-GPT, OLMo 3; with the causal mask, ``a_i - W < j <= a_i``).
  Without the causal mask it bounds the past only.
- ``"banded:W"``: ``|a_i - j| < W`` on both sides (a bidirectional local band; under the causal
  mask the same keys as ``sliding:W``: gpt-oss's 128-token banded layers).
- ``"chunked:C"``: the keys of the query's own chunk, ``floor(a_i / C) == floor(j / C)``, chunks
  counted from key index 0 (Llama 4's chunked local attention, 8192 tokens).

The other options (each off by default):

- ``sinks``: one learned logit per head in the softmax's denominator only (gpt-oss; Xiao et
  al.'s sink as a parameter): ``p_ij = exp(z_ij) / (exp(s_h) + sum_j exp(z_ij))``.
- ``qk_norm``: ``"rms"`` (RMSNorm over each head's channels, one learned scale of ``head_dim``
  for queries and one for keys: Qwen3, Gemma 3), ``"rms_all_heads"`` (RMSNorm over every head's
  channels of a token together, ``H * Dh`` for the queries and ``KV * Dh`` for the keys, each
  with a learned scale of that width: OLMo 2 and OLMo 3, which norm the whole projection before
  splitting it into heads) or ``"l2"`` (Llama 4's ``L2Norm``, which despite its name divides by
  the root mean square, not the length: unit RMS, no parameter), applied ``"before_rotate"``
  (Qwen3, Gemma 3, OLMo) or ``"after_rotate"`` (Llama 4) by ``qk_norm_placement``.
- ``temperature_floor`` (> 0): Llama 4's attention temperature tuning, queries multiplied by
  ``log(floor((pos + 1) / temperature_floor) + 1) * temperature_scale + 1`` at their position.
- ``ssmax``: Scalable-Softmax (Nakanishi 2025), queries multiplied by ``s_h * log n_i`` with
  ``n_i`` the number of keys query ``i`` may see (its causal prefix within the window, the keys
  that exist: a key ``attend``'s ``k_valid`` removes is not counted) and a
  learned ``s_h`` per head (initialised to 0.43, the paper's value).
- ``softcap`` (> 0): Gemma 2's logit soft-capping, ``cap * tanh(z / cap)`` on the scaled logits
  with every positional term, before the mask.
- ``logit_scale`` (> 0): the logits' scale instead of ``1 / sqrt(head_dim)`` (Gemma 2's
  ``query_pre_attn_scalar ** -0.5``).

The temperature and Scalable-Softmax multiply the queries after rotation, as Llama 4 and the
SSMax implementations do, so they scale ``q . k`` (and content logits that read ``q``) but not a
content-free bias.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

WINDOW_KINDS = ("full", "sliding", "banded", "chunked")
QK_NORMS = ("none", "rms", "rms_all_heads", "l2")
QK_NORM_PLACEMENTS = ("before_rotate", "after_rotate")
SSMAX_INIT = 0.43  # Nakanishi (2025)'s initial s


@dataclasses.dataclass(frozen=True)
class Window:
    """A parsed window: ``kind`` of :data:`WINDOW_KINDS` and its size (0 for ``"full"``)."""

    kind: str = "full"
    size: int = 0

    @property
    def full(self) -> bool:
        return self.kind == "full"

    def __str__(self) -> str:
        return "full" if self.full else f"{self.kind}:{self.size}"

    def reach_after(self, causal: bool) -> int | None:
        """The most key indices a query may see after its own (None: unbounded)."""
        if causal:
            return 0
        if self.kind == "banded":
            return self.size - 1
        if self.kind == "chunked":
            return self.size - 1
        return None


def parse_window(value: object, field: str = "model.window") -> Window:
    """``"full"``, ``"sliding:W"``, ``"banded:W"`` or ``"chunked:C"`` (W, C positive integers)
    as a :class:`Window`; a one-line ``ValueError`` naming ``field`` otherwise."""
    if isinstance(value, Window):
        return value
    allowed = "'full', 'sliding:W', 'banded:W' or 'chunked:C' (W, C positive integers)"
    if not isinstance(value, str):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    if value == "full":
        return Window()
    kind, sep, size = value.partition(":")
    if not sep or kind not in WINDOW_KINDS[1:] or not size.isdigit() or int(size) < 1:
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    return Window(kind, int(size))


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """One layer's attention options (module docstring); the defaults change nothing.

    ``prefix`` names where the options were set (``model`` or ``layers.kinds.<name>``), for
    error messages only.
    """

    window: str = "full"
    sinks: bool = False
    qk_norm: str = "none"
    qk_norm_placement: str = "before_rotate"
    softcap: float = 0.0
    logit_scale: float = 0.0
    temperature_floor: int = 0
    temperature_scale: float = 0.1
    ssmax: bool = False
    prefix: str = dataclasses.field(default="model", compare=False)

    def __post_init__(self):
        p = self.prefix
        parse_window(self.window, f"{p}.window")
        for name in ("sinks", "ssmax"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{p}.{name} must be True or False, got {getattr(self, name)!r}")
        for name, allowed in (("qk_norm", QK_NORMS), ("qk_norm_placement", QK_NORM_PLACEMENTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{p}.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}"
                )
        for name in ("softcap", "logit_scale", "temperature_scale"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"{p}.{name} must be a finite number >= 0 (0: off), got {value!r}")
        floor = self.temperature_floor
        if not isinstance(floor, int) or isinstance(floor, bool) or floor < 0:
            raise ValueError(
                f"{p}.temperature_floor must be an integer >= 0 (0: no query temperature), "
                f"got {floor!r}"
            )

    @property
    def parsed_window(self) -> Window:
        return parse_window(self.window, f"{self.prefix}.window")

    @property
    def default(self) -> bool:
        """No option is set: attention is posenc's original."""
        return self == AttentionOptions()

    def changes_logits(self) -> list[str]:
        """The options that act on the logits or the softmax, which the fused kernels' inputs
        cannot carry (the window aside, which they take as a mask)."""
        out = []
        if self.sinks:
            out.append("sinks")
        if self.softcap:
            out.append("softcap")
        return out

    def learned(
        self, num_heads: int, head_dim: int, num_kv_heads: int | None = None
    ) -> dict[str, tuple[tuple[int, ...], float]]:
        """The options' learned parameters: name -> (shape, initial value); ``num_kv_heads``
        (None: ``num_heads``) sizes the keys' scale of ``"rms_all_heads"``."""
        out: dict[str, tuple[tuple[int, ...], float]] = {}
        if self.qk_norm == "rms":
            out["q_norm"] = ((head_dim,), 1.0)
            out["k_norm"] = ((head_dim,), 1.0)
        if self.qk_norm == "rms_all_heads":
            out["q_norm"] = ((num_heads * head_dim,), 1.0)
            out["k_norm"] = (((num_kv_heads or num_heads) * head_dim,), 1.0)
        if self.sinks:
            out["sinks"] = ((num_heads,), 0.0)
        if self.ssmax:
            out["ssmax"] = ((num_heads,), SSMAX_INIT)
        return out


OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(AttentionOptions) if f.name != "prefix")


def visible(
    i: jax.Array,
    j: jax.Array,
    causal: bool,
    window: Window,
) -> jax.Array:
    """Whether the query at key index ``i`` may see key ``j`` (broadcasting integer arrays):
    the causal mask and the window (module docstring)."""
    ok = j <= i if causal else jnp.ones(jnp.broadcast_shapes(i.shape, j.shape), bool)
    if window.kind in ("sliding", "banded"):
        ok = ok & (j > i - window.size)
    if window.kind == "banded":
        ok = ok & (j < i + window.size)
    if window.kind == "chunked":
        ok = ok & (j // window.size == i // window.size)
    return ok


def visible_count(
    i: jax.Array, s: int, causal: bool, window: Window, valid: jax.Array | None = None
) -> jax.Array:
    """How many of ``s`` keys the query at key index ``i [T]`` may see (Scalable-Softmax's
    ``n``), as float32, at least 1: ``[T]``, or with ``valid [B|1, S]`` (the keys that exist,
    ``attend``'s ``k_valid``) the visible keys that exist, ``[B|1, T]``, so that a removed key
    is not counted (a padded row's ``n`` is that of the row without its padding)."""
    i = i.astype(jnp.int32)
    hi = jnp.minimum(i, s - 1) if causal else jnp.full_like(i, s - 1)
    lo = jnp.zeros_like(i)
    if window.kind in ("sliding", "banded"):
        lo = jnp.maximum(lo, i - window.size + 1)
    if window.kind == "banded":
        hi = jnp.minimum(hi, i + window.size - 1)
    if window.kind == "chunked":
        lo = jnp.maximum(lo, (i // window.size) * window.size)
        hi = jnp.minimum(hi, (i // window.size + 1) * window.size - 1)
    if valid is None:
        return jnp.maximum(hi - lo + 1, 1).astype(jnp.float32)
    # Keys that exist among indices lo..hi, from a running count: O(S), not O(T x S).
    before = jnp.cumsum(valid.astype(jnp.int32), axis=-1)  # [B|1, S]: valid keys <= j
    before = jnp.pad(before, ((0, 0), (1, 0)))  # [B|1, S + 1]: valid keys < j
    count = jnp.take(before, jnp.clip(hi + 1, 0, s), axis=1) - jnp.take(
        before, jnp.clip(lo, 0, s), axis=1
    )  # [B|1, T]
    return jnp.maximum(count, 1).astype(jnp.float32)


def qk_normalize(x: jax.Array, kind: str, scale: jax.Array | None, eps: float) -> jax.Array:
    """``x [.., H, Dh]`` normalised in float32, ``x * rsqrt(mean(x^2) + eps)``, the mean over
    each head's ``Dh`` channels (``"rms"``, ``"l2"``) or over all ``H * Dh`` channels of a
    token (``"rms_all_heads"``): times ``scale`` (``[Dh]``, or ``[H * Dh]`` for all heads) for
    the RMSNorms, without one for ``"l2"`` (Llama 4's ``L2Norm``, the same unit-RMS form);
    returned in ``x.dtype``.

    Keys repeated for grouped-query attention (``[.., H, Dh]`` made of ``KV`` heads, each
    repeated ``H / KV`` times in a row) with a ``[KV * Dh]`` scale of ``"rms_all_heads"`` take
    the scale repeated alike; the mean over the repeated channels is the mean over the ``KV``
    heads' own."""
    x32 = x.astype(jnp.float32)
    axes = (-2, -1) if kind == "rms_all_heads" else (-1,)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axes, keepdims=True) + eps)
    if kind in ("rms", "rms_all_heads") and scale is not None:
        scale = scale.astype(jnp.float32)
        if kind == "rms_all_heads":
            heads, width = x.shape[-2], x.shape[-1]
            scale = scale.reshape(-1, width)  # [KV, Dh]
            scale = jnp.repeat(scale, heads // scale.shape[0], axis=0)  # [H, Dh]
        y = y * scale
    return y.astype(x.dtype)


def query_factor(
    options: AttentionOptions,
    learned: dict[str, jax.Array],
    q_pos: jax.Array,
    q_index: jax.Array,
    s: int,
    causal: bool,
    k_valid: jax.Array | None = None,
) -> jax.Array | None:
    """The per-query (and, with Scalable-Softmax, per-head) factor on the queries:
    ``[B|1, T, H|1, 1]`` float32, or None when neither the temperature nor SSMax is set.

    ``q_pos``: ``[B|1, T]`` the queries' positions (the temperature's); ``q_index``: ``[T]`` their
    key indices (SSMax's ``n``); ``k_valid``: ``[B|1, S]`` the keys that exist (None: all), the
    only ones SSMax's ``n`` counts."""
    factor = None
    if options.temperature_floor:
        pos = q_pos.astype(jnp.float32)
        t = jnp.log(jnp.floor((pos + 1.0) / options.temperature_floor) + 1.0)
        factor = (t * options.temperature_scale + 1.0)[:, :, None, None]  # [B|1, T, 1, 1]
    if options.ssmax:
        n = visible_count(q_index, s, causal, options.parsed_window, k_valid)
        n = jnp.atleast_2d(n)  # [B|1, T]
        s_h = learned["ssmax"].astype(jnp.float32)  # [H]
        ss = jnp.log(n)[:, :, None, None] * s_h[None, None, :, None]  # [B|1, T, H, 1]
        factor = ss if factor is None else factor * ss
    return factor
