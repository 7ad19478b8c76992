"""Classification runs: a bidirectional model fine-tuned on labelled text (BERT's recipe, GLUE;
RoFormer's Tables 2 and 5), and train short / test long by example length.

A config is a classification run when ``model.assembly = "classifier"`` (``configs/
classify.py``); its ``data.source`` is a labelled source (:mod:`posenc.data.labelled`:
``labelled:default``, ``tsv:<dir>``, ``tfds:glue/<task>``) and ``model.num_labels`` the number of
classes of its training split (1: a regression, STS-B).

- Training (:func:`posenc.runs.train.train`) reads :class:`~posenc.data.classify_batching.
  ClassifyBatches` of ``train.batch_size`` examples truncated to ``train.seq_len`` tokens; the
  loss is the cross entropy of the classes (a regression: the squared error), per example.
  ``train.init_from`` starts the shared parts from a masked-LM run (or a model imported into a
  run directory); the head and segment embedding start fresh.
- Evaluation (:func:`evaluate_classifier`): ``overall``, every example of the split truncated
  to ``train.seq_len`` as in training (the number GLUE tables report), with the task's metrics
  (:mod:`posenc.kinds.classification_metrics`); and ``results``, one entry per length bucket, the
  examples whose untruncated length falls in ``(previous length, length]`` of ``eval.lengths``, read
  whole: within the training length, then longer (RoFormer Table 5's question). Examples longer
  than the largest length are truncated to it (counted as ``truncated``).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from posenc.data.classify_batching import (
    VOCAB_SIZE,
    ClassifyBatches,
    EncodedExamples,
    encode_examples,
    eval_batches,
)
from posenc.data.labelled import LabelledSource, encode_labels, get_labelled_source, label_classes
from posenc.decoding.lm import layer_encodings
from posenc.devices.budget import MAX_BATCH_TOKENS
from posenc.kinds import classification_metrics as classify_metrics
from posenc.kinds.base import EvalContext, RunKind, StepLoss, TrainingData
from posenc.kinds.common import (
    eval_lengths,
    require_int,
    short_info,
    validate_batch_split,
    validate_optim,
)
from posenc.kinds.registry import register
from posenc.models.build import HEAD_FIELDS, assembly, head_config, make_encoding, model_config
from posenc.models.classifier import OWN_PARTS, Classifier


def is_classifier(config: ml_collections.ConfigDict) -> bool:
    """Whether ``config`` describes a classification run."""
    return assembly(config) == "classifier"


# Fields of `config.model` a classifier keeps when it takes its model from train.init_from: the
# assembly, its head, and what fine-tuning may choose (dropout, the attention path).
_OWN_FIELDS = ("assembly", *HEAD_FIELDS, "dropout", "attention_impl", "attention_block_size")


def inherit_model(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` with its model, encoder and ``data.tokenizer`` taken from the run
    ``train.init_from`` names, when ``train.inherit_model`` is True (an imported BERT or
    RoBERTa, whose options no one types: ``posenc train --config configs/classify.py:tiny
    --config.train.inherit_model=True --init-from W``); the head's fields, dropout and the
    attention path stay ``config``'s. The same config back otherwise (and when it already
    holds the other run's model), so it may be applied twice."""
    t = config.train
    if not t.get("inherit_model", False):
        return config
    if not t.get("init_from"):
        raise ValueError(
            "train.inherit_model=True takes the model from train.init_from, which is not set; "
            "pass --init-from RUN (a masked-LM run or an imported BERT or RoBERTa)"
        )
    from posenc.workdir import RunDir, config_from_dict

    other = RunDir(t.init_from).read_config()
    fields = config.to_dict()
    own = {k: v for k, v in fields["model"].items() if k in _OWN_FIELDS}
    fields["model"] = {**other.model.to_dict(), **own}
    fields["encoding"] = other.encoding.to_dict()
    fields["data"]["tokenizer"] = other.data.get("tokenizer", "bytes")
    return config_from_dict(fields)


def regression(config: ml_collections.ConfigDict) -> bool:
    """Whether the run is a regression (``model.num_labels == 1``)."""
    return head_config(config).regression


