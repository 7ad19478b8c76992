"""Published ``config.json`` files import as published (issue 32): a field that no transformers
model of the type reads is ignored (recorded in ``pretrained.json``, reported once, refused by
``--strict``); a field the model reads and posenc does not map is refused, naming it.

The files are tests/hf/published/ (transcribed from public repositories, SOURCES.md); each one's
outcome is stated below with its reason, written from the checkpoint's architecture and from
which keys transformers' config class of its type consumes (posenc/hf/consumed.json, written by
tests/hf/make_consumed.py from transformers itself), never from what the code under test
returned. A few files, shrunk in their size fields only, are imported end to end with tiny random
weights.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from posenc.hf import families, load_pretrained
from posenc.hf.fields import HFConfig, IgnoredFieldsWarning, consumed, sub_config_type
from posenc.hf.load import spec_of_config

PUBLISHED = Path(__file__).resolve().parent / "published"
GOLDEN = Path(__file__).resolve().parent / "golden"


@dataclasses.dataclass(frozen=True)
class Imports:
    """The file reads into a Spec; ``ignored`` are the fields no transformers model of its type
    reads (None: not checked, for a family that lands elsewhere)."""

    why: str
    ignored: tuple[str, ...] | None = ()


@dataclasses.dataclass(frozen=True)
class Refused:
    """The file is refused in one line naming ``field``, which changes the model."""

    field: str
    why: str


EXPECTED = {
    "Llama-2-7b-hf.json": Imports("Llama 2: every field LlamaConfig reads is mapped"),
    "Llama-2-7b-chat-hf.json": Imports("Llama 2 chat: as the base model, eps 1e-6"),
    "Meta-Llama-3-8B-Instruct.json": Imports(
        "Llama 3: grouped-query heads, rope_theta 5e5; _name_or_path twice is still bookkeeping"
    ),
    "Llama-3.1-8B.json": Imports("Llama 3.1: the llama3 rope_scaling is mapped"),
    "Llama-3.2-3B.json": Imports("Llama 3.2: head_dim, tied embeddings, llama3 scaling"),
    "TinyLlama-1.1B-Chat-v1.0.json": Imports("a Llama saved by transformers 4.56 (dtype key)"),
    "SmolLM2-135M.json": Imports(
        "a Llama whose nanotron export kept two keys LlamaConfig does not consume",
        ("is_llama_config", "rope_interleaved"),
    ),
    "Yi-1.5-34B.json": Imports("a Llama with pad_token_id and rope_theta 5e6"),
    "Mistral-Nemo-Base-2407.json": Imports(
        "Mistral with sliding_window null (no window) and its own head_dim"
    ),
    "Qwen2.5-14B.json": Imports(
        "Qwen2: use_sliding_window false, so sliding_window and max_window_layers are unused"
    ),
    "Qwen2.5-3B.json": Imports(
        "Qwen2 with use_mrope, which Qwen2Config does not consume (Qwen2-VL's)", ("use_mrope",)
    ),
    "Qwen2.5-7B.json": Imports("as Qwen2.5-3B", ("use_mrope",)),
    "Llama-3.1-8B-Instruct.json": Imports("Llama 3.1 with three eos ids"),
    "Falcon3-7B-Instruct.json": Imports("a Llama with head_dim 256 and rope_theta 1000042"),
    "SmolLM2-1.7B-Instruct.json": Imports(
        "a Llama whose file carries transformers.js's own settings", ("transformers.js_config",)
    ),
    "Mistral-7B-Instruct-v0.3.json": Imports("Mistral v0.3: sliding_window null, no window"),
    "Phi-4-mini-instruct.json": Imports(
        "Phi-3 with longrope and partial_rotary_factor 0.75; its remote-code fields are not "
        "Phi3Config's, and transformers' own Phi-3 model reads none of them",
        ("full_attn_mod", "interpolate_factor", "lm_head_bias"),
    ),
    "gpt2.json": Imports("GPT-2 saved by 4.47: the summary_* head fields are read as unused"),
    "gpt2-2019.json": Imports("the first GPT-2 file: n_ctx, task_specific_params"),
    "opt-125m.json": Imports(
        "OPT: activation_dropout is a key OPTConfig no longer consumes (training only)",
        ("activation_dropout",),
    ),
    "pythia-6.9b-deduped.json": Imports(
        "GPT-NeoX re-saved by 4.45 with copies of rotary_pct and rotary_emb_base under the "
        "names GPTNeoXConfig keeps as plain attributes and its model does not read",
        ("partial_rotary_factor", "rope_theta"),
    ),
    "pythia-12b-deduped.json": Imports("as pythia-6.9b", ("partial_rotary_factor", "rope_theta")),
    "bloom-560m.json": Imports(
        "BLOOM: Megatron-DeepSpeed's switches and unk_token_id, none consumed by BloomConfig",
        (
            "attention_softmax_in_fp32",
            "bias_dropout_fusion",
            "masked_softmax_fusion",
            "offset_alibi",
            "skip_bias_add",
            "skip_bias_add_qkv",
            "unk_token_id",
        ),
    ),
    "t5-small.json": Imports(
        "T5: n_positions and output_past are not T5Config's", ("n_positions", "output_past")
    ),
    "t5-v1_1-base.json": Imports("T5 v1.1 (gated-gelu, Flan-T5's architecture)", ("output_past",)),
    "bert-base-uncased-finetuned.json": Imports(
        "BERT saved by 4.10: gradient_checkpointing is a training switch BertConfig dropped",
        ("gradient_checkpointing",),
    ),
    "roberta-base-2019.json": Refused("model_type", "a 2019 file without model_type"),
    "Phi-3-mini-4k-instruct.json": Imports(
        "Phi-3 attends within 2047 tokens of its 4096: the window sliding:2047 (issue 32)"
    ),
    "Phi-3-medium-4k-instruct.json": Imports("as Phi-3 mini"),
    "Qwen3-30B-A3B.json": Refused("model_type", "qwen3_moe: a mixture of experts, no family"),
    "gpt-j-6b.json": Refused("model_type", "gptj: no family"),
    "granite-3.3-8b-instruct.json": Refused(
        "model_type", "granite: its embedding, attention, residual and logit multipliers"
    ),
    "DeepSeek-V3.json": Refused(
        "model_type",
        "deepseek_v3: latent attention and experts (its fp8 quantization_config "
        "would be judged by the tensors)",
    ),
    "Mistral-7B-v0.1.json": Imports("Mistral: sliding_window 4096 as window='sliding:4096'"),
    "Qwen3-4B.json": Imports("Qwen3: per-head QK-norm before RoPE"),
    "Qwen3-8B.json": Imports("Qwen3: per-head QK-norm before RoPE"),
    "gemma-2-9b-it.json": Imports(
        "Gemma 2: local/global kinds, both soft caps, sandwich norms",
        ("cache_implementation", "hidden_act", "sliding_window_size"),
    ),
    "gemma-3-1b-it.json": Imports(
        "Gemma 3 text: 5:1 local/global, a RoPE base per layer type, QK-norm",
        ("cache_implementation",),
    ),
    "OLMo-2-1124-7B-Instruct.json": Imports(
        "OLMo 2: QK-norm over all heads, norms after each branch"
    ),
    "dictalm2.0-instruct.json": Imports(
        "Mistral with sliding_window 4096; document_attention is not MistralConfig's",
        ("document_attention",),
    ),
}


def _cases():
    for name, outcome in sorted(EXPECTED.items()):
        yield pytest.param(name, outcome, id=name)


def _fields(name: str) -> dict:
    return json.loads((PUBLISHED / name).read_text())


def test_every_transcribed_file_has_an_expected_outcome():
    files = {p.name for p in PUBLISHED.glob("*.json")}
    assert files == set(EXPECTED)
    assert len(files) >= 28


@pytest.mark.parametrize("name,outcome", list(_cases()))
def test_a_published_config_imports_or_is_refused_naming_a_model_field(name, outcome):
    fields = _fields(name)
    if isinstance(outcome, Refused):
        with pytest.raises(ValueError) as info:
            spec_of_config(fields, name)
        line = str(info.value)
        assert outcome.field in line and "\n" not in line, line
        return
    family, spec = spec_of_config(fields, name)
    assert fields["model_type"] in family.model_types
    if outcome.ignored is not None:
        assert sorted(spec.ignored) == sorted(outcome.ignored)
        assert all(spec.ignored[k] == fields[k] for k in spec.ignored)


@pytest.mark.parametrize(
    "name", sorted(n for n, o in EXPECTED.items() if isinstance(o, Imports) and o.ignored)
)
def test_strict_refuses_every_ignored_field_of_a_published_config(name):
    with pytest.raises(ValueError) as info:
        spec_of_config(_fields(name), name, strict=True)
    line = str(info.value)
    assert "\n" not in line and "strict" in line
    for field in EXPECTED[name].ignored:
        assert field in line


# -- the rule: what transformers' config classes consume ---------------------------------------


def test_consumed_json_covers_every_registered_model_type():
    """A family someone adds must have its type in consumed.json (rerun make_consumed.py), else
    every unread field of its configs is refused."""
    for family in families().values():
        for model_type in family.model_types:
            assert consumed(model_type) is not None, model_type


@pytest.mark.parametrize(
    "model_type,key,expected",
    [
        ("llama", "rope_theta", True),  # converted into rope_parameters
        ("llama", "rope_scaling", True),
        ("llama", "pretraining_tp", True),
        ("llama", "unk_token_id", False),  # kept as a plain attribute, read by no model
        ("llama", "is_llama_config", False),
        ("llama", "sliding_window", False),  # LlamaModel has no window
        ("mistral", "sliding_window", True),
        ("gpt_neox", "rotary_pct", True),  # GPTNeoXConfig converts its legacy names
        ("gpt_neox", "rotary_emb_base", True),
        ("gpt_neox", "rope_theta", False),  # ... and keeps this one, unread
        ("gpt2", "n_embd", True),  # an attribute_map alias
        ("bloom", "n_embed", True),  # taken in __post_init__
        ("bloom", "masked_softmax_fusion", False),
        ("gemma3_text", "rope_local_base_freq", True),
        ("gemma3", "text_config", True),
        ("t5", "n_positions", False),
    ],
)
def test_consumed_follows_what_transformers_config_classes_take(model_type, key, expected):
    assert (key in consumed(model_type)) is expected


def test_a_field_the_model_reads_and_posenc_does_not_map_is_refused():
    """A field Qwen2Config consumes and nothing read is refused, naming it (the first; the
    others counted)."""
    hf = HFConfig({"model_type": "qwen2", "layer_types": ["x"], "rope_theta": 1.0}, "llama", "c")
    with pytest.raises(ValueError, match=r"field layer_types=\['x'\].*Qwen2Config reads it.*"):
        hf.finish()


@pytest.mark.parametrize("value,refused", [(False, False), (True, True), (0, True)])
def test_a_consumed_field_at_transformers_default_is_accepted(value, refused):
    """Old files state PretrainedConfig's attributes at their defaults (is_encoder_decoder:
    false): the model transformers builds then is the one without the field; any other value
    is refused, naming it."""
    fields = {**_fields("Llama-2-7b-hf.json"), "is_encoder_decoder": value}
    if not refused:
        _, spec = spec_of_config(fields, "c", strict=True)
        assert spec.ignored == {}
        return
    with pytest.raises(ValueError, match=r"is_encoder_decoder=.*LlamaConfig reads it"):
        spec_of_config(fields, "c")


def test_a_model_type_missing_from_the_table_refuses_every_unread_field():
    hf = HFConfig({"model_type": "not_a_type", "unk_token_id": 0}, "llama", "c")
    with pytest.raises(ValueError, match="consumed.json has no model_type 'not_a_type'"):
        hf.finish()


def test_a_nested_config_is_read_field_by_field_with_its_own_type():
    """Gemma 3's text_config (model_type gemma3_text by transformers' sub-config): its unread
    fields are named text_config.<field>; one Gemma3TextConfig consumes is refused."""
    assert sub_config_type("gemma3", "text_config") == "gemma3_text"
    fields = {
        "model_type": "gemma3",
        "text_config": {"hidden_size": 8, "js_note": 1, "sliding_window": 4},
        "vision_config": {},
    }
    hf = HFConfig(fields, "gemma3", "c")
    text = hf.sub("text_config")
    assert text.model_type == "gemma3_text"
    assert text.take("hidden_size") == 8
    hf.ignore("vision_config")
    with pytest.raises(ValueError, match=r"field text_config\.sliding_window=4 .*Gemma3TextConfig"):
        hf.finish()
    text.take("sliding_window")
    assert hf.finish() == {"text_config.js_note": 1}
    strict = HFConfig(fields, "gemma3", "c", strict=True)
    strict_text = strict.sub("text_config")
    strict_text.take("hidden_size")
    strict_text.take("sliding_window")
    strict.ignore("vision_config")
    with pytest.raises(ValueError, match=r"text_config\.js_note.*strict"):
        strict.finish()


# -- quantization_config: the tensors decide -------------------------------------------------


def _golden_copy(tmp_path: Path, edit=None) -> Path:
    folder = tmp_path / "llama"
    shutil.copytree(GOLDEN / "llama", folder, ignore=shutil.ignore_patterns("*.npz"))
    if edit:
        fields = json.loads((folder / "config.json").read_text())
        edit(fields)
        (folder / "config.json").write_text(json.dumps(fields))
    return folder


QUANT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}


def test_a_quantization_config_beside_float_weights_is_ignored_and_reported_once(tmp_path):
    """A dequantized export keeps its quantization_config but holds the float tensors of the
    usual shapes: they are the model, so the field is ignored (and named), not refused."""
    folder = _golden_copy(tmp_path, lambda f: f.update(quantization_config=QUANT))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, spec = load_pretrained(str(folder))
    assert spec.ignored == {"quantization_config": QUANT}
    lines = [str(w.message) for w in caught if w.category is IgnoredFieldsWarning]
    assert len(lines) == 1 and "quantization_config" in lines[0] and "\n" not in lines[0]
    with pytest.raises(ValueError, match="quantization_config.*strict"):
        load_pretrained(str(folder), strict=True)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_quantized_tensors_are_refused_naming_the_tensor_whatever_the_config(tmp_path, dtype):
    """Integer weights of the right shape were cast to float32 and imported as if they were
    the model's (a bitsandbytes int8 export's layout): now refused, naming tensor and dtype."""
    folder = _golden_copy(tmp_path, lambda f: f.update(quantization_config=QUANT))
    tensors = load_file(str(folder / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = np.clip(np.round(tensors[name] * 50), -127, 127).astype(dtype)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError) as info:
        load_pretrained(str(folder))
    line = str(info.value)
    assert name in line and dtype in line and "quantized" in line and "\n" not in line


# -- end to end: shrunk published configs, tiny random weights ---------------------------------

# The size fields a shrunk copy changes (every other field stays as published); 260 ids fit the
# byte tokenizer (--no-tokenizer), so no tokenizer file is needed.
TINY = {
    "vocab_size": 260,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "head_dim": 8,
    "n_head": 4,
    "n_layer": 2,
}


def tiny_folder(tmp_path: Path, name: str) -> tuple[Path, dict]:
    """A folder with published config ``name`` shrunk (:data:`TINY`) and random float32 weights
    of every tensor its family's rules name; returns it and the shrunk fields."""
    fields = _fields(name)
    fields.update({k: v for k, v in TINY.items() if k in fields})
    family, spec = spec_of_config(fields, name)
    rng = np.random.default_rng(0)
    tensors = {}
    for rule in family.rules(spec):
        for hf, shape in ((rule.hf, rule.shape), *rule.also):
            tensors[hf] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    folder = tmp_path / name.removesuffix(".json")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fields))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder, fields


