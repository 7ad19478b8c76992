"""Config readings every kind shares: one-line field checks, the data source, the evaluation's
lengths and positions, the objective and its masking, Transformer-XL memory, the optimizer.

Kinds (:mod:`posenc.kinds`) and the run machinery (:mod:`posenc.runs`) both read a config through
these; nothing here knows a kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_collections

from posenc import data as data_lib
from posenc.data import summary
from posenc.data.base import resolve_data_dir

EVAL_MODES = ("nonoverlapping", "sliding")


EVAL_POSITIONS = ("as_trained", "contiguous", "randomized")


EVAL_SPLITS = ("validation", "test")


def open_source(config: ml_collections.ConfigDict) -> data_lib.Source:
    """The data source of ``config.data`` (``data.text_field`` applies to ``tfds:`` only)."""
    d = config.data
    text_field = d.text_field if d.source.startswith("tfds:") else None
    source = data_lib.get_source(d.source, data_dir=d.data_dir, text_field=text_field)
    tokenizer = d.get("tokenizer", "bytes")
    if tokenizer == "bytes":
        return source
    from posenc.data.hf_tokenizer import TokenizedSource, make_tokenizer

    return TokenizedSource(source, make_tokenizer(tokenizer), resolve_data_dir(d.data_dir))


def short_info(info: dict[str, Any]) -> dict[str, Any]:
    """The identifying parts of a source's info (hashes, counts), without long file lists (what
    an evaluation report records of its data)."""
    return {k: v for k, v in info.items() if not isinstance(v, list | dict) or len(v) <= 16}


def eval_lengths(config: ml_collections.ConfigDict) -> tuple[int, ...]:
    """``eval.lengths``, or ``eval.multiples`` times ``train.seq_len`` when that is empty."""
    if config.eval.lengths:
        return tuple(int(x) for x in config.eval.lengths)
    return tuple(int(m * config.train.seq_len) for m in config.eval.multiples)


def objective(config: ml_collections.ConfigDict) -> str:
    """``train.objective``: ``"causal_lm"`` or ``"masked_lm"``."""
    return config.train.get("objective", "causal_lm")


def masked_lm(config: ml_collections.ConfigDict) -> data_lib.MaskedLM | None:
    """The run's masked-LM corruption (a function of its seed), or None for causal LM.

    With posenc's bytes the mask token is id 257 and random replacements are bytes or the
    separator; with a pretrained tokenizer (``data.tokenizer="hf:..."``, an imported BERT or
    RoBERTa) the mask token is the tokenizer's own (``mask_token``) and replacements are uniform
    over its ids, as Hugging Face's masked-LM collator draws them."""
    if objective(config) != "masked_lm":
        return None
    tokenizer = config.data.get("tokenizer", "bytes")
    if tokenizer == "bytes":
        return data_lib.MaskedLM(config.seed)
    from posenc.data.hf_tokenizer import make_tokenizer

    hf = make_tokenizer(tokenizer)
    if hf.mask_id is None:
        raise ValueError(
            f"data.tokenizer={tokenizer!r} names no mask_token (tokenizer_config.json), which "
            "train.objective='masked_lm' replaces chosen tokens with; use a masked LM's tokenizer"
        )
    return data_lib.MaskedLM(config.seed, num_tokens=hf.vocab_size, mask_id=hf.mask_id)


def eval_positions(config: ml_collections.ConfigDict) -> str:
    """The positions evaluation windows get: ``"contiguous"`` or ``"randomized"``."""
    mode = config.eval.get("positions", "as_trained")
    return config.train.get("positions", "contiguous") if mode == "as_trained" else mode


def check_eval_lengths(stream_len: int, lengths: Sequence[int], split: str) -> None:
    """Raises a ``ValueError`` naming ``eval.lengths`` if a length cannot fill one window (or
    saying that the split is empty, when it holds no token to predict), and warns
    (:class:`posenc.data.summary.ThinSplitWarning`) if one fills fewer than a few."""
    if stream_len < 2:  # nothing, or one document separator: an empty file
        raise ValueError(
            f"the {split} split is empty ({stream_len} token{'s' * (stream_len != 1)}, nothing "
            f"to score at eval.lengths {list(lengths)}); give data.source a {split} split with "
            f"text (textdir: files in its {split}/ folder), or evaluate another eval.split"
        )
    too_long = [length for length in lengths if length + 1 > stream_len]
    if too_long:
        raise ValueError(
            f"eval.lengths {too_long} cannot be evaluated: a window of L tokens needs L + 1 "
            f"tokens and the {split} split has {stream_len}; use lengths <= {stream_len - 1} "
            "or a larger data set (data.source)"
        )
    summary.warn_thin(stream_len, lengths, split)


