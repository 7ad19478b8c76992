"""Configs: loading variants, dotted overrides, and validation that names the bad field.

Nothing here compiles or trains: these are the checks a run goes through before it starts.
"""

from __future__ import annotations

import re

import _train_helpers as helpers
import ml_collections
import pytest

from posenc import encodings
from posenc.models import make_encoding, model_config
from posenc.runs.config import (
    EVAL_MODES,
    apply_overrides,
    eval_lengths,
    load_config,
    parse_value,
    validate,
)


@pytest.fixture
def tiny():
    return helpers.tiny_config("/nonexistent-data-dir")


def _flat_fields(config: ml_collections.ConfigDict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in config.items():
        # hparams and the layer kinds are maps the user fills: one field each.
        if isinstance(value, ml_collections.ConfigDict) and key not in ("hparams", "kinds"):
            out |= _flat_fields(value, f"{prefix}{key}.")
        else:
            out.add(prefix + key)
    return out


def test_variants_load_and_differ_as_documented():
    base = load_config(str(helpers.BASE_CONFIG))
    tiny = load_config(helpers.TINY_SPEC)
    assert (base.model.num_layers, base.model.model_dim, base.train.seq_len) == (6, 512, 512)
    assert (tiny.model.num_layers, tiny.model.model_dim, tiny.train.seq_len) == (2, 64, 64)
    assert tiny.model.dtype == "float32" and base.model.dtype == "bfloat16"
    assert _flat_fields(base) == _flat_fields(tiny), "variants change values, not the schema"
    validate(base, num_devices=1)
    validate(tiny, num_devices=1)
    with pytest.raises(AttributeError):
        base.train.new_field = 1  # loaded configs are locked: typos cannot add fields


def test_unknown_variant_and_missing_file_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"'base' and 'tiny'.*'huge'"):
        load_config(f"{helpers.BASE_CONFIG}:huge")
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_config(str(tmp_path / "nope.py"))
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(ValueError, match="no get_config"):
        load_config(str(tmp_path / "empty.py"))


def test_every_field_of_base_config_is_commented():
    """DESIGN: get_config() has a comment on every field (a comment may head a small group)."""
    lines = helpers.BASE_CONFIG.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def get_config"))
    assigned, commented = [], set()
    covered = False
    for line in lines[start + 1 :]:
        stripped = line.strip()
        if stripped.startswith("if variant"):
            break
        if not stripped:
            covered = False
        elif stripped.startswith("#"):
            covered = True
        elif match := re.match(r"config\.([\w.]+) = (.*)", stripped):
            field, value = match.groups()
            if "." not in field and value.startswith("ml_collections.ConfigDict()"):
                covered = False  # a section header, not a field
                continue
            assigned.append(field)
            if covered:
                commented.add(field)
    assert set(assigned) == _flat_fields(load_config(str(helpers.BASE_CONFIG)))
    assert set(assigned) - commented == set()


@pytest.mark.parametrize(
    "text, value",
    [
        ("3", 3),
        ("1e-3", 1e-3),
        ("-2", -2),
        ("True", True),
        ("None", None),
        ("64,128", (64, 128)),
        ("[1, 2]", [1, 2]),
        ("'rope'", "rope"),
        ("rope", "rope"),
        ("/tmp/a b", "/tmp/a b"),
        ("textdir:/x/y", "textdir:/x/y"),
    ],
)
def test_parse_value(text, value):
    assert parse_value(text) == value
    assert type(parse_value(text)) is type(value)


def test_overrides_apply_to_a_copy_with_types(tiny):
    before = tiny.to_dict()
    out = apply_overrides(
        tiny,
        [
            "encoding.name=alibi",
            "--config.train.steps=7",  # the CLI's prefix is accepted
            "optim.learning_rate=1",  # an int for a float field is widened
            "eval.lengths=64",  # a scalar for a tuple field becomes a 1-tuple
            "eval.multiples=[1, 3]",
            "encoding.hparams.base=500000.0",  # hparams are free-form
            "model.head_dim=8",  # a placeholder(int) field
            "train.steps=9",  # later overrides win
        ],
    )
    assert tiny.to_dict() == before, "the input config is not modified"
    assert out.encoding.name == "alibi"
    assert out.train.steps == 9
    assert out.optim.learning_rate == 1.0 and isinstance(out.optim.learning_rate, float)
    assert out.eval.lengths == (64,)
    assert out.eval.multiples == (1, 3)
    assert out.encoding.hparams.to_dict() == {"base": 500000.0}
    assert out.model.head_dim == 8
    with pytest.raises(AttributeError):
        out.train.new_field = 1  # still locked


