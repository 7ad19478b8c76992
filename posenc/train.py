"""The training loop: functional NNX, one ``jax.jit`` step, data parallelism over a device mesh.

The model is split once into a static graph and a state pytree (``nnx.split``). The jitted step
merges them, computes the loss and its gradient, applies the ``optax`` update and returns the new
state. Batches are sharded over the ``data`` axis of a ``jax.sharding.Mesh`` and parameters are
replicated, so the same code runs on one CPU, several GPUs, a TPU slice or several hosts (after
:func:`posenc.distributed.initialize`).

Everything a run needs to continue lives in the work directory: ``config.json``, orbax
checkpoints under ``checkpoints/`` (parameters, optimizer state, step; training windows and
dropout keys are pure functions of the seed and the step, so the step *is* the data position and
the RNG state), ``metrics.jsonl`` and ``data.json``. Calling :func:`train` again on the same work
directory resumes from the last checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from posenc import data as data_lib
from posenc import distributed
from posenc.config import build_model, check_eval_lengths, eval_lengths, open_source, validate
from posenc.distributed import make_mesh
from posenc.metrics import MetricsWriter, drop_metrics_after, progress_bar
from posenc.model import EncoderParam, Transformer, token_loss


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or infinite loss; the last good checkpoint is kept."""


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
      model: the trained model (parameters gathered on this host).
      step: the last completed step.
      history: metric lines written during this call (one per log step).
      resumed_from: the checkpoint step the run continued from, or None for a fresh start.
    """

    model: Transformer
    step: int
    history: list[dict[str, Any]]
    resumed_from: int | None


def make_optimizer(
    config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with linear warmup, cosine decay and global-norm clipping, and its schedule.

    Weight decay applies to matrices only: norms, biases and the encoders' parameters
    (:class:`~posenc.model.EncoderParam`) are not decayed (decaying T5's or Shaw's tables toward
    zero would bias the comparison).

    Returns:
      ``(optimizer, learning-rate schedule)``.
    """
    o, steps = config.optim, max(config.train.steps, 1)
    warmup = min(o.warmup_steps, steps - 1) if steps > 1 else 0
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=o.learning_rate,
        warmup_steps=warmup,
        decay_steps=steps,
        end_value=o.learning_rate * o.final_lr_ratio,
    )

    def decay_mask(params):
        # A prefix of the parameter tree: one bool per nnx.Variable (or per bare array).
        def is_decayed(leaf):
            return leaf.ndim >= 2 and not isinstance(leaf, EncoderParam)

        return jax.tree.map(is_decayed, params, is_leaf=lambda x: isinstance(x, nnx.Variable))

    adamw = optax.adamw(
        schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask
    )
    clip = optax.clip_by_global_norm(o.grad_clip) if o.grad_clip > 0 else optax.identity()
    return optax.chain(clip, adamw), schedule


class Trainer:
    """Holds the static parts of a run (graph, optimizer, mesh) and the jitted step.

    Most users call :func:`train`; the class is public so tests and notebooks can step a run by
    hand.
    """

    def __init__(self, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None):
        self.config = config
        self.mesh = mesh or make_mesh()
        self.replicated = NamedSharding(self.mesh, P())
        self.batch_sharding = NamedSharding(self.mesh, P("data"))
        self.optimizer, self.schedule = make_optimizer(config)
        abstract = nnx.eval_shape(lambda: build_model(config))
        self.graphdef, _, self.rest = nnx.split(abstract, nnx.Param, ...)
        self._step = jax.jit(self._train_step, donate_argnums=(0,))

    def init_state(self) -> dict[str, Any]:
        """Fresh parameters and optimizer state, created replicated on the mesh."""

        def init():
            _, params, _ = nnx.split(build_model(self.config), nnx.Param, ...)
            return {
                "params": params,
                "opt_state": self.optimizer.init(params),
                "step": jnp.zeros((), jnp.int32),
            }

        return jax.jit(init, out_shardings=self.replicated)()

    def model(self, state: dict[str, Any]) -> Transformer:
        """The NNX model holding ``state``'s parameters."""
        return nnx.merge(self.graphdef, state["params"], self.rest)

    def dropout_key(self, step: jax.Array) -> jax.Array | None:
        if self.config.model.dropout == 0:
            return None
        return jax.random.fold_in(jax.random.key(self.config.seed + 1), step)

    def _train_step(self, state, batch):
        def loss_fn(params):
            model = nnx.merge(self.graphdef, params, self.rest)
            logits = model(batch["inputs"], rng=self.dropout_key(state["step"]))
            losses = token_loss(logits, batch["targets"])  # [B, T]
            return losses.mean(), losses.sum()

        (_, loss_sum), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = self.optimizer.update(grads, state["opt_state"], state["params"])
        new_state = {
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
            "step": state["step"] + 1,
        }
        metrics = {
            "loss_sum": loss_sum,
            "tokens": jnp.asarray(batch["targets"].size, jnp.float32),
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": self.schedule(state["step"]),
        }
        return new_state, metrics

    def global_batch(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's rows of the batch -> a global array sharded over ``data``."""
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local.items()
        }

    def step(self, state, batch):
        """One optimizer step (the state is donated); returns ``(state, metrics)``."""
        return self._step(state, batch)


