"""Hostile Hugging Face folders are refused in one line that names the file (issue 36): broken
weights and shard indexes, malformed ``rope_scaling``, a corrupt tokenizer, a vocabulary the
byte tokenizer does not fit, a base config of another kind, and bad ``load_pretrained``
arguments. Each case is a golden folder (tests/hf/golden) copied and broken by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from posenc.hf import load_pretrained

GOLDEN = Path(__file__).resolve().parent / "golden"


def _copy(tmp_path: Path, name: str = "llama") -> Path:
    folder = tmp_path / name
    shutil.copytree(GOLDEN / name, folder, ignore=shutil.ignore_patterns("*.npz"))
    return folder


def _refused(folder: Path, **kwargs) -> str:
    """The one-line ValueError/FileNotFoundError ``load_pretrained(folder)`` raises."""
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        load_pretrained(str(folder), **kwargs)
    line = str(info.value)
    assert "\n" not in line and line, line
    return line


# -- item 1: weights and shard indexes --------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    ["truncated", "five_bytes", "not_safetensors", "empty"],
)
def test_a_broken_safetensors_file_is_named(tmp_path, damage):
    folder = _copy(tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "five_bytes": data[:5],
            "not_safetensors": b'{"this is": "json, not safetensors"}' * 4,
            "empty": b"",
        }[damage]
    )
    line = _refused(folder)
    assert str(weights) in line and "safetensors" in line


def _shard(folder: Path) -> tuple[dict, list[str]]:
    """Splits the folder's weights into two shards and an index; returns the index and the
    tensor names of the second shard."""
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    save_file({n: tensors[n] for n in first}, str(folder / "a.safetensors"))
    save_file({n: tensors[n] for n in second}, str(folder / "b.safetensors"))
    index = {
        "weight_map": {n: "a.safetensors" for n in first} | {n: "b.safetensors" for n in second}
    }
    return index, second


def _write_index(folder: Path, index) -> Path:
    path = folder / "model.safetensors.index.json"
    path.write_text(json.dumps(index) if not isinstance(index, str) else index)
    return path


def test_a_valid_two_shard_index_loads(tmp_path):
    """The control of the cases below: the same shards with a true index load."""
    folder = _copy(tmp_path)
    index, _ = _shard(folder)
    _write_index(folder, index)
    load_pretrained(str(folder))


def test_an_index_mapping_a_tensor_to_a_shard_without_it_is_named(tmp_path):
    folder = _copy(tmp_path)
    index, second = _shard(folder)
    index["weight_map"][second[0]] = "a.safetensors"
    _write_index(folder, index)
    line = _refused(folder)
    assert "model.safetensors.index.json" in line and second[0] in line and "a.safetensors" in line


def test_an_index_naming_a_missing_shard_is_named(tmp_path):
    folder = _copy(tmp_path)
    index, second = _shard(folder)
    (folder / "b.safetensors").unlink()
    _write_index(folder, index)
    line = _refused(folder)
    assert "model.safetensors.index.json" in line and "b.safetensors" in line


@pytest.mark.parametrize(
    "index",
    [
        {"metadata": {}},
        [],
        {"weight_map": ["a.safetensors"]},
        "{not json",
        {"weight_map": {"x": 3}},
    ],
)
def test_a_malformed_index_is_named(tmp_path, index):
    folder = _copy(tmp_path)
    _shard(folder)
    _write_index(folder, index)
    line = _refused(folder)
    assert "model.safetensors.index.json" in line


def test_a_config_that_is_not_json_is_named(tmp_path):
    folder = _copy(tmp_path)
    (folder / "config.json").write_text('{"model_type": "llama",')
    line = _refused(folder)
    assert str(folder / "config.json") in line


# -- item 2: lengths (the rope_scaling cases: test_rope_golden.py) -----------------------------


@pytest.mark.parametrize(
    "name,key,value",
    [
        ("llama", "max_position_embeddings", 0),
        ("gpt2", "n_positions", 0),
        ("opt", "max_position_embeddings", -4),
        ("llama", "max_position_embeddings", "32"),
        ("llama", "hidden_size", 0),
    ],
)
def test_a_length_or_size_that_is_not_positive_is_refused(tmp_path, name, key, value):
    folder = _copy(tmp_path, name)
    fields = json.loads((folder / "config.json").read_text())
    fields[key] = value
    (folder / "config.json").write_text(json.dumps(fields))
    line = _refused(folder)
    assert f"{key}={value!r}" in line and "positive integer" in line
