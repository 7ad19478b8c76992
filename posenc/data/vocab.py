"""Vocabularies for sequence-to-sequence data: bytes, a SentencePiece model trained once, or a
pretrained model's own tokenizer (``data.vocab="hf:<folder>"``, an imported T5).

One small interface for both (`Vocab`): `vocab_size`, `pad_id`, `bos_id`, `eos_id`,
`encode(text) -> int32 ids` (no BOS or EOS added), `decode(ids) -> text` (stops at the first EOS,
skips PAD and BOS), and `identity()`, a JSON-able record for the run directory.

Special ids:

| vocabulary | text ids | EOS | BOS | PAD | UNK | vocab_size |
|---|---|---|---|---|---|---|
| `ByteVocab` | 0..255 (UTF-8 bytes, as `ByteTokenizer`) | 256 (`SEP_ID`) | 257 | 258 | — | 259 |
| `SentencePieceVocab` | 4.. | 1 | 2 | 0 | 3 | the model's |
| `HFVocab` | its own | `eos_token` | decoder start (below) | `pad_token` | `unk_token` | its own |

`HFVocab`'s "BOS" is what the decoder starts from: `decoder_start_token_id` of the folder's
`generation_config.json` when it names one, else the tokenizer's `bos_token`, else its
`pad_token` (T5 starts its decoder with its padding token).

The byte vocabulary's EOS is the language-model stream's document separator, so "end of text"
has one id in posenc. SentencePiece models are trained on the joint source + target training
text (one vocabulary for both sides, as Vaswani et al.), with byte fallback (no unknown
characters: every text round-trips, up to SentencePiece's NFKC normalisation and whitespace
folding), deterministically, and cached under `<data_dir>/posenc/spm/` keyed by the training
text's sha256, the vocabulary size and the model type.
"""

from __future__ import annotations

import abc
import hashlib
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.data import storage
from posenc.data.parallel import Pair, pairs_sha256
from posenc.data.tokenizer import SEP_ID
from posenc.workdir.files import atomic_write_bytes

# Config fields, named in errors.
VOCAB_FIELD = "data.vocab"
VOCAB_SIZE_FIELD = "data.vocab_size"
MODEL_TYPE_FIELD = "data.spm_model_type"
VOCAB_KINDS: tuple[str, ...] = ("bytes", "sentencepiece", "hf:<folder>")
HF_PREFIX = "hf:"
GENERATION_CONFIG = "generation_config.json"
MODEL_TYPES: tuple[str, ...] = ("unigram", "bpe")
# Sentences (source and target lines) a SentencePiece model is trained on at most; a larger
# training set is thinned to every k-th pair (deterministic, unlike SentencePiece's sampling).
MAX_TRAINING_SENTENCES = 2_000_000
# Smallest useful SentencePiece vocabulary: 4 special ids and 256 byte-fallback pieces.
MIN_SPM_VOCAB = 260


class Vocab(abc.ABC):
    """Text <-> ids for sequence-to-sequence models."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    @abc.abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """int32 ids `[n]` of `text`, without BOS or EOS."""

    @abc.abstractmethod
    def _decode_ids(self, ids: list[int]) -> str:
        """Text of ids that hold no EOS, BOS or PAD."""

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`[encode(t) for t in texts]` (a vocabulary may do it faster)."""
        return [self.encode(t) for t in texts]

    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """A JSON-able record that identifies the vocabulary (kind, size, special ids, hash)."""

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Detokenised text of `ids` up to the first EOS (PAD and BOS are skipped).

        Args:
          ids: 1-D ids, e.g. one row of a model's output.

        Returns:
          The text; invalid UTF-8 (bytes vocabulary) decodes with U+FFFD replacements.
        """
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError(f"decode expects a 1-D sequence of ids, got shape {arr.shape}")
        ends = np.flatnonzero(arr == self.eos_id)
        if ends.size:
            arr = arr[: ends[0]]
        arr = arr[(arr != self.pad_id) & (arr != self.bos_id)]
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            bad = arr[(arr < 0) | (arr >= self.vocab_size)][0]
            raise ValueError(
                f"token id {int(bad)} is outside the vocabulary [0, {self.vocab_size})"
            )
        return self._decode_ids(arr.tolist())

    def special_ids(self) -> dict[str, int]:
        """{"pad_id", "bos_id", "eos_id"}."""
        return {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}


class ByteVocab(Vocab):
    """UTF-8 bytes (ids 0..255) plus EOS = 256 (`SEP_ID`), BOS = 257, PAD = 258."""

    vocab_size = 259
    eos_id = SEP_ID
    bos_id = 257
    pad_id = 258

    def encode(self, text: str) -> np.ndarray:
        """See `Vocab.encode`: one id per UTF-8 byte."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def _decode_ids(self, ids: list[int]) -> str:
        if any(i > 255 for i in ids):
            raise ValueError(f"ids {sorted({i for i in ids if i > 255})} are not bytes")
        return bytes(ids).decode("utf-8", errors="replace")

    def identity(self) -> dict[str, Any]:
        """See `Vocab.identity`."""
        return {"kind": "bytes", "vocab_size": self.vocab_size, **self.special_ids()}


