"""configs/sweeps/hybrids.py and hybrids_passkey.py: each architecture is the published pattern
at this scale, layer by layer, as written out by hand here (no model is built)."""

from __future__ import annotations

import _train_helpers as helpers
import pytest

from posenc.models.build import layer_kinds
from posenc.runs.config import validate
from posenc.runs.sweep import load_sweep

SWEEPS = helpers.REPO / "configs" / "sweeps"


def _layers(config):
    """Per layer: (encoder, hyperparameters, window, other options set), read from the built
    layer kinds (``model.*`` for every layer without a pattern)."""
    kinds = layer_kinds(config)
    out = []
    for i in range(config.model.num_layers):
        if not kinds:
            out.append((config.encoding.name, {}, config.model.window, {}))
            continue
        kind = kinds[i % len(kinds)]
        enc = kind.encoding
        hparams = {"base": enc.base} if enc is not None and enc.name == "rope" else {}
        options = kind.options
        extra = {
            k: getattr(options, k)
            for k in ("qk_norm", "qk_norm_placement", "temperature_floor")
            if getattr(options, k) not in ("none", "before_rotate", 0)
        }
        out.append((enc.name, hparams, options.window, extra))
    return out


@pytest.mark.parametrize("sweep, seq_len", [("hybrids.py", 64), ("hybrids_passkey.py", 288)])
def test_each_architecture_is_its_published_pattern(sweep, seq_len):
    points, configs = load_sweep(f"{SWEEPS / sweep}:tiny")
    assert [c.train.seq_len for c in configs] == [seq_len] * 8
    half, quarter = f"{seq_len // 2}", f"{seq_len // 4}"
    rope = ("rope", {"base": 10000.0})
    l2 = {"qk_norm": "l2", "qk_norm_placement": "after_rotate"}
    want = {
        "rope": [("rope", {}, "full", {})] * 4,
        "nope": [("nope", {}, "full", {})] * 4,
        "alibi": [("alibi", {}, "full", {})] * 4,
        "swa_rope": [("rope", {}, f"sliding:{half}", {})] * 4,
        "rnope_swa": [(*rope, f"sliding:{half}", {})] * 3 + [("nope", {}, "full", {})],
        "irope": [(*rope, f"chunked:{half}", l2)] * 3
        + [("nope", {}, "full", {"temperature_floor": seq_len // 2})],
        "gemma3": [(*rope, f"sliding:{quarter}", {"qk_norm": "rms"})] * 3
        + [("rope", {"base": 1e6}, "full", {"qk_norm": "rms"})],
        "smollm3": [(*rope, "full", {})] * 3 + [("nope", {}, "full", {})],
    }
    got = []
    for config in configs:
        validate(config)
        assert config.model.num_layers == 4 and config.seed == 0
        got.append(_layers(config))
    assert got == list(want.values())
    if sweep == "hybrids.py":  # ALiBi Table 2's protocol at 1-16 x L
        assert configs[0].eval.multiples == (1, 2, 4, 8, 16)
        assert configs[0].eval.mode == "nonoverlapping"
    else:
        assert configs[0].data.source == "synthetic:passkey"