def test_an_import_records_the_ignored_fields_in_pretrained_json(tmp_path):
    from posenc.hf.rundir import import_hf

    name = "bloom-560m.json"
    folder, fields = tiny_folder(tmp_path, name)
    workdir = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = import_hf(str(folder), str(workdir), tokenizer=False)
    expected = {k: fields[k] for k in EXPECTED[name].ignored}
    written = json.loads((workdir / "pretrained.json").read_text())
    assert written["ignored"] == expected == record["ignored"]
    assert "transformers" in written["ignored_by"]
    reported = [w for w in caught if w.category is IgnoredFieldsWarning]
    assert len(reported) == 1 and all(k in str(reported[0].message) for k in expected)


def test_the_cli_reports_ignored_fields_once_and_strict_refuses_them(tmp_path, capsys):
    from posenc.cli import main

    name = "SmolLM2-135M.json"
    folder, _ = tiny_folder(tmp_path, name)
    strict = tmp_path / "strict"
    args = ["import-hf", str(folder), "--no-tokenizer", "--workdir"]
    assert main([*args, str(strict), "--strict"]) == 2
    err = capsys.readouterr().err
    assert "is_llama_config" in err and "rope_interleaved" in err and "strict" in err
    assert len(err.strip().splitlines()) == 1
    assert not (strict / "config.json").exists() and not (strict / "checkpoints").exists()

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main([*args, str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("posenc: warning:")]
    assert len(warned) == 1 and "is_llama_config" in warned[0] and "rope_interleaved" in warned[0]
    written = json.loads((tmp_path / "run" / "pretrained.json").read_text())
    assert written["ignored"] == {"is_llama_config": True, "rope_interleaved": False}
