"""Translation runs: an encoder-decoder trained on parallel text, decoded with beam search, scored
with sacreBLEU, and train short / test long by source length.

A config is a translation run when ``model.assembly = "encoder_decoder"`` (``configs/
translation.py``); its ``data.source`` is a parallel source (:mod:`posenc.data.parallel`) and its
vocabulary ``data.vocab`` (bytes, or SentencePiece trained once on the training pairs).

- Training (:func:`posenc.runs.train.train`) reads token-bucketed batches
  (:class:`posenc.data.pair_batching.PairBatches`, deterministic per (seed, step)) of the pairs
  whose source has at most ``data.max_src_len`` tokens, with label smoothing
  ``train.label_smoothing`` (0.1, as the papers).
- Decoding (:func:`translate_ids`): beam search (``eval.beam_size``, GNMT's ``eval.alpha``;
  4 and 0.6 as Vaswani et al. and Shaw et al.) through the decoder's key/value caches and
  cross-attention caches computed once per source; beam size 1 is greedy. A source of ``n``
  tokens gets at most ``n + eval.max_len_offset`` output tokens (Vaswani et al.: 50).
- Evaluation (:func:`evaluate_translation`): the split's teacher-forced loss, then every source
  decoded; sacreBLEU BLEU (13a, and the ``intl`` tokenisation comparable with the papers'
  tokenised BLEU) and chrF overall and per source-length bucket (within the training length,
  1x-2x, 2x-4x, ...: where extrapolation breaks), with the output/reference length ratio
  (truncated or runaway outputs).
- ``posenc translate`` (:data:`TRANSLATE`, the verb this kind adds to the command line): a
  trained run's translations of the lines of a file (:func:`translate_workdir`).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from posenc.data.pair_batching import EncodedPairs, PairBatches, encode_pairs, eval_pair_batches
from posenc.data.parallel import ParallelSource, get_parallel_source, split_lines
from posenc.data.vocab import (
    HF_PREFIX,
    ByteVocab,
    HFVocab,
    SentencePieceVocab,
    Vocab,
    make_vocab,
)
from posenc.decoding.beam import beam_search
from posenc.decoding.greedy import greedy_search
from posenc.devices import sharding
from posenc.kinds import translation_metrics
from posenc.kinds.base import Command, EvalContext, RunKind, StepLoss, TrainingData
from posenc.kinds.common import EVAL_SPLITS, require_choice, require_int, validate_optim
from posenc.kinds.registry import register
from posenc.models.build import assembly, layer_kinds, make_encoding, model_config
from posenc.models.encdec import EncoderDecoder, bind_sides
from posenc.models.restore import restore_model
from posenc.workdir import PRETRAINED_FILE, RunDir
from posenc.workdir.files import is_run_record


def is_translation(config: ml_collections.ConfigDict) -> bool:
    """Whether ``config`` describes a translation run (an encoder-decoder)."""
    return assembly(config) == "encoder_decoder"


def open_parallel(config: ml_collections.ConfigDict) -> ParallelSource:
    """The run's parallel source (``data.source``, ``data.src_lang``, ``data.tgt_lang``)."""
    d = config.data
    return get_parallel_source(
        d.source, d.data_dir, src_lang=d.get("src_lang"), tgt_lang=d.get("tgt_lang")
    )


def open_data(config: ml_collections.ConfigDict) -> tuple[ParallelSource, Vocab]:
    """The run's parallel source and vocabulary, checked against ``model.vocab_size``."""
    source = open_parallel(config)
    vocab = make_run_vocab(config, source)
    check_vocab(config, vocab)
    return source, vocab


def run_vocab(run: RunDir, config: ml_collections.ConfigDict) -> Vocab:
    """The vocabulary a trained run was trained with: its recorded SentencePiece model
    (``vocab.model``), a pretrained tokenizer (``data.vocab="hf:<folder>"``, an imported T5),
    or bytes; checked against ``data.json``'s record."""
    model = run.read_vocab()
    if config.data.vocab.startswith(HF_PREFIX):
        vocab = make_vocab(config.data.vocab)
    elif model is not None:
        vocab = SentencePieceVocab(model)
    else:
        vocab = ByteVocab()
    recorded = (run.read_data() or {}).get("vocab")
    if recorded is not None and recorded != vocab.identity():
        raise ValueError(
            f"{run.path}: the vocabulary on disk ({vocab.identity().get('kind')}) is not the one "
            f"the run was trained with ({recorded.get('kind')}); its vocab.model was changed"
        )
    check_vocab(config, vocab, imported=os.path.exists(run.file(PRETRAINED_FILE)))
    return vocab


