"""The benchmark's peer: the NoPE decoder written by hand in plain ``jax.numpy``.

What does posenc's model code (NNX modules, the encoder contract's hooks, the attention path
chooser, sharding annotations) cost against the same network written directly? This module is
that network, with nothing but arrays: token embedding times ``sqrt(D)``, pre-norm blocks of
causal softmax attention and a ``gelu_tanh`` MLP, a final norm and the tied output projection,
the mean token cross-entropy, and posenc's own optimizer (:func:`posenc.runs.train.make_optimizer`:
clipping, AdamW, the same schedule and decay mask), so the two steps do the same arithmetic.
``throughput.py --rounds N --peer`` times its training step in the same rounds as the encoders
and reports its ratio to NoPE: below 1 is posenc's overhead.

It supports exactly the benchmark's NoPE configuration (``--size`` models: LayerNorm, pre-norm,
``gelu``, no attention biases, tied embeddings, one device) and refuses any other in one line.
``tests/test_benchmark_peer.py`` checks that its logits equal posenc's model's with the same
parameters.
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from posenc.benchmark.settings import Settings, make_config, train_windows
from posenc.models import build
from posenc.runs.train import make_optimizer

NAME = "jax (hand-written)"

# The model fields the hand-written network implements, with the one value each it supports.
_SUPPORTED = {
    "norm": "layernorm",
    "norm_position": "pre",
    "mlp": "gelu",
    "mlp_bias": True,
    "qkv_bias": False,
    "out_bias": False,
    "output_bias": False,
    "tie_embeddings": True,
    "scale_embeddings": True,
    "norm_unit_offset": False,
    "output_softcap": 0.0,
    "embed_norm": False,
    "residual": "sequential",
    "num_kv_heads": None,
    "head_dim": None,
    "head_transform": None,
    "mem_len": 0,
    "dropout": 0.0,
    "causal": True,
}


def check_supported(model_config) -> None:
    """Raises ``ValueError`` naming the first model field the hand-written network lacks."""
    for field, value in _SUPPORTED.items():
        if model_config[field] != value:
            raise ValueError(
                f"the hand-written peer implements model.{field}={value!r} only, got "
                f"{model_config[field]!r}"
            )


def params_of(model) -> dict[str, Any]:
    """posenc's model parameters as a plain pytree of arrays (the same values)."""
    return nnx.state(model, nnx.Param).to_pure_dict()


def _layernorm(x: jax.Array, p: dict[str, jax.Array], eps: float) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def forward(params: dict[str, Any], tokens: jax.Array, eps: float) -> jax.Array:
    """``[B, T]`` token ids -> ``[B, T, V]`` float32 logits."""
    table = params["embed"]["embedding"]  # [V, D]
    x = table[tokens] * math.sqrt(table.shape[1])  # [B, T, D]
    t = tokens.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    blocks = params["blocks"]
    for key in sorted(blocks):  # {0: ..., 1: ...}
        block = blocks[key]
        a = block["attn"]
        h = _layernorm(x, block["attn_norm"], eps)
        q = jnp.einsum("BTD,DHK->BTHK", h, a["q"])
        k = jnp.einsum("BSD,DHK->BSHK", h, a["k"])
        v = jnp.einsum("BSD,DHK->BSHK", h, a["v"])
        logits = jnp.einsum("BTHK,BSHK->BHTS", q, k) / math.sqrt(q.shape[-1])
        weights = jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), axis=-1)
        out = jnp.einsum("BHTS,BSHK->BTHK", weights, v)
        x = x + jnp.einsum("BTHK,HKD->BTD", out, a["o"])
        m = block["mlp"]
        h = _layernorm(x, block["mlp_norm"], eps)
        h = jax.nn.gelu(h @ m["wi"]["kernel"] + m["wi"]["bias"], approximate=True)
        x = x + h @ m["wo"]["kernel"] + m["wo"]["bias"]
    x = _layernorm(x, params["final_norm"], eps)
    return x @ table.T


class PeerTrain:
    """The hand-written network's compiled training step, its state and posenc's batches
    (the interface of :class:`posenc.benchmark.rounds._Train`)."""

    def __init__(self, settings: Settings):
        config = make_config(settings, "nope")
        check_supported(config.model)
        self.windows = train_windows(config)
        optimizer, _ = make_optimizer(config)
        eps = config.model.norm_eps

        def step(params, opt_state, inputs, targets):
            def loss_fn(p):
                logits = forward(p, inputs, eps)
                return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self._step = jax.jit(step, donate_argnums=(0, 1))
        self.params = params_of(build(config))
        self.opt_state = optimizer.init(self.params)
        self.step = 0
        self.time(settings.warmup + 1)  # compiles, then warms up

    def time(self, steps: int) -> float:
        """Seconds of ``steps`` training steps, host batching included."""
        jax.block_until_ready(self.params)
        start = time.perf_counter()
        loss = None
        for _ in range(steps):
            batch = self.windows.batch(self.step)
            self.params, self.opt_state, loss = self._step(
                self.params, self.opt_state, batch["inputs"], batch["targets"]
            )
            self.step += 1
        jax.block_until_ready((self.params, loss))
        return time.perf_counter() - start