def require_int(field: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")


def require_choice(field: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ValueError(f"{field} must be one of {list(allowed)}, got {value!r}")


def eval_mem_len(config: ml_collections.ConfigDict) -> int:
    """The memory evaluation carries across windows: ``eval.mem_len``, or ``model.mem_len`` when
    that is None (0: evaluation without memory)."""
    value = config.eval.get("mem_len")
    return config.model.get("mem_len", 0) if value is None else value


TRAIN_ORDERS = ("auto", "random", "consecutive")


def consecutive_segments(config: ml_collections.ConfigDict) -> bool:
    """Whether training reads consecutive segments per batch row (``train.order``; ``auto``:
    with Transformer-XL memory) rather than random windows."""
    order = config.train.get("order", "auto")
    return order == "consecutive" or (order == "auto" and config.model.get("mem_len", 0) > 0)


def validate_batch_split(batch_size: int, num_devices: int | None, process_count: int) -> None:
    """``train.batch_size`` divides over the devices and the processes."""
    if num_devices is not None and batch_size % num_devices:
        raise ValueError(
            f"train.batch_size={batch_size} must be divisible by the number of devices "
            f"({num_devices}) its rows are split over (mesh.data x mesh.fsdp); use a multiple "
            f"of {num_devices}"
        )
    if batch_size % process_count:
        raise ValueError(
            f"train.batch_size={batch_size} must be divisible by the number of processes "
            f"({process_count})"
        )


def validate_optim(o: ml_collections.ConfigDict) -> None:
    """The ``optim`` section (AdamW, warmup, cosine decay, clipping)."""
    if not o.learning_rate > 0:
        raise ValueError(f"optim.learning_rate must be > 0, got {o.learning_rate!r}")
    require_int("optim.warmup_steps", o.warmup_steps, 0)
    for field in ("final_lr_ratio", "weight_decay", "grad_clip"):
        if getattr(o, field) < 0:
            raise ValueError(f"optim.{field} must be >= 0, got {getattr(o, field)!r}")
    for field in ("b1", "b2"):
        if not 0 <= getattr(o, field) < 1:
            raise ValueError(f"optim.{field} must be in [0, 1), got {getattr(o, field)!r}")


def check_source(
    config: ml_collections.ConfigDict, source: data_lib.Source, *, stream: bool = True
) -> None:
    """Checks a run config against its opened data source: the evaluation split can fill every
    ``eval.lengths`` window (``stream`` False: the kind generates its examples, no split to
    fill), and ``model.vocab_size`` covers the tokenizer's ids."""
    if stream:
        check_eval_lengths(
            len(source.split_stream(config.eval.split)), eval_lengths(config), config.eval.split
        )
    vocab = source.info().get("vocab_size")
    if vocab is not None and config.model.vocab_size < vocab:
        raise ValueError(
            f"model.vocab_size={config.model.vocab_size} is smaller than the {vocab} token ids "
            f"of data.source={config.data.source!r}'s tokenizer; use model.vocab_size >= {vocab}"
        )


def validate_layers(config: ml_collections.ConfigDict, model: Any, seq_len: int) -> None:
    """The ``layers`` section and the attention options (:mod:`posenc.layers.pattern`): known
    kinds and fields, each kind's encoder bound to the model's shape and mask, each layer's
    encoder and options on ``model.attention_impl`` (sinks and soft-capping need a path that
    forms the softmax, linear attention takes no option), and no window larger than the training
    length ``seq_len`` (it would mask nothing the model trains on); one-line errors naming the
    field, before anything is built."""
    from posenc import encodings
    from posenc.attention.core import check_implementation
    from posenc.models.build import layer_kinds, make_encoding

    kinds = layer_kinds(config, model)
    model_encoding = make_encoding(config).bind(model.dims)
    options = model.attention_options()
    if not options.default:
        check_implementation(model_encoding, model.attention_impl, options)
    named = [("model.window", options)]
    for kind in kinds:
        named.append((f"layers.kinds.{kind.name}.window", kind.options))
        encoding = model_encoding
        if kind.encoding is not None:
            with encodings.registry.fields_as_set(kind.encoding.name):
                encoding = kind.encoding.bind(model.dims)
                encoding.check_causal(model.causal)
        check_implementation(encoding, model.attention_impl, kind.options)
    for field, options in named:
        window = options.parsed_window
        if not window.full and window.size > seq_len:
            raise ValueError(
                f"{field}={options.window!r} is larger than train.seq_len={seq_len}: it would "
                f"mask nothing in training; use a size <= {seq_len} or 'full'"
            )