def data_record(source: ParallelSource, vocab: Vocab) -> dict[str, Any]:
    """What ``data.json`` keeps about a translation run's data: the source's identity and the
    vocabulary's."""
    return {**source.info(), "vocab": vocab.identity()}


def make_run_vocab(config: ml_collections.ConfigDict, source: ParallelSource) -> Vocab:
    """The vocabulary ``data.vocab`` names, SentencePiece trained on (or read from the cache
    of) the training pairs."""
    d = config.data
    pairs = source.pairs("train") if d.vocab == "sentencepiece" else ()
    return make_vocab(
        d.vocab,
        pairs,
        vocab_size=d.vocab_size,
        model_type=d.spm_model_type,
        data_dir=d.data_dir,
    )


def check_vocab(config: ml_collections.ConfigDict, vocab: Vocab, *, imported: bool = False) -> None:
    """``model.vocab_size`` must equal the vocabulary's size (one line naming both); a
    pretrained model's table may be larger than its tokenizer (T5: 32128 rows, 32100 ids).
    ``imported``: the run holds a model ``posenc import-hf`` wrote, whose table its weights
    fix, so the advice is to import it with its tokenizer, not to change the size."""
    size = config.model.vocab_size
    if size != vocab.vocab_size and not (isinstance(vocab, HFVocab) and size > vocab.vocab_size):
        remedy = (
            "an imported model's table is fixed by its weights: import it again with its "
            "tokenizer.json (posenc import-hf without --no-tokenizer)"
            if imported
            else f"set model.vocab_size={vocab.vocab_size}"
        )
        raise ValueError(
            f"model.vocab_size={config.model.vocab_size} does not match data.vocab="
            f"{config.data.vocab!r}, which has {vocab.vocab_size} ids; {remedy}"
        )


def train_batches(
    config: ml_collections.ConfigDict, train: EncodedPairs, row_multiple: int
) -> PairBatches:
    """The run's training batches (token-bucketed, deterministic per (seed, step))."""
    t = config.train
    return PairBatches(
        train,
        t.tokens_per_batch,
        config.seed,
        row_multiple=row_multiple,
        max_src_len=config.data.get("max_src_len"),
        max_tgt_len=config.data.get("max_tgt_len"),
        bucket_step=config.data.get("bucket_step", 1.1),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )


# --- decoding -----------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7, 8, 9))
def _decode(graphdef, state, src, src_mask, limits, beam, alpha, max_len, bos, eos):
    """``[B, S]`` sources -> ``[B, max_len]`` best outputs and their scores ``[B]``."""
    model: EncoderDecoder = nnx.merge(graphdef, state)
    b = src.shape[0]
    encoded, mask = model.encode(src, src_mask)
    # Each source's encoder output once, its beams reading it through the same rows.
    cross = model.cross_caches(jnp.repeat(encoded, beam, 0), jnp.repeat(mask, beam, 0))
    slots = max_len + 1
    positions = jnp.arange(slots, dtype=jnp.int32)[None]
    tokens = jnp.zeros((b, slots), jnp.int32).at[:, 0].set(bos)

    def step(tokens, slot, caches):
        logits, caches = model.decode(tokens, slot, positions, caches, cross)
        return logits[:, 0], caches

    caches = model.empty_caches(b * beam, slots)
    if beam == 1:
        out = greedy_search(step, caches, tokens, start=0, max_len=max_len, eos_id=eos)
        ended = jnp.arange(max_len)[None, :] >= limits[:, None]
        return jnp.where(ended, eos, out), jnp.zeros((b,), jnp.float32)
    seqs, scores = beam_search(
        step,
        caches,
        tokens,
        start=0,
        beam_size=beam,
        alpha=alpha,
        max_len=max_len,
        eos_id=eos,
        limits=limits,
    )
    return seqs[:, 0], scores[:, 0]


def decoder_length_limit(model: EncoderDecoder, wanted: int) -> int:
    """The most output tokens, at most ``wanted``, whose positions the decoder's encoder can
    embed: ``wanted`` for every encoder without a position table, else the table's rows."""
    return _length_limit(model.decoder.encoding, wanted)


