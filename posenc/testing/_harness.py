"""Settings, tiny models and the compiled programs the contract checks share.

Compiling dominates the battery's run time, so each compiled program (a forward pass, a training
step, a Jacobian) is built once per (encoder, settings) and process and shared by the checks.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from posenc import encodings
from posenc.attention.terms import NEG
from posenc.encodings.base import Dims, Encoding
from posenc.layers.config import ModelConfig
from posenc.layers.params import EncoderParam
from posenc.models.lm import Transformer

# Hyperparameters the battery uses for registered encoders that need something other than their
# defaults to be exercised at the battery's tiny sizes. A new encoder needs no entry.
HPARAMS: dict[str, dict[str, Any]] = {
    # Longer than the offset windows of the shift check (17 + 12 <= 32), shorter than 4 x 12, so
    # the extrapolation check meets the learned table's clear error.
    "learned": {"max_len": 32},
    # Clip distance and buckets inside the 12-token window, so clipping and log buckets happen.
    "shaw": {"max_distance": 4},
    "t5": {"num_buckets": 8, "max_distance": 16},
    # CoPE's embeddings and PoPE's phase bias start at zero, as in their papers' code, where they
    # change nothing; random ones let every check see them at work.
    "cope": {"init_std": 0.5},
    "pope": {"bias_init": "uniform"},
    # FIRE's normaliser psi(max(L, i)) is the constant psi(L) while every query is below the
    # threshold L (512 by default, far above the battery's positions), and there its bias depends
    # on i - j alone. A threshold inside the window makes the bias read the query's position, as
    # it does past L at full size, so the shift check sees that FIRE is absolute.
    "fire": {"init_L": 4.0},
    # xPos's decay over the battery's 12-48 tokens, as the paper's scale_base = 512 gives it over
    # hundreds (zeta_0^(48/8) ~ 5e-4); at 512 it would be ~1 here, plain RoPE.
    "xpos": {"scale_base": 8.0},
    # DeBERTa's clip distance (512) and v2's log buckets inside the battery's windows.
    "deberta": {"max_distance": 8, "buckets": 4},
    # HoPE and FoPE are defined by the training length (a run fills it from train.seq_len).
    # HoPE at the battery's own: one pair of 8 turns, the rest stay still. FoPE at 64, where 3
    # pairs keep a frequency (a series of 3 terms each) and 5 are clipped.
    "hope": {"train_len": 12},
    "fope": {"train_len": 64},
    # DAPE on FIRE with FIRE's battery threshold: the base whose bias reads the query's position,
    # so the shift check sees what relative = False declares (on ALiBi or KERPLE it is relative).
    "dape": {"base": "fire", "base_hparams": {"init_L": 4.0}},
}


# What the bidirectional check adds for registered encoders whose hyperparameters choose the
# masking: T5's buckets must be bidirectional under model.causal=False (its check_causal); conv's
# centred convolution (wav2vec 2.0's) is what a bidirectional model takes it with.
BIDIRECTIONAL_HPARAMS: dict[str, dict[str, Any]] = {
    "t5": {"bidirectional": True},
    "conv": {"causal": False},
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes and tolerances of the contract checks; the defaults suit any encoder.

    Attributes:
      length: ``T``, the window the model is built, trained and checked at.
      block_size: tile of the ``blocked`` path; below ``length`` so that it really tiles (and
        does not divide it, so the last tile is padded).
      extra_keys: the attention check uses ``S = T + extra_keys`` keys, queries the last ``T``.
      offsets: first position of each batch row (the batch size is ``len(offsets)``); the shift
        check moves row ``b`` by ``offsets[b]``.
      max_position: the attention check also runs with randomized positions (Ruoss et al.
        2023): each row a sorted random subset of ``[0, max_position)``.
      extrapolation: the extrapolation check runs at ``extrapolation * length`` tokens; the
        bf16 check uses the same window (several blocks long).
      vocab_size, num_layers, model_dim, num_heads, mlp_dim: the tiny model.
      train_steps, learning_rate: the training check's Adam loop on one fixed batch.
      tolerance: float32 agreement of attention paths and of shifted logits (absolute and
        relative).
      bf16_tolerance: bf16 logits may differ from float32 by this fraction of the largest
        float32 logit.
      seed: parameters, tokens and attention inputs.
    """

    length: int = 12
    block_size: int = 5
    extra_keys: int = 4
    offsets: tuple[int, ...] = (3, 17)
    max_position: int = 64
    extrapolation: int = 4
    vocab_size: int = 64
    num_layers: int = 1
    model_dim: int = 32
    num_heads: int = 2
    mlp_dim: int = 64
    train_steps: int = 8
    learning_rate: float = 1e-2
    tolerance: float = 1e-5
    bf16_tolerance: float = 0.05
    seed: int = 0

    @property
    def dims(self) -> Dims:
        return Dims(self.num_heads, self.model_dim // self.num_heads, self.model_dim)


class NotApplicable(Exception):  # noqa: N818 (a verdict, not an error)
    """Raised by a check that does not apply to the encoder (e.g. ``carry`` without a
    ``contextual_logits`` hook) or cannot run on this machine (``cudnn`` without an NVIDIA GPU).

    Neither a pass nor a failure: posenc's suite leaves the first kind out of its cases and
    reports the second as a skip with this reason; :func:`posenc.testing.check_encoder` lists
    both.
    """


def resolve(encoder: str | Encoding, bidirectional: bool = False) -> Encoding:
    """A registered name (with the battery's :data:`HPARAMS`, and with ``bidirectional`` its
    :data:`BIDIRECTIONAL_HPARAMS`) or an unbound encoder instance."""
    if isinstance(encoder, str):
        extra = BIDIRECTIONAL_HPARAMS.get(encoder, {}) if bidirectional else {}
        return encodings.get(encoder, **{**HPARAMS.get(encoder, {}), **extra})
    if not isinstance(encoder, Encoding):
        raise TypeError(f"expected an encoder name or an Encoding instance, got {encoder!r}")
    if encoder.dims is not None:
        raise ValueError(f"pass the unbound encoder (encodings.get(...)), not {encoder!r}")
    return encoder


def label(encoder: Encoding) -> str:
    """How failures name an encoder: its registry name and hyperparameters."""
    args = ", ".join(f"{k}={v!r}" for k, v in encoder.hparams().items())
    return f"encoder {encoder.name!r} ({type(encoder).__name__}({args}))"


def fail(encoder: Encoding, check: str, message: str) -> AssertionError:
    """The error a check raises: the encoder, the check and what failed."""
    return AssertionError(f"{label(encoder)} fails {check}: {message}")


def max_error(got: np.ndarray, expected: np.ndarray) -> str:
    return f"max |difference| {np.nanmax(np.abs(got - expected)):.3g}"


def memo(fn: Callable) -> Callable:
    """``functools.lru_cache`` for hashable arguments; calls straight through otherwise (an
    encoder with an unhashable hyperparameter is still checked, only without sharing)."""
    cached = functools.lru_cache(maxsize=64)(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            hash((args, tuple(kwargs.items())))
        except TypeError:
            return fn(*args, **kwargs)
        return cached(*args, **kwargs)

    return wrapper


# Compiling dominates these tiny programs' run time; LLVM at -O0 compiles about twice as fast and
# computes the same program (XLA's graph passes still run).
def jit(fn: Callable, **kwargs) -> Callable:
    return jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0}, **kwargs)


