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
        "gemma2",
        "gemma3",
        "gpt2",
        "gpt_neox",
        "llama",
        "olmo2",
        "olmo3",
        "opt",
        "phi3",
        "t5",
    ]
    expected = {"llama", "mistral", "qwen2", "gpt_neox", "gpt2", "bloom", "t5", "bert", "roberta"}
    expected.update({"opt", "phi3", "gemma2", "gemma3_text", "olmo2", "olmo3"})
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
        ("mistral", lambda c: c.update(sliding_window=16), "sliding_window=16"),
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
