"""posenc.report's view of models whose layers differ: a pattern of layer kinds names its columns
(``pattern_text``) and its ``posenc analyze`` records get a section per kind."""

from __future__ import annotations

import json

import pytest

from posenc.report import write_report
from posenc.report.attention import attention_section
from posenc.report.runs import pattern_text


def test_pattern_text_counts_runs_of_a_kind():
    identity = {
        "encoding.name": "rope",
        "layers.pattern": ["local", "local", "local", "global"],
        "layers.kinds.local.encoding": "rope",
        "layers.kinds.local.hparams.base": 10000.0,
        "layers.kinds.local.window": "sliding:16",
        "layers.kinds.local.qk_norm": "rms",
        "layers.kinds.global.qk_norm": "rms",  # no encoder: the run's (rope)
    }
    assert pattern_text(identity) == (
        "3 x [rope, base=10000.0, sliding:16, qk_norm=rms] + [rope, qk_norm=rms]"
    )
    identity["layers.pattern"] = ["local", "global", "local", "global"]
    assert pattern_text(identity).count(" + ") == 3
    assert pattern_text({"encoding.name": "rope", "layers.pattern": []}) == ""


def _length_record():
    """One length (4 tokens, 2 windows, 1 head) of two kinds: ``local`` (sliding:2, layer 0)
    and ``global`` (full, layer 1)."""
    return {
        "length": 4,
        "buckets": [[0, 0], [1, 1], [2, 2], [3, 3]],  # fine; octaves: 0, 1, 2-3
        "by_kind": {
            "local": {
                "layers": [0],
                "pairs": [8, 6, 0, 0],
                "weight": [[0.6, 0.4, None, None]],
                "uniform": [0.625, 0.5, None, None],
                "normalized_entropy": [0.9],
            },
            "global": {
                "layers": [1],
                "pairs": [8, 6, 4, 2],
                "weight": [[0.4, 0.3, 0.2, 0.5]],
                "uniform": [0.52, 0.36, 0.29, 0.25],
                "normalized_entropy": [0.8],
            },
        },
    }


def test_attention_section_reads_each_kind(tmp_path):
    run = tmp_path / "hybrid"
    run.mkdir()
    record = {
        "train_seq_len": 4,
        "layer_kinds": ["local", "global"],
        "kinds": {"local": "local: rope, sliding:2", "global": "global: nope"},
        "lengths": [_length_record()],
    }
    (run / "attention.json").write_text(json.dumps(record))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "attention.json").write_text(json.dumps({**record, "layer_kinds": None}))
    lines = attention_section(str(tmp_path))
    assert lines[0].startswith("## Attention by layer kind")
    assert sum(line.startswith("### ") for line in lines) == 1  # the plain model: no section
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    # Far weight: local's farthest distance is 1 (octave "1"); global's the octave 2-3, the
    # pair-weighted means (0.2 x 4 + 0.5 x 2) / 6 = 0.3 and (0.29 x 4 + 0.25 x 2) / 6.
    assert rows["| local: rope, sliding:2"].endswith("| 0 | 0.9 | 0.4 (0.5) |")
    uniform = (0.29 * 4 + 0.25 * 2) / 6
    assert rows["| global: nope"].endswith(f"| 1 | 0.8 | 0.3 ({uniform:.3g}) |")
    # A folder holding only such records gets a report of that section.
    paths = write_report(str(tmp_path))
    text = open(paths[0]).read()
    assert text.startswith(f"# {tmp_path.name}: attention") and "### hybrid/attention.json" in text


@pytest.mark.parametrize("kinds", [None, []])
def test_no_section_without_kinds(tmp_path, kinds):
    record = {"train_seq_len": 4, "layer_kinds": kinds, "lengths": [_length_record()]}
    (tmp_path / "attention.json").write_text(json.dumps(record))
    assert attention_section(str(tmp_path)) == []