@pytest.mark.parametrize(
    "override, match",
    [
        ("train.stepz=3", r"unknown config field 'train.stepz'.*steps"),
        ("trian.steps=3", r"unknown config field 'trian'.*train"),
        ("model.num_layers.x=1", r"model.num_layers"),
        ("train.steps=abc", r"config field train.steps"),
        ("train.steps=1.5", r"config field train.steps"),
        ("train.progress=0", r"config field train.progress"),
        ("encoding.name=3", r"config field encoding.name"),
        ("train.steps", r"not of the form field.path=value"),
        ("=3", r"not of the form field.path=value"),
    ],
)
def test_bad_override_names_the_field(tiny, override, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides(tiny, [override])


def test_eval_lengths_from_multiples(tiny):
    config = apply_overrides(tiny, ["eval.lengths=()", "eval.multiples=1,2,4", "train.seq_len=24"])
    assert eval_lengths(config) == (24, 48, 96)
    assert eval_lengths(apply_overrides(config, ["eval.lengths=5,7"])) == (5, 7)


def test_model_config_and_encoding_follow_the_config(tiny):
    config = apply_overrides(tiny, ["encoding.name=t5", "encoding.hparams.num_buckets=16"])
    assert model_config(config).model_dim == 32
    assert model_config(config).num_layers == 1
    enc = make_encoding(config)
    assert enc.name == "t5" and enc.hparams()["num_buckets"] == 16


# (override(s), expected fragment of the message): each must name the field to fix.
BAD_CONFIGS = [
    (["encoding.name=fancy"], r"encoding.name 'fancy'.*alibi"),
    (["encoding.hparams.nonsense=1"], r"nonsense.*accepts"),
    (["model.head_dim=15"], r"RoPE.*head dimension of 15"),
    (["model.model_dim=31"], r"model.model_dim=31.*model.num_heads=2"),
    (["encoding.name=learned", "encoding.hparams.max_len=8"], r"encoding.hparams.max_len=8"),
    (["model.norm=batchnorm"], r"model.norm"),
    (["model.dtype=float64"], r"model.dtype"),
    (["model.attention_impl=flash"], r"model.attention_impl"),
    (["model.dropout=1.0"], r"model.dropout"),
    (["train.seq_len=1"], r"train.seq_len"),
    (["train.batch_size=0"], r"train.batch_size"),
    (["train.log_every=0"], r"train.log_every"),
    (["train.steps=-1"], r"train.steps"),
    (["train.steps=0"], r"train.steps must be an integer >= 1, got 0"),  # it trained nothing
    (["optim.learning_rate=0"], r"optim.learning_rate"),
    (["optim.b2=1.0"], r"optim.b2"),
    (["optim.weight_decay=-0.1"], r"optim.weight_decay"),
    (["eval.lengths=0,16"], r"eval.lengths must all be >= 1"),
    (["eval.lengths=16,abc"], r"eval.lengths must be integers"),
    (["eval.lengths=16.5"], r"eval.lengths must be integers"),
    (["eval.lengths=()", "eval.multiples=()"], r"eval.lengths and eval.multiples"),
    (["eval.mode=strided"], r"eval.mode must be one of \['nonoverlapping', 'sliding'\]"),
    (["eval.mode=sliding"], r"eval.stride"),  # sliding needs a stride
    (["eval.mode=sliding", "eval.stride=17"], r"eval.stride=17.*eval.lengths \[16, 32\]"),
    (["eval.split=train"], r"eval.split"),
    (["eval.batch_tokens=0"], r"eval.batch_tokens"),
    (["data.source="], r"data.source"),
]


@pytest.mark.parametrize("overrides, match", BAD_CONFIGS, ids=[b[0][-1] for b in BAD_CONFIGS])
def test_validate_names_the_bad_field(tiny, overrides, match):
    config = apply_overrides(tiny, overrides)
    with pytest.raises(ValueError, match=match):
        validate(config, num_devices=1)


def test_good_variations_validate(tiny):
    for overrides in (
        ["eval.mode=sliding", "eval.stride=16"],  # stride == smallest length is fine
        ["encoding.name=learned", "encoding.hparams.max_len=16"],  # table exactly seq_len
        ["model.head_dim=16", "model.model_dim=30"],  # explicit head_dim lifts divisibility
    ):
        validate(apply_overrides(tiny, overrides), num_devices=1)
    for name in encodings.names():
        validate(apply_overrides(tiny, [f"encoding.name={name}"]), num_devices=1)
    assert "sliding" in EVAL_MODES


def test_batch_must_divide_over_devices_and_processes(tiny):
    validate(tiny, num_devices=8)  # batch 8
    validate(tiny, num_devices=4, process_count=2)
    with pytest.raises(ValueError, match=r"train.batch_size=8.*number of devices \(3\)"):
        validate(tiny, num_devices=3)
    with pytest.raises(ValueError, match=r"train.batch_size=8.*number of processes \(3\)"):
        validate(tiny, num_devices=1, process_count=3)
    validate(tiny)  # no device count given: not checked
