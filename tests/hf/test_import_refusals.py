"""Hostile Hugging Face folders are refused in one line that names the file (issue 36): broken
weights and shard indexes, malformed ``rope_scaling``, a corrupt tokenizer, a vocabulary the
byte tokenizer does not fit, a base config of another kind, and bad ``load_pretrained``
arguments. Each case is a golden folder (tests/hf/golden) copied and broken by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
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


# -- items 4, 5, 7: import_hf's refusals -------------------------------------------------------


def _import_refused(folder: Path, workdir: Path, **kwargs) -> str:
    from posenc.hf.rundir import import_hf

    with pytest.raises((ValueError, FileNotFoundError)) as info:
        import_hf(str(folder), str(workdir), **kwargs)
    line = str(info.value)
    assert "\n" not in line and line, line
    assert not (workdir / "config.json").exists() and not (workdir / "checkpoints").exists()
    return line


@pytest.mark.parametrize(
    "text", ["{not json", '{"version": "1.0"}', "[]", '{"model": {"type": "Nonsense"}}']
)
def test_a_corrupt_tokenizer_json_is_refused_at_import(tmp_path, text):
    folder = _copy(tmp_path)
    (folder / "tokenizer.json").write_text(text)
    line = _import_refused(folder, tmp_path / "run")
    assert str(folder / "tokenizer.json") in line


@pytest.mark.parametrize("name,need", [("llama", 257), ("bert", 258), ("t5", 259)])
def test_no_tokenizer_is_refused_when_bytes_do_not_fit_the_vocabulary(tmp_path, name, need):
    """The golden models have 96 ids; the byte tokenizer needs 257 (a causal LM), 258 (a masked
    LM: the mask token) or exactly 259 (a translation run's byte vocabulary); evaluation printed
    loss nan (LM) or advised a model.vocab_size an imported model cannot change (T5)."""
    line = _import_refused(_copy(tmp_path, name), tmp_path / "run", tokenizer=False)
    assert "--no-tokenizer" in line and "96" in line and str(need) in line


def test_no_tokenizer_is_accepted_where_bytes_fit(tmp_path):
    """The control: the golden Llama with its table grown to 257 rows imports as bytes."""
    from posenc.hf.rundir import import_hf

    folder = _copy(tmp_path)
    fields = json.loads((folder / "config.json").read_text())
    fields["vocab_size"] = 257
    (folder / "config.json").write_text(json.dumps(fields))
    tensors = load_file(str(folder / "model.safetensors"))
    table = tensors["model.embed_tokens.weight"]
    grown = np.concatenate([table, np.zeros((257 - len(table), table.shape[1]), table.dtype)])
    tensors["model.embed_tokens.weight"] = grown
    save_file(tensors, str(folder / "model.safetensors"))
    import_hf(str(folder), str(tmp_path / "run"), tokenizer=False)
    fields = json.loads((tmp_path / "run" / "config.json").read_text())
    assert fields["data"]["tokenizer"] == "bytes"


@pytest.mark.parametrize(
    "name,base,needs",
    [
        ("llama", "configs/translation.py:base", "'lm'"),
        ("llama", "configs/classify.py", "'lm'"),
        ("t5", "configs/base.py", "'encoder_decoder'"),
    ],
)
def test_a_base_config_of_another_kind_is_refused(tmp_path, name, base, needs):
    root = Path(__file__).resolve().parents[2]
    folder = _copy(tmp_path, name)
    if name == "t5":
        from test_rundirs import word_tokenizer

        word_tokenizer(folder, "t5")
    line = _import_refused(folder, tmp_path / "run", base=str(root / base))
    assert "--config" in line and needs in line


# -- item 9: load_pretrained's arguments --------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"param_dtype": "int8"}, "param_dtype"),
        ({"dtype": "int8"}, "dtype"),
        ({"dtype": "float64"}, "dtype"),
        ({"param_dtype": "bf16"}, "param_dtype"),
    ],
)
def test_load_pretrained_refuses_a_dtype_the_cli_refuses(kwargs, field):
    line = _refused(GOLDEN / "llama", **kwargs)
    assert field in line and "bfloat16" in line


def test_an_imported_t5_with_bytes_is_advised_to_reimport_not_to_resize(tmp_path):
    """A T5 imported before --no-tokenizer was refused (data.vocab = bytes): evaluation advised
    ``set model.vocab_size=259``, which the imported weights cannot follow."""
    from test_rundirs import word_tokenizer

    from posenc.hf.rundir import import_hf
    from posenc.kinds.translation import run_vocab
    from posenc.workdir import RunDir

    folder = _copy(tmp_path, "t5")
    word_tokenizer(folder, "t5")
    workdir = tmp_path / "run"
    import_hf(str(folder), str(workdir))
    fields = json.loads((workdir / "config.json").read_text())
    fields["data"].update(vocab="bytes", tokenizer="bytes")
    (workdir / "config.json").write_text(json.dumps(fields))
    run = RunDir(str(workdir))
    with pytest.raises(ValueError) as info:
        run_vocab(run, run.read_config())
    line = str(info.value)
    assert "set model.vocab_size" not in line and "tokenizer.json" in line and "import" in line


def test_save_pretrained_refuses_an_integer_dtype(tmp_path):
    from posenc.hf import save_pretrained

    model, spec = load_pretrained(str(GOLDEN / "llama"))
    with pytest.raises(ValueError, match="dtype='int8' is not one of float32"):
        save_pretrained(model, spec, str(tmp_path / "out"), dtype="int8")
    assert not (tmp_path / "out").exists()


def test_a_corrupt_tokenizer_config_is_refused_at_import(tmp_path):
    folder = _copy(tmp_path)
    (folder / "tokenizer_config.json").write_text('{"eos_token": ')
    line = _import_refused(folder, tmp_path / "run")
    assert str(folder / "tokenizer_config.json") in line


def test_a_run_whose_tokenizer_was_damaged_later_is_refused_in_one_line(tmp_path):
    """An imported run whose tokenizer.json broke after the import: loading it names the
    file (a bare exception of the tokenizers library before)."""
    import posenc
    from posenc.hf.rundir import import_hf

    workdir = tmp_path / "run"
    import_hf(str(_copy(tmp_path)), str(workdir))
    (workdir / "tokenizer" / "tokenizer.json").write_text('{"model": {"type": "Nonsense"}}')
    with pytest.raises(ValueError) as info:
        posenc.load_run(str(workdir))
    assert str(workdir / "tokenizer" / "tokenizer.json") in str(info.value)
    assert "\n" not in str(info.value)


def _llama_like_config():
    from posenc.runs.config import load_config

    config = load_config("configs/base.py:tiny")
    config.model.update(
        norm="rmsnorm",
        mlp="swiglu",
        mlp_bias=False,
        scale_embeddings=False,
        tie_embeddings=False,
        norm_eps=1e-5,
    )
    return config


@pytest.mark.parametrize(
    "field, value",
    [("softcap", 30.0), ("window", "sliding:32"), ("sinks", True), ("qk_norm", "rms")],
)
def test_export_refuses_attention_options_no_family_holds(field, value):
    """A Llama-shaped model exports as llama; with an attention option llama's config cannot
    state, no family is chosen and the option is named (the export would drop it silently)."""
    from posenc.hf.rundir import choose_family, spec_of_run

    config = _llama_like_config()
    assert choose_family(spec_of_run(config)).name == "llama"
    config.model[field] = value
    with pytest.raises(ValueError, match=rf"model\.{field}=.*an attention option"):
        choose_family(spec_of_run(config))


def test_export_refuses_a_layer_pattern_no_family_holds():
    """A layer pattern reaches the spec; a family that does not write per-layer kinds (llama)
    names it as what it cannot hold."""
    from posenc.hf.rundir import choose_family, spec_of_run

    config = _llama_like_config()
    config.layers.pattern = ("a",)
    config.layers.kinds = {"a": {"window": "sliding:16"}}
    spec = spec_of_run(config)
    assert spec.pattern == ("a",) and spec.kinds == {"a": {"window": "sliding:16"}}
    with pytest.raises(ValueError, match=r"llama: .*layers\.pattern=\('a',\) \(per-layer kinds\)"):
        choose_family(spec, recorded="llama")