def finite_or_recompiled(compute: Callable[[Callable], Any], what: str) -> Any:
    """``compute(jit)`` (LLVM -O0); where that is not finite, ``compute(jax.jit)`` (the default
    optimisation level) with a ``RuntimeWarning`` saying so, never silently.

    At -O0 XLA:CPU returns NaN gradients through the ``blocked`` path's ``lax.cond`` for some
    encoders (DeBERTa, CoPE; depending on the tile size) where the default level is finite and
    equals the ``einsum`` path's gradients (the causal check compares them). A result that is
    not finite at either level is returned as it is, for the check to fail on.

    Args:
      compute: builds and runs the program with the ``jit`` it is given; returns a pytree of
        arrays or numbers.
      what: names the program in the warning.
    """
    result = compute(jit)
    if _finite(result):
        return result
    retried = compute(jax.jit)
    if _finite(retried):
        warnings.warn(
            f"posenc.testing: {what} is not finite when compiled at LLVM -O0 but is at XLA's "
            "default optimisation level; using the latter (XLA:CPU at -O0 miscompiles some "
            "gradients through lax.cond)",
            RuntimeWarning,
            stacklevel=2,
        )
    return retried


def _finite(tree: Any) -> bool:
    return all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(tree))


def contextual_inputs(settings: Settings, rng: np.random.Generator, scale: float = 1.0):
    """What ``contextual_logits`` is called with, at random: queries ``[B, T, H, Dh]`` and keys
    ``[B, S, H, Dh]`` (standard normal, ``S = T + extra_keys``), the causal mask ``[T, S]`` of
    queries at the last ``T`` keys, and logits ``[B, H, T, S]`` (``scale`` x standard normal)
    at ``NEG`` where masked."""
    dims = settings.dims
    b, t, s = len(settings.offsets), settings.length, settings.length + settings.extra_keys
    q, k = (
        jnp.asarray(rng.standard_normal((b, n, dims.num_heads, dims.head_dim)), jnp.float32)
        for n in (t, s)
    )
    visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
    logits = scale * rng.standard_normal((b, dims.num_heads, t, s))
    return q, k, visible, jnp.asarray(np.where(visible, logits, NEG), jnp.float32)


