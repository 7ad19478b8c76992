"""What the golden logits do not show: BLOOM's ALiBi slopes for every head count, the strict
reading of configs (one-line refusals), and the family registry."""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pytest

from posenc.encodings import alibi_slopes
from posenc.hf import families, load_pretrained, model_types

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def bloom_slopes(n: int) -> np.ndarray:
    """transformers' ``build_alibi_tensor`` slopes (models/bloom/modeling_bloom.py), float64."""
    closest = 2 ** math.floor(math.log2(n))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base**p for p in range(1, 1 + closest)]
    if closest != n:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, n - closest)
        slopes += [extra_base**p for p in range(1, 1 + 2 * remaining, 2)]
    return np.array(slopes)


@pytest.mark.parametrize("heads", range(1, 65))
def test_alibi_slopes_are_blooms_for_every_head_count(heads):
    np.testing.assert_allclose(alibi_slopes(heads), bloom_slopes(heads), rtol=1e-6)


def test_every_family_is_registered():
    assert list(families()) == [
        "bert",
        "bloom",
        "cohere2",
        "gemma2",
        "gemma3",
        "gpt2",
        "gpt_neox",
        "llama",
        "olmo2",
        "olmo3",
        "opt",
        "phi3",
        "qwen3",
        "smollm3",
        "t5",
    ]
    expected = {"llama", "mistral", "qwen2", "gpt_neox", "gpt2", "bloom", "t5", "bert", "roberta"}
    expected.update({"opt", "phi3", "gemma2", "gemma3_text", "olmo2", "olmo3"})
    expected.update({"qwen3", "smollm3", "cohere2"})
    assert expected <= set(model_types())


def _edited(tmp_path, name, edit):
    folder = tmp_path / name
    shutil.copytree(os.path.join(GOLDEN, name), folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize(
    "name,edit,match",
    [
        ("llama", lambda c: c.update(model_type="mpt"), "model_type 'mpt' is not supported"),
        # A field transformers' GPT2Config consumes and posenc's gpt2 import does not map.
        ("gpt2", lambda c: c.update(add_cross_attention=True), "add_cross_attention=True"),
        ("llama", lambda c: c.update(hidden_act="gelu"), "hidden_act='gelu'"),
        ("mistral", lambda c: c.update(sliding_window=0), "sliding_window=0 must be a positive"),
        (
            "qwen2",
            lambda c: c.update(layer_types=["full_attention"]),
            "lists 1 layers, but the model has num_hidden_layers=2",
        ),
        (
            "qwen2",
            lambda c: c.update(layer_types=["full_attention", "sliding_attention"]),
            "sliding_attention layers but no window",
        ),
        (
            "qwen3",
            lambda c: c.update(layer_types=["full_attention", "chunked_attention"]),
            "entry 'chunked_attention' is not supported",
        ),
        ("smollm3", lambda c: c.update(no_rope_layers=[1, 1, 0]), "no_rope_layers=.*4 entries"),
        ("smollm3", lambda c: c.update(no_rope_layers=[1, 2, 1, 0]), "each 1 \\(RoPE\\)"),
        (
            "smollm3_window",
            lambda c: c.update(use_sliding_window=False),
            "without use_sliding_window",
        ),
        ("cohere2", lambda c: c.update(layer_types=["full_attention"] * 3), "lists 3 layers"),
        ("cohere2", lambda c: c.update(sliding_window=None), "sliding_window is null"),
        ("cohere2", lambda c: c.update(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
        (
            "cohere2",
            lambda c: c.update(rope_parameters={"sliding_attention": {"rope_theta": 10.0}}),
            "rope_scaling key 'sliding_attention'",
        ),
        ("llama", lambda c: c.update(num_hidden_layers=3), "no tensor 'model.layers.2"),
        ("llama", lambda c: c.update(intermediate_size=40), "has shape .* says"),
        ("llama", lambda c: c.update(num_hidden_layers=1), "tensors the config does not"),
        ("gpt2", lambda c: c.update(scale_attn_by_inverse_layer_idx=True), "inverse_layer_idx"),
        (
            "llama_yarn",
            lambda c: c["rope_parameters"].update(truncate=False),
            "truncate=false",
        ),
        (
            "llama_yarn",
            lambda c: c["rope_parameters"].update(rope_type="su"),
            "rope_scaling type 'su'",
        ),
    ],
)
def test_bad_configs_are_refused_in_one_line(tmp_path, name, edit, match):
    folder = _edited(tmp_path, name, edit)
    with pytest.raises(ValueError, match=match) as error:
        load_pretrained(folder)
    assert "\n" not in str(error.value)


def test_a_missing_folder_says_how_to_fetch_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads.*huggingface-cli download"):
        load_pretrained(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(str(tmp_path / "empty"))


def _pop_layer_types(c, **fields):
    c.pop("layer_types", None)
    c.update(fields)


# How transformers 5.24 reads each config's window (its config classes, checked by hand with
# transformers: MistralConfig().sliding_window == 4096; Qwen2/Qwen3 make the layers from
# max_window_layers on sliding, only with use_sliding_window, unless layer_types says otherwise).
WINDOWS = [
    ("mistral", lambda c: None, "full"),  # "sliding_window": null
    ("mistral", lambda c: c.pop("sliding_window"), "sliding:4096"),  # the class's default
    ("mistral_window", lambda c: None, "sliding:8"),
    ("phi3", lambda c: c.update(sliding_window=2047), "sliding:2047"),  # Phi-3-mini-4k's
    (
        "qwen2",
        lambda c: _pop_layer_types(
            c, use_sliding_window=True, sliding_window=8, max_window_layers=0
        ),
        "sliding:8",
    ),
    ("qwen2", lambda c: c.update(use_sliding_window=True, sliding_window=8), "full"),
    (
        "qwen3",
        lambda c: _pop_layer_types(
            c, use_sliding_window=True, sliding_window=8, max_window_layers=2
        ),
        "full",
    ),
    (
        "qwen3",
        lambda c: _pop_layer_types(
            c, use_sliding_window=False, sliding_window=8, max_window_layers=0
        ),
        "full",
    ),
]


@pytest.mark.parametrize("name,edit,window", WINDOWS)
def test_windows_are_read_as_transformers_reads_them(tmp_path, name, edit, window):
    from posenc.hf import read_spec

    _, spec, _ = read_spec(_edited(tmp_path, name, edit))
    assert spec.model.window == window


def test_cohere2_without_layer_types_reads_sliding_window_pattern(tmp_path):
    """Hub configs written before ``layer_types`` (Command R7B's) state
    ``sliding_window_pattern``: layer i slides unless (i + 1) % pattern == 0, as transformers'
    Cohere2Config derives it (4: three sliding RoPE layers, then a full NoPE one)."""
    from posenc.hf import read_spec

    _, spec, _ = read_spec(os.path.join(GOLDEN, "cohere2"))
    assert spec.pattern == ("sliding_attention",) * 3 + ("full_attention",)
    for every, want in ((4, spec.layers), (2, None)):
        folder = _edited(
            tmp_path / str(every),
            "cohere2",
            lambda c, every=every: (c.pop("layer_types"), c.update(sliding_window_pattern=every)),
        )
        got = read_spec(folder)[1]
        if want is not None:
            assert got.layers == want
        else:
            assert got.pattern == ("sliding_attention", "full_attention")