def open_data(config: ml_collections.ConfigDict) -> tuple[LabelledSource, tuple[str, ...] | None]:
    """The run's labelled source and its classes (None for a regression), checked against
    ``model.num_labels``."""
    source = get_labelled_source(config.data.source, config.data.data_dir)
    if source.pair and head_config(config).num_segments == 1:
        raise ValueError(
            f"model.num_segments=1, but data.source={config.data.source!r} holds sentence pairs "
            "(segments 0 and 1); use model.num_segments=2, or 0 for no segment embedding"
        )
    if regression(config):
        _check_labels(source, None)
        return source, None
    classes = label_classes(source, source.examples("train"))
    n = config.model.num_labels
    numeric = all(_is_number(c) for c in classes)
    if len(classes) == 1:
        raise ValueError(
            f"the training split of data.source={config.data.source!r} has one class "
            f"{list(classes)}: a classifier needs two or more; add rows of the other classes"
            + (
                ", or set model.num_labels=1 for a regression on its numeric labels"
                if numeric
                else ""
            )
        )
    if n != len(classes):
        shown = list(classes) if len(classes) <= 10 else [*classes[:10], "..."]
        raise ValueError(
            f"model.num_labels={n}, but the training split of data.source="
            f"{config.data.source!r} has {len(classes)} classes {shown}; set "
            f"model.num_labels={len(classes)}"
            + (" (or 1 for a regression on numeric labels)" if numeric else "")
        )
    _check_labels(source, classes)
    return source, classes


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_labels(source: LabelledSource, classes: tuple[str, ...] | None) -> None:
    """Reads every split's labels against the training split's classes (or as real numbers for
    a regression), so that a validation label the training split lacks is refused before the
    first step rather than when the finished run is evaluated (one line naming file and row)."""
    for split in source.splits:
        encode_labels(source.examples(split), classes, split)


def encoded(
    source: LabelledSource,
    split: str,
    classes: tuple[str, ...] | None,
    tokenizer: str = "bytes",
) -> EncodedExamples:
    """A split's examples as token rows of ``data.tokenizer`` (bytes, or a pretrained model's
    tokenizer, whose own special tokens frame the rows) with their label ids (or real
    targets)."""
    from posenc.data.hf_tokenizer import make_tokenizer

    examples = source.examples(split)
    labels = encode_labels(examples, classes, split)
    return encode_examples(examples, labels, make_tokenizer(tokenizer))


def data_record(source: LabelledSource, classes: tuple[str, ...] | None) -> dict[str, Any]:
    """What ``data.json`` keeps about a classification run's data."""
    return {**source.info(), "classes": None if classes is None else list(classes)}


def train_batches(
    config: ml_collections.ConfigDict, source: LabelledSource, classes: tuple[str, ...] | None
) -> ClassifyBatches:
    """The run's training batches (a function of (seed, step))."""
    train = encoded(source, "train", classes, config.data.get("tokenizer", "bytes"))
    if not regression(config) and (train.labels < 0).any():
        raise ValueError(
            f"data.source={config.data.source!r}: the training split has unlabelled rows"
        )
    t = config.train
    return ClassifyBatches(
        train,
        t.seq_len,
        t.batch_size,
        config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )


def example_losses(outputs: jax.Array, labels: jax.Array, is_regression: bool) -> jax.Array:
    """Per-example losses ``[B]``: the cross entropy of ``outputs [B, C]`` logits at integer
    ``labels [B]``, or for a regression the squared error of ``outputs [B, 1]``."""
    if is_regression:
        return (outputs[:, 0] - labels.astype(jnp.float32)) ** 2
    log_probs = jax.nn.log_softmax(outputs, axis=-1)
    return -jnp.take_along_axis(log_probs, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]


def batch_loss(
    model: Classifier, batch: dict[str, jax.Array], rng: jax.Array | None, is_regression: bool
):
    """The mean loss over a training batch's examples, and its sum (what the metrics report)."""
    outputs = model(batch["inputs"], batch["segments"], batch["mask"], rng=rng)
    losses = example_losses(outputs, batch["labels"], is_regression)
    return losses.mean(), losses.sum()


# --- evaluation ---------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(0,))
def _outputs(graphdef, state, batch):
    model: Classifier = nnx.merge(graphdef, state)
    return model(batch["inputs"], batch["segments"], batch["mask"])


