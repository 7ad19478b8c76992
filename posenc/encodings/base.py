"""The contract every positional encoder follows.

An encoder is a frozen dataclass of hyperparameters plus pure functions of explicit arrays. It
provides only the hooks it needs, and attention calls whichever are present:

=================================================  =============================================
hook                                               returns
=================================================  =============================================
``embed(params, positions)``                       ``[B|1, T, D]`` term added to token embeddings
``embed_tokens(params, x, positions)``             ``[B, T, D]`` term from the token embeddings
``augment_positions(params, positions, rng)``      ``[B, T]`` float positions ``embed`` receives
``rotate(params, q, k, q_pos, k_pos)``             transformed ``q`` and ``k`` (see widths below)
``bias(params, q_pos, k_pos)``                     content-free logits ``[B|1, H, T, S]``
``content_logits(params, q, k, q_pos, k_pos)``     content-dependent logits ``[B, H, T, S]``
``log_decay(params, inputs)``                      per-token log decay ``[B, S, H]`` (see below)
``householder(params, inputs)``                    ``(w [B, S, H, Dh], beta [B, S, H])`` (below)
``contextual_logits(params, q, k, logits, carry)`` ``(terms [B, H, T, S], carry [B, H, T])``
``value_term(params, probs, q_pos, k_pos)``        ``[B, T, H, Dh]`` added to attention output
=================================================  =============================================

Shapes: ``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]``, ``probs: [B, H, T, S]``; positions are integer
arrays ``[B|1, T]`` (queries) and ``[B|1, S]`` (keys) — attention normalises ``[T]`` to ``[1, T]``
before calling a hook — except in ``embed`` and ``augment_positions`` of an encoder that
declares ``continuous_positions`` (float32, below). Every hook takes the encoder's parameters
first (``{}`` when it has none). The queries are the last ``T`` of the ``S`` keys
(self-attention over a window).

Widths: ``rotate`` may change the last axis of ``q`` and ``k`` (both to ``qk_head_dim(Dh)``, a
declaration below; PoPE doubles it); ``v`` and the output keep ``Dh``, and the logit scale stays
``1/sqrt(Dh)`` of the projected width. Hooks after ``rotate`` see the transformed ``q`` and ``k``.

The token embeddings: ``embed_tokens`` reads ``x: [B, T, D]``, the model's scaled float32 token
embeddings (before any ``embed`` term), and returns a float32 term the model adds to them, like
``embed`` (wav2vec 2.0's convolution over the embeddings). Entry ``t`` may depend on ``x`` at
``t`` and before only unless the encoder refuses a causal model (its ``check_causal``). It is
computed once per window at the input, so its parameters are shared (``param_scope``).

Continuous positions: an encoder that declares ``continuous_positions = True`` gets float32
positions ``[B|1, T]`` in ``embed`` (the given positions as float32; every other hook still gets
them as int32). With an ``augment_positions`` hook (which requires the declaration) the model
first passes them, broadcast to ``[B, T]``, through it on every pass: ``rng`` is a key in
training, derived from the model's ``rng`` (so from the seed and the step), and None in a
deterministic pass (evaluation), where the hook must not draw anything (CAPE's shifts and scaling
in training; only its deterministic part, e.g. mean-centring, at evaluation).

The layer input: ``log_decay`` reads ``inputs: [B, S, D]``, the normed input of the attention layer
at the keys (the model passes it; ``attend(..., inputs=...)``), and returns a log decay per token
and head; attention adds ``sum_{l=j+1..i} log_decay_l`` (computed once per window as float32
cumulative sums, ``c_i - c_j``) to the logit of query ``i`` and key ``j`` after scaling, like a
bias (the Forgetting Transformer's forget gates). Entry ``l`` may depend on ``inputs`` at ``l`` and
before only, or the model would see the future.

Householder products (PaTH): ``householder`` reads ``inputs: [B, S, D]`` as ``log_decay`` does
and returns, per token ``t`` and head, a vector ``w_t`` and a scalar ``beta_t`` (float32) of the
map ``H_t = I - beta_t w_t w_t^T``; attention replaces ``q_i . k_j`` (before scaling, so with
``content_logits`` it is the same units) by ``q_i^T H_i H_{i-1} ... H_{j+1} k_j``, the key
carried through every map after it up to the query (nothing for ``j = i``). Entry ``t`` may
depend on ``inputs`` at ``t`` and before only: the model would see the future otherwise, and a
key/value cache, which calls the hook on the filled slots, would not reproduce a full pass. The
``einsum`` path forms each chunk's product in compact form and carries every query's vector
from the last key chunk to the first; the ``blocked`` path does the same per key tile
(:mod:`posenc.attention.householder`), so memory stays linear in the window. The products are
defined for keys before the query only: an encoder with the hook declares ``causal_only``. The
fused kernels and linear attention never form the logits and refuse it.

Contextual logits (CoPE's positions, which count the keys between a query and a key): attention
passes ``logits``, the float32 logits of the pairs so far (scaled, with ``bias`` and decay) with
masked pairs (the future, padding) at ``-1e30``, and ``carry``, a float32 ``[B, H, T]`` running sum
the encoder keeps over the keys *after* those passed (zeros at the last key). The hook returns
terms added to the logits after scaling (bias units) and the carry for the keys before these.
The ``einsum`` path calls it once on whole rows; the ``blocked`` path on key tiles from the last to
the first, carrying the sum (the online softmax does not care about the order). So splitting the
keys ``[left | right]`` and calling ``right`` (carry zeros) then ``left`` (the returned carry)
must equal one call on the whole row. The fused kernels never form the logits and refuse it.

Unnormalised weights (stick-breaking attention): an encoder that declares ``normalized = False``
gets attention weights ``exp(logits)`` as they are, with no softmax over the keys; its hooks
(``contextual_logits``, typically) make the logits the log weights. It promises that every row's
weights sum to at most 1 (a log weight is at most 0), so no path's arithmetic overflows: ``einsum``
forms ``exp(logits)``; ``blocked`` forms them on each tile and sums them with the values, without
the online softmax's running maximum and sum; the fused kernels and linear
attention (which normalise inside) refuse it, and so do attention sinks (a share of a softmax's
denominator). Masked pairs keep logit ``-1e30``, weight exactly 0.

Tiling: the ``blocked`` attention path calls ``bias``, ``content_logits``, ``contextual_logits``
and ``value_term`` on tiles of queries and keys, each with that tile's positions, and
accumulates ``value_term`` with unnormalised probabilities; so hooks must depend on positions
only through their arguments, and ``value_term`` must be linear in ``probs``. ``rotate``,
``log_decay`` and ``householder`` are called once on the whole window.

Cheaper tiles, declared (attention chooses the work from these declarations, never from a
name; :mod:`posenc.testing` checks that each is true):

- ``bias_by_distance``: ``bias`` depends on positions only through each pair's distance
  ``k_pos - q_pos`` (T5's buckets, ALiBi, KERPLE, dynamic position bias). Attention then calls
  ``bias`` once per window, on one query against the window's ``T + S`` distances, and lays
  that table out on each tile by index arithmetic (a Toeplitz band,
  :func:`~posenc.encodings.relative.rel_shift`) where positions are contiguous; elsewhere it
  calls ``bias`` per tile as before.
- ``reach``: an integer ``w`` (None: unbounded) past which pairs are all alike. For a fixed
  query, every key more than ``w`` positions before it (``k_pos - q_pos < -w``) gets the same
  ``bias`` and ``content_logits``, whatever that key's position and content, and ``value_term``
  gives each such key's probability the same vector; likewise every key more than ``w``
  positions after it (bidirectional attention). Shaw's clip distance and T5's last bucket are
  reaches. The ``blocked`` path then calls those hooks once per query block on one probe key on
  each side and runs tiles lying wholly beyond the reach at NoPE's cost, adding the probed
  per-query constants.
- ``carry_limit``: a float ``c`` (None: none) at which ``contextual_logits`` stops reading its
  tile. For every query whose carry is at or past ``c`` (CoPE's count, clipped at ``max_pos - 1``),
  the terms are the same for every key of the tile, whatever its logits and content, and the
  carry returned stays at or past ``c``. The ``blocked`` path then runs a key tile whose every
  query has reached the limit at NoPE's cost plus the terms of one probe key (a masked logit,
  content zero), which is exact; whether a tile qualifies depends on the data, so the saving
  does too (CoPE: every key tile but the last two of a query block, while its gates stay open).

Logit units: ``content_logits`` are *unscaled* terms added to ``q . k`` (both are multiplied by
``1/sqrt(Dh)`` together, as in Shaw et al. and Transformer-XL); ``bias`` terms are added after
scaling (as in T5 and ALiBi).

Learned parameters are created by ``init(rng, dims)`` as a flat ``dict`` of float32 arrays and
passed back into the hooks; nothing lives in hidden module state. ``param_scope`` says where the
model keeps them: ``"layer"`` (one set per attention layer) or ``"shared"`` (one set for the whole
model, e.g. T5's bias table, or a learned absolute table used once at the input).
``window_params(params)`` (default: unchanged) is what the hooks of one attention call read:
attention computes it once per call, before a path splits the window into tiles, so that a
transform whose gradient is not linear in its cotangent (KERPLE's projection onto its bounds)
sees the gradient of the whole window and not each tile's share; the hooks give the same values
on its result as on ``params``.

Declarations (class attributes and methods that describe the encoder; :mod:`posenc.testing`
checks each one against what the encoder does):

- ``relative``: True when attention depends on positions only through differences ``j - i``
  (shifting every position by a constant changes nothing), False for absolute encoders. The
  default is False, the claim that promises nothing.
- ``bias_by_distance``, ``reach``, ``carry_limit``: the cheaper tiles above (defaults False,
  None and None, the claims that promise nothing).
- ``param_shapes(dims)``: ``{name: shape}`` of what ``init`` returns (default ``{}``), so code
  can know an encoder's parameters without initialising them.
- ``param_axes()``: ``{name: logical axis names}`` of the parameters worth splitting over
  devices (Transformer-XL's ``W_kR``: ``("embed", "heads", "head_dim")``, as the attention
  projections; :mod:`posenc.devices.sharding` maps the names to mesh axes); the others are
  replicated (default ``{}``).
- ``eval_safe_hparams``: hyperparameters that may differ between training and evaluation without
  changing what was trained (Transformer-XL's ``clamp_len``: the original code clamps relative
  distances only at evaluation). ``posenc eval`` refuses to change any other;
  :meth:`Encoding.describe_eval` names a change in report columns (RoPE's ``yarn x8``).
- ``qk_head_dim(head_dim)``: the per-head width of ``q`` and ``k`` after ``rotate`` (default:
  unchanged), so attention can choose a path without running the encoder.
- ``continuous_positions``: True when ``embed`` takes float positions (see above); the model then
  passes it float32 positions and, if the encoder has one, the output of ``augment_positions``.
  Default False: ``embed`` gets int32 positions, as every other hook.
- ``causal_only``: True when the encoder is defined for causal attention only (nothing for keys
  after the query: FoX's decay, CoPE's counting); the model refuses it with
  ``model.causal=False``. Default False: every hook also serves bidirectional attention, where
  attention passes pairs with keys after the query too. :meth:`Encoding.check_causal` applies
  it, and an encoder whose hyperparameters decide (T5's ``bidirectional``) extends it.
- ``for_direction(causal)``: the encoder in the form that serves causal or bidirectional
  attention, which an encoder-decoder asks for on each side (its encoder bidirectional, its
  decoder causal) from the one encoder the config names. Default: itself. An encoder whose
  hyperparameters choose a direction overrides it (T5's ``bidirectional`` buckets, as T5's own
  encoder and decoder use; conv's centred or causal convolution).
- ``normalized``: False when attention's weights are ``exp(logits)`` with no softmax, each row
  summing to at most 1 (above). Default True: a softmax over the keys.
- ``cacheable``: True when a key/value cache reproduces a full pass (:mod:`posenc.decoding`):
  each token's keys, values and layer inputs, once computed, stay what a full pass over any
  longer window would compute for them. Hooks that read positions through their arguments
  satisfy it (the cache passes every slot's position); an encoder whose *window* changes earlier
  tokens' representations does not (RoPE's dynamic NTK scaling takes one length for the whole
  window, so every token of layers after the first changes as the window grows). Default True;
  :meth:`Encoding.check_cacheable` applies it, and an encoder whose hyperparameters decide
  extends it; greedy generation refuses a non-cacheable encoder in one line.
- ``key_lookback``: how many keys before its own each key's output of ``rotate`` reads (default
  0: key ``j`` after ``rotate`` depends on key ``j``'s input and the positions alone). A
  positive value says that ``rotate`` reads the ``key_lookback`` keys before it in the window,
  in time order (modded-nanogpt's key offset: 1); the first keys of a window read what there
  is. A full cache holds every earlier key, so it stays exact; a window-sized cache
  (:mod:`posenc.decoding.window`) keeps that many slots more than its window, masked by the
  window but passed to ``rotate``; the linear attention paths, which apply ``rotate`` to
  feature maps, refuse it.

An encoder is created unbound (``posenc.encodings.get("rope", base=1e4)``); the model binds it to
its shape with :meth:`Encoding.bind`, which validates the combination (e.g. RoPE needs an even
number of rotated dimensions) and fills :attr:`Encoding.dims`. Each encoder module registers its
class with :func:`posenc.encodings.register` (see :mod:`posenc.encodings.registry`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp

Params = dict[str, jax.Array]

HOOKS = (
    "augment_positions",
    "embed",
    "embed_tokens",
    "rotate",
    "bias",
    "content_logits",
    "log_decay",
    "householder",
    "contextual_logits",
    "value_term",
)


@dataclasses.dataclass(frozen=True)
class Dims:
    """The attention shape an encoder is bound to.

    Attributes:
      num_heads: attention heads ``H``.
      head_dim: per-head width ``Dh``.
      model_dim: residual stream width ``D``.
    """

    num_heads: int
    head_dim: int
    model_dim: int


@dataclasses.dataclass(frozen=True)
class Encoding:
    """Base class: hyperparameters as dataclass fields, hooks as methods of subclasses.

    Subclasses set ``name`` (the registry key), ``paper`` (a one-line citation), ``relative``
    when attention sees only position differences and, when their parameters are shared by all
    layers, ``param_scope = "shared"``. They define only the hooks they need (see the module
    docstring); the base class defines none of them.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    param_scope: ClassVar[str] = "layer"
    # Attention depends on positions only through differences (invariant to shifting them all).
    relative: ClassVar[bool] = False
    # Hyperparameters that evaluation may change without changing what was trained.
    eval_safe_hparams: ClassVar[tuple[str, ...]] = ()
    # Defined for causal attention only; the model refuses it with model.causal=False.
    causal_only: ClassVar[bool] = False
    # `embed` takes float32 (continuous) positions, possibly from `augment_positions`.
    continuous_positions: ClassVar[bool] = False
    # A key/value cache reproduces a full pass (posenc.decoding refuses it otherwise).
    cacheable: ClassVar[bool] = True
    # False: attention weights are exp(logits), no softmax; rows sum to at most 1 (docstring).
    normalized: ClassVar[bool] = True
    # `bias` depends on positions only through k_pos - q_pos (see the module docstring).
    bias_by_distance: ClassVar[bool] = False
    # Set by `bind`; None while unbound.
    dims: Dims | None = dataclasses.field(default=None, kw_only=True)

    # -- lifecycle -------------------------------------------------------------------------

    def bind(self, dims: Dims) -> Self:
        """Returns a copy bound to ``dims`` after validating that this encoder supports them."""
        for field, value in dataclasses.asdict(dims).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{field} must be a positive integer, got {value!r}")
        self.validate(dims)
        return dataclasses.replace(self, dims=dims)

    def validate(self, dims: Dims) -> None:
        """Raises ``ValueError`` if this encoder cannot run with ``dims``. Default: accepts all."""
        del dims

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        """Creates the learned parameters (a flat dict of float32 arrays). Default: none."""
        del rng, dims
        return {}

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        """The names and shapes of the arrays :meth:`init` returns for ``dims``. Default: none."""
        del dims
        return {}

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        """Logical axis names of the arrays :meth:`init` returns (``embed``, ``heads``,
        ``head_dim``, ... or None; :mod:`posenc.devices.sharding` maps them to mesh axes), for those
        worth splitting over devices; an array not named here is replicated. Default: none."""
        return {}

    def qk_head_dim(self, head_dim: int) -> int:
        """The per-head width of ``q`` and ``k`` after ``rotate``. Default: unchanged."""
        return head_dim

    def window_params(self, params: Params) -> Params:
        """The parameters as the hooks of one attention call read them; attention calls this
        once per call, before any path splits the window into tiles, and passes the result to
        every hook. Default: ``params`` unchanged.

        For a transform whose gradient is not linear in its cotangent (KERPLE's projection,
        which drops an outward gradient by its sign): a path that calls a hook once per tile
        would apply it to each tile's share of the gradient instead of the window's total. The
        hooks must give the same values on the result as on ``params`` (the transform is
        idempotent), since tests and other callers may pass either.
        """
        return params

    @property
    def reach(self) -> int | None:
        """The distance past which pairs on one side of a query are all alike to every hook
        (module docstring), or None. Default None: no such distance is promised."""
        return None

    @property
    def key_lookback(self) -> int:
        """How many earlier keys of the window ``rotate`` reads for each key (module
        docstring). Default 0: none."""
        return 0

    @property
    def carry_limit(self) -> float | None:
        """The carry at which ``contextual_logits`` stops reading its tile (module docstring),
        or None. Default None: no such value is promised."""
        return None

    def check_causal(self, causal: bool) -> None:
        """Raises a one-line ``ValueError`` naming ``model.causal`` if this encoder cannot run
        with that masking. Default: a ``causal_only`` encoder refuses ``causal=False``."""
        if not causal and self.causal_only:
            raise ValueError(
                f"model.causal=False: encoding {self.name!r} is causal only (causal_only = True; "
                "it defines nothing for keys after the query); use model.causal=True or a "
                "bidirectional encoder"
            )

    def for_direction(self, causal: bool) -> Self:
        """This encoder in the form for causal (``True``) or bidirectional attention (module
        docstring); :meth:`check_causal` still applies to the result. Default: itself."""
        del causal
        return self

    def check_cacheable(self) -> None:
        """Raises a one-line ``ValueError`` if a key/value cache cannot reproduce a full pass
        with this encoder (greedy generation asks). Default: refuses when not ``cacheable``."""
        if not self.cacheable:
            raise ValueError(
                f"encoding {self.name!r} cannot be decoded with a key/value cache (cacheable = "
                "False); use posenc.decoding.lm.greedy_generate_reference (full recomputation)"
            )

    @classmethod
    def describe_eval(cls, changes: dict[str, Any], train_len: int) -> str:
        """A short name for hyperparameters changed at evaluation (some of
        ``eval_safe_hparams``, ``{name: value}``), as a report's column shows it beside the
        encoder's name. Default: ``name=value, ...``.

        Args:
          changes: the changed hyperparameters and their values at evaluation.
          train_len: the run's training length (a value equal to it may go unsaid).
        """
        del train_len
        return ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))

    def check_length(self, length: int) -> None:
        """Raises ``ValueError`` if positions ``0..length-1`` are outside what the encoder supports.

        Only encoders with a finite position table (learned absolute) override this.
        """
        del length

    # -- introspection ---------------------------------------------------------------------

    @property
    def hooks(self) -> tuple[str, ...]:
        """The hooks this encoder provides, in the order attention applies them."""
        return tuple(h for h in HOOKS if callable(getattr(self, h, None)))

    @property
    def bound_dims(self) -> Dims:
        if self.dims is None:
            raise RuntimeError(
                f"encoding {self.name!r} is not bound to a model shape; call .bind(Dims(...)) "
                "first (the model does this for you)"
            )
        return self.dims

    def hparams(self) -> dict[str, Any]:
        """The hyperparameters as a plain dict (without ``dims``), e.g. for reports."""
        out = dataclasses.asdict(self)
        out.pop("dims")
        return out


def check_choice(field: str, value: Any, allowed: tuple[Any, ...]) -> None:
    """Raises a ``ValueError`` naming ``field`` and the allowed values if ``value`` is not one."""
    if value not in allowed:
        raise ValueError(f"{field} must be one of {list(allowed)}, got {value!r}")


def check_positive(field: str, value: Any, *, allow_zero: bool = False) -> None:
    """Raises a ``ValueError`` naming ``field`` unless ``value`` is a positive (or >= 0) number."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{field} must be a number {bound}, got {value!r}")


def torch_linear_init(rng: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
    """PyTorch's default ``nn.Linear`` initialisation, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``,
    float32 (the encoders whose official code is PyTorch start their MLPs so)."""
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(rng, shape, jnp.float32, -bound, bound)
