"""The run-kind contract: everything that differs between kinds of run, in one class per kind.

posenc runs several kinds of experiment (causal and masked language modelling, translation,
classification, the synthetic length-generalisation tasks). What a kind decides is gathered in a
:class:`RunKind` subclass, registered by name (:mod:`posenc.kinds.registry`); the generic
machinery (:mod:`posenc.runs`: config validation, the training loop, the evaluation driver,
``posenc plan``, sweeps; :mod:`posenc.report`, :mod:`posenc.analysis`, the CLI) asks the run's
kind and never branches on one. fairseq's ``tasks/`` registry and seqio's ``Task`` are the idea;
this contract is kept small.

A kind is chosen from the config alone (:func:`posenc.kinds.registry.kind_of`): the kinds are
asked in order of :attr:`RunKind.precedence` and the first whose :meth:`RunKind.claims` is true
runs the config. A kind answers for:

- **config**: :meth:`~RunKind.prepare` (fill in what the kind derives, before validation) and
  :meth:`~RunKind.validate` (its part of the config; a one-line ``ValueError`` naming the field);
  :attr:`~RunKind.eval_may_change`, the fields an evaluation may change beyond the common ones;
- **data**: :meth:`~RunKind.training_data` (the batches, what ``data.json`` records, extra files)
  and :meth:`~RunKind.local_batch` (this process's rows of a step's batch);
- **the step**: :meth:`~RunKind.loss` (the mean that is differentiated, the sum and counts that
  are logged), :meth:`~RunKind.step_batch` (the batch shapes a step is compiled for) and
  :meth:`~RunKind.describe_step` (what a step computes, what to lower if it does not fit);
- **evaluation**: :meth:`~RunKind.open_evaluation` (what is read and checked before the run is
  locked), :meth:`~RunKind.evaluate` (what is scored; the fields of ``eval.json``),
  :meth:`~RunKind.write_outputs` (files kept beside the report) and :meth:`~RunKind.record`
  (what every report says about the kind); :attr:`~RunKind.retrieval`, whether retrieval
  applies;
- **the command line**: :meth:`~RunKind.describe_evaluation` and
  :meth:`~RunKind.announce_evaluation` (what ``posenc train`` and ``posenc eval`` say they
  score), :meth:`~RunKind.eval_summary` (what they print after) and :meth:`~RunKind.commands`
  (the kind's own verbs, :class:`Command`);
- **plan**: :meth:`~RunKind.plan_refusal` (what ``posenc plan`` cannot plan),
  :meth:`~RunKind.plan_step` (the training batch it compiles, from the config where it can),
  :meth:`~RunKind.plan_lengths` and :attr:`~RunKind.plan_eval` (the evaluation it compiles);
- **analysis**: :meth:`~RunKind.analysis_refusal` (whether ``posenc analyze`` reads the run) and
  :meth:`~RunKind.window_masking` (how a window is corrupted before it is read);
- **report**: :meth:`~RunKind.owns_eval` (which ``eval.json`` records are the kind's),
  :attr:`~RunKind.report_writer` (the function writing its section, named as an entry point,
  or the common tables), its metrics, notes and refusals;
- **the battery**: :meth:`~RunKind.example_config` (a tiny config of a plugin's kind).

The training loop keeps one step function shape for every kind: ``(state, batch[, memory
tokens]) -> (state, metrics)``, with the kind's :meth:`~RunKind.loss` inside. Evaluation keeps
exact sums and counts.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import ml_collections
import numpy as np

from posenc.kinds.common import eval_lengths


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """What a kind's training reads, from :meth:`RunKind.training_data`.

    Attributes:
      batches: the step's batches; an object with ``batch(step) -> {name: numpy array}``
        (this process's rows), given back to :meth:`RunKind.local_batch`.
      record: the identity of the data (``data.json``); a resumed run must read the same.
      vocab_model: a vocabulary model trained on the data (SentencePiece's), kept by the run
        (``vocab.model``; a resumed run must read the same); None: the vocabulary is fixed.
    """

    batches: Any
    record: dict[str, Any]
    vocab_model: bytes | None = None


@dataclasses.dataclass(frozen=True)
class StepLoss:
    """One training step's loss, from :meth:`RunKind.loss` (traced arrays).

    Attributes:
      mean: the scalar that is differentiated (label smoothing and weights included).
      loss_sum: the plain loss summed over what is scored (what the metrics report, divided by
        ``scored``).
      tokens: the tokens the step read (throughput).
      scored: what the loss is a mean over (tokens, masked tokens, target tokens, examples).
      memory: the new Transformer-XL memory of a run that carries one; None otherwise.
    """

    mean: Any
    loss_sum: Any
    tokens: Any
    scored: Any
    memory: Any = None


@dataclasses.dataclass
class EvalContext:
    """What the evaluation driver (:func:`posenc.runs.evaluate.evaluate_workdir`) hands a kind's
    :meth:`RunKind.open_evaluation`, :meth:`RunKind.evaluate` and :meth:`RunKind.write_outputs`.

    Attributes:
      run: the run directory (:class:`posenc.workdir.RunDir`).
      config: the config evaluated with (the run's own, or changed at evaluation).
      changes: ``{field: value}`` the evaluation changes from the trained config.
      name: the report's file name (``eval.json`` or ``eval-<changes>.json``).
      restore: ``restore(mesh) -> (model, step)``: the newest intact checkpoint's model placed
        on ``mesh`` (None: replicated on this process's devices); :meth:`model_on` calls it.
      progress: print a line per length.
      is_main: whether this is the main process (which prints and writes the run's files).
      model, step: the trained model and its checkpoint step, if the caller has them; else set
        by :meth:`model_on`.
      inputs: what :meth:`RunKind.open_evaluation` opened, before the run was locked.
      outputs: what :meth:`RunKind.evaluate` keeps for :meth:`RunKind.write_outputs` beside the
        report's fields (a translation run's hypotheses).
    """

    run: Any
    config: ml_collections.ConfigDict
    changes: dict[str, Any]
    name: str
    restore: Callable[[Any], tuple[Any, int | None]]
    progress: bool = True
    is_main: bool = True
    model: Any = None
    step: int | None = None
    inputs: Any = None
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def model_on(self, mesh: Any = None) -> Any:
        """The model (restored on ``mesh`` the first time it is asked for, unless the caller
        gave one)."""
        if self.model is None:
            self.model, self.step = self.restore(mesh)
        return self.model


@dataclasses.dataclass(frozen=True)
class Command:
    """A verb a kind adds to the ``posenc`` command line (:meth:`RunKind.commands`): the CLI
    adds it to its parser with the common verbs and runs it as it runs them (errors in one
    line, the same exit statuses).

    Attributes:
      name: the verb (``translate``).
      help: its line in ``posenc --help``.
      description: what ``posenc <name> --help`` says of it.
      add_arguments: ``add_arguments(parser)``: adds its flags to its ``argparse`` parser.
      run: ``run(args, overrides) -> exit status``; ``overrides``: the ``--config.<field>=
        <value>`` overrides given (none unless :attr:`overrides`).
      writes: what it writes where, for the one-line error about a directory it cannot write
        to ("its lock file in the work directory").
      overrides: whether it takes ``--config.<field>=<value>`` overrides (refused otherwise).
    """

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list[str]], int]
    writes: str = "there"
    overrides: bool = False


class RunKind:
    """One kind of run. Subclass it, set :attr:`name`, and register the class
    (:func:`posenc.kinds.registry.register`); the methods without a default must be given."""

    #: The registry name (:func:`posenc.kinds.names` lists them).
    name: ClassVar[str] = ""
    #: What the kind trains, in a few words (docs and errors).
    summary: ClassVar[str] = ""
    #: The config settings that choose this kind, as a user writes them (docs and errors).
    chosen_by: ClassVar[str] = ""
    #: Kinds are asked in increasing order; the first that claims a config runs it. A kind that
    #: claims what another also claims (a task's causal-LM config) asks first.
    precedence: ClassVar[int] = 50
    #: What ``eval.json`` records as ``objective`` (what was scored).
    objective: ClassVar[str] = ""
    #: Fields (dotted, ``*`` for any key) an evaluation may change beyond the common ones
    #: (:data:`posenc.runs.config.EVAL_MAY_CHANGE`).
    eval_may_change: ClassVar[tuple[str, ...]] = ()
    #: The model's parts (top-level parameter names) this kind adds to the shared ones (a
    #: classifier's head): they start fresh when ``train.init_from`` names another kind's run,
    #: whose parts this model lacks are left behind.
    own_parts: ClassVar[tuple[str, ...]] = ()
    #: Said after a ``train.init_from`` whose parameters do not fit (how this kind takes them).
    init_from_hint: ClassVar[str] = ""

    # -- which configs

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        """Whether ``config`` describes a run of this kind (asked in :attr:`precedence` order)."""
        raise NotImplementedError

    def example_config(self, folder: str) -> ml_collections.ConfigDict | None:
        """A tiny config of this kind (one layer, a few steps), with any data it reads written
        under ``folder``: what the kind battery (:mod:`posenc.testing.kinds`) runs. posenc's
        own kinds take theirs from the repository's configs (None here); a plugin's gives one."""
        return None

    # -- config

    def prepare(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        """The config with what the kind derives filled in, before it is validated (a
        classifier takes the shape of the model it fine-tunes); by default ``config``."""
        return config

    def validate(
        self,
        config: ml_collections.ConfigDict,
        *,
        num_devices: int | None = None,
        process_count: int = 1,
    ) -> None:
        """Checks the kind's part of ``config``; raises a one-line ``ValueError`` naming the
        first bad field. ``num_devices``, ``process_count``: what the batch's rows are split over
        (None: skip that check)."""
        raise NotImplementedError

    # -- data and batches

    def training_data(self, config: ml_collections.ConfigDict, mesh: Any) -> TrainingData:
        """The run's training batches, what ``data.json`` records, and files the run keeps."""
        raise NotImplementedError

    def local_batch(
        self, config: ml_collections.ConfigDict, batches: Any, step: int
    ) -> dict[str, np.ndarray]:
        """This process's rows of step ``step``'s batch (host arrays, made global by the loop);
        by default ``batches.batch(step)``."""
        return batches.batch(step)

    def step_batch(
        self, config: ml_collections.ConfigDict, batches: Any
    ) -> dict[str, tuple[tuple[int, ...], Any]]:
        """``{field: (global shape, dtype)}`` of the batch a step is compiled for before the run
        starts (its largest: a translation run's longest bucket); by default step 0's batch with
        ``train.batch_size`` rows."""
        local = self.local_batch(config, batches, 0)
        rows = config.train.batch_size
        return {k: ((rows, *v.shape[1:]), v.dtype) for k, v in local.items()}

    # -- the training step

    def loss(
        self,
        config: ml_collections.ConfigDict,
        model: Any,
        batch: dict[str, Any],
        rng: Any,
        memory: Any = None,
    ) -> StepLoss:
        """The step's loss on ``batch`` (traced); ``rng``: dropout's key or None; ``memory``: a
        Transformer-XL run's memory of real states (None without)."""
        raise NotImplementedError

    def describe_step(
        self, config: ml_collections.ConfigDict, batch: dict[str, Any]
    ) -> tuple[str, str]:
        """What a training step on ``batch`` computes, and which fields to lower if it does not
        fit in memory (:mod:`posenc.devices.fits`)."""
        rows, length = batch["inputs"].shape
        return (
            f"a training step on {rows} windows of {length} tokens",
            "lower train.batch_size or train.seq_len",
        )

    # -- evaluation

    def record(self, config: ml_collections.ConfigDict) -> dict[str, Any]:
        """What every report of this kind says about the run beside the common fields (the
        objective, the task, a translation run's source length); the same keys for every kind,
        so ``eval.json`` keeps one shape."""
        return {
            "objective": self.objective,
            "task": None,
            "train_seq_len": config.train.seq_len,
            "max_src_len": None,
        }

    def evaluate(self, context: EvalContext) -> dict[str, Any]:
        """Scores a trained run, under the run's lock (the model: ``context.model_on(mesh)``).
        Returns the report's kind-specific fields (``data``, ``results``, ...), in the order
        ``eval.json`` keeps them; the driver puts the run's record (:meth:`record` among the
        common fields), ``file`` and ``changes`` before them and ``time`` after, and writes the
        report. A field the record has too replaces the record's value in its place (a
        translation run's ``train_seq_len``: its longest training source)."""
        raise NotImplementedError

    # -- evaluation: what is scored, eval.json, CLI verbs and summaries

    #: Whether retrieval (``posenc retrieval``, ``posenc eval --tasks``: passkey and needle in a
    #: haystack, greedy generation by a decoder-only LM) applies to runs of this kind.
    retrieval: ClassVar[bool] = False
    #: Whether the model predicts each token from those before it, so that a window's
    #: next-token losses are the run's loss (``posenc.load_run(...).token_losses``).
    predicts_next: ClassVar[bool] = False

    def open_evaluation(self, context: EvalContext) -> Any:
        """Opens and checks what the evaluation reads before the run is locked and its checkpoint
        read (a split's token stream, a parallel source and the run's vocabulary), so that a
        bad split or length is refused first; the driver keeps it as ``context.inputs`` for
        :meth:`evaluate`. By default None."""
        return None

    def write_outputs(self, context: EvalContext) -> dict[str, Any]:
        """Writes the files an evaluation keeps beside its report, after the report (on the main
        process, under the run's lock: a translation run's outputs). Returns the fields they add
        to the report :func:`posenc.runs.evaluate.evaluate_workdir` returns, not to the file
        (their names); by default writes nothing and adds none."""
        return {}

    def describe_evaluation(self, config: ml_collections.ConfigDict) -> str:
        """What an evaluation of ``config`` scores, as ``posenc train`` says before it evaluates
        (``evaluating W at ...``): by default the lengths, ``"64, 256, 1024"``."""
        return ", ".join(str(x) for x in eval_lengths(config))

    def announce_evaluation(self, config: ml_collections.ConfigDict, workdir: str) -> str:
        """The line ``posenc eval`` prints before it evaluates ``workdir``: by default
        ``evaluating W at <lengths> (<eval.mode>)``."""
        return f"evaluating {workdir} at {self.describe_evaluation(config)} ({config.eval.mode})"

    def eval_summary(self, report: dict[str, Any], workdir: str, command: str) -> str | None:
        """What ``posenc <command>`` (``"train"`` or ``"eval"``) prints after an evaluation wrote
        ``report`` in ``workdir`` (a classification run's metric per length bucket), as one
        string of lines; None (the default): nothing."""
        return None

    def commands(self) -> tuple[Command, ...]:
        """The verbs this kind adds to the ``posenc`` command line (a translation run's
        ``translate``); by default none."""
        return ()

    # -- config, plan and analysis

    #: Whether ``posenc plan`` compiles an evaluation batch for this kind (the decoder-only
    #: scorer over the longest ``eval.lengths``); False: only the training step is planned.
    plan_eval: ClassVar[bool] = False

    def plan_refusal(self, config: ml_collections.ConfigDict, parts: tuple[str, ...]) -> str | None:
        """Why ``posenc plan`` cannot plan ``parts`` (of ``train``, ``eval``, as given, not yet
        checked) of ``config``: the one-line message, or None (it can); asked before anything
        else is checked. By default None."""
        del config, parts
        return None

    def plan_lengths(
        self, config: ml_collections.ConfigDict, parts: tuple[str, ...]
    ) -> dict[str, int] | None:
        """``{field: window length}`` the planned ``parts`` compile, from the config alone, for
        ``posenc plan``'s up-front checks (int32 positions, a ``context`` axis that splits one of
        them, a ``tensor`` axis that splits the model); None: the lengths are the data's, and
        the mesh is not checked up front. By default None."""
        del config, parts
        return None

    def plan_step(
        self, config: ml_collections.ConfigDict, mesh: Any
    ) -> tuple[dict[str, tuple[tuple[int, ...], Any]], dict[str, int]]:
        """The batch ``posenc plan`` compiles the training step for on ``mesh``: ``{field:
        (global shape, dtype)}``, and what it holds for the plan's table (``rows`` and
        ``length``; ``source`` too for pairs, ``length`` then being the target's).

        By default the batch a run compiles for (:meth:`step_batch` of :meth:`training_data`'s
        batches: the data is read) with ``rows`` x ``length`` of its first field (``inputs``);
        a kind whose batch follows from the config alone gives it without reading data."""
        batch = self.step_batch(config, self.training_data(config, mesh).batches)
        rows, length = next(iter(batch.values()))[0][:2]
        return batch, {"rows": int(rows), "length": int(length)}

    def analysis_refusal(self, config: ml_collections.ConfigDict) -> str | None:
        """Why ``posenc analyze`` (the self-attention of a decoder-only model over its
        evaluation windows) cannot read a run of this kind: the end of a one-line message
        that starts with the run's directory (``"is a ...; analyze reads ..."``), or None (it
        can). By default refused: only a kind that evaluates a stream's windows is read."""
        del config
        return (
            f"is a {self.name} run ({self.chosen_by}); analyze reads the self-attention of "
            "language-model runs over text windows"
        )

    def window_masking(self, config: ml_collections.ConfigDict) -> Any:
        """How the kind corrupts an evaluation window before the model reads it (a masked LM's
        :class:`posenc.data.MaskedLM`: ``eval_batch(batch, length)``), or None (read as
        they are); what evaluation and ``posenc analyze`` apply. By default None."""
        del config
        return None

    # -- report

    #: The function that writes this kind's report section, named as an entry point is
    #: (``"package.module:function"``; :mod:`posenc.report` imports it when a report needs it, so
    #: a kind never imports the report): ``writer(sweep_dir, runs, metric) -> paths``, with
    #: ``runs`` the kind's evaluated runs (:class:`posenc.report.runs.Run`), ``metric`` the one
    #: asked for (None: ``--metric`` left at its default, the writer's choice) and ``paths`` the
    #: files written, ``report.md`` first. None (the default): the kind's runs are tabled in the
    #: common tables by evaluation length (the language models').
    report_writer: ClassVar[str | None] = None
    #: A folder holding runs of several kinds with a writer is reported by the kind with the
    #: lowest value; the others' runs are named as left out.
    report_precedence: ClassVar[int] = 50
    #: What a report calls the kind's runs (``"<report_runs> runs"``, in notes and errors); empty:
    #: :attr:`name`.
    report_runs: ClassVar[str] = ""
    #: The metrics the kind's report offers (``posenc report --metric``).
    report_metrics: ClassVar[tuple[str, ...]] = ()
    #: The per-length metrics only this kind's runs have (named when ``--metric`` asks for one no
    #: run under the report has).
    report_own_metrics: ClassVar[tuple[str, ...]] = ()
    #: ``{metric: heading}``: how the common tables head a metric of this kind's beyond their
    #: own (perplexity, bits per byte, loss): the masked LM's ``accuracy``.
    report_metric_text: ClassVar[dict[str, str]] = {}
    #: Whether runs tabled in the common tables, found beside this kind's, follow its section
    #: in ``report.md`` (their tables in ``report-lm.csv`` and ``runs-lm.csv``); False: they are
    #: named as left out, like other kinds' runs.
    report_lm_beside: ClassVar[bool] = True

    def owns_eval(self, report: dict[str, Any]) -> bool:
        """Whether an evaluation report (``eval.json``'s record) is of a run of this kind, from
        what :meth:`record` wrote into it; kinds are asked in :attr:`precedence` order, the
        first that owns a report reports it. By default: its ``objective`` is
        :attr:`objective`."""
        return report.get("objective") == self.objective

    def report_notes(self, reports: list[dict[str, Any]]) -> list[str]:
        """Lines the description of what was measured (the list heading ``report.md``) adds
        about this kind's runs among the evaluation ``reports`` it describes, after the line on
        entries (the masked LM states its objective); by default none."""
        return []

    def report_evaluation(self, reports: list[dict[str, Any]]) -> str | None:
        """The description's evaluation line (up to its final period) when ``reports`` are all
        this kind's and are not scored on windows of a token stream (the tasks' generated
        examples per input length); None (the default): windows."""
        return None

    def report_refusal(self, metric: str, reports: list[dict[str, Any]], where: str) -> str | None:
        """Why the common tables of the evaluation ``reports`` (under the folder ``where``)
        cannot show ``metric``, where this kind says it better than the general refusal (the
        masked LM: accuracy without a masked-LM run); None (the default): nothing to say."""
        return None