def predict(
    model: Classifier, examples: EncodedExamples, bounds: list[int], batch_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """The outputs ``[N, labels]`` of every example read at its bucket's bound (longer ones
    truncated to the last bound), and each example's bucket ``[N]``."""
    graphdef, state = nnx.split(model)
    outputs = np.zeros((len(examples), model.head.config.num_labels), np.float32)
    bucket = np.zeros(len(examples), np.int64)
    keys = ("inputs", "segments", "mask")
    for k, indices, batch in eval_batches(examples, bounds, batch_tokens):
        out = np.asarray(_outputs(graphdef, state, {key: jnp.asarray(batch[key]) for key in keys}))
        real = indices >= 0
        outputs[indices[real]] = out[real]
        bucket[indices[real]] = k
    return outputs, bucket


def _scores(outputs: np.ndarray, labels: np.ndarray, num_classes: int | None) -> dict[str, Any]:
    """The task's metrics and mean loss of some examples (float64 on the host)."""
    if num_classes is None:
        predictions = outputs[:, 0]
        loss = float(((predictions - labels) ** 2).mean()) if labels.size else math.nan
    else:
        predictions = outputs.argmax(-1)
        shifted = outputs - outputs.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, labels[:, None].astype(np.int64), -1)
        loss = float(-picked.mean()) if labels.size else math.nan
    return {**classify_metrics.metrics(labels, predictions, num_classes=num_classes), "loss": loss}


def _bucket_label(lo: int, hi: int, train_len: int) -> str:
    """``"<=1x"``, ``"1x-2x"``, ... of a bucket ``(lo, hi]`` relative to the training length."""

    def x(n: int) -> str:
        return f"{n / train_len:g}x"

    return f"<={x(hi)}" if lo == 0 else f"{x(lo)}-{x(hi)}"


def evaluate_classifier(
    model: Classifier,
    config: ml_collections.ConfigDict,
    source: LabelledSource,
    classes: tuple[str, ...] | None,
    lengths: tuple[int, ...],
    *,
    split: str,
) -> dict[str, Any]:
    """Scores a classifier on ``split``: overall at the training length, and per length bucket
    (module docstring).

    Args:
      model: the classifier.
      config: the run config (``train.seq_len``, ``eval.batch_tokens``).
      source: the labelled source.
      classes: its classes (None: a regression).
      lengths: the buckets' upper bounds in tokens (``eval.lengths``).
      split: "validation" or "test".

    Returns:
      The report's fields: ``overall`` (metrics, ``loss``, ``examples``, ``truncated``),
      ``results`` (per bucket: ``length`` its upper bound, ``lo``, ``label``, ``examples``,
      ``truncated``, the metrics, or ``unrepresentable`` where the encoder cannot read that
      length), ``metric`` (the task's headline metric), ``classes``, ``split``, ``seconds``.

    Raises:
      ValueError: an empty or unlabelled split.
    """
    examples = encoded(source, split, classes, config.data.get("tokenizer", "bytes"))
    labelled = ~np.isnan(examples.labels) if classes is None else examples.labels >= 0
    if not labelled.any():
        raise ValueError(
            f"eval.split={split!r} of data.source={config.data.source!r} has no labelled "
            "examples (GLUE's test labels are held by its server); evaluate eval.split=validation"
        )
    examples = EncodedExamples(
        [t for t, keep in zip(examples.texts, labelled, strict=True) if keep],
        examples.labels[labelled],
        examples.fmt,
    )
    start = time.perf_counter()
    num_classes = None if classes is None else len(classes)
    train_len, batch_tokens = config.train.seq_len, config.eval.batch_tokens
    if batch_tokens is None:  # a classifier's outputs are [B, labels]: the fixed count does
        batch_tokens = MAX_BATCH_TOKENS
    lengths_all = examples.lengths
    outputs, _ = predict(model, examples, [train_len], batch_tokens)
    overall = {
        **_scores(outputs, examples.labels, num_classes),
        "truncated": int((lengths_all > train_len).sum()),
    }
    bounds = sorted(set(lengths))
    readable = []
    for bound in bounds:
        try:
            for _, encoding in layer_encodings(model):  # every layer kind's encoder
                encoding.check_length(bound)
            readable.append(bound)
        except ValueError:
            break
    results = []
    if readable:
        outputs, bucket = predict(model, examples, readable, batch_tokens)
    lo = 0
    for k, hi in enumerate(bounds):
        row: dict[str, Any] = {"length": hi, "lo": lo, "label": _bucket_label(lo, hi, train_len)}
        if k < len(readable):
            # Longer examples truncated into the last readable bucket belong to later buckets
            # when those exist (an encoder that cannot read them: reported unrepresentable).
            members = (bucket == k) & ((lengths_all <= hi) | (k == len(bounds) - 1))
            if members.any():  # an empty bucket has no metrics (a table shows "—")
                row.update(_scores(outputs[members], examples.labels[members], num_classes))
            else:
                row["examples"] = 0
            row["truncated"] = int((members & (lengths_all > hi)).sum())
        else:
            row["unrepresentable"] = True
            row["examples"] = int(((lengths_all > lo) & (lengths_all <= hi)).sum())
        results.append(row)
        lo = hi
    return {
        "split": split,
        "metric": classify_metrics.headline(config.data.source, classes is None),
        "classes": None if classes is None else list(classes),
        "overall": overall,
        "results": results,
        "seconds": time.perf_counter() - start,
    }


