"""Gemma 2, Gemma 3, OLMo 2 and OLMo 3 beyond the golden logits (tests/hf/test_golden.py) and the
import -> export round trip (tests/test_hf_rundir.py): how their configs are read as
transformers 5 reads them (the older files' spellings, null soft caps, default layer types),
one-line refusals, and an imported OLMo 3 run under ``posenc eval`` with its global layers'
RoPE scaled at evaluation.

The references are transformers' own readings (recorded from transformers 5.24 in the comments
of each case) and the model's logits (equal to transformers', test_golden.py) on windows cut by
hand from text the ``tokenizers`` library tokenised.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from posenc.hf import convert, load_pretrained
from posenc.hf.family import get as get_family
from posenc.hf.load import read_spec

GOLDEN = Path(__file__).resolve().parent / "golden"
S, F = "sliding_attention", "full_attention"


def _edited(tmp_path: Path, name: str, edit) -> str:
    folder = tmp_path / name
    shutil.copytree(GOLDEN / name, folder, ignore=shutil.ignore_patterns("*.npz"))
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _spec(tmp_path, name, edit):
    return read_spec(_edited(tmp_path, name, edit))[1]


def _flat_rope(**fields):
    """Drops the nested rope_parameters for the older files' flat fields."""

    def edit(config):
        config.pop("rope_parameters")
        config.update(fields)

    return edit


def test_gemma3_older_files_rope_fields_are_read_as_transformers_reads_them(tmp_path):
    """Gemma 3's published configs: rope_theta for the global layers, rope_local_base_freq for
    the local ones, rope_scaling on the global ones alone. transformers 5.24 reads
    Gemma3TextConfig(rope_theta=1234, rope_local_base_freq=55, rope_scaling=linear x4) as
    {sliding_attention: default, theta 55; full_attention: linear x4, theta 1234}."""
    edit = _flat_rope(
        rope_theta=1234.0,
        rope_local_base_freq=55.0,
        rope_scaling={"rope_type": "linear", "factor": 4.0},
    )
    spec = _spec(tmp_path, "gemma3", edit)
    assert spec.hparams == {"base": 55.0, "layout": "half"}
    assert spec.kinds[F] == {
        "encoding": "rope",
        "hparams": {"base": 1234.0, "layout": "half", "scaling": "linear", "factor": 4.0},
    }
    # Without them: the class's defaults, 1e6 global and 1e4 local.
    spec = _spec(tmp_path / "defaults", "gemma3", _flat_rope())
    assert spec.hparams["base"] == 10_000.0 and spec.kinds[F]["hparams"]["base"] == 1e6


def test_olmo3_flat_rope_theta_goes_to_the_global_layers_alone(tmp_path):
    """transformers 5.24 reads Olmo3Config(rope_theta=1234, rope_scaling=yarn) as
    {sliding_attention: default, theta 500000 (the class default); full_attention: yarn,
    theta 1234}: the one rope_theta reaches the full-attention layers only."""
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}
    spec = _spec(tmp_path, "olmo3", _flat_rope(rope_theta=1234.0, rope_scaling=yarn))
    assert spec.hparams == {"base": 500_000.0, "layout": "half"}
    full = spec.kinds[F]["hparams"]
    assert (full["base"], full["scaling"], full["original_max_len"]) == (1234.0, "yarn", 16)
    assert spec.train_len == 16  # the global layers were trained at 16


def test_default_layer_types_and_null_caps(tmp_path):
    """Without layer_types: Gemma 2 alternates from a local layer, Gemma 3 follows
    sliding_window_pattern (6 when absent: every one of 4 layers local), OLMo 3 puts a global
    layer every fourth. A null soft cap is off; an absent one is the class default (Gemma 2:
    50 on attention, 30 on the output)."""

    def drop(*keys, **fields):
        def edit(config):
            for key in keys:
                config.pop(key, None)
            config.update(fields)

        return edit

    spec = _spec(tmp_path / "a", "gemma2", drop("layer_types", "attn_logit_softcapping"))
    assert spec.pattern == (S, F) and spec.model.softcap == 50.0
    spec = _spec(tmp_path / "b", "gemma2", drop(final_logit_softcapping=None))
    assert spec.model.output_softcap == 0.0 and spec.model.softcap == 2.0
    spec = _spec(tmp_path / "c", "gemma3", drop("layer_types", sliding_window_pattern=2))
    assert spec.pattern == (S, F)
    spec = _spec(
        tmp_path / "d",
        "gemma3",
        drop("layer_types", "sliding_window_pattern", "_sliding_window_pattern"),
    )
    assert spec.pattern == (S,)
    spec = _spec(tmp_path / "e", "olmo3", drop("layer_types"))
    assert spec.pattern == (S, S, S, F)
    assert spec.kinds[S] == {"window": "sliding:8"}


