"""data.tokenizer = "hf:<folder>": any text source in a pretrained model's own token ids.

The reference is the ``tokenizers`` library called directly on each document, the end-of-text
token after each; posenc's streams must equal it, across chunk boundaries that cut a UTF-8
character, and be built once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from posenc import data as data_lib
from posenc.data import hf_tokenizer
from posenc.data.hf_tokenizer import HFTokenizer, TokenizedSource, check_spec, make_tokenizer

FOLDER = Path(__file__).resolve().parents[1] / "hf" / "golden" / "llama"
DOCUMENTS = [
    "def add(a, b):\n    return a + b\n",
    "the quick brown fox — jumps over the lazy dog ünïcödé\n",
    "x" * 50,
]


def _reference(documents) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    eos = tok.token_to_id("</s>")
    return np.concatenate([[*tok.encode(d, add_special_tokens=False).ids, eos] for d in documents])


def _byte_stream(documents) -> np.ndarray:
    """posenc's byte stream of ``documents``: UTF-8 bytes, the separator after each."""
    parts = [np.append(np.frombuffer(d.encode(), np.uint8), data_lib.SEP_ID) for d in documents]
    return np.concatenate(parts).astype(np.uint16)


class _Bytes(data_lib.Source):
    """A byte-level source of fixed documents (one split)."""

    spec, splits = "fixed", ("validation",)

    def __init__(self, documents):
        self.stream = _byte_stream(documents)

    def split_stream(self, split):
        return self.stream

    def info(self):
        return {"spec": self.spec, "splits": {"validation": {"stream_sha256": "ab" * 32}}}


def test_streams_equal_the_tokenizers_library_and_are_built_once(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_tokenizer, "_CHUNK", 7)  # chunk edges inside words and characters
    source = TokenizedSource(_Bytes(DOCUMENTS), HFTokenizer(str(FOLDER)), tmp_path)
    stream = source.split_stream("validation")
    assert stream.dtype == np.uint32
    np.testing.assert_array_equal(stream, _reference(DOCUMENTS))
    info = source.info()
    assert info["vocab_size"] == 84 and info["splits"]["validation"]["tokens"] == len(stream)

    def refuse(*args, **kwargs):
        raise AssertionError("encoded again")

    again = TokenizedSource(_Bytes(DOCUMENTS), make_tokenizer(f"hf:{FOLDER}"), tmp_path)
    monkeypatch.setattr(again.tokenizer.tokenizer, "encode_batch", refuse, raising=False)
    np.testing.assert_array_equal(again.split_stream("validation"), stream)


def test_decode_inverts_encode():
    tok = HFTokenizer(str(FOLDER))
    assert tok.decode(tok.encode(DOCUMENTS[0])) == DOCUMENTS[0]
    np.testing.assert_array_equal(tok.encode_documents(DOCUMENTS), _reference(DOCUMENTS))


@pytest.mark.parametrize("spec", ["hf:", "sentencepiece", "HF:/x"])
def test_a_bad_spec_is_one_line(spec):
    with pytest.raises(ValueError, match="data.tokenizer must be 'bytes' or 'hf:<folder"):
        check_spec(spec)


def test_missing_files_and_tokens_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json") as error:
        HFTokenizer(str(tmp_path))
    assert "\n" not in str(error.value)
    folder = tmp_path / "tok"
    shutil.copytree(FOLDER, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.npz"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    with pytest.raises(
        ValueError, match="names eos_token '<\\|endoftext\\|>', which tokenizer.json"
    ):
        HFTokenizer(str(folder))


def _word_level(folder: Path, words, config: dict) -> None:
    """A word-level ``tokenizer.json`` of ``words`` (ids in that order) and its config."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[1]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def test_special_ids_are_the_tokens_the_config_names(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "fox"]
    bert = {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "mask_token": {"content": "[MASK]", "lstrip": False},
        "unk_token": "[UNK]",
    }
    _word_level(tmp_path / "bert", words, bert)
    tok = HFTokenizer(str(tmp_path / "bert"))
    assert tok.special_ids() == {
        "bos_id": None,
        "eos_id": None,
        "pad_id": 0,
        "sep_id": 3,  # no end-of-text token: documents are separated by [SEP]
        "cls_id": 2,
        "mask_id": 4,
        "unk_id": 1,
    }
    llama = ["<unk>", "<s>", "</s>", "the", "fox"]
    _word_level(tmp_path / "llama", llama, {"bos_token": "<s>", "eos_token": "</s>"})
    tok = HFTokenizer(str(tmp_path / "llama"))
    assert (tok.bos_id, tok.eos_id, tok.sep_id, tok.pad_id) == (1, 2, 2, None)
    # A config that says texts do not start with its BOS (GPT-2's files): no BOS to prepend.
    (tmp_path / "llama" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False})
    )
    assert HFTokenizer(str(tmp_path / "llama")).bos_id is None
    # special_tokens_map.json (older folders) names them when tokenizer_config.json does not.
    (tmp_path / "llama" / "tokenizer_config.json").write_text("{}")
    (tmp_path / "llama" / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert HFTokenizer(str(tmp_path / "llama")).eos_id == 2
    (tmp_path / "llama" / "special_tokens_map.json").unlink()
    with pytest.raises(ValueError, match="names no eos_token or sep_token"):
        HFTokenizer(str(tmp_path / "llama"))
