"""The training loop: functional NNX, one ``jax.jit`` step, sharded over a device mesh.

The model is split once into a static graph and a state pytree (``nnx.split``). The jitted step
merges them, computes the loss and its gradient, applies the ``optax`` update and returns the new
state. The mesh's axes come from the config's ``mesh`` section and :mod:`posenc.devices.sharding`'s
rules place the state: by default every device is on ``data`` (batches split by rows, parameters
replicated); ``mesh.fsdp`` also splits the parameters, gradients and Adam moments, and
``mesh.tensor`` the attention heads and MLP units. XLA inserts the communication. The same code
runs on one CPU, several GPUs, a TPU slice or several hosts (after
:func:`posenc.devices.distributed.initialize`).

Everything a run needs to continue lives in its work directory (:class:`posenc.workdir.RunDir`,
which owns the layout and its rules): the config, the data's identity, verified orbax
checkpoints (parameters, optimizer state, step; training windows and dropout keys are pure
functions of the seed and the step, so the step *is* the data position and the RNG state) and
the metrics. Calling :func:`train` again on the same work directory resumes from the newest
intact checkpoint; the directory is locked while a process trains in it.

With Transformer-XL memory (``model.mem_len > 0``; Dai et al. 2019, Sec. 3.2) the batches are
consecutive segments of each row's part of the stream (:class:`posenc.data.StreamSegments`) and
the train state also holds the memory, ``[L, batch, mem_len, D]`` float32, the per-layer states of
each row's last ``mem_len`` tokens (zero-padded at the front while fewer have been read; how
many are real is a function of the step). Each step reads it as its memory and writes the next
one; it is checkpointed with the optimizer state, so a resumed run continues with exactly the
memory the uninterrupted run had. No gradient flows into it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from posenc import kinds
from posenc.devices import distributed, fits, sharding
from posenc.devices.distributed import abstract_on, make_mesh
from posenc.layers.params import EncoderParam
from posenc.models import build
from posenc.models.lm import Transformer
from posenc.runs import drope
from posenc.runs.config import (
    validate,
)
from posenc.workdir import (
    PRETRAINED_FILE,
    PRETRAINED_PARTS,
    Checkpoints,
    RunDir,
    WorkdirError,
    config_sha256,
    diff_fields,
)
from posenc.workdir.metrics import MetricsWriter, drop_metrics_after, progress_bar


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
    (:class:`~posenc.layers.params.EncoderParam`) are not decayed (decaying T5's or Shaw's tables
    toward zero would bias the comparison).

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
        self.mesh = mesh or make_mesh(config)
        self.replicated = NamedSharding(self.mesh, P())
        self.batch_sharding = NamedSharding(self.mesh, sharding.batch_spec(self.mesh))
        self.optimizer, self.schedule = make_optimizer(config)
        # What differs between kinds of run (data, loss, batch shapes): posenc.kinds.
        self.kind = kinds.kind_of(config)
        self.mem_len = config.model.get("mem_len", 0)
        abstract = nnx.eval_shape(lambda: build(config))
        self.graphdef, _, self.rest = nnx.split(abstract, nnx.Param, ...)
        # Where every array of the train state lives (posenc.devices.sharding's rules): parameters
        # and their optimizer moments by their axis names, the rest replicated.
        self.state_shardings = sharding.tree_shardings(jax.eval_shape(self._init), self.mesh)
        # CAPE-like encoders draw a position augmentation from the step's key, even without dropout.
        self.augments = "augment_positions" in abstract.encoding.hooks
        # With memory, the count of real memory states is static (one compilation per count).
        # Each compilation is refused in one line if it cannot fit (posenc.devices.fits).
        static = dict(static_argnums=(2,)) if self.mem_len else {}
        self._step = fits.CheckedJit(
            self._train_step, self._describe, donate_argnums=(0,), **static
        )

    def _describe(self, state, batch, *memory_tokens) -> tuple[str, str]:
        """What a training step computes and what to change if it does not fit."""
        m = self.config.model
        attention = fits.attention_change(m.attention_impl, m.attention_block_size)
        what, change = self.kind.describe_step(self.config, batch)
        return what, f"{change}, or {attention}"

    def compile_step(self, windows: Any) -> None:
        """Compiles the step for the run's shapes (those of step 0's batch; with memory, a full
        memory), so that a run that cannot fit is refused before anything is written."""
        self._step.compile(*self.step_inputs(windows))

    def step_inputs(self, windows: Any) -> tuple[Any, ...]:
        """The step's arguments as shapes with their shardings (``jax.ShapeDtypeStruct``): the
        state, the batch the kind compiles for (:meth:`posenc.kinds.RunKind.step_batch`: step 0's,
        or the largest of several shapes) and, with memory, the static count of a full memory;
        what :meth:`compile_step` and ``posenc plan`` compile."""
        state = self.abstract_state()
        batch = {
            k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)
            for k, (shape, dtype) in self.kind.step_batch(self.config, windows).items()
        }
        return (state, batch, *([self.mem_len] if self.mem_len else []))

    def _init(self, params: Any | None = None) -> dict[str, Any]:
        """The train state at step 0 (traced: :meth:`init_state` places it)."""
        if params is None:
            _, params, _ = nnx.split(build(self.config), nnx.Param, ...)
        state = {
            "params": params,
            "opt_state": self.optimizer.init(params),
            "step": jnp.zeros((), jnp.int32),
        }
        if self.mem_len:
            m = self.config.model
            shape = (m.num_layers, self.config.train.batch_size, self.mem_len, m.model_dim)
            state["memory"] = jnp.zeros(shape, jnp.float32)
        return state

    def init_state(self, params: Any | None = None) -> dict[str, Any]:
        """Step 0: fresh parameters (or ``params``) and a fresh optimizer state, placed on the
        mesh as :attr:`state_shardings` says (replicated on the default mesh)."""
        return jax.jit(self._init, out_shardings=self.state_shardings)(params)

    def abstract_state(self) -> dict[str, Any]:
        """The train state's shapes, dtypes and shardings (``jax.ShapeDtypeStruct`` s): what a
        step compiles for and a checkpoint is restored into, on this trainer's mesh."""
        return abstract_on(jax.eval_shape(self._init), self.state_shardings)

    def restore_or_init(
        self, checkpoints: Checkpoints, run: RunDir | None = None
    ) -> tuple[dict[str, Any], int | None]:
        """The state of the newest intact checkpoint (damaged ones are moved aside with a
        warning), or a fresh one (from ``train.init_from``'s parameters if set, recorded in
        ``run``); and the step resumed from (None for a fresh start)."""
        abstract = self.abstract_state()
        train_state = _train_state(abstract)
        restored = checkpoints.restore_latest(abstract["params"], train_state, set_aside=True)
        if restored is not None:
            step, params, train_state = restored
            return {"params": params, **train_state}, step
        source = self.config.train.get("init_from")
        if not source:
            return self.init_state(), None
        params, record = _params_of(source, abstract["params"], self.config)
        if run is not None and jax.process_index() == 0:
            run.record_init(record)
        return self.init_state(params), None

    def save(self, checkpoints: Checkpoints, state: dict[str, Any], step: int) -> None:
        """Saves ``state`` as checkpoint ``step`` (parameters apart from the optimizer state,
        so evaluation can restore them alone)."""
        checkpoints.save(step, state["params"], _train_state(state))

    def model(self, state: dict[str, Any]) -> Transformer:
        """The NNX model holding ``state``'s parameters."""
        return nnx.merge(self.graphdef, state["params"], self.rest)

    def dropout_key(self, step: jax.Array) -> jax.Array | None:
        """The step's training key, a pure function of (seed, step): dropout's and the position
        augmentation's (``augment_positions``); None when the model needs none."""
        if self.config.model.dropout == 0 and not self.augments:
            return None
        return jax.random.fold_in(jax.random.key(self.config.seed + 1), step)

    def _train_step(self, state, batch, memory_tokens=0):
        """One step; ``memory_tokens`` (static): how many of the memory's states are real."""

        def loss_fn(params):
            model = nnx.merge(self.graphdef, params, self.rest)
            with sharding.tracing_on(self.mesh):
                return _loss(model)

        def _loss(model):
            rng = self.dropout_key(state["step"])
            memory = None
            if self.mem_len:  # the real states of the memory, [L, B, M, D]
                memory = state["memory"][:, :, self.mem_len - memory_tokens :]
            loss = self.kind.loss(self.config, model, batch, rng, memory)
            # Tokens read (throughput), and what the loss is a mean over (the kind's).
            counts = {
                "loss_sum": loss.loss_sum,
                "tokens": jnp.asarray(loss.tokens, jnp.float32),
                "scored": jnp.asarray(loss.scored, jnp.float32),
            }
            return loss.mean, (counts, loss.memory)

        (_, (counts, memory)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = self.optimizer.update(grads, state["opt_state"], state["params"])
        new_state = {
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
            "step": state["step"] + 1,
        }
        if self.mem_len:  # zero-padded at the front to the fixed [L, B, mem_len, D]
            pad = self.mem_len - memory.shape[2]
            new_state["memory"] = jnp.pad(memory, ((0, 0), (0, 0), (pad, 0), (0, 0)))
        # The next step's state where this one's was (XLA would otherwise choose).
        new_state = jax.lax.with_sharding_constraint(new_state, self.state_shardings)
        metrics = {
            **counts,
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": self.schedule(state["step"]),
        }
        return new_state, metrics

    def windows(self, stream: np.ndarray) -> Any:
        """The run's training batches over a token stream, for the kinds that read one
        (``windows(config, stream)`` of :class:`posenc.kinds.causal_lm.CausalLM`)."""
        return self.kind.windows(self.config, stream)

    def local_batch(self, batches: Any, step: int) -> dict[str, np.ndarray]:
        """This process's rows of step ``step``'s batch, as the run's kind makes them
        (:meth:`posenc.kinds.RunKind.local_batch`)."""
        return self.kind.local_batch(self.config, batches, step)

    def global_batch(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's rows of the batch -> a global array sharded over ``data``."""
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local.items()
        }

    def step(self, state, batch, memory_tokens: int = 0):
        """One optimizer step (the state is donated); returns ``(state, metrics)``.

        ``memory_tokens``: with memory, how many of the state's memory states are real
        (:meth:`posenc.data.StreamSegments.memory_tokens`); one compilation per value.
        """
        if not self.mem_len:
            return self._step(state, batch)
        return self._step(state, batch, min(memory_tokens, self.mem_len))


def _train_state(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint keeps beside the parameters: optimizer state, step (and memory)."""
    return {k: v for k, v in state.items() if k != "params"}


def _params_of(
    source: str, abstract_params: Any, config: ml_collections.ConfigDict
) -> tuple[Any, dict[str, Any]]:
    """The parameters of another run's newest intact checkpoint (``train.init_from``), checked
    against the shapes this run's model needs, and what to record about them.

    A classifier takes the shared parts of any run whose model has them (a masked-LM run, or
    another classifier's): its own parts (:data:`posenc.models.classifier.OWN_PARTS`, the head
    and segment embedding) start fresh where the other model has none, except those an
    imported checkpoint holds (``pretrained_parts.safetensors``: BERT's token-type table as
    the segment embedding, its pooler), and the other model's parts the classifier lacks (an
    LM's output projection) are left behind.

    Raises:
      ValueError: the other run is not a trained work directory, or its parameters do not fit
        this model (naming the parameters and the config fields that differ).
    """
    other = RunDir(source)
    other_config = other.read_config()
    other_model = nnx.eval_shape(lambda: build(other_config))
    theirs_abstract = nnx.split(other_model, nnx.Param, ...)[1]
    mine, theirs = _shapes(abstract_params), _shapes(theirs_abstract)
    # The source's positional encoder's parameters (EncoderParam), by path.
    positional = set(_shapes(nnx.state(other_model, EncoderParam)))
    fresh: set[str] = set()
    kind = kinds.kind_of(config)
    own = tuple(f"['{part}']" for part in kind.own_parts)
    if own:  # the kind's own parts start fresh; the other model's parts it lacks stay behind
        fresh = {k for k in mine if k not in theirs and k.startswith(own)}
        theirs_used = {k: v for k, v in theirs.items() if k in mine}
    else:
        theirs_used = theirs
    dropped: list[str] = []
    if config.train.get("drop_positions"):  # DroPE: the source's encoder stays behind
        dropped = sorted(k for k in theirs_used if k in positional)
        theirs_used = {k: v for k, v in theirs_used.items() if k not in positional}
    needed = {k: v for k, v in mine.items() if k not in fresh}
    if needed != theirs_used:
        differ = sorted(
            k for k in set(needed) | set(theirs_used) if needed.get(k) != theirs_used.get(k)
        )
        fields = [
            f
            for f in diff_fields(other_config.to_dict(), config.to_dict())
            if f.startswith(("model.", "encoding."))
        ]
        hint = kind.init_from_hint
        if (
            not config.train.get("drop_positions")
            and config.encoding.name == drope.NOPE
            and set(differ) <= positional
        ):  # only the source's encoder parameters stand in the way of a NoPE run
            hint += f"; to drop the source's positional encoder (DroPE), pass {drope.FLAG}"
        raise ValueError(
            f"train.init_from={source!r}: its parameters do not fit this model ({len(differ)} "
            f"differ, e.g. {differ[:3]}; config fields that differ: {fields}); initialise from a "
            "run with the same model shape and encoder parameters" + hint
        )
    sharding = jax.tree.leaves(abstract_params)[0].sharding
    with other.lock():
        step, params = other.restore_params(abstract_on(theirs_abstract, sharding))
    pretrained: list[str] = []
    if theirs != mine:  # keep the shared parts; the kind's own parts start fresh
        start = nnx.split(build(config), nnx.Param, ...)[1]
        start, pretrained = _pretrained_parts(other, start, fresh)
        params = _merge_params(params, start, fresh)
    record = {
        "init_from": os.path.abspath(source),
        "step": step,
        "finished": step == other_config.train.steps,
        "encoding": other_config.encoding.to_dict(),
        "train_seq_len": other_config.train.seq_len,
        "config_sha256": config_sha256(other_config),
        "fresh": sorted(set(fresh) - set(pretrained)),
        "pretrained_parts": pretrained,
    }
    if config.train.get("drop_positions"):
        record["drop_positions"] = {
            "encoders": drope.source_encoders(other_config),
            "parameters": dropped,
        }
    return params, record


def _pretrained_parts(other: RunDir, start: Any, fresh: set[str]) -> tuple[Any, list[str]]:
    """``start`` (a fresh classifier's parameters) with the parts in ``fresh`` that the other
    run's ``pretrained_parts.safetensors`` holds put in (a table with fewer rows than this
    model's, RoBERTa's one token type, fills the first rows); and which were."""
    path = other.file(PRETRAINED_PARTS)
    if not os.path.isfile(path):
        return start, []
    from safetensors.numpy import load_file

    parts = {
        "".join(f"['{p}']" for p in name.split(".")): array
        for name, array in load_file(path).items()
    }
    taken = []

    def put(key_path, leaf):
        key = jax.tree_util.keystr(key_path)
        part = next((v for k, v in parts.items() if key.startswith(k + ".") or key == k), None)
        if key not in fresh or part is None or part.shape[1:] != leaf.shape[1:]:
            return leaf
        taken.append(key)
        rows = min(len(part), len(leaf))
        return jnp.asarray(leaf).at[:rows].set(jnp.asarray(part[:rows], leaf.dtype))

    return jax.tree_util.tree_map_with_path(put, start), sorted(taken)


def _merge_params(theirs: Any, mine: Any, fresh: set[str]) -> Any:
    """``mine``'s tree with every leaf not in ``fresh`` taken from ``theirs`` (same path)."""
    by_path = {
        jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(theirs)
    }
    paths, treedef = jax.tree_util.tree_flatten_with_path(mine)
    leaves = [
        leaf if (key := jax.tree_util.keystr(path)) in fresh else by_path[key]
        for path, leaf in paths
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}


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
      mesh: device mesh; default the config's ``mesh`` section over every device
        (:func:`posenc.devices.sharding.make_mesh`).

    Returns:
      A :class:`TrainResult`.

    Raises:
      ValueError: an invalid config field (named in the message), or a work directory that
        holds another run, other data, or no intact checkpoint
        (:class:`posenc.workdir.WorkdirError`).
      posenc.workdir.WorkdirBusyError: another process uses ``workdir``.
      NonFiniteLossError: the loss became NaN/inf; the last good checkpoint is kept.
    """
    distributed.maybe_initialize(config)
    config = kinds.kind_of(config).prepare(config)
    mesh = mesh or make_mesh(config)
    run = RunDir(workdir)
    if os.path.exists(run.file(PRETRAINED_FILE)):
        raise WorkdirError(
            f"{workdir} holds a model imported by posenc import-hf, not a training run; "
            f"fine-tune it in a new work directory: posenc train --config {workdir}/config.json "
            f"--init-from {workdir} --workdir NEW"
        )
    if stop_at is not None and (not isinstance(stop_at, int) or stop_at < 1):
        raise ValueError(f"--stop-at must be a step >= 1, got {stop_at!r}")
    validate(config, num_devices=sharding.batch_shards(mesh), process_count=jax.process_count())
    drope.check(config)
    t = config.train
    data = kinds.kind_of(config).training_data(config, mesh)
    windows = data.batches
    is_main = jax.process_index() == 0
    # Created only now, so that a bad config or a missing data set leaves nothing behind; a
    # refusal while the run is set up (a bad train.init_from) removes what it wrote.
    # Refusals before compiling, and before anything is written: another run or other data in
    # the directory, then a step that cannot fit in memory.
    run.check_config(config)
    run.check_data(data.record)
    trainer = Trainer(config, mesh)
    trainer.compile_step(windows)
    with run.starting(enabled=is_main) as started, run.lock(enabled=is_main):
        if is_main:
            run.record_config(config)
            run.record_data(data.record)
            if data.vocab_model is not None:
                run.record_vocab(data.vocab_model)
        checkpoints = run.checkpoints(keep=t.keep_checkpoints, primary=is_main)
        try:
            state, resumed_from = trainer.restore_or_init(checkpoints, run)
            started()
            last = t.steps if stop_at is None else min(stop_at, t.steps)
            state, history = _train_steps(trainer, state, windows, run, checkpoints, last)
        finally:
            checkpoints.close()
    return TrainResult(trainer.model(state), int(state["step"]), history, resumed_from)


def _train_steps(
    trainer: Trainer,
    state: dict[str, Any],
    windows: Any,
    run: RunDir,
    checkpoints: Checkpoints,
    last: int,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Steps from ``state``'s step to ``last``: logs every ``log_every`` steps, checks the loss,
    saves every ``checkpoint_every`` steps and at ``last``. Returns the state and the lines."""
    t = trainer.config.train
    step = int(state["step"])
    is_main = jax.process_index() == 0
    if is_main:
        # A run cut off after its last checkpoint logged steps that are about to be redone.
        drop_metrics_after(run.path, step)
    writer = MetricsWriter(run.path, enabled=is_main)
    bar = progress_bar(total=t.steps, initial=step, enabled=is_main and t.progress)
    history: list[dict[str, Any]] = []
    pending: list[dict[str, jax.Array]] = []
    tick, tick_step = time.perf_counter(), step
    try:
        while step < last:
            batch = trainer.global_batch(trainer.local_batch(windows, step))
            memory_tokens = windows.memory_tokens(step, trainer.mem_len) if trainer.mem_len else 0
            state, metrics = trainer.step(state, batch, memory_tokens)
            pending.append(metrics)
            step += 1
            # The bar moves at every step, not only at logged ones: a run whose first steps
            # compile new shapes (translation's length buckets) shows that it is advancing.
            bar.update(1)
            save = step % t.checkpoint_every == 0 or step == last
            if step % t.log_every == 0 or save:
                line = _summarise(pending, step, tick, step - tick_step)
                pending, tick, tick_step = [], time.perf_counter(), step
                _check_finite(line, checkpoints, run)
                history.append(line)
                writer.write(line)
                bar.set_postfix(loss=f"{line['loss']:.3f}", tok_s=f"{line['tokens_per_s']:.3g}")
            if save:
                trainer.save(checkpoints, state, step)
    finally:
        bar.close()
        writer.close()
    return state, history


def _check_finite(line: dict[str, Any], checkpoints: Checkpoints, run: RunDir) -> None:
    """Raises :class:`NonFiniteLossError` for a non-finite loss or gradient norm.

    A non-finite gradient norm means this step's update already corrupted the parameters, even
    when its loss (computed before the update) is finite.
    """
    if math.isfinite(line["loss"]) and math.isfinite(line["grad_norm"]):
        return
    steps = checkpoints.steps()
    kept = f"the last good checkpoint (step {steps[-1]})" if steps else "no checkpoint"
    raise NonFiniteLossError(
        f"non-finite loss or gradient by step {line['step']} (loss {line['loss']}, grad norm "
        f"{line['grad_norm']}); {kept} is kept in {run.path}. Lower optim.learning_rate, raise "
        "optim.warmup_steps, or use model.dtype=float32."
    )


def _summarise(pending, step, tick, steps) -> dict[str, Any]:
    """One metrics line over the steps since ``tick`` (their metrics are in ``pending``)."""
    fetched = jax.device_get(pending)  # waits for the device: the elapsed time is real
    elapsed = time.perf_counter() - tick
    loss_sum = sum(float(m["loss_sum"]) for m in fetched)
    tokens = sum(float(m["tokens"]) for m in fetched)
    scored = sum(float(m["scored"]) for m in fetched)  # what the loss is a mean over
    return {
        "step": step,
        "loss": loss_sum / max(scored, 1.0),
        "grad_norm": float(fetched[-1]["grad_norm"]),
        "learning_rate": float(fetched[-1]["learning_rate"]),
        "tokens_per_s": tokens / max(elapsed, 1e-9),
        "step_time_s": elapsed / max(steps, 1),
        "time": time.time(),
    }