def validate_classifier(config: ml_collections.ConfigDict) -> None:
    """Checks a classification run's config (``model.assembly="classifier"``,
    ``configs/classify.py``); one line naming the first bad field."""
    m, t, e = config.model, config.train, config.eval
    if t.get("objective") != "classification":
        raise ValueError(
            f"train.objective={t.get('objective')!r} with model.assembly='classifier': a "
            "classifier trains on labels; use train.objective=classification"
        )
    head_config(config)  # num_labels, pool, num_segments, pooler
    model_cfg = model_config(config)  # shapes and rates
    if model_cfg.causal:
        raise ValueError(
            "model.causal must be False for model.assembly='classifier': every token reads both "
            "sides, as in the masked-LM model it is fine-tuned from"
        )
    if model_cfg.mem_len:
        raise ValueError("model.mem_len must be 0 for model.assembly='classifier'")
    tokenizer = config.data.get("tokenizer", "bytes")
    if tokenizer != "bytes":  # a pretrained model's own: rows framed by its special tokens
        from posenc.data.hf_tokenizer import check_spec, make_tokenizer

        check_spec(tokenizer)
        size = make_tokenizer(tokenizer).vocab_size
        if m.vocab_size < size:
            raise ValueError(
                f"model.vocab_size={m.vocab_size} is smaller than the {size} ids of "
                f"data.tokenizer={tokenizer!r}; use model.vocab_size >= {size}"
            )
    elif m.vocab_size < VOCAB_SIZE:
        raise ValueError(
            f"model.vocab_size={m.vocab_size} has no id for [CLS] (id {VOCAB_SIZE - 1}, "
            "after the bytes, the separator and the mask token); use model.vocab_size >= "
            f"{VOCAB_SIZE}"
        )
    encoding = make_encoding(config)
    encoding.bind(model_cfg.dims)
    encoding.check_causal(False)
    for field in ("steps", "log_every", "checkpoint_every", "keep_checkpoints", "batch_size"):
        require_int(f"train.{field}", t[field])
    require_int("train.seq_len", t.seq_len, 4)
    encoding.check_length(t.seq_len)
    for field, value in (("train.positions", t.positions), ("eval.positions", e.positions)):
        if value == "randomized":
            raise ValueError(
                f"{field}='randomized' applies to decoder-only runs; a classifier reads "
                "contiguous positions"
            )
    validate_optim(config.optim)
    if e.split not in ("validation", "test"):
        raise ValueError(f"eval.split must be one of ['validation', 'test'], got {e.split!r}")
    lengths = eval_lengths(config)
    if not lengths or any(not isinstance(n, int) or n < 4 for n in lengths):
        raise ValueError(f"eval.lengths must be integers >= 4, got {list(lengths)}")
    if e.batch_tokens is not None:
        require_int("eval.batch_tokens", e.batch_tokens)