def _length_limit(encoding: Any, wanted: int) -> int:
    """The longest length, at most ``wanted``, that ``encoding`` can embed (found through its
    ``check_length``, the encoders' one statement of what they can read)."""
    try:
        encoding.check_length(wanted)
        return wanted
    except ValueError:
        pass
    lo, hi = 0, wanted  # check_length(lo) passes (lo = 0: nothing to embed), (hi) fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            encoding.check_length(mid)
            lo = mid
        except ValueError:
            hi = mid
    return lo


def decode_batch(
    model: EncoderDecoder,
    batch: dict[str, np.ndarray],
    vocab: Vocab,
    *,
    beam_size: int,
    alpha: float,
    max_len_offset: int,
) -> np.ndarray:
    """The best output ids ``[B, S + offset]`` (EOS after the end) of one padded batch of
    sources (``src``, ``src_mask``): each row stops by ``its source length + offset`` tokens,
    and by the decoder's position table where it has one (fewer columns then:
    :func:`decoder_length_limit`)."""
    if not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1:
        raise ValueError(f"eval.beam_size must be a positive integer, got {beam_size!r}")
    if not isinstance(max_len_offset, int) or max_len_offset < 1:
        raise ValueError(f"eval.max_len_offset must be a positive integer, got {max_len_offset!r}")
    graphdef, state = nnx.split(model)
    src_len = batch["src_mask"].sum(axis=1) - 1  # tokens without the source's EOS
    # Output token t is read back at decoder position t - 1: a decoder with a finite position
    # table (learned) stops at its last row rather than reading NaN rows past it.
    cap = decoder_length_limit(model, batch["src"].shape[1] + max_len_offset)
    limits = jnp.asarray(np.minimum(src_len + max_len_offset, cap), jnp.int32)
    max_len = cap
    out, _ = _decode(
        graphdef,
        state,
        jnp.asarray(batch["src"]),
        jnp.asarray(batch["src_mask"]),
        limits,
        beam_size,
        float(alpha),
        max_len,
        vocab.bos_id,
        vocab.eos_id,
    )
    return np.asarray(out)


def check_sources(model: EncoderDecoder, pairs: EncodedPairs) -> None:
    """Refuses sources the encoder cannot read (past a learned position table) before any is
    decoded: batches go shortest first, so the refusal would otherwise come after the rest.

    Raises:
      ValueError: naming the first such sentence, its length and how many there are.
    """
    if not len(pairs):
        return
    lengths = np.asarray(pairs.src_lengths) + 1  # the encoder reads each source with its EOS
    encoding = model.encoder.encoding
    try:
        encoding.check_length(int(lengths.max()))
    except ValueError as e:
        limit = _length_limit(encoding, int(lengths.max()))
        long = np.flatnonzero(lengths > limit)
        i = int(long[0])
        raise ValueError(
            f"sentence {i + 1} of {len(lengths)} has {int(lengths[i])} source tokens (with its "
            f"EOS), {len(long)} in all longer than {limit}: {e}"
        ) from None


def translate_ids(
    model: EncoderDecoder,
    pairs: EncodedPairs,
    vocab: Vocab,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_offset: int = 50,
    tokens_per_batch: int = 4096,
    bucket_step: float = 1.1,
    progress: bool = False,
) -> list[str]:
    """Detokenised translations of every source of ``pairs``, in their order.

    Sources are sorted into bucketed shapes (one compilation per shape; ``bucket_step``: the
    growth factor of their padded lengths) and the outputs put back in order. ``progress``: a
    bar on stderr counting the sentences decoded (a split takes minutes).
    """
    from tqdm.auto import tqdm

    check_sources(model, pairs)
    out: list[str | None] = [None] * len(pairs)
    batches = eval_pair_batches(pairs, tokens_per_batch, targets=False, bucket_step=bucket_step)
    bar = tqdm(total=len(pairs), desc="decoding", unit=" sentences", disable=not progress)
    try:
        for batch in batches:
            ids = decode_batch(
                model,
                batch,
                vocab,
                beam_size=beam_size,
                alpha=alpha,
                max_len_offset=max_len_offset,
            )
            for row, index in enumerate(batch["index"]):
                if index >= 0:
                    out[int(index)] = vocab.decode(ids[row])
            bar.update(int((batch["index"] >= 0).sum()))
    finally:
        bar.close()
    return [text or "" for text in out]


