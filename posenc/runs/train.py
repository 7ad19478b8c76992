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

from posenc import data as data_lib
from posenc.data.pair_batching import encode_pairs
from posenc.devices import distributed, fits, sharding
from posenc.devices.distributed import abstract_on, make_mesh
from posenc.kinds import classification as classify
from posenc.kinds import tasks, translation
from posenc.layers.params import EncoderParam
from posenc.models import build
from posenc.models import memory as memory_lib
from posenc.models.classifier import OWN_PARTS
from posenc.models.lm import Transformer
from posenc.models.losses import smoothed_token_loss, token_loss
from posenc.runs.config import (
    check_source,
    consecutive_segments,
    masked_lm,
    open_source,
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


def _pair_fields(s: int, t: int) -> list[tuple[str, int, jnp.dtype]]:
    """The fields of a translation batch with sources of ``s`` and targets of ``t`` tokens."""
    return [
        ("src", s, jnp.int32),
        ("src_mask", s, jnp.bool_),
        ("tgt_in", t, jnp.int32),
        ("tgt_out", t, jnp.int32),
        ("tgt_mask", t, jnp.bool_),
    ]


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
        self.masked_lm = masked_lm(config)  # None for causal LM
        # A translation run: batches of source/target pairs, a label-smoothed loss.
        self.translation = translation.is_translation(config)
        self.smoothing = config.train.get("label_smoothing", 0.0) if self.translation else 0.0
        # A classification run: labelled rows, a loss per example (posenc.kinds.classification).
        self.classify = classify.is_classifier(config)
        self.regression = self.classify and classify.regression(config)
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
        if self.translation:
            (rows, s), t = batch["src"].shape, batch["tgt_in"].shape[1]
            what = f"a training step on {rows} pairs of {s} source and {t} target tokens"
            return what, f"lower train.tokens_per_batch or data.max_src_len, or {attention}"
        rows, length = batch["inputs"].shape
        what = f"a training step on {rows} windows of {length} tokens"
        return what, f"lower train.batch_size or train.seq_len, or {attention}"

    def compile_step(self, windows: Any) -> None:
        """Compiles the step for the run's shapes (those of step 0's batch; with memory, a full
        memory), so that a run that cannot fit is refused before anything is written."""
        self._step.compile(*self.step_inputs(windows))

    def step_inputs(self, windows: Any) -> tuple[Any, ...]:
        """The step's arguments as shapes with their shardings (``jax.ShapeDtypeStruct``): the
        state, the batch of step 0 (a translation run's longest bucket) and, with memory, the
        static count of a full memory; what :meth:`compile_step` and ``posenc plan`` compile."""
        state = self.abstract_state()
        if self.translation:  # the longest of the bucketed shapes
            rows, s, t = max(windows.shapes, key=lambda shape: (max(shape[1:]), shape))
            batch = {
                k: jax.ShapeDtypeStruct((rows, n), dtype, sharding=self.batch_sharding)
                for k, n, dtype in _pair_fields(s, t)
            }
            return state, batch
        local = self.local_batch(windows, 0)
        rows = self.config.train.batch_size
        batch = {
            k: jax.ShapeDtypeStruct((rows, *v.shape[1:]), v.dtype, sharding=self.batch_sharding)
            for k, v in local.items()
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
            if self.translation:
                return self._pair_loss(model, batch, rng)
            if self.classify:
                mean, loss_sum = classify.batch_loss(model, batch, rng, self.regression)
                return mean, (loss_sum, None)
            if self.mem_len:
                memory = state["memory"][:, :, self.mem_len - memory_tokens :]  # [L, B, M, D]
                logits, memory = memory_lib.forward(model, batch["inputs"], memory, rng=rng)
            else:
                logits, memory = model(batch["inputs"], batch.get("positions"), rng=rng), None
            losses = token_loss(logits, batch["targets"])  # [B, T]
            if "weights" in batch:  # masked LM: the chosen tokens; a task: its targets
                loss_sum = (losses * batch["weights"]).sum()
                return loss_sum / jnp.maximum(batch["weights"].sum(), 1.0), (loss_sum, memory)
            return losses.mean(), (losses.sum(), memory)

        (_, (loss_sum, memory)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
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
        if self.translation:  # tokens read (both sides), scored (the targets)
            tokens = batch["src_mask"].sum() + batch["tgt_mask"].sum()
        elif self.classify:  # tokens read; the loss is per example
            tokens = batch["mask"].sum()
        else:
            tokens = batch["targets"].size
        metrics = {
            "loss_sum": loss_sum,
            "tokens": jnp.asarray(tokens, jnp.float32),
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": self.schedule(state["step"]),
        }
        if "weights" in batch:
            metrics["scored"] = batch["weights"].sum()  # the loss's tokens; "tokens" all read
        if self.translation:
            metrics["scored"] = batch["tgt_mask"].sum().astype(jnp.float32)
        if self.classify:
            metrics["scored"] = jnp.asarray(batch["labels"].shape[0], jnp.float32)
        return new_state, metrics

    def _pair_loss(self, model, batch, rng):
        """A translation batch's label-smoothed mean loss over its target tokens, and the
        plain cross entropy's sum (what the metrics report)."""
        logits = model(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"], rng=rng)
        weights = batch["tgt_mask"].astype(jnp.float32)
        smoothed = smoothed_token_loss(logits, batch["tgt_out"], self.smoothing)
        loss_sum = (token_loss(logits, batch["tgt_out"]) * weights).sum()
        return (smoothed * weights).sum() / jnp.maximum(weights.sum(), 1.0), (loss_sum, None)

    def windows(self, stream: np.ndarray) -> data_lib.TrainWindows | data_lib.StreamSegments:
        """The run's training batches over ``stream`` (:func:`training_windows`)."""
        return training_windows(self.config, stream)

    def local_batch(
        self,
        windows: data_lib.TrainWindows
        | data_lib.StreamSegments
        | tasks.TaskBatches
        | classify.ClassifyBatches,
        step: int,
    ) -> dict[str, np.ndarray]:
        """This process's rows of step ``step``'s batch: ``inputs``, ``targets`` (for a task,
        ``weights`` on its target tokens) and, with
        ``train.positions = "randomized"``, the step's ``positions`` (one draw per batch); for
        masked LM the windows corrupted (BERT's rule, drawn per global row) with ``weights`` on
        the chosen tokens, and the windows themselves as ``targets``."""
        batch = windows.batch(step)
        if self.classify:  # labelled rows, padded to train.seq_len
            return batch
        if self.translation:  # where each row's pair came from stays on the host
            return {k: v for k, v in batch.items() if k != "index"}
        if self.masked_lm is not None:
            first_row = windows.process_index * windows.local_batch
            batch = self.masked_lm.train_batch(batch["inputs"], step, first_row)
        t = self.config.train
        if t.positions == "randomized":
            rows, length = batch["inputs"].shape
            batch["positions"] = data_lib.batch_positions(
                self.config.seed, step, rows, length, t.max_position
            )
        return batch

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


def training_windows(
    config: ml_collections.ConfigDict, stream: np.ndarray
) -> data_lib.TrainWindows | data_lib.StreamSegments:
    """A run's training batches over ``stream``: random windows, or consecutive segments per
    row (with memory, or ``train.order = "consecutive"``)."""
    t = config.train
    cls = data_lib.StreamSegments if consecutive_segments(config) else data_lib.TrainWindows
    return cls(
        stream,
        seq_len=t.seq_len,
        global_batch=t.batch_size,
        seed=config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )


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
    theirs_abstract = nnx.split(nnx.eval_shape(lambda: build(other_config)), nnx.Param, ...)[1]
    mine, theirs = _shapes(abstract_params), _shapes(theirs_abstract)
    fresh: set[str] = set()
    own: tuple[str, ...] = ()
    if classify.is_classifier(config):
        own = tuple(f"['{part}']" for part in OWN_PARTS)
        fresh = {k for k in mine if k not in theirs and k.startswith(own)}
        theirs_used = {k: v for k, v in theirs.items() if k in mine}
    else:
        theirs_used = theirs
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
        raise ValueError(
            f"train.init_from={source!r}: its parameters do not fit this model ({len(differ)} "
            f"differ, e.g. {differ[:3]}; config fields that differ: {fields}); initialise from a "
            "run with the same model shape and encoder parameters"
            + (" (a classifier takes them with train.inherit_model=True)" if own else "")
        )
    sharding = jax.tree.leaves(abstract_params)[0].sharding
    with other.lock():
        step, params = other.restore_params(abstract_on(theirs_abstract, sharding))
    pretrained: list[str] = []
    if theirs != mine:  # keep the shared parts; the classifier's own parts start fresh
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
    config = classify.inherit_model(config)
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
    t = config.train
    windows, data_info, vocab_model = _training_data(config, mesh)
    is_main = jax.process_index() == 0
    # Created only now, so that a bad config or a missing data set leaves nothing behind; a
    # refusal while the run is set up (a bad train.init_from) removes what it wrote.
    # Refusals before compiling, and before anything is written: another run or other data in
    # the directory, then a step that cannot fit in memory.
    run.check_config(config)
    run.check_data(data_info)
    trainer = Trainer(config, mesh)
    trainer.compile_step(windows)
    with run.starting(enabled=is_main) as started, run.lock(enabled=is_main):
        if is_main:
            run.record_config(config)
            run.record_data(data_info)
            if vocab_model is not None:  # a translation run's SentencePiece model
                run.record_vocab(vocab_model)
        checkpoints = run.checkpoints(keep=t.keep_checkpoints, primary=is_main)
        try:
            state, resumed_from = trainer.restore_or_init(checkpoints, run)
            started()
            last = t.steps if stop_at is None else min(stop_at, t.steps)
            state, history = _train_steps(trainer, state, windows, run, checkpoints, last)
        finally:
            checkpoints.close()
    return TrainResult(trainer.model(state), int(state["step"]), history, resumed_from)


def _training_data(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh):
    """The run's training batches, the identity of its data (``data.json``) and a translation
    run's SentencePiece model (None otherwise): random windows or segments of a text stream, a
    task's generated examples, or token-bucketed pairs."""
    if classify.is_classifier(config):
        source, classes = classify.open_data(config)
        return (
            classify.train_batches(config, source, classes),
            classify.data_record(source, classes),
            None,
        )
    if translation.is_translation(config):
        source, vocab = translation.open_data(config)
        pairs = encode_pairs(source.pairs("train"), vocab)
        return (
            translation.train_batches(config, pairs, sharding.batch_shards(mesh)),
            translation.data_record(source, vocab),
            getattr(vocab, "model_bytes", lambda: None)(),
        )
    source = open_source(config)
    check_source(config, source)
    task = tasks.task_of(config)
    if not task:
        return training_windows(config, source.split_stream("train")), source.info(), None
    t = config.train
    batches = tasks.TaskBatches(
        task,
        t.seq_len,
        t.batch_size,
        config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    return batches, source.info(), None


def _train_steps(
    trainer: Trainer,
    state: dict[str, Any],
    windows: data_lib.TrainWindows | data_lib.StreamSegments,
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
    scored = sum(float(m.get("scored", m["tokens"])) for m in fetched)  # masked LM: the chosen
    return {
        "step": step,
        "loss": loss_sum / max(scored, 1.0),
        "grad_norm": float(fetched[-1]["grad_norm"]),
        "learning_rate": float(fetched[-1]["learning_rate"]),
        "tokens_per_s": tokens / max(elapsed, 1e-9),
        "step_time_s": elapsed / max(steps, 1),
        "time": time.time(),
    }