class SentencePieceVocab(Vocab):
    """A SentencePiece model: PAD = 0, EOS = 1, BOS = 2, UNK = 3.

    Args:
      model: the serialized model (`ModelProto` bytes), as `model_bytes()` returns it.
    """

    pad_id = 0
    eos_id = 1
    bos_id = 2
    unk_id = 3

    def __init__(self, model: bytes):
        import sentencepiece as spm

        self._model = bytes(model)
        self._sp = spm.SentencePieceProcessor(model_proto=self._model)
        ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id())
        if ids != (self.pad_id, self.eos_id, self.bos_id, self.unk_id):
            raise ValueError(
                f"SentencePiece model has pad/eos/bos/unk ids {ids}; posenc expects (0, 1, 2, 3) "
                "(train it with train_sentencepiece)"
            )
        self.vocab_size = int(self._sp.get_piece_size())

    def encode(self, text: str) -> np.ndarray:
        """See `Vocab.encode`."""
        return np.asarray(self._sp.encode(text, out_type=int), dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """See `Vocab.encode_batch`: SentencePiece encodes the list in C++ threads."""
        return [np.asarray(ids, dtype=np.int32) for ids in self._sp.encode(list(texts))]

    def _decode_ids(self, ids: list[int]) -> str:
        return self._sp.decode(ids)

    def pieces(self, text: str) -> list[str]:
        """The pieces of `text` (for reading what the model does)."""
        return self._sp.encode(text, out_type=str)

    def model_bytes(self) -> bytes:
        """The serialized model, to record in the run directory (`SentencePieceVocab(bytes)`
        loads it again)."""
        return self._model

    def identity(self) -> dict[str, Any]:
        """See `Vocab.identity`; `model_sha256` is the hash of `model_bytes()`."""
        return {
            "kind": "sentencepiece",
            "vocab_size": self.vocab_size,
            "model_sha256": hashlib.sha256(self._model).hexdigest(),
            **self.special_ids(),
            "unk_id": self.unk_id,
        }


class HFVocab(Vocab):
    """A pretrained model's ``tokenizer.json`` (:class:`~posenc.data.hf_tokenizer.HFTokenizer`)
    as a sequence-to-sequence vocabulary (module docstring).

    Args:
      folder: the tokenizer's folder (``tokenizer.json``, ``tokenizer_config.json``, optionally
        ``generation_config.json``).

    Raises:
      ValueError: the tokenizer names no ``eos_token`` or ``pad_token``.
    """

    def __init__(self, folder: str):
        import json

        from posenc.data.hf_tokenizer import HFTokenizer

        self.tokenizer = HFTokenizer(folder)
        tok = self.tokenizer
        if tok.eos_id is None or tok.pad_id is None:
            raise ValueError(
                f"{VOCAB_FIELD}=hf:{folder}: its tokenizer_config.json must name an eos_token and "
                "a pad_token (a sequence-to-sequence model ends outputs and pads rows with them)"
            )
        generation = Path(folder) / GENERATION_CONFIG
        start = None
        if generation.is_file():
            start = json.loads(generation.read_text()).get("decoder_start_token_id")
        if start is None:
            start = tok.bos_id if tok.bos_id is not None else tok.pad_id
        self.vocab_size = tok.vocab_size
        self.eos_id, self.pad_id, self.bos_id = tok.eos_id, tok.pad_id, int(start)

    def encode(self, text: str) -> np.ndarray:
        """See `Vocab.encode` (no special tokens added)."""
        return self.tokenizer.encode(text).astype(np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """See `Vocab.encode_batch`: the tokenizers library encodes the list in threads."""
        found = self.tokenizer.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in found]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """See `Vocab.decode`; ids past the tokenizer's, which a pretrained model's larger table
        may emit (T5: 28 rows past its 32100 ids), have no text and are dropped."""
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64)
        return super().decode(arr[arr < self.vocab_size] if arr.ndim == 1 else arr)

    def _decode_ids(self, ids: list[int]) -> str:
        return self.tokenizer.tokenizer.decode(ids, skip_special_tokens=True)

    def identity(self) -> dict[str, Any]:
        """See `Vocab.identity`; `tokenizer_sha256` is the hash of `tokenizer.json`."""
        return {
            "kind": "hf",
            "vocab_size": self.vocab_size,
            "tokenizer_sha256": self.tokenizer.sha256,
            **self.special_ids(),
        }