# --- evaluation ---------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(0,))
def _scores(graphdef, state, batch):
    """Summed teacher-forced loss, target tokens and correct arg maxes of one batch."""
    model: EncoderDecoder = nnx.merge(graphdef, state)
    hidden = model.hidden_states(batch["src"], batch["tgt_in"], src_mask=batch["src_mask"])
    weights = batch["tgt_mask"].astype(jnp.float32)
    scored = model.token_losses(hidden, batch["tgt_out"], correct=True)
    losses = scored.loss
    correct = scored.correct * weights
    return (losses * weights).sum(), weights.sum(), correct.sum()


def teacher_forced(
    model: EncoderDecoder, pairs: EncodedPairs, tokens_per_batch: int, bucket_step: float = 1.1
) -> dict[str, Any]:
    """The split's per-token cross entropy (targets and EOS), its ``exp`` and arg max accuracy,
    exact sums in float64 (batches bucketed by length with ``bucket_step``, as
    :func:`translate_ids`)."""
    graphdef, state = nnx.split(model)
    loss = count = correct = 0.0
    keys = ("src", "src_mask", "tgt_in", "tgt_out", "tgt_mask")
    for batch in eval_pair_batches(pairs, tokens_per_batch, targets=True, bucket_step=bucket_step):
        sums = _scores(graphdef, state, {k: jnp.asarray(batch[k]) for k in keys})
        loss, count, correct = (
            a + float(x) for a, x in zip((loss, count, correct), sums, strict=True)
        )
    mean = loss / max(count, 1.0)
    return {
        "tokens": int(count),
        "loss": mean,
        "perplexity": math.exp(mean) if mean < 700 else math.inf,
        "accuracy": correct / max(count, 1.0),
    }