def _checkpoint_manager(workdir: str, config) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=config.train.keep_checkpoints, create=True, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), "checkpoints"), options=options
    )


def restore_state(trainer: Trainer, manager: ocp.CheckpointManager, step: int | None = None):
    """The training state saved at ``step`` (default: the latest), replicated on the mesh."""
    step = manager.latest_step() if step is None else step
    abstract = jax.eval_shape(trainer.init_state)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=trainer.replicated), abstract
    )
    restored = manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
    )
    return restored["state"]


def load_model(workdir: str, config: ml_collections.ConfigDict | None = None) -> Transformer:
    """The model of a trained work directory, from its latest checkpoint."""
    config = config or read_config(workdir)
    trainer = Trainer(config)
    manager = _checkpoint_manager(workdir, config)
    if manager.latest_step() is None:
        raise FileNotFoundError(
            f"no checkpoint in {os.path.join(workdir, 'checkpoints')}; train first with "
            f"`posenc train --workdir {workdir} ...`"
        )
    return trainer.model(restore_state(trainer, manager))


def read_config(workdir: str) -> ml_collections.ConfigDict:
    """The resolved config a work directory was trained with (``config.json``)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} does not exist: {workdir!r} is not a posenc work directory"
        )
    with open(path) as f:
        fields = json.load(f)
    # JSON turns tuples into lists; the config schema uses tuples. (Converting after building the
    # ConfigDict would not do: a field keeps the type it was created with.)
    for field in ("lengths", "multiples"):
        fields["eval"][field] = tuple(fields["eval"][field])
    config = ml_collections.ConfigDict(fields)
    config.lock()
    return config


def _write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
    """Writes ``config.json``; refuses a work directory that holds a different run."""
    path = os.path.join(workdir, "config.json")
    if os.path.exists(path):
        previous = _comparable(read_config(workdir)).to_dict()
        changed = _diff(previous, _comparable(config).to_dict())
        if changed:
            raise ValueError(
                f"{workdir} holds a run with a different config (fields {changed}); resume it "
                "with the same config or use another --workdir"
            )
    _atomic_write(path, config.to_json(indent=2, sort_keys=True))


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _diff(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(prefix + key)
    return out


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _comparable(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The fields that define what a run computes; logging, evaluation and the process layout
    may change when a run is resumed."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.progress = True
    config.train.log_every = 1
    config.eval = ml_collections.ConfigDict()
    config.distributed = ml_collections.ConfigDict()
    return config


def train(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    stop_at: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> TrainResult:
    """Trains (or resumes) the run described by ``config`` in ``workdir``.

    Args:
      config: a run config (``configs/base.py``); validated before anything compiles.
      workdir: the run's directory; created if missing, resumed if it holds checkpoints.
      stop_at: stop (with a checkpoint) after this step, as an interruption would; the run
        continues from there when called again. None: train to ``train.steps``.
      mesh: device mesh; default all devices along ``data``.

    Returns:
      A :class:`TrainResult`.

    Raises:
      ValueError: an invalid config field (named in the message).
      NonFiniteLossError: the loss became NaN/inf; the last good checkpoint is kept.
    """
    distributed.maybe_initialize(config)
    mesh = mesh or make_mesh()
    validate(config, num_devices=mesh.devices.size, process_count=jax.process_count())
    t = config.train
    source = open_source(config)
    stream = source.split_stream("train")
    # posenc train evaluates when training ends: refuse lengths the evaluation split cannot fill
    # now rather than after the run.
    check_eval_lengths(
        len(source.split_stream(config.eval.split)), eval_lengths(config), config.eval.split
    )
    windows = data_lib.TrainWindows(
        stream,
        seq_len=t.seq_len,
        global_batch=t.batch_size,
        seed=config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    is_main = jax.process_index() == 0
    # Created only now, so that a bad config or a missing data set leaves nothing behind.
    os.makedirs(workdir, exist_ok=True)
    if is_main:
        _write_config(workdir, config)
        _atomic_write(os.path.join(workdir, "data.json"), json.dumps(source.info(), indent=2))

    trainer = Trainer(config, mesh)
    manager = _checkpoint_manager(workdir, config)
    resumed_from = manager.latest_step()
    state = trainer.init_state() if resumed_from is None else restore_state(trainer, manager)
    step = int(state["step"])
    last = t.steps if stop_at is None else min(stop_at, t.steps)

    if is_main:
        # A run cut off after its last checkpoint logged steps that are about to be redone.
        drop_metrics_after(workdir, step)
    writer = MetricsWriter(workdir, enabled=is_main)
    history: list[dict[str, Any]] = []
    bar = progress_bar(total=t.steps, initial=step, enabled=is_main and t.progress)
    pending: list[dict[str, jax.Array]] = []
    tick, tick_step = time.perf_counter(), step
    try:
        while step < last:
            state, metrics = trainer.step(state, trainer.global_batch(windows.batch(step)))
            pending.append(metrics)
            step += 1
            save = step % t.checkpoint_every == 0 or step == last
            if step % t.log_every == 0 or save:
                line = _summarise(pending, step, tick, step - tick_step)
                pending, tick, tick_step = [], time.perf_counter(), step
                # A non-finite gradient norm means this step's update already corrupted the
                # parameters, even when its loss (computed before the update) is finite.
                if not (math.isfinite(line["loss"]) and math.isfinite(line["grad_norm"])):
                    raise NonFiniteLossError(
                        f"non-finite loss or gradient by step {step} (loss {line['loss']}, grad "
                        f"norm {line['grad_norm']}); the last good checkpoint (step "
                        f"{manager.latest_step()}) is kept in {workdir}/checkpoints. Lower "
                        "optim.learning_rate, raise optim.warmup_steps, or use model.dtype=float32."
                    )
                history.append(line)
                writer.write(line)
                bar.update(step - bar.n)
                bar.set_postfix(loss=f"{line['loss']:.3f}", tok_s=f"{line['tokens_per_s']:.3g}")
            if save:
                manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
        manager.wait_until_finished()
    finally:
        bar.close()
        writer.close()
        manager.close()
    return TrainResult(trainer.model(state), step, history, resumed_from)


def _summarise(pending, step, tick, steps) -> dict[str, Any]:
    """One metrics line over the steps since ``tick`` (their metrics are in ``pending``)."""
    fetched = jax.device_get(pending)  # waits for the device: the elapsed time is real
    elapsed = time.perf_counter() - tick
    loss_sum = sum(float(m["loss_sum"]) for m in fetched)
    tokens = sum(float(m["tokens"]) for m in fetched)
    return {
        "step": step,
        "loss": loss_sum / tokens,
        "grad_norm": float(fetched[-1]["grad_norm"]),
        "learning_rate": float(fetched[-1]["learning_rate"]),
        "tokens_per_s": tokens / max(elapsed, 1e-9),
        "step_time_s": elapsed / max(steps, 1),
        "time": time.time(),
    }