@pytest.mark.parametrize(
    "name,edit,match",
    [
        ("gemma2", lambda c: c.update(hidden_activation="gelu"), r"hidden_activation='gelu'"),
        ("gemma2", lambda c: c.update(sliding_window=None), r"sliding_window=None must be a pos"),
        ("gemma2", lambda c: c.update(final_logit_softcapping="x"), r"final_logit_softcapping="),
        ("gemma2", lambda c: c.update(layer_types=[S, F]), r"lists 2 layers.*num_hidden_layers=3"),
        ("gemma3", lambda c: c.update(use_bidirectional_attention=True), r"use_bidirectional"),
        (
            "gemma3",
            lambda c: c["rope_parameters"].update(chunked_attention={"rope_type": "default"}),
            r"rope_parameters has an entry for layer type 'chunked_attention'",
        ),
        (
            "gemma3",
            lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": 1.0}),
            r"must be nested by layer type",
        ),
        ("olmo3", lambda c: c.update(layer_types=[S, S, "chunked_attention", F]), r"entry 'chunk"),
        ("olmo2", lambda c: c.update(hidden_act="gelu"), r"hidden_act='gelu'"),
    ],
)
def test_bad_configs_are_refused_in_one_line(tmp_path, name, edit, match):
    folder = _edited(tmp_path, name, edit)
    with pytest.raises(ValueError, match=match) as error:
        read_spec(folder)
    assert "\n" not in str(error.value)


def test_export_names_what_gemma_cannot_hold():
    """A posenc model with Gemma's parts but kinds not named after transformers' layer types,
    or a local kind with more than its window, is refused by the family, naming the kind."""
    family, spec, _ = read_spec(str(GOLDEN / "gemma2"))
    assert family.fits(spec) == []
    renamed = dataclasses.replace(
        spec, layers={"pattern": ("local", F), "kinds": {"local": {"window": "sliding:8"}, F: {}}}
    )
    assert any("layers.kinds.local" in m for m in family.fits(renamed))
    sinks = dataclasses.replace(
        spec,
        layers={"pattern": (S, F), "kinds": {S: {"window": "sliding:8", "sinks": True}, F: {}}},
    )
    assert any("layers.kinds.sliding_attention" in m for m in family.fits(sinks))
    assert get_family("llama").fits(spec)  # Llama holds none of it


WORDS = "def add return the quick brown fox jumps over lazy dog a b".split()


