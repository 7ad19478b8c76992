"""A pretrained model's own tokenizer as the data tokenizer of a run (``data.tokenizer``).

``data.tokenizer`` is ``"bytes"`` (posenc's default, :mod:`posenc.data.tokenizer`) or
``"hf:<folder>"``: a folder with a Hugging Face ``tokenizer.json`` (read with the ``tokenizers``
library, no ``transformers`` needed) and the ``tokenizer_config.json`` (or the older
``special_tokens_map.json``) that names its special tokens: :class:`HFTokenizer` exposes their
ids (``bos_id``, ``eos_id``, ``pad_id``, ``cls_id``, ``mask_id``, ``unk_id``; None where the
files name none), and the document separator ``sep_id`` (the end-of-text token, or BERT's
``[SEP]`` for a tokenizer without one). ``posenc import-hf`` copies the model's files into the
run directory and sets this field, so evaluation text is tokenised as the model was trained.

:class:`TokenizedSource` turns any text source into that tokenizer's streams: the source's byte
streams are split at their document separators, each document is decoded as UTF-8, encoded
without special tokens, and followed by the document separator (GPT-2's ``<|endoftext|>``
between documents; BERT's ``[SEP]``). Streams are built once per source content
and tokenizer (cached under the data directory by the byte stream's hash and the
``tokenizer.json`` hash) and memory-mapped as ``uint32`` (vocabularies beyond 65 536 ids).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.data import storage
from posenc.data.base import Source
from posenc.data.tokenizer import SEP_ID

PREFIX = "hf:"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# The special tokens a tokenizer config may name, as attributes ``<role>_id``.
ROLES = ("bos", "eos", "pad", "sep", "cls", "mask", "unk")
_CHUNK = 1 << 22  # tokens of a byte stream scanned at a time
_BATCH = 256  # documents encoded at a time


def check_spec(spec: str) -> None:
    """Raises a one-line ``ValueError`` unless ``spec`` is ``"bytes"`` or ``"hf:<folder>"``."""
    if spec == "bytes" or (isinstance(spec, str) and spec.startswith(PREFIX) and spec[3:]):
        return
    raise ValueError(
        f"data.tokenizer must be 'bytes' or 'hf:<folder with tokenizer.json>', got {spec!r}"
    )


class HFTokenizer:
    """A ``tokenizer.json`` with its special tokens (module docstring).

    Attributes:
      vocab_size: ids the tokenizer produces (added tokens included).
      sep_id: the document separator: the end-of-text token (``eos_token``), else the
        separator (``sep_token``: BERT's ``[SEP]``).
      bos_id: the beginning-of-text token, None where there is none or ``tokenizer_config.json``
        says the model's texts do not start with it (``add_bos_token: false``, GPT-2's files):
        what retrieval prompts start with.
      eos_id, pad_id, cls_id, mask_id, unk_id: the tokens ``tokenizer_config.json`` names (or
        ``special_tokens_map.json``), None where it names none. ``cls_id`` and ``sep_id`` frame a
        classifier's rows (:meth:`frame`), ``mask_id`` is a masked LM's mask token.

    Args:
      folder: holds ``tokenizer.json`` and ``tokenizer_config.json`` (or ``tokenizer.json``'s
        path, the config beside it).

    Raises:
      FileNotFoundError: no ``tokenizer.json``.
      ValueError: no document separator named, or a named special token the vocabulary does
        not have.
    """

    def __init__(self, folder: str):
        from tokenizers import Tokenizer

        folder = os.path.dirname(folder) if folder.endswith(TOKENIZER_JSON) else folder
        path = os.path.join(folder, TOKENIZER_JSON)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"data.tokenizer: {folder} has no {TOKENIZER_JSON} (the tokenizers library's "
                "file; posenc reads no other tokenizer format)"
            )
        with open(path, "rb") as f:
            raw = f.read()
        self.sha256 = hashlib.sha256(raw).hexdigest()
        try:
            self.tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises bare Exceptions
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(
                f"data.tokenizer: {path} is not a tokenizer the tokenizers library reads "
                f"({first}); restore the model's own file"
            ) from None
        # A file may carry truncation or padding settings (for its model's inputs); posenc
        # cuts and pads its own windows and rows.
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.folder = folder
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        config = {
            **_read_json(os.path.join(folder, SPECIAL_TOKENS_MAP)),
            **_read_json(os.path.join(folder, TOKENIZER_CONFIG)),
        }
        ids = {role: self._special_id(config, role) for role in ROLES}
        self.eos_id, self.pad_id, self.cls_id = ids["eos"], ids["pad"], ids["cls"]
        self.mask_id, self.unk_id = ids["mask"], ids["unk"]
        self.bos_id = ids["bos"] if config.get("add_bos_token", True) is not False else None
        self.sep_id = ids["eos"] if ids["eos"] is not None else ids["sep"]
        if self.sep_id is None:
            raise ValueError(
                f"data.tokenizer: {folder}/{TOKENIZER_CONFIG} names no eos_token or sep_token; "
                "posenc separates documents with it"
            )
        self.eos = self.tokenizer.id_to_token(self.sep_id)

    def _special_id(self, config: dict[str, Any], role: str) -> int | None:
        """The id of the ``<role>_token`` the config names (None: it names none)."""
        text = _token_text(config.get(f"{role}_token"))
        if not text:
            return None
        found = self.tokenizer.token_to_id(text)
        if found is None:
            raise ValueError(
                f"data.tokenizer: {self.folder}/{TOKENIZER_CONFIG} names {role}_token {text!r}, "
                f"which {TOKENIZER_JSON}'s vocabulary does not have"
            )
        return int(found)

    def row_format(self):
        """How this tokenizer frames a classifier's row
        (:class:`~posenc.data.classify_batching.RowFormat`): its post-processor run on a probe
        text and pair (the tokenizers library's ``post_process``), each special token kept with
        its segment id (``type_ids``), each text replaced by a slot. BERT's gives ``[CLS] a
        [SEP] b [SEP]`` with segments 0, 0, 0, 1, 1; RoBERTa's ``<s> a </s></s> b </s>``, all
        0; a tokenizer with no post-processor the bare texts."""
        from posenc.data.classify_batching import SPECIAL, RowFormat

        probe = self.tokenizer.encode("a", add_special_tokens=False)

        def template(*texts) -> tuple[tuple[int, int, int], ...]:
            done = self.tokenizer.post_process(*texts, add_special_tokens=True)
            items, last = [], None
            for token, segment, seq in zip(done.ids, done.type_ids, done.sequence_ids, strict=True):
                if seq is None:
                    items.append((SPECIAL, token, segment))
                elif (seq, segment) != last:  # the first token of a text: its slot
                    items.append((seq, 0, segment))
                last = None if seq is None else (seq, segment)
            return tuple(items)

        return RowFormat(single=template(probe), pair=template(probe, probe))

    def special_ids(self) -> dict[str, int | None]:
        """``{"bos_id", "eos_id", "pad_id", "sep_id", "cls_id", "mask_id", "unk_id"}``."""
        return {f"{role}_id": getattr(self, f"{role}_id") for role in ROLES}

    def encode(self, text: str) -> np.ndarray:
        """``text`` as uint32 ids (no special tokens added)."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.uint32)

    def encode_documents(self, documents: Iterable[str]) -> np.ndarray:
        """Documents as one stream, the end-of-text token after each."""
        parts = [np.append(self.encode(d), np.uint32(self.sep_id)) for d in documents]
        return np.concatenate(parts) if parts else np.zeros((0,), np.uint32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in np.asarray(ids)], skip_special_tokens=False)


