"""get_source / prepare: spec forms, errors, and the data directory."""

from pathlib import Path

import numpy as np
import pytest

import posenc.data as data
from posenc.data import default_data_dir, get_source, prepare


def test_public_api():
    for name in (
        "ByteTokenizer VOCAB_SIZE SEP_ID get_source prepare DataNotFoundError TrainWindows "
        "eval_windows EvalWindows default_data_dir"
    ).split():
        assert hasattr(data, name), name
    assert issubclass(data.DataNotFoundError, FileNotFoundError)


@pytest.mark.parametrize(
    "spec", ["", "wikitext", "synthetic:", "tfds:", "textdir:", "pystdlib:extra", "TFDS:pg19"]
)
def test_unknown_spec_names_the_field_and_the_allowed_forms(spec, tmp_path):
    with pytest.raises(ValueError) as err:
        get_source(spec, tmp_path)
    message = str(err.value)
    assert "data.source" in message
    for form in ("pystdlib", "textdir:<path>", "tfds:<name>", "synthetic:<task>"):
        assert form in message


def test_an_unknown_task_lists_the_tasks(tmp_path):
    with pytest.raises(ValueError, match=r"unknown task 'copyy'; tasks: even_pairs, .*copy"):
        get_source("synthetic:copyy", tmp_path)


def test_default_data_dir(monkeypatch):
    monkeypatch.setenv("POSENC_DATA_DIR", "/some/where")
    assert default_data_dir() == Path("/some/where")
    monkeypatch.delenv("POSENC_DATA_DIR")
    assert default_data_dir() == Path.home() / ".cache" / "posenc" / "data"


def test_data_dir_defaults_to_env(monkeypatch, tmp_path):
    monkeypatch.setenv("POSENC_DATA_DIR", str(tmp_path))
    src = prepare("pystdlib")
    assert Path(src.info()["cache_dir"]).is_relative_to(tmp_path)
    assert list((tmp_path / "posenc" / "pystdlib").glob("*/train.npy"))


def test_split_names_are_checked(tmp_path):
    src = get_source("pystdlib", tmp_path)
    assert src.splits == ("train", "validation", "test")
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        src.split_stream("valid")
    assert isinstance(src.split_stream("test"), np.ndarray)


def test_text_field_only_for_tfds(tmp_path):
    with pytest.raises(ValueError, match="data.text_field"):
        get_source("pystdlib", tmp_path, text_field="text")