@register
class Classification(RunKind):
    """Sequence classification and regression (GLUE's tasks) with a bidirectional encoder and a
    pooled head, fine-tuned from a masked-LM run or an imported BERT."""

    name = "classification"
    summary = "classification and regression of labelled rows, GLUE's metrics by example length"
    chosen_by = "model.assembly='classifier' (configs/classify.py)"
    precedence = 10
    objective = "classification"
    own_parts = OWN_PARTS
    init_from_hint = " (a classifier takes them with train.inherit_model=True)"

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        return is_classifier(config)

    def prepare(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
        return inherit_model(config)

    def training_data(self, config: ml_collections.ConfigDict, mesh: Any) -> TrainingData:
        source, classes = open_data(config)
        return TrainingData(train_batches(config, source, classes), data_record(source, classes))

    def loss(
        self,
        config: ml_collections.ConfigDict,
        model: Any,
        batch: dict[str, Any],
        rng: Any,
        memory: Any = None,
    ) -> StepLoss:
        """The mean loss over the batch's examples; the tokens read are the rows' real ones."""
        mean, loss_sum = batch_loss(model, batch, rng, regression(config))
        scored = jnp.asarray(batch["labels"].shape[0], jnp.float32)
        return StepLoss(mean, loss_sum, batch["mask"].sum(), scored)

    # -- evaluation: what is scored, eval.json, CLI verbs and summaries

    def open_evaluation(
        self, context: EvalContext
    ) -> tuple[LabelledSource, tuple[str, ...] | None]:
        """The labelled source and its classes, checked against ``model.num_labels``."""
        return open_data(context.config)

    def evaluate(self, context: EvalContext) -> dict[str, Any]:
        """The split's metrics at the training length and per length bucket
        (:func:`evaluate_classifier`)."""
        config = context.config
        source, classes = context.inputs
        fields = evaluate_classifier(
            context.model_on(None),
            config,
            source,
            classes,
            eval_lengths(config),
            split=config.eval.split,
        )
        return {"data": {"source": config.data.source, **short_info(source.info())}, **fields}

    def describe_evaluation(self, config: ml_collections.ConfigDict) -> str:
        lengths = ", ".join(str(x) for x in eval_lengths(config))
        return f"the {config.eval.split} split, length buckets up to {lengths} tokens"

    def announce_evaluation(self, config: ml_collections.ConfigDict, workdir: str) -> str:
        return f"evaluating {workdir} on {self.describe_evaluation(config)}"

    def eval_summary(self, report: dict[str, Any], workdir: str, command: str) -> str | None:
        """One line per bucket: its headline metric and examples."""
        metric = report["metric"]
        overall = report["overall"]
        lines = [
            f"{metric} {overall[metric]:.4f} over {overall['examples']} examples at the training "
            f"length ({overall['truncated']} truncated)"
        ]
        for row in report["results"]:
            value = f"{row[metric]:.4f}" if metric in row else "—"
            lines.append(
                f"  {row['label']:>8} (<= {row['length']} tokens): {metric} {value} over "
                f"{row['examples']} examples"
            )
        return "\n".join(lines)

    # -- config, plan and analysis

    def validate(
        self,
        config: ml_collections.ConfigDict,
        *,
        num_devices: int | None = None,
        process_count: int = 1,
    ) -> None:
        """The objective, the head, a bidirectional model without memory, the vocabulary,
        the encoder, training and evaluation fields (:func:`validate_classifier`), then the
        batch split."""
        validate_classifier(config)
        validate_batch_split(config.train.batch_size, num_devices, process_count)

    def plan_refusal(self, config: ml_collections.ConfigDict, parts: tuple[str, ...]) -> str | None:
        """``--only eval`` is refused: the evaluation scores the split's rows by length bucket
        on one device and is not planned; the training step is."""
        if tuple(parts) == ("eval",):
            return (
                "posenc plan --only eval: a classification run's evaluation is not planned; "
                "plan its training step"
            )
        return None

    def analysis_refusal(self, config: ml_collections.ConfigDict) -> str | None:
        return (
            "is a classifier (model.assembly='classifier'); analyze reads the self-attention "
            "of language-model runs over text windows"
        )

    # -- report

    report_writer = "posenc.report.classify:write_classify_report"
    report_precedence = 20
    report_runs = "classification"
    report_metrics = tuple(
        dict.fromkeys(
            (*classify_metrics.CLASSIFICATION_METRICS, *classify_metrics.REGRESSION_METRICS)
        )
    )
