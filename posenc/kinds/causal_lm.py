"""Causal language modelling: next-token prediction on a token stream, trained on windows of
``train.seq_len`` tokens and scored exactly at every evaluation length.

The kind every decoder-only config is unless another claims it (a masked LM, a synthetic task).
Training reads random windows of the ``train`` split, or consecutive segments per batch row with
Transformer-XL memory (``model.mem_len``) or ``train.order="consecutive"``; with
``train.positions="randomized"`` each batch gets one sorted draw of positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from posenc import data as data_lib
from posenc import encodings
from posenc.attention import linear as linear_attention
from posenc.attention.core import IMPLEMENTATIONS
from posenc.devices import budget as budget_lib
from posenc.devices.distributed import make_mesh
from posenc.kinds import stream
from posenc.kinds.base import EvalContext, RunKind, StepLoss, TrainingData
from posenc.kinds.common import (
    EVAL_MODES,
    EVAL_POSITIONS,
    EVAL_SPLITS,
    TRAIN_ORDERS,
    check_eval_lengths,
    check_source,
    consecutive_segments,
    eval_lengths,
    eval_mem_len,
    eval_positions,
    objective,
    open_source,
    require_choice,
    require_int,
    short_info,
    validate_batch_split,
    validate_layers,
    validate_optim,
)
from posenc.kinds.registry import register
from posenc.layers.config import DTYPES
from posenc.layers.norms import NORMS
from posenc.models import memory as memory_lib
from posenc.models.build import assembly, make_encoding, model_config


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


@dataclasses.dataclass(frozen=True)
class StreamInputs:
    """What a stream's evaluation reads (:meth:`CausalLM.open_evaluation`): the data source,
    its evaluation split's tokens and the evaluation's mesh (``config.mesh``; it may differ
    from training's)."""

    source: data_lib.Source
    tokens: np.ndarray | None
    mesh: jax.sharding.Mesh


@register
class CausalLM(RunKind):
    """Next-token prediction on a token stream (the default kind of a decoder-only model)."""

    name = "causal_lm"
    summary = "next-token prediction on a token stream, perplexity at every evaluation length"
    chosen_by = "model.assembly='lm' (the default), train.objective='causal_lm' (the default)"
    precedence = 90  # asked last: every decoder-only config another kind does not claim
    objective = "causal_lm"
    predicts_next = True

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        return assembly(config) == "lm"

    # -- data and batches

    def windows(self, config: ml_collections.ConfigDict, stream: np.ndarray) -> Any:
        """The training batches over a token stream (:func:`training_windows`)."""
        return training_windows(config, stream)

    def training_data(self, config: ml_collections.ConfigDict, mesh: Any) -> TrainingData:
        source = open_source(config)
        check_source(config, source)
        return TrainingData(self.windows(config, source.split_stream("train")), source.info())

    def local_batch(
        self, config: ml_collections.ConfigDict, batches: Any, step: int
    ) -> dict[str, np.ndarray]:
        """Step ``step``'s rows: ``inputs``, ``targets`` (and ``weights`` where the batches give
        them) and, with ``train.positions = "randomized"``, the step's ``positions``."""
        batch = batches.batch(step)
        t = config.train
        if t.positions == "randomized":
            rows, length = batch["inputs"].shape
            batch["positions"] = data_lib.batch_positions(
                config.seed, step, rows, length, t.max_position
            )
        return batch

    # -- the training step

    def loss(
        self,
        config: ml_collections.ConfigDict,
        model: Any,
        batch: dict[str, Any],
        rng: Any,
        memory: Any = None,
    ) -> StepLoss:
        """The mean cross entropy over the batch's tokens (over those with weight 1 where the
        batch has ``weights``: a masked LM's chosen tokens, a task's targets)."""
        if memory is not None:
            hidden, memory = memory_lib.hidden_states(model, batch["inputs"], memory, rng=rng)
        else:
            hidden = model.hidden_states(batch["inputs"], batch.get("positions"), rng=rng)
        # The logits a chunk at a time (model.loss_chunk), never all [B, T, V] of them.
        losses = model.token_losses(hidden, batch["targets"]).loss  # [B, T]
        tokens = batch["targets"].size
        if "weights" in batch:
            scored = batch["weights"].sum()
            loss_sum = (losses * batch["weights"]).sum()
            mean = loss_sum / jnp.maximum(scored, 1.0)
            return StepLoss(mean, loss_sum, tokens, scored, memory)
        return StepLoss(losses.mean(), losses.sum(), tokens, tokens, memory)

    # -- evaluation: what is scored, eval.json, CLI verbs and summaries

    retrieval = True

    def open_evaluation(self, context: EvalContext) -> StreamInputs:
        """The evaluation split's tokens, checked against the lengths, and the mesh."""
        config = context.config
        e = config.eval
        source = open_source(config)
        tokens = source.split_stream(e.split)
        check_eval_lengths(len(tokens), eval_lengths(config), e.split)
        return StreamInputs(source, tokens, make_mesh(config))

    def evaluate(self, context: EvalContext) -> dict[str, Any]:
        """The split scored exactly in windows at each length (:func:`posenc.kinds.stream.
        evaluate`), with randomized positions and Transformer-XL memory as the config says,
        the windows corrupted by :meth:`masking`."""
        config, inputs = context.config, context.inputs
        e = config.eval
        results = stream.evaluate(
            context.model_on(inputs.mesh),
            inputs.tokens,
            eval_lengths(config),
            mode=e.mode,
            stride=e.stride,
            batch_tokens=e.batch_tokens,
            memory_budget=e.get("memory_budget"),
            max_tokens=e.max_tokens,
            split=e.split,
            mesh=inputs.mesh,
            progress=context.progress,
            positions=stream.random_positions(config),
            masked_lm=self.window_masking(config),
            mem_len=eval_mem_len(config),
            byte_level=config.data.get("tokenizer", "bytes") == "bytes",
        )
        data = {"source": config.data.source, "split": e.split, **short_info(inputs.source.info())}
        return {"data": data, "results": results}

    # -- config, plan and analysis

    #: Whether the run reads windows of a token stream (False: generated examples, whose
    #: lengths the kind checks itself).
    reads_stream: ClassVar[bool] = True
    plan_eval = True
    #: Whether the kind's batches carry ``weights`` (the tokens scored: a masked LM's chosen
    #: tokens, a task's targets).
    weighted: ClassVar[bool] = False

    def validate(
        self,
        config: ml_collections.ConfigDict,
        *,
        num_devices: int | None = None,
        process_count: int = 1,
    ) -> None:
        """A decoder-only run's fields, in this order: the model and its encoder, the training
        fields, the objective (:meth:`validate_objective`), positions, Transformer-XL memory,
        the batch split, the optimizer, the evaluation fields, the data source and tokenizer."""
        m = config.model
        require_choice("model.norm", m.norm, NORMS)
        require_choice("model.dtype", m.dtype, DTYPES)
        require_choice("model.attention_impl", m.attention_impl, IMPLEMENTATIONS)
        encoding = make_encoding(config)  # unknown names and hyperparameters raise here
        model_cfg = model_config(config)  # shapes and rates are checked by ModelConfig
        # Encoders phrase these as encoding.<name>; the field is encoding.hparams.<name>.
        with encodings.registry.fields_as_set(config.encoding.name):
            encoding.bind(model_cfg.dims)  # encoder/shape combinations (e.g. RoPE, odd head dim)
            encoding.check_causal(model_cfg.causal)  # causal-only encoders, T5's buckets

        t = config.train
        require_int("train.seq_len", t.seq_len, 2)
        validate_layers(config, model_cfg, t.seq_len)  # the layer pattern and its windows
        require_int("train.batch_size", t.batch_size)
        require_int("train.steps", t.steps, 1)  # 0 would train nothing and write nothing
        require_int("train.log_every", t.log_every)
        require_int("train.checkpoint_every", t.checkpoint_every)
        require_int("train.keep_checkpoints", t.keep_checkpoints)
        self.validate_objective(config)
        if self.reads_stream:  # examples' lengths are input lengths: the kind checks them
            encoding.check_length(t.seq_len)
        validate_positions(config, encoding, lengths=self.reads_stream)
        self.validate_memory(config)
        validate_batch_split(t.batch_size, num_devices, process_count)

        validate_optim(config.optim)

        e = config.eval
        require_choice("eval.mode", e.mode, EVAL_MODES)
        require_choice("eval.split", e.split, EVAL_SPLITS)
        # eval_lengths() converts with int(): check first, so "abc" or 16.5 is named.
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in e.lengths):
            raise ValueError(f"eval.lengths must be integers, got {e.lengths!r}")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in e.multiples):
            raise ValueError(f"eval.multiples must be numbers, got {e.multiples!r}")
        lengths = eval_lengths(config)
        if not lengths:
            raise ValueError("eval.lengths and eval.multiples are both empty; give at least one")
        for length in lengths:
            if length < 1:
                raise ValueError(f"eval.lengths must all be >= 1, got {length} in {list(lengths)}")
        self.validate_eval_mode(config)  # before the stride, which would be the wrong complaint
        if e.mode == "sliding":
            require_int("eval.stride", e.stride)
            if any(e.stride > length for length in lengths):
                raise ValueError(
                    f"eval.stride={e.stride} must not exceed any of eval.lengths {list(lengths)}"
                )
        if e.batch_tokens is not None:  # None: sized from eval.memory_budget
            require_int("eval.batch_tokens", e.batch_tokens)
        if e.get("memory_budget") is not None:
            budget_lib.parse_bytes(e.memory_budget, "eval.memory_budget")
        require_int("eval.max_tokens", e.max_tokens, 0)
        if not isinstance(config.data.source, str) or not config.data.source:
            raise ValueError(
                "data.source must be 'pystdlib', 'textdir:<path>', 'tfds:<name>' or "
                "'synthetic:<task>'"
            )
        self.validate_tokenizer(config)

    def validate_objective(self, config: ml_collections.ConfigDict) -> None:
        """``train.objective`` with ``model.causal`` and ``model.vocab_size``: one of the
        objectives, a kind's own checks (:meth:`validate_masking`), and no bidirectional
        model predicting the next token."""
        goal = objective(config)
        require_choice("train.objective", goal, data_lib.OBJECTIVES)
        self.validate_masking(config)
        if goal == "causal_lm" and not config.model.get("causal", True):
            raise ValueError(
                "model.causal=False with train.objective='causal_lm': a bidirectional model sees "
                "the token it is asked to predict; use train.objective=masked_lm or "
                "model.causal=True"
            )

    def validate_masking(self, config: ml_collections.ConfigDict) -> None:
        """What a corrupting objective needs of the model (a masked LM's); none here."""
        del config

    def validate_memory(self, config: ml_collections.ConfigDict) -> None:
        """``model.mem_len`` and ``eval.mem_len`` with what Transformer-XL memory cannot combine
        with: a bidirectional model, randomized positions, linear attention, sliding
        evaluation, an encoder reading neighbouring tokens, and what
        :meth:`memory_conflicts` adds."""
        m = config.model
        mem_len = m.get("mem_len", 0)
        require_int("model.mem_len", mem_len, 0)
        require_choice("train.order", config.train.get("order", "auto"), TRAIN_ORDERS)
        if mem_len and config.train.get("order") == "random":
            raise ValueError(
                f"train.order='random' with model.mem_len={mem_len}: the memory would hold the "
                "states of an unrelated window; use train.order=auto or consecutive"
            )
        if config.eval.get("mem_len") is not None:
            require_int("eval.mem_len", config.eval.mem_len, 0)
        if not mem_len and not eval_mem_len(config):
            return
        field = "model.mem_len" if mem_len else "eval.mem_len"
        paths = linear_attention.PATHS
        reads_neighbours = "embed_tokens" in make_encoding(config).hooks
        conflicts = {
            "model.causal=False": not m.get("causal", True),
            "train.positions='randomized'": config.train.positions == "randomized",
            "eval.positions='randomized'": eval_positions(config) == "randomized",
            f"model.attention_impl={m.attention_impl!r}": m.attention_impl in paths,
            "eval.mode='sliding'": config.eval.mode == "sliding",
            f"encoding.name={config.encoding.name!r} (its embed_tokens reads neighbouring "
            "tokens, which the memory does not keep)": reads_neighbours,
            **self.memory_conflicts(config),
        }
        bad = [name for name, conflict in conflicts.items() if conflict]
        if bad:
            raise ValueError(
                f"{field} > 0 (Transformer-XL memory) cannot run with {bad[0]}: memory needs a "
                "causal softmax-attention model over contiguous positions and non-overlapping "
                f"windows; set {field}=0 or change that field"
            )

    def memory_conflicts(self, config: ml_collections.ConfigDict) -> dict[str, bool]:
        """``{what, as the error names it: whether it is so}`` the kind adds to what
        Transformer-XL memory cannot run with; none here."""
        del config
        return {}

    def validate_eval_mode(self, config: ml_collections.ConfigDict) -> None:
        """``eval.mode`` for the kind (checked before ``eval.stride``); any mode here."""
        del config

    def validate_tokenizer(self, config: ml_collections.ConfigDict) -> None:
        """``data.tokenizer``: its form, then :meth:`validate_pretrained_tokenizer` for one
        that is not posenc's bytes."""
        from posenc.data.hf_tokenizer import check_spec

        tokenizer = config.data.get("tokenizer", "bytes")
        check_spec(tokenizer)
        if tokenizer != "bytes":
            self.validate_pretrained_tokenizer(config, tokenizer)

    def validate_pretrained_tokenizer(
        self, config: ml_collections.ConfigDict, tokenizer: str
    ) -> None:
        """A pretrained ``data.tokenizer`` with the kind (a masked LM needs its mask token);
        any here."""
        del config, tokenizer

    def plan_lengths(
        self, config: ml_collections.ConfigDict, parts: tuple[str, ...]
    ) -> dict[str, int] | None:
        """``train.seq_len`` and, with :attr:`plan_eval`, the longest evaluation length."""
        lengths = {}
        if "train" in parts:
            lengths["train.seq_len"] = int(config.train.seq_len)
        if "eval" in parts and self.plan_eval:
            field = "eval.lengths" if config.eval.lengths else "eval.multiples x train.seq_len"
            lengths[field] = max(eval_lengths(config))
        return lengths

    def plan_step(
        self, config: ml_collections.ConfigDict, mesh: Any
    ) -> tuple[dict[str, tuple[tuple[int, ...], Any]], dict[str, int]]:
        """From the config alone (no data read): ``train.batch_size`` x ``train.seq_len`` of
        ``inputs`` and ``targets``, ``positions`` when they are randomized, ``weights`` where
        the kind scores some tokens only (:attr:`weighted`)."""
        del mesh
        t = config.train
        rows, length = t.batch_size, t.seq_len
        fields = {"inputs": jnp.int32, "targets": jnp.int32}
        if t.positions == "randomized":
            fields["positions"] = jnp.int32
        if self.weighted:
            fields["weights"] = jnp.float32
        return {k: ((rows, length), d) for k, d in fields.items()}, {"rows": rows, "length": length}

    def analysis_refusal(self, config: ml_collections.ConfigDict) -> str | None:
        """None: ``posenc analyze`` reads a stream's evaluation windows."""
        del config
        return None

    # -- report

    report_runs = "causal-LM"
    report_metrics = ("perplexity", "bits_per_byte", "loss")
    report_own_metrics = ("bits_per_byte",)

    def owns_eval(self, report: dict[str, Any]) -> bool:
        """Every report no kind asked before owns (asked last, as for configs; an older report
        without an ``objective`` too)."""
        return True


def validate_positions(
    config: ml_collections.ConfigDict, encoding: encodings.Encoding, lengths: bool = True
) -> None:
    """``train.positions``, ``train.max_position`` and ``eval.positions`` (against the window
    lengths too, unless ``lengths`` is False)."""
    t = config.train
    require_choice("train.positions", t.positions, data_lib.POSITION_MODES)
    require_choice("eval.positions", config.eval.positions, EVAL_POSITIONS)
    if "randomized" not in (t.positions, eval_positions(config)) or not lengths:
        return
    require_int("train.max_position", t.max_position, 1)
    if t.positions == "randomized" and t.max_position < t.seq_len:
        raise ValueError(
            f"train.max_position={t.max_position} must be >= train.seq_len={t.seq_len}: a "
            "window draws that many distinct positions"
        )
    encoding.check_length(t.max_position)  # a learned table must cover every drawn position
    if eval_positions(config) == "randomized":
        too_long = [n for n in eval_lengths(config) if n > t.max_position]
        if too_long:
            raise ValueError(
                f"eval.lengths {too_long} exceed train.max_position={t.max_position}, the range "
                "randomized evaluation positions are drawn from; use shorter lengths or "
                "eval.positions=contiguous"
            )