@pytest.mark.slow  # about 15 s: an import and two evaluations
def test_imported_olmo3_evaluates_with_its_global_layers_scaled(tmp_path):
    """posenc eval of an imported OLMo 3 at 16 tokens (its global layers' training length) and
    48 (past it and past the 8-token window), as released and with the global layers' YaRN
    factor raised at evaluation (``layers.kinds.full_attention.hparams.factor=4``): the mean
    cross entropy of windows cut by hand from the text the tokenizers library tokenised, under
    the logits of the model loaded with those hyperparameters."""
    from tokenizers import Tokenizer

    from posenc import data as data_lib
    from posenc.cli import main
    from posenc.hf.rundir import import_hf
    from posenc.runs.evaluate import load_eval

    texts = tmp_path / "texts"
    texts.mkdir()
    rng = np.random.default_rng(0)
    for i in range(9):
        lines = [" ".join(rng.choice(WORDS, size=10)) for _ in range(30)]
        (texts / f"doc{i}.txt").write_text("\n".join(lines) + "\n")
    folder = tmp_path / "olmo3"
    shutil.copytree(GOLDEN / "olmo3", folder, ignore=shutil.ignore_patterns("*.npz"))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(GOLDEN / "llama" / file, folder / file)
    workdir, data_dir = tmp_path / "run", tmp_path / "data"
    import_hf(
        str(folder),
        str(workdir),
        data=f"textdir:{texts}",
        overrides=[f"data.data_dir={str(data_dir)!r}"],
    )
    lengths, budget = (16, 48), 192
    args = ["eval", "--workdir", str(workdir), "--lengths=16,48", f"--max-tokens={budget}"]
    assert main([*args, "--output=plain.json"]) == 0
    scaled = "--config.layers.kinds.full_attention.hparams.factor=4.0"
    assert main([*args, scaled, "--output=scaled.json"]) == 0

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = tok.token_to_id("</s>")
    stream = np.asarray(
        data_lib.get_source(f"textdir:{texts}", data_dir).split_stream("validation")
    )
    cuts = np.flatnonzero(stream == data_lib.SEP_ID)
    starts = np.concatenate([[0], cuts + 1])
    docs = [
        bytes(stream[a:b].astype(np.uint8)).decode()
        for a, b in zip(starts, [*cuts, len(stream)], strict=True)
        if b > a
    ]
    ids = np.concatenate([[*tok.encode(d, add_special_tokens=False).ids, eos] for d in docs])

    family, spec, reader = read_spec(str(folder))
    kinds = spec.kinds
    kinds[F]["hparams"] = {**kinds[F]["hparams"], "factor": 4.0}
    factor4 = dataclasses.replace(spec, layers={"pattern": spec.pattern, "kinds": kinds})
    models = {"plain.json": load_pretrained(str(folder))[0], "scaled.json": None}
    models["scaled.json"] = convert.fill(family, factor4, reader)
    for output, model in models.items():
        results = {r["length"]: r for r in load_eval(str(workdir), output)["results"]}
        for length in lengths:
            n = min((len(ids) - 1) // length, budget // length)
            windows = np.stack([ids[i * length : i * length + length + 1] for i in range(n)])
            logits = np.asarray(model(jnp.asarray(windows[:, :-1])), np.float64)
            logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
            logz += logits.max(-1)
            picked = np.take_along_axis(logits, windows[:, 1:, None], -1)[..., 0]
            want = float((logz - picked).mean())
            assert results[length]["tokens"] == n * length
            np.testing.assert_allclose(results[length]["loss"], want, rtol=1e-5, err_msg=output)
    plain = load_eval(str(workdir), "plain.json")["results"][1]["loss"]
    assert plain != load_eval(str(workdir), "scaled.json")["results"][1]["loss"]


# posenc-built models with Gemma 2's and OLMo 3's options (run-config overrides) and layer kinds.
_BUILT = {
    "gemma2": (
        dict(
            norm="rmsnorm",
            norm_position="sandwich",
            norm_unit_offset=True,
            mlp="geglu",
            mlp_bias=False,
            softcap=20.0,
            output_softcap=10.0,
            logit_scale=0.2,
            num_kv_heads=2,
        ),
        {S: {"window": "sliding:8"}, F: {}},
    ),
    "olmo3": (
        dict(
            norm="rmsnorm",
            norm_position="post_branch",
            mlp="swiglu",
            mlp_bias=False,
            scale_embeddings=False,
            tie_embeddings=False,
            qk_norm="rms_all_heads",
            num_kv_heads=2,
        ),
        {
            S: {"window": "sliding:8"},
            F: {"encoding": "rope", "hparams": {"base": 500.0, "scaling": "linear", "factor": 2.0}},
        },
    ),
}


@pytest.mark.slow  # about 15 s each: two compilations of a model
@pytest.mark.parametrize("family", ["gemma2", "olmo3"])
def test_posenc_model_with_their_options_is_saved_as_that_family(tmp_path, family):
    """A model posenc builds with Gemma 2's (OLMo 3's) options and layer kinds named after
    transformers' layer types is saved as that family and loads back with its own logits
    (norm scales and QK-norm scales away from their initial values, so that the unit offset
    matters)."""
    import jax
    from flax import nnx

    from posenc.hf import save_pretrained
    from posenc.hf.rundir import spec_of_run
    from posenc.models.build import build
    from posenc.runs.config import load_config

    options, kinds = _BUILT[family]
    config = load_config(str(Path(__file__).resolve().parents[2] / "configs" / "base.py") + ":tiny")
    config.unlock()
    config.model.update(options)
    config.layers.pattern = (S, F)
    config.layers.kinds = kinds
    config.lock()
    model = build(config)
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    noise = [x + 0.1 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    nnx.update(model, jax.tree.unflatten(tree, noise))
    spec = spec_of_run(config)
    assert save_pretrained(model, spec, str(tmp_path / "out")) == family
    loaded, got_spec = load_pretrained(str(tmp_path / "out"))
    assert got_spec.layers["pattern"] == (S, F)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 257, (2, 20)))

    def logits(m):
        graphdef, state = nnx.split(m)
        return np.asarray(jax.jit(lambda s: nnx.merge(graphdef, s)(tokens))(state))

    want = logits(model)
    np.testing.assert_allclose(logits(loaded), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(
    "name,scopes",
    [
        ("gemma2", ["encoding"]),  # one RoPE for every layer
        ("gemma3", ["layers.kinds.full_attention"]),  # the global layers' own
        ("olmo2", ["encoding"]),
        ("olmo3", ["layers.kinds.full_attention"]),
    ],
)
def test_evaluation_time_scaling_reaches_the_layers_that_take_it(name, scopes):
    """The run config of an import names the RoPE that ``experiments/pretrained_extrapolation``
    scales (:func:`rope_scopes`): Gemma 3's and OLMo 3's global layers alone (their local layers
    keep theirs, as released), the one RoPE of Gemma 2 and OLMo 2."""
    from posenc.hf.rundir import base_config, run_config
    from posenc.studies.pretrained_extrapolation import rope_scopes

    spec = read_spec(str(GOLDEN / name))[1]
    config = run_config(spec, base_config(), source="pystdlib", tokenizer="bytes")
    assert rope_scopes(config) == scopes
