"""Vocabularies: bytes and SentencePiece, special ids, round trips, training once and caching."""

import numpy as np
import pytest

from posenc.data import ByteVocab, SentencePieceVocab, get_parallel_source, make_vocab
from posenc.data.tokenizer import SEP_ID
from posenc.data.vocab import spm_cache_path, train_sentencepiece

TEXTS = ["Hello, world.", "Grüße aus Köln — 東京 ✓", "", "tab\tand  two spaces"]


@pytest.fixture(scope="module")
def train_pairs():
    return get_parallel_source("parallel:default").pairs("train")[:3000]


def test_byte_vocab_ids_and_round_trip():
    vocab = ByteVocab()
    assert (vocab.eos_id, vocab.bos_id, vocab.pad_id, vocab.vocab_size) == (SEP_ID, 257, 258, 259)
    for text in TEXTS:
        ids = vocab.encode(text)
        assert ids.dtype == np.int32
        np.testing.assert_array_equal(ids, list(text.encode("utf-8")))
        assert vocab.decode(ids) == text
    ids = [vocab.bos_id, *vocab.encode("ab"), vocab.pad_id, *vocab.encode("c"), vocab.eos_id, 120]
    assert vocab.decode(ids) == "abc", "BOS and PAD skipped, stops at EOS"
    assert vocab.decode(np.array([0xC3])) == "\ufffd", "a cut multi-byte character never raises"
    with pytest.raises(ValueError, match=r"token id 300 is outside the vocabulary \[0, 259\)"):
        vocab.decode([65, 300])
    assert vocab.identity() == {
        "kind": "bytes",
        "vocab_size": 259,
        "pad_id": 258,
        "bos_id": 257,
        "eos_id": 256,
    }


def test_sentencepiece_is_deterministic_joint_and_round_trips(train_pairs):
    model = train_sentencepiece(train_pairs, vocab_size=400)
    assert model == train_sentencepiece(train_pairs, vocab_size=400), "same data, same model"
    vocab = SentencePieceVocab(model)
    assert (vocab.pad_id, vocab.eos_id, vocab.bos_id) == (0, 1, 2)
    assert 260 <= vocab.vocab_size <= 400
    # Joint vocabulary: both languages' words are single pieces.
    assert vocab.pieces("the die") == ["▁the", "▁die"]
    for en, de in train_pairs[:50]:
        for text in (en, de):
            ids = vocab.encode(text)
            assert ids.dtype == np.int32 and ids.min() > 3, "no special id inside text"
            assert len(ids) < len(text.encode("utf-8"))
            assert vocab.decode(ids) == text
            assert vocab.decode([*ids, vocab.eos_id, *ids]) == text, "stops at EOS"
    texts = [t for pair in train_pairs[:50] for t in pair]
    batch = vocab.encode_batch(texts)
    assert all(np.array_equal(a, vocab.encode(t)) for a, t in zip(batch, texts, strict=True))
    # Byte fallback: characters never seen in training still round-trip.
    assert vocab.decode(vocab.encode("東京 ✓ Ωmega")) == "東京 ✓ Ωmega"
    assert SentencePieceVocab(vocab.model_bytes()).identity() == vocab.identity()
    bpe = train_sentencepiece(train_pairs, vocab_size=400, model_type="bpe")
    assert bpe != model


def test_make_vocab_trains_once_and_caches_by_content(tmp_path, train_pairs, monkeypatch):
    vocab = make_vocab("sentencepiece", train_pairs, vocab_size=330, data_dir=tmp_path)
    cached = list((tmp_path / "posenc" / "spm").glob("*.model"))
    assert len(cached) == 1 and cached[0].read_bytes() == vocab.model_bytes()

    def fail(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr("posenc.data.vocab.train_sentencepiece", fail)
    again = make_vocab("sentencepiece", train_pairs, vocab_size=330, data_dir=tmp_path)
    assert again.identity() == vocab.identity()
    # Other data, size or model type is another cache entry (and would train).
    with pytest.raises(AssertionError, match="trained again"):
        make_vocab("sentencepiece", train_pairs[1:], vocab_size=330, data_dir=tmp_path)
    sha = cached[0].name.split("-")[0]
    assert spm_cache_path(tmp_path, sha, 330, "unigram") == cached[0]


def test_vocab_refusals(train_pairs):
    assert isinstance(make_vocab("bytes"), ByteVocab)
    with pytest.raises(
        ValueError,
        match=r"data.vocab='words'; allowed: \['bytes', 'sentencepiece', 'hf:<folder>'\]",
    ):
        make_vocab("words")
    with pytest.raises(ValueError, match=r"data.vocab_size=100: .* at least 260"):
        make_vocab("sentencepiece", train_pairs, vocab_size=100)
    with pytest.raises(ValueError, match=r"data.vocab_size=270 is smaller than the \d+ ids"):
        train_sentencepiece(train_pairs, 270)
    with pytest.raises(ValueError, match=r"data.spm_model_type='char'"):
        train_sentencepiece(train_pairs, 300, model_type="char")
