"""ByteTokenizer: byte ids, separator placement, round trips."""

import numpy as np
import pytest

from posenc.data import SEP_ID, VOCAB_SIZE, ByteTokenizer
from posenc.data.tokenizer import SEP_TEXT

TEXTS = ["hello", "héllo wörld ✓ 日本語 🙂", "", "line\nbreak\ttab", "<|sep|> is just text"]


def test_constants():
    assert VOCAB_SIZE == 257
    assert SEP_ID == 256
    assert ByteTokenizer.vocab_size == VOCAB_SIZE


@pytest.mark.parametrize("text", TEXTS)
def test_encode_is_utf8_bytes_and_round_trips(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == np.uint16
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_non_ascii_uses_multiple_bytes():
    ids = ByteTokenizer().encode("é🙂")
    assert len(ids) == 2 + 4
    assert ids.max() < 256


def test_encode_documents_places_one_separator_after_each_document():
    tok = ByteTokenizer()
    docs = ["ab", "", "ç"]
    stream = tok.encode_documents(docs)
    assert stream.dtype == np.uint16
    expected = [97, 98, SEP_ID, SEP_ID, 0xC3, 0xA7, SEP_ID]
    assert stream.tolist() == expected
    assert tok.decode_documents(stream) == docs + [""]
    assert tok.decode(stream) == f"ab{SEP_TEXT}{SEP_TEXT}ç{SEP_TEXT}"


def test_encode_documents_empty_iterable():
    stream = ByteTokenizer().encode_documents([])
    assert stream.shape == (0,) and stream.dtype == np.uint16


def test_text_never_produces_separator():
    ids = ByteTokenizer().encode(SEP_TEXT * 3)
    assert SEP_ID not in ids


def test_decode_replaces_invalid_utf8_and_rejects_out_of_range_ids():
    tok = ByteTokenizer()
    # A window cut inside a two-byte character.
    assert tok.decode([0xC3]) == "\ufffd"
    with pytest.raises(ValueError, match="257"):
        tok.decode([65, 257])
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(np.zeros((2, 2), np.int32))