def evaluate_translation(
    model: EncoderDecoder,
    config: ml_collections.ConfigDict,
    source: ParallelSource,
    vocab: Vocab,
    *,
    split: str,
    train_max_src_len: int | None = None,
    progress: bool | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Scores a translation model on ``split``: teacher-forced loss, then BLEU and chrF of its
    beam-search outputs overall and per source-length bucket.

    Args:
      model: the encoder-decoder.
      config: the run config (``eval.beam_size``, ``eval.alpha``, ``eval.max_len_offset``,
        ``eval.tokens_per_batch``, ``eval.bucket_step``, ``eval.max_sentences``).
      source: the parallel source.
      vocab: the run's vocabulary.
      split: "validation" or "test".
      train_max_src_len: the longest training source in tokens (bucket 1's bound); None: the
        longest source of the split.
      progress: a bar on stderr counting the sentences decoded; None: ``train.progress`` (on
        the main process).

    Returns:
      The report's fields and the hypotheses in the split's order. Fields: ``results`` (one
      entry per source-length bucket: ``length`` its upper bound in tokens, ``lo``, ``label``
      ("<=1x", "1x-2x", ...), ``sentences``, ``bleu``, ``bleu_intl``, ``chrf``,
      ``length_ratio``, ...), ``overall`` (the same over the split, with sacreBLEU's
      signatures), ``teacher_forced`` (loss, perplexity, accuracy, tokens), ``decoding``,
      ``split``, ``sentences``, ``train_max_src_len``, ``seconds``.
    """
    e = config.eval
    pairs = source.pairs(split)
    limit = e.get("max_sentences", 0)
    if limit:
        pairs = pairs[:limit]
    if not pairs:
        raise ValueError(f"eval.split={split!r} of data.source={config.data.source!r} is empty")
    encoded = encode_pairs(pairs, vocab)
    start = time.perf_counter()
    step = eval_bucket_step(config)
    scored = teacher_forced(model, encoded, e.tokens_per_batch, step)
    hypotheses = translate_ids(
        model,
        encoded,
        vocab,
        beam_size=e.beam_size,
        alpha=e.alpha,
        max_len_offset=e.max_len_offset,
        tokens_per_batch=e.tokens_per_batch,
        bucket_step=step,
        progress=(
            config.train.get("progress", True) and jax.process_index() == 0
            if progress is None
            else progress
        ),
    )
    references = [tgt for _, tgt in pairs]
    bound = train_max_src_len or int(encoded.src_lengths.max())
    table = translation_metrics.length_bucket_table(
        encoded.src_lengths, hypotheses, references, bound, source.tgt_lang
    )
    fields = {
        "split": split,
        "sentences": len(pairs),
        "train_max_src_len": bound,
        "decoding": {
            "beam_size": e.beam_size,
            "alpha": e.alpha,
            "max_len_offset": e.max_len_offset,
        },
        "teacher_forced": scored,
        "overall": table["overall"],
        "results": [{**row, "length": row["hi"]} for row in table["buckets"]],
        "seconds": time.perf_counter() - start,
    }
    return fields, hypotheses


def eval_bucket_step(config: ml_collections.ConfigDict) -> float:
    """``eval.bucket_step``: the growth factor of the padded source lengths of evaluation and
    decoding batches (runs recorded before the field existed used 1.1)."""
    return config.eval.get("bucket_step", 1.1)


def longest_training_source(config: ml_collections.ConfigDict, train: EncodedPairs) -> int:
    """The longest source (tokens) among the training pairs the run keeps."""
    lengths = train.src_lengths
    cap = config.data.get("max_src_len")
    kept = lengths if cap is None else lengths[lengths <= cap]
    return int(kept.max())


def read_source_file(path: str | None) -> list[str]:
    """The sentences to translate: the lines of ``path`` (None or "-": standard input), split at
    "\\n" only as the parallel data is (:func:`posenc.data.parallel.split_lines`), so output line
    ``i`` translates input line ``i`` whatever the lines hold (U+2028, U+0085, a lone "\\r").

    Raises:
      ValueError: ``path`` is missing, a folder, or not UTF-8 text (one line naming it).
    """
    if path is None or path == "-":
        stream = sys.stdin
        data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read().encode()
        return split_lines(data, "standard input")
    if os.path.isdir(path):
        raise ValueError(f"--input {path} is a folder; give a text file, one sentence per line")
    if not os.path.exists(path):
        raise ValueError(f"--input {path} does not exist; give a text file, one sentence per line")
    with open(path, "rb") as f:
        return split_lines(f.read(), path)


def check_output_file(path: str, workdir: str) -> None:
    """Refuses, before any decoding, an ``--output`` that could not be written or would write
    over one of the run's own files (``posenc eval --output`` refuses those too).

    Raises:
      ValueError: ``path`` is a folder, its folder is missing or not writable, or it is (a file
        in) one of the run's own files; one line naming it.
    """
    full = os.path.realpath(path)  # a "..", or a link into the run, names the file it reaches
    folder = os.path.dirname(full)
    run = os.path.realpath(workdir)
    relative = os.path.relpath(full, run)
    if not relative.startswith(os.pardir) and relative != os.curdir and is_run_record(relative):
        raise ValueError(
            f"--output {path} is the run's own {relative.split(os.sep)[0]}: posenc keeps the "
            "run's records there; write the translations to another file"
        )
    if os.path.isdir(full):
        raise ValueError(f"--output {path} is a folder; give a file name (in {path}, say)")
    if not os.path.isdir(folder):
        raise ValueError(
            f"--output {path}: its folder {folder} does not exist; create it first "
            f"(mkdir -p {folder})"
        )
    if not os.access(full if os.path.exists(full) else folder, os.W_OK):
        raise ValueError(
            f"--output {path} cannot be written (no write permission); choose another file"
        )


def read_lines(lines: Sequence[str], vocab: Vocab) -> EncodedPairs:
    """Sources to translate (one per line, no references) as :class:`EncodedPairs`."""
    return encode_pairs([(line.rstrip("\n"), "") for line in lines], vocab)


def translate_workdir(
    workdir: str,
    lines: Sequence[str],
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    max_len_offset: int | None = None,
    progress: bool = False,
) -> list[str]:
    """Translations of ``lines`` (one source sentence each) by a trained translation run's
    newest intact checkpoint; decoding settings default to the run's ``eval`` section;
    ``progress``: a bar on stderr counting the sentences decoded."""
    if alpha is not None and not 0 <= alpha < math.inf:
        raise ValueError(f"--alpha must be a finite number >= 0, got {alpha!r}")
    run = RunDir(workdir)
    config = run.read_config()
    if not is_translation(config):
        raise ValueError(
            f"{workdir} is not a translation run (model.assembly={assembly(config)!r}); "
            "posenc translate needs model.assembly='encoder_decoder'"
        )
    e = config.eval
    vocab = run_vocab(run, config)
    with run.lock():
        model, _ = restore_model(run, config)
    return translate_ids(
        model,
        read_lines(lines, vocab),
        vocab,
        beam_size=e.beam_size if beam_size is None else beam_size,
        alpha=e.alpha if alpha is None else alpha,
        max_len_offset=e.max_len_offset if max_len_offset is None else max_len_offset,
        tokens_per_batch=e.tokens_per_batch,
        bucket_step=eval_bucket_step(config),
        progress=progress,
    )


# --- posenc translate ---------------------------------------------------------------------------


def _count(text: str) -> int:
    """An argument that is an integer >= 1 (``--beam``, ``--offset``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _translate_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``posenc translate``."""
    p.add_argument("--workdir", required=True, help="a trained translation run directory")
    p.add_argument("--input", default=None, help="a text file, one source sentence per line")
    p.add_argument("--output", default=None, help="file to write (default: standard output)")
    p.add_argument("--beam", type=_count, default=None, help="beam size (1: greedy)")
    p.add_argument("--alpha", type=float, default=None, help="GNMT length penalty exponent")
    p.add_argument(
        "--offset", type=_count, default=None, help="outputs stop at source length + this"
    )


def _translate_command(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    """``posenc translate``: one detokenised line per input line, to ``--output`` or standard
    output."""
    # Both files are checked before the model decodes anything (minutes for a large input).
    if args.output:
        check_output_file(args.output, args.workdir)
    lines = read_source_file(args.input)
    outputs = translate_workdir(
        args.workdir,
        lines,
        beam_size=args.beam,
        alpha=args.alpha,
        max_len_offset=args.offset,
        progress=True,
    )
    # One line per input line: a newline decoded inside an output becomes a space.
    text = "".join(line.replace("\n", " ") + "\n" for line in outputs)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


TRANSLATE = Command(
    name="translate",
    help="translate sentences with a trained translation run (beam search)",
    description="Translate one sentence per line of --input (default: standard input) with "
    "the newest intact checkpoint of a translation run (model.assembly=encoder_decoder), "
    "writing one detokenised line per input line, in order, to --output (default: standard "
    "output). Defaults: the run's eval.beam_size, eval.alpha and eval.max_len_offset.",
    add_arguments=_translate_arguments,
    run=_translate_command,
    writes="its lock file in the work directory",
)


def _pair_fields(s: int, t: int) -> list[tuple[str, int, Any]]:
    """The fields of a translation batch with sources of ``s`` and targets of ``t`` tokens."""
    return [
        ("src", s, jnp.int32),
        ("src_mask", s, jnp.bool_),
        ("tgt_in", t, jnp.int32),
        ("tgt_out", t, jnp.int32),
        ("tgt_mask", t, jnp.bool_),
    ]


def validate_translation(config: ml_collections.ConfigDict) -> None:
    """Checks a translation run's config (``model.assembly="encoder_decoder"``,
    ``configs/translation.py``): the encoder in both directions, the parallel data, token
    batches, label smoothing and decoding; one line naming the first bad field."""
    from posenc.data.pair_batching import TOKENS_FIELD
    from posenc.data.vocab import HF_PREFIX, MODEL_TYPES, VOCAB_KINDS

    bind_sides(model_config(config), make_encoding(config))
    layer_kinds(config)  # a layer pattern is refused for an encoder-decoder, naming the field
    m, d, t, e = config.model, config.data, config.train, config.eval
    if m.get("mem_len", 0):
        raise ValueError("model.mem_len must be 0 for model.assembly='encoder_decoder'")
    for field, value in (("train.positions", t.positions), ("eval.positions", e.positions)):
        if value == "randomized":
            raise ValueError(
                f"{field}='randomized' applies to decoder-only runs; a translation run reads "
                "contiguous positions"
            )
    vocab = d.get("vocab")
    if not (isinstance(vocab, str) and vocab.startswith(HF_PREFIX) and vocab[len(HF_PREFIX) :]):
        require_choice("data.vocab", vocab, VOCAB_KINDS)
    require_choice("data.spm_model_type", d.get("spm_model_type"), MODEL_TYPES)
    require_int("data.vocab_size", d.get("vocab_size"))
    for field in ("max_src_len", "max_tgt_len"):
        if d.get(field) is not None:
            require_int(f"data.{field}", d.get(field))
    for field, step in (
        ("data.bucket_step", d.get("bucket_step", 1.1)),
        ("eval.bucket_step", e.get("bucket_step", 1.1)),
    ):
        if not isinstance(step, int | float) or isinstance(step, bool) or not 1 < step <= 4:
            raise ValueError(f"{field} must be a number in (1, 4], got {step!r}")
    for field in ("steps", "log_every", "checkpoint_every", "keep_checkpoints"):
        require_int(f"train.{field}", t[field], 0 if field == "steps" else 1)
    require_int(TOKENS_FIELD, t.get("tokens_per_batch"))
    smoothing = t.get("label_smoothing", 0.0)
    if not isinstance(smoothing, int | float) or not 0 <= smoothing < 1:
        raise ValueError(f"train.label_smoothing must be in [0, 1), got {smoothing!r}")
    validate_optim(config.optim)
    require_choice("eval.split", e.split, EVAL_SPLITS)
    require_int("eval.beam_size", e.get("beam_size"))
    alpha = e.get("alpha")
    # Finite: an infinite length penalty gives NaN scores, and eval.json records it.
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not 0 <= alpha < math.inf:
        raise ValueError(f"eval.alpha must be a finite number >= 0, got {alpha!r}")
    require_int("eval.max_len_offset", e.get("max_len_offset"))
    require_int("eval.tokens_per_batch", e.get("tokens_per_batch"))
    require_int("eval.max_sentences", e.get("max_sentences", 0), 0)


@register
class Translation(RunKind):
    """Translation with an encoder-decoder: token-bucketed pairs, a label-smoothed loss, beam
    search and sacreBLEU by source length."""

    name = "translation"
    summary = "translation with an encoder-decoder, BLEU and chrF by source length"
    chosen_by = "model.assembly='encoder_decoder' (configs/translation.py)"
    precedence = 10
    objective = "translation"

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        return is_translation(config)

    def training_data(self, config: ml_collections.ConfigDict, mesh: Any) -> TrainingData:
        source, vocab = open_data(config)
        pairs = encode_pairs(source.pairs("train"), vocab)
        return TrainingData(
            train_batches(config, pairs, sharding.batch_shards(mesh)),
            data_record(source, vocab),
            getattr(vocab, "model_bytes", lambda: None)(),
        )

    def local_batch(
        self, config: ml_collections.ConfigDict, batches: Any, step: int
    ) -> dict[str, np.ndarray]:
        # Where each row's pair came from stays on the host.
        return {k: v for k, v in batches.batch(step).items() if k != "index"}

    def step_batch(
        self, config: ml_collections.ConfigDict, batches: Any
    ) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The longest of the bucketed shapes."""
        rows, s, t = max(batches.shapes, key=lambda shape: (max(shape[1:]), shape))
        return {k: ((rows, n), dtype) for k, n, dtype in _pair_fields(s, t)}

    def loss(
        self,
        config: ml_collections.ConfigDict,
        model: Any,
        batch: dict[str, Any],
        rng: Any,
        memory: Any = None,
    ) -> StepLoss:
        """The label-smoothed mean loss over the target tokens (``train.label_smoothing``), and
        the plain cross entropy's sum (what the metrics report); the tokens read are both
        sides'."""
        hidden = model.hidden_states(
            batch["src"], batch["tgt_in"], src_mask=batch["src_mask"], rng=rng
        )
        weights = batch["tgt_mask"].astype(jnp.float32)
        smoothing = config.train.get("label_smoothing", 0.0)
        scored = model.token_losses(hidden, batch["tgt_out"], smoothing=smoothing)
        smoothed = scored.smoothed
        loss_sum = (scored.loss * weights).sum()
        mean = (smoothed * weights).sum() / jnp.maximum(weights.sum(), 1.0)
        tokens = batch["src_mask"].sum() + batch["tgt_mask"].sum()
        scored = batch["tgt_mask"].sum().astype(jnp.float32)
        return StepLoss(mean, loss_sum, tokens, scored)

    def describe_step(
        self, config: ml_collections.ConfigDict, batch: dict[str, Any]
    ) -> tuple[str, str]:
        (rows, s), t = batch["src"].shape, batch["tgt_in"].shape[1]
        what = f"a training step on {rows} pairs of {s} source and {t} target tokens"
        return what, "lower train.tokens_per_batch or data.max_src_len"

    def record(self, config: ml_collections.ConfigDict) -> dict[str, Any]:
        return {**super().record(config), "max_src_len": config.data.get("max_src_len")}

    # -- evaluation: what is scored, eval.json, CLI verbs and summaries

    def open_evaluation(self, context: EvalContext) -> tuple[ParallelSource, Vocab]:
        """The parallel source and the vocabulary the run was trained with."""
        return open_parallel(context.config), run_vocab(context.run, context.config)

    def evaluate(self, context: EvalContext) -> dict[str, Any]:
        """The split's teacher-forced loss, its beam-search outputs (kept for
        :meth:`write_outputs`) and their BLEU and chrF overall and per source-length bucket
        (:func:`evaluate_translation`); ``train_seq_len`` is the longest training source."""
        config = context.config
        source, vocab = context.inputs
        model = context.model_on(None)
        pairs = source.pairs("train")
        if context.progress and context.is_main:
            # A subword tokenizer takes a minute over a large training split: say what it does.
            print(f"tokenizing the {len(pairs):,} training pairs (their longest source) ...")
        train_pairs = encode_pairs(pairs, vocab)
        fields, hypotheses = evaluate_translation(
            model,
            config,
            source,
            vocab,
            split=config.eval.split,
            train_max_src_len=longest_training_source(config, train_pairs),
        )
        context.outputs["hypotheses"] = hypotheses
        return {
            # Tables group translation runs by their training source length.
            "train_seq_len": fields["train_max_src_len"],
            "data": {"source": config.data.source, "split": config.eval.split, **source.info()},
            "vocab": vocab.identity(),
            **fields,
        }

    def write_outputs(self, context: EvalContext) -> dict[str, Any]:
        """The outputs, one line per source line, beside the report
        (:meth:`posenc.workdir.RunDir.write_hypotheses`)."""
        path = context.run.write_hypotheses(context.outputs["hypotheses"], context.name)
        return {"hypotheses": os.path.basename(path)}

    def describe_evaluation(self, config: ml_collections.ConfigDict) -> str:
        e = config.eval
        return f"the {e.split} split (beam {e.beam_size}, alpha {e.alpha}; BLEU, chrF)"

    def announce_evaluation(self, config: ml_collections.ConfigDict, workdir: str) -> str:
        return f"evaluating {workdir} on {self.describe_evaluation(config)}"

    def eval_summary(self, report: dict[str, Any], workdir: str, command: str) -> str | None:
        """``posenc eval``: BLEU, chrF and where the outputs are (``posenc train`` prints
        none)."""
        if command != "eval" or "hypotheses" not in report:
            return None
        overall = report["overall"]
        return (
            f"BLEU {overall['bleu']:.2f} (intl {overall['bleu_intl']:.2f}), chrF "
            f"{overall['chrf']:.2f} over {overall['sentences']} sentences; outputs in "
            f"{os.path.join(workdir, report['hypotheses'])}"
        )

    def commands(self) -> tuple[Command, ...]:
        return (TRANSLATE,)

    # -- config, plan and analysis

    def validate(
        self,
        config: ml_collections.ConfigDict,
        *,
        num_devices: int | None = None,
        process_count: int = 1,
    ) -> None:
        """The encoder in both directions, the parallel data, token batches, label smoothing
        and decoding; one line naming the first bad field. The batch split needs no check: rows
        per batch are a multiple of the devices (at least one each) by construction."""
        del num_devices, process_count
        validate_translation(config)

    def plan_refusal(self, config: ml_collections.ConfigDict, parts: tuple[str, ...]) -> str | None:
        """``--only eval`` is refused: beam search runs on one device and is not planned."""
        if tuple(parts) == ("eval",):
            return (
                "posenc plan --only eval: a translation run's evaluation (beam search on one "
                "device) is not planned; plan its training step"
            )
        return None

    def plan_step(
        self, config: ml_collections.ConfigDict, mesh: Any
    ) -> tuple[dict[str, tuple[tuple[int, ...], Any]], dict[str, int]]:
        """The longest bucket of the training pairs (read and encoded as training reads them):
        ``rows`` pairs of ``source`` source and ``length`` target tokens."""
        batch, _ = super().plan_step(config, mesh)
        (rows, source), length = batch["src"][0], batch["tgt_in"][0][1]
        return batch, {"rows": int(rows), "source": int(source), "length": int(length)}

    def analysis_refusal(self, config: ml_collections.ConfigDict) -> str | None:
        return (
            "is an encoder-decoder (model.assembly='encoder_decoder'); analyze reads the "
            "self-attention of decoder-only runs"
        )

    # -- report

    report_writer = "posenc.report.translation:write_translation_report"
    report_precedence = 10
    report_runs = "translation"
    report_metrics = ("bleu", "bleu_intl", "chrf", "length_ratio")
