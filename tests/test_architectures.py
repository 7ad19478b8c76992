"""The presets of ``configs/architectures.py`` equal by-hand descriptions of the published
configurations they cite (per pattern slot: kind, encoder, RoPE base and layout, scaling, window,
attention options), and each ``tiny`` variant validates, builds and runs a forward pass."""

from __future__ import annotations

import _train_helpers as helpers
import numpy as np
import pytest

from posenc.models.build import build, layer_kinds, make_encoding
from posenc.runs.config import apply_overrides, load_config, validate

SPEC = helpers.REPO / "configs" / "architectures.py"

_CHUNK_QK = {"qk_norm": "l2", "qk_norm_placement": "after_rotate"}
_GEMMA2 = {"softcap": 50.0, "logit_scale": 0.0625}
_GEMMA3 = {"qk_norm": "rms", "logit_scale": 0.0625}
_GPT_OSS_YARN = ("yarn", 32.0, 4096)
_OLMO3_YARN = ("yarn", 8.0, 8192)

# Written from the sources each preset cites (see configs/architectures.py), not from the code:
# one row per pattern slot, (kind, encoder, base, layout, (scaling, factor, original length) or
# None, window, the options other than their defaults).
PUBLISHED = {
    # Llama 4: RoPE layers (i + 1) % 4 != 0, chunks of 8192, L2 QK-norm after the rotation;
    # NoPE layers with the attention temperature (floor 8192, scale 0.1); theta 5e5, complex
    # (interleaved) pairs.
    "irope": [
        ("local", "rope", 5e5, "interleaved", None, "chunked:8192", _CHUNK_QK),
        ("local", "rope", 5e5, "interleaved", None, "chunked:8192", _CHUNK_QK),
        ("local", "rope", 5e5, "interleaved", None, "chunked:8192", _CHUNK_QK),
        ("global", "nope", None, None, None, "full", {"temperature_floor": 8192}),
    ],
    # Command R7B: 3 sliding (4096) RoPE layers, 1 global NoPE; theta 50000, rope_gptj.
    "rnope_swa": [
        ("local", "rope", 5e4, "interleaved", None, "sliding:4096", {}),
        ("local", "rope", 5e4, "interleaved", None, "sliding:4096", {}),
        ("local", "rope", 5e4, "interleaved", None, "sliding:4096", {}),
        ("global", "nope", None, None, None, "full", {}),
    ],
    # SWAN-GPT: global NoPE first, then three sliding-window (512) RoPE layers.
    "swan": [
        ("global", "nope", None, None, None, "full", {}),
        ("local", "rope", 1e4, "half", None, "sliding:512", {}),
        ("local", "rope", 1e4, "half", None, "sliding:512", {}),
        ("local", "rope", 1e4, "half", None, "sliding:512", {}),
    ],
    # Gemma 2: sliding (4096) and global alternating, soft cap 50, 256 ** -0.5, theta 1e4.
    "gemma2": [
        ("local", "rope", 1e4, "half", None, "sliding:4096", _GEMMA2),
        ("global", "rope", 1e4, "half", None, "full", _GEMMA2),
    ],
    # Gemma 3: five sliding (1024) layers at base 1e4, one global at 1e6; RMS QK-norm.
    "gemma3": [
        *[("local", "rope", 1e4, "half", None, "sliding:1024", _GEMMA3)] * 5,
        ("global", "rope", 1e6, "half", None, "full", _GEMMA3),
    ],
    # SmolLM3: NoPE every fourth layer, theta 5e6, full attention.
    "smollm3": [
        ("rope", "rope", 5e6, "half", None, "full", {}),
        ("rope", "rope", 5e6, "half", None, "full", {}),
        ("rope", "rope", 5e6, "half", None, "full", {}),
        ("nope", "nope", None, None, None, "full", {}),
    ],
    # gpt-oss: banded 128 and dense alternating, sinks everywhere, YaRN x32 over 4096, theta
    # 150000.
    "gpt_oss": [
        ("local", "rope", 1.5e5, "half", _GPT_OSS_YARN, "banded:128", {"sinks": True}),
        ("global", "rope", 1.5e5, "half", _GPT_OSS_YARN, "full", {"sinks": True}),
    ],
    # OLMo 3: 3 sliding (4096) layers with plain RoPE, 1 full layer with YaRN x8 over 8192; QK-norm
    # over all heads everywhere.
    "olmo3": [
        ("local", "rope", 5e5, "half", None, "sliding:4096", {"qk_norm": "rms_all_heads"}),
        ("local", "rope", 5e5, "half", None, "sliding:4096", {"qk_norm": "rms_all_heads"}),
        ("local", "rope", 5e5, "half", None, "sliding:4096", {"qk_norm": "rms_all_heads"}),
        ("global", "rope", 5e5, "half", _OLMO3_YARN, "full", {"qk_norm": "rms_all_heads"}),
    ],
}