def model_config(settings: Settings, **overrides: Any) -> ModelConfig:
    """The battery's tiny float32 model: untied output (the causality check needs it)."""
    base = dict(
        vocab_size=settings.vocab_size,
        num_layers=settings.num_layers,
        model_dim=settings.model_dim,
        num_heads=settings.num_heads,
        mlp_dim=settings.mlp_dim,
        dtype="float32",
        tie_embeddings=False,
        attention_impl="auto",
        attention_block_size=settings.block_size,
        # As many random features as channels, so a rotate tied to the head width runs too.
        performer_features=settings.dims.head_dim,
    )
    return ModelConfig(**{**base, **overrides})


def build(encoder: Encoding, settings: Settings, **overrides: Any) -> Transformer:
    """A fresh model; the same ``settings.seed`` gives the same float32 parameters."""
    return Transformer(model_config(settings, **overrides), encoder, rngs=nnx.Rngs(settings.seed))


def tokens(settings: Settings, length: int, seed: int = 0) -> jax.Array:
    """``[len(offsets), length]`` random token ids."""
    rng = np.random.default_rng(settings.seed + seed)
    shape = (len(settings.offsets), length)
    return jnp.asarray(rng.integers(0, settings.vocab_size, shape), jnp.int32)


@memo
def forward(encoder: Encoding, settings: Settings, positions: bool, **overrides: Any):
    """``(run, state)``: ``run(state, tokens[, positions]) -> [B, T, V]`` logits, compiled once.

    With ``positions=False`` the model uses its default positions (and ``check_length``).
    """
    graphdef, state = nnx.split(build(encoder, settings, **overrides))
    if positions:
        run = jit(lambda state, tokens, pos: nnx.merge(graphdef, state)(tokens, pos))
    else:
        run = jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
    return run, state


def _encoder_leaf(path: tuple, var: Any) -> bool:
    """Whether a flat-state entry is one of the encoder's own parameters: an
    :class:`~posenc.layers.params.EncoderParam`, or held under ``pos_params``."""
    return isinstance(var, EncoderParam) or "pos_params" in map(str, path)


def train_losses(
    encoder: Encoding, settings: Settings, model: Transformer | None = None
) -> tuple[tuple[float, ...], dict[str, tuple[float, ...]]]:
    """The loss at every step of Adam on one fixed batch of ``length + 1`` tokens, and for each
    of the encoder's own parameters (``'blocks/0/pos_params/table'``) the largest
    ``|gradient|`` at every step (NaN where any entry of the gradient is not finite).

    ``model``: the model to train (default :func:`build` of ``encoder``); ``encoder`` then only
    names it in warnings. A pattern's model (:mod:`posenc.testing.patterns`) has every
    encoder's parameters as :class:`~posenc.layers.params.EncoderParam` s too.

    A functional loop like :mod:`posenc.runs.train`'s (split once, a jitted step returning the new
    state), but self-contained so the battery does not depend on the training stack.
    """
    model = build(encoder, settings) if model is None else model
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch = tokens(settings, settings.length + 1, seed=1)
    tx = optax.adam(settings.learning_rate)

    def loss_fn(params):
        logits = nnx.merge(graphdef, params, rest)(batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    def encoder_grads(grads) -> dict[str, jax.Array]:
        return {
            "/".join(map(str, path)): jnp.where(
                jnp.isfinite(var[...]).all(), jnp.abs(var[...]).max(), jnp.nan
            )
            for path, var in nnx.to_flat_state(grads)
            if _encoder_leaf(path, var)
        }

    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, encoder_grads(grads)

    def run(compile_fn):
        compiled, state, losses, sizes = compile_fn(step), (params, tx.init(params)), [], []
        for _ in range(settings.train_steps):
            *state, loss, size = compiled(*state)
            losses.append(float(loss))
            sizes.append({name: float(value) for name, value in size.items()})
        return tuple(losses), {name: tuple(s[name] for s in sizes) for name in sizes[0]}

    return finite_or_recompiled(run, f"training {label(encoder)}")