def read_json_object(path: str, what: str = "an object", field: str = "") -> dict[str, Any]:
    """A Hugging Face folder's JSON settings file (``config.json``, ``tokenizer_config.json``)
    as a dict; a one-line ``ValueError`` naming the file (after ``field``, the config field it
    came through) when it is not JSON or holds something other than ``what``, a JSON object."""
    try:
        with open(path) as f:
            fields = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{field}{path} is not valid JSON ({e})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{field}{path} holds a {type(fields).__name__}, not {what}")
    return fields


def _read_json(path: str) -> dict[str, Any]:
    """A tokenizer's JSON settings file, {} when absent."""
    if not os.path.isfile(path):
        return {}
    return read_json_object(path, field="data.tokenizer: ")


def _token_text(token: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` spells it: a string or ``{"content": ...}``."""
    return token.get("content") if isinstance(token, dict) else token


def make_tokenizer(spec: str):
    """The tokenizer ``data.tokenizer`` names: a :class:`~posenc.data.ByteTokenizer` or an
    :class:`HFTokenizer`."""
    from posenc.data.tokenizer import ByteTokenizer

    check_spec(spec)
    return ByteTokenizer() if spec == "bytes" else HFTokenizer(spec[len(PREFIX) :])


def _documents(stream: np.ndarray) -> Iterator[str]:
    """The documents of a byte stream (``SEP_ID`` after each), scanned in chunks."""
    pending = b""
    for start in range(0, len(stream), _CHUNK):
        chunk = np.asarray(stream[start : start + _CHUNK])
        cuts = np.flatnonzero(chunk == SEP_ID)
        begin = 0
        for cut in cuts:
            yield (pending + chunk[begin:cut].astype(np.uint8).tobytes()).decode("utf-8")
            pending, begin = b"", cut + 1
        pending += chunk[begin:].astype(np.uint8).tobytes()
    if pending:
        yield pending.decode("utf-8")


def _batches(items: Iterator[str], size: int) -> Iterator[list[str]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _write_uint32(path: Path, parts: Iterable[np.ndarray]) -> dict[str, Any]:
    """A uint32 ``.npy`` stream from parts, written atomically (as
    :func:`posenc.data.storage.write_stream` writes byte streams); returns its metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    digest, tokens = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as f:
            f.write(storage.npy_header(0, "<u4"))
            for part in parts:
                data = part.astype("<u4").tobytes()
                f.write(data)
                digest.update(data)
                tokens += len(part)
            f.seek(0)
            f.write(storage.npy_header(tokens, "<u4"))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    meta = {"tokens": tokens, "sha256": digest.hexdigest()}
    storage.atomic_write_json(storage.stream_meta_path(path), meta)
    return meta


class TokenizedSource(Source):
    """A byte-level source's splits in a pretrained tokenizer's ids (module docstring).

    Args:
      base: the byte-level source (``pystdlib``, ``textdir:``, ``tfds:``).
      tokenizer: the tokenizer.
      data_dir: the data directory the caches go under.
    """

    def __init__(self, base: Source, tokenizer: HFTokenizer, data_dir: Path):
        self.base = base
        self.tokenizer = tokenizer
        self.spec = base.spec
        self.splits = base.splits
        self._root = Path(data_dir) / "posenc" / "tokenized" / tokenizer.sha256[:16]

    def _path(self, split: str) -> Path:
        byte_hash = self.base.info()["splits"][split]["stream_sha256"]
        return self._root / byte_hash[:16] / f"{split}.npy"

    def split_stream(self, split: str) -> np.ndarray:
        """See ``Source.split_stream``: uint32 ids, the end-of-text token after each document."""
        path = self._path(self.check_split(split))
        if not storage.stream_is_built(path):
            tok = self.tokenizer.tokenizer
            documents = _batches(_documents(self.base.split_stream(split)), _BATCH)
            sep = np.asarray([self.tokenizer.sep_id], np.uint32)
            parts = (
                np.concatenate([np.asarray(e.ids, np.uint32), sep])
                for batch in documents
                for e in tok.encode_batch(batch, add_special_tokens=False)
            )
            _write_uint32(path, parts)
        return storage.load_stream(path)

    def info(self) -> dict[str, Any]:
        """The base source's identity with this tokenizer's streams and vocabulary."""
        base = self.base.info()
        splits = {}
        for split in self.splits:
            self.split_stream(split)
            meta = storage.read_json(storage.stream_meta_path(self._path(split)))
            splits[split] = {
                **base["splits"][split],
                "tokens": meta["tokens"],
                "stream_sha256": meta["sha256"],
            }
        return {
            **base,
            "tokenizer": f"{PREFIX}{self.tokenizer.folder}",
            "tokenizer_sha256": self.tokenizer.sha256,
            "vocab_size": self.tokenizer.vocab_size,
            "splits": splits,
        }
