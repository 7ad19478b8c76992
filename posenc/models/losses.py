"""Per-token losses: cross entropy, and with label smoothing for training translation models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def token_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-token cross entropy in nats: ``[B, T, V]`` logits -> ``[B, T]`` float32."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def smoothed_token_loss(logits: jax.Array, targets: jax.Array, smoothing: float) -> jax.Array:
    """Cross entropy against a label smoothed toward the other ids (Szegedy et al. 2016), as
    Vaswani et al. train with ``smoothing = 0.1``: ``1 - smoothing`` on the target and
    ``smoothing / (V - 1)`` on each other id, as tensor2tensor and Flax's WMT example spread it.
    ``[B, T, V]``, ``[B, T]`` -> ``[B, T]`` float32; ``smoothing = 0`` is :func:`token_loss`.

    Its minimum is the entropy of the smoothed label, not 0; evaluation reports the plain cross
    entropy.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {smoothing!r}")
    logits = logits.astype(jnp.float32)
    if smoothing == 0.0:
        return token_loss(logits, targets)
    v = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # [B, T, V]
    on_target = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [B, T]
    others = jnp.sum(log_probs, axis=-1) - on_target
    return -((1.0 - smoothing) * on_target + smoothing / (v - 1) * others)