def describe(config) -> list[tuple]:
    """The config's pattern as the rows of :data:`PUBLISHED`, read from the built layer kinds."""
    model_encoding = make_encoding(config)
    rows = []
    for kind in layer_kinds(config):
        enc = kind.encoding if kind.encoding is not None else model_encoding
        scaling = None
        if getattr(enc, "scaling", None) is not None:
            scaling = (enc.scaling, enc.factor, enc.original_max_len)
        defaults = type(kind.options)()
        options = {
            f: getattr(kind.options, f)
            for f in ("sinks", "qk_norm", "qk_norm_placement", "softcap", "logit_scale")
            + ("temperature_floor", "temperature_scale", "ssmax")
            if getattr(kind.options, f) != getattr(defaults, f)
        }
        rows.append(
            (
                kind.name,
                enc.name,
                getattr(enc, "base", None),
                getattr(enc, "layout", None),
                scaling,
                kind.options.window,
                options,
            )
        )
    return rows


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_base_preset_is_the_published_configuration(name):
    config = load_config(f"{SPEC}:{name}")
    assert describe(config) == PUBLISHED[name]
    # Each kind's other RoPE hyperparameters are at their defaults (no partial rotation).
    for kind in layer_kinds(config):
        enc = kind.encoding or make_encoding(config)
        assert getattr(enc, "fraction", 1.0) == 1.0
    # The training length holds the longest window, the only departure from configs/base.py.
    longest = max(
        [int(w.partition(":")[2]) for *_, w, _ in PUBLISHED[name] if w != "full"] or [512]
    )
    assert config.train.seq_len == max(512, longest)
    assert config.train.seq_len * config.train.batch_size == 64 * 512
    validate(config)


def test_a_base_pattern_is_cut_short_at_the_top():
    config = load_config(f"{SPEC}:irope")
    assert config.model.num_layers == 6
    kinds = [config.layers.pattern[i % 4] for i in range(6)]
    assert kinds == ["local", "local", "local", "global", "local", "local"]


def test_tiny_divides_every_length_by_128_with_windows_of_at_least_4():
    windows = {
        name: [row[5] for row in describe(load_config(f"{SPEC}:{name},tiny"))] for name in PUBLISHED
    }
    assert windows["irope"] == ["chunked:64"] * 3 + ["full"]
    assert windows["rnope_swa"][0] == windows["gemma2"][0] == "sliding:32"
    assert windows["gemma3"][0] == "sliding:8"
    assert windows["swan"][1] == "sliding:4"
    assert windows["gpt_oss"][0] == "banded:4"  # 128 / 128 = 1, raised to 4
    irope = load_config(f"{SPEC}:irope,tiny")
    assert irope.layers.kinds["global"].temperature_floor == 64
    assert load_config(f"{SPEC}:gpt_oss,tiny").encoding.hparams.original_max_len == 32


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_tiny_preset_validates(name):
    config = load_config(f"{SPEC}:{name},tiny")
    assert config.train.seq_len == 64
    assert config.model.num_layers == max(2, len(config.layers.pattern))
    validate(config)


# Compiling each preset's forward pass: one in the default suite, the rest in the slow step.
@pytest.mark.parametrize(
    "name",
    [n if n == "gemma3" else pytest.param(n, marks=pytest.mark.slow) for n in sorted(PUBLISHED)],
)
def test_the_tiny_preset_builds_and_runs(name):
    config = load_config(f"{SPEC}:{name},tiny")
    # Narrower than tiny (32 wide, 2 heads of 16) to compile fast; the pattern is the preset's.
    small = apply_overrides(config, ["model.model_dim=32", "model.num_heads=2", "model.mlp_dim=64"])
    model = build(small)
    assert [block.kind for block in model.blocks] == [
        small.layers.pattern[i % len(small.layers.pattern)] for i in range(len(model.blocks))
    ]
    tokens = np.arange(64, dtype=np.int32)[None] % 200
    logits = np.asarray(helpers.jit_forward(model)(tokens))
    assert logits.shape == (1, 64, 257) and np.isfinite(logits).all()


@pytest.mark.parametrize("arg", ["", "gemma5", "irope,huge", "irope,gemma2", "tiny"])
def test_a_bad_argument_names_the_presets(arg):
    with pytest.raises(ValueError, match="NAME one of .*'irope'.*VARIANT one of"):
        load_config(f"{SPEC}:{arg}" if arg else str(SPEC))