def _training_sentences(pairs: Sequence[Pair], max_sentences: int) -> Iterator[str]:
    stride = max(1, -(-2 * len(pairs) // max_sentences))  # ceil: each pair gives two sentences
    for src, tgt in pairs[::stride]:
        yield src
        yield tgt


def _check_spm_args(vocab_size: int, model_type: str) -> None:
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{MODEL_TYPE_FIELD}={model_type!r}; allowed: {list(MODEL_TYPES)}")
    if not isinstance(vocab_size, int) or vocab_size < MIN_SPM_VOCAB:
        raise ValueError(
            f"{VOCAB_SIZE_FIELD}={vocab_size!r}: a SentencePiece vocabulary needs at least "
            f"{MIN_SPM_VOCAB} ids (4 special ids and 256 byte-fallback pieces)"
        )


def train_sentencepiece(
    pairs: Sequence[Pair],
    vocab_size: int,
    model_type: str = "unigram",
    max_sentences: int = MAX_TRAINING_SENTENCES,
) -> bytes:
    """Trains a joint source + target SentencePiece model on training pairs.

    Deterministic: the same pairs and arguments give the same model bytes (one thread, no
    sentence sampling). Characters outside the 99.95 % most frequent are left to byte fallback.

    Args:
      pairs: the training (source, target) pairs.
      vocab_size: pieces in the model, >= `MIN_SPM_VOCAB`; a soft limit (a small corpus may give
        fewer).
      model_type: "unigram" (T5's) or "bpe".
      max_sentences: train on at most this many sentences (every k-th pair beyond it).

    Returns:
      The serialized model.
    """
    import sentencepiece as spm

    _check_spm_args(vocab_size, model_type)
    if not pairs:
        raise ValueError("cannot train a SentencePiece model on an empty training split")
    out = io.BytesIO()
    try:
        _train(spm, pairs, out, vocab_size, model_type, max_sentences)
    except RuntimeError as err:
        if "smaller than required_chars" not in str(err):
            raise
        needed = str(err).split(" vs ")[-1].split(".")[0]
        raise ValueError(
            f"{VOCAB_SIZE_FIELD}={vocab_size} is smaller than the {needed} ids this training text "
            "needs (4 special ids, 256 byte-fallback pieces, one per common character); raise it"
        ) from None
    return out.getvalue()


def _train(
    spm: Any,
    pairs: Sequence[Pair],
    out: io.BytesIO,
    vocab_size: int,
    model_type: str,
    max_sentences: int,
) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=_training_sentences(pairs, max_sentences),
        model_writer=out,
        vocab_size=vocab_size,
        model_type=model_type,
        # Characters rarer than this share go to byte fallback (the usual setting for
        # scripts with thousands of characters); none are unknown.
        character_coverage=0.9995,
        byte_fallback=True,
        hard_vocab_limit=False,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=1,
        minloglevel=2,
    )


def spm_cache_path(data_dir: Path, train_sha256: str, vocab_size: int, model_type: str) -> Path:
    """Where the SentencePiece model of a training set is cached under the data directory."""
    return (
        Path(data_dir) / "posenc" / "spm" / f"{train_sha256[:16]}-{model_type}-{vocab_size}.model"
    )


def make_vocab(
    kind: str,
    train_pairs: Sequence[Pair] = (),
    *,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    data_dir: str | os.PathLike[str] | None = None,
) -> Vocab:
    """The vocabulary a config asks for, training and caching a SentencePiece model once.

    Args:
      kind: "bytes", "sentencepiece" or "hf:<folder>" (`data.vocab`).
      train_pairs: the training pairs (`source.pairs("train")`); used by "sentencepiece" only.
      vocab_size: SentencePiece vocabulary size (`data.vocab_size`).
      model_type: "unigram" or "bpe" (`data.spm_model_type`).
      data_dir: data directory holding the cache; None means `default_data_dir()`.

    Returns:
      A `ByteVocab`, a `SentencePieceVocab` or an `HFVocab`.
    """
    if kind == "bytes":
        return ByteVocab()
    if isinstance(kind, str) and kind.startswith(HF_PREFIX) and kind[len(HF_PREFIX) :]:
        return HFVocab(kind[len(HF_PREFIX) :])
    if kind != "sentencepiece":
        raise ValueError(f"{VOCAB_FIELD}={kind!r}; allowed: {list(VOCAB_KINDS)}")
    from posenc.data.base import resolve_data_dir

    _check_spm_args(vocab_size, model_type)
    train_sha = pairs_sha256([("train", train_pairs)])
    path = spm_cache_path(resolve_data_dir(data_dir), train_sha, vocab_size, model_type)
    if not path.exists():
        # Several processes may start at once: one trains, the others wait and load its model.
        with storage.file_lock(path.with_name(path.name + ".lock")):
            if not path.exists():
                model = train_sentencepiece(train_pairs, vocab_size, model_type)
                atomic_write_bytes(path, model)
    return SentencePieceVocab(path.read_bytes())
