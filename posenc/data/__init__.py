"""Data for posenc: sources addressed by spec strings, a byte tokenizer, and batching.

Typical use::

    source = posenc.data.get_source("pystdlib")           # or "textdir:<path>", "tfds:pg19"
    train = TrainWindows(source.split_stream("train"), seq_len=512, global_batch=32, seed=0)
    batch = train.batch(step)                             # {"inputs", "targets"} int32
    windows = eval_windows(source.split_stream("validation"), length=2048)
    for b in windows.iter_batches(8): ...                 # {"inputs", "targets", "mask"}
    MaskedLM(seed=0).train_batch(batch["inputs"], step)   # BERT's masked LM: + "weights"

Nothing downloads at run time; `prepare(spec)` is the explicit preparation step.
"""

from posenc.data.base import DataNotFoundError, Source, default_data_dir
from posenc.data.batching import (
    EvalWindows,
    MemorySegments,
    StreamSegments,
    TrainWindows,
    eval_windows,
    memory_segments,
)
from posenc.data.masking import MASK_ID, OBJECTIVES, MaskedLM
from posenc.data.positions import MODES as POSITION_MODES
from posenc.data.positions import batch_positions, random_positions
from posenc.data.sources import SPEC_FORMS, get_source, prepare
from posenc.data.tokenizer import SEP_ID, SEP_TEXT, VOCAB_SIZE, ByteTokenizer

__all__ = [
    "MASK_ID",
    "OBJECTIVES",
    "SEP_ID",
    "SEP_TEXT",
    "SPEC_FORMS",
    "VOCAB_SIZE",
    "ByteTokenizer",
    "DataNotFoundError",
    "EvalWindows",
    "MaskedLM",
    "POSITION_MODES",
    "Source",
    "MemorySegments",
    "StreamSegments",
    "TrainWindows",
    "batch_positions",
    "default_data_dir",
    "eval_windows",
    "memory_segments",
    "get_source",
    "prepare",
    "random_positions",
]

# Translation (sequence-to-sequence) data: parallel sources, vocabularies, pair batches.
from posenc.data.pair_batching import (  # noqa: E402
    EncodedPairs,
    PairBatches,
    bucket_boundaries,
    encode_pairs,
    eval_pair_batches,
)
from posenc.data.parallel import (  # noqa: E402
    PARALLEL_SPEC_FORMS,
    ParallelSource,
    get_parallel_source,
    prepare_parallel,
)
from posenc.data.vocab import (  # noqa: E402
    ByteVocab,
    SentencePieceVocab,
    Vocab,
    make_vocab,
    train_sentencepiece,
)

__all__ += [
    "PARALLEL_SPEC_FORMS",
    "ByteVocab",
    "EncodedPairs",
    "PairBatches",
    "ParallelSource",
    "SentencePieceVocab",
    "Vocab",
    "bucket_boundaries",
    "encode_pairs",
    "eval_pair_batches",
    "get_parallel_source",
    "make_vocab",
    "prepare_parallel",
    "train_sentencepiece",
]
