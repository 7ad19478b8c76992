"""``posenc import-hf`` and ``posenc export-hf`` end to end, through the command line.

- Import -> export gives back the Hugging Face folder that transformers wrote (``tests/hf/golden``,
  see make_golden.py): the same tensors bit for bit under the same names and dtypes, a config that
  reads as the same model, the tokenizer files. transformers' logits of the exported folder are
  therefore the golden logits (``tests/hf/check_export.py`` loads them with transformers where
  torch is installed; so does the last test here).
- An imported run is a run: ``posenc eval`` at 1x and 2x its training length scores the text
  tokenised by the model's own tokenizer, equal to the cross entropy of the model's logits
  (equal to transformers', tests/hf/test_golden.py) on windows cut by hand from the text
  tokenised here with the ``tokenizers`` library itself.
- A posenc-trained RoPE, ALiBi or learned-position model exported and loaded back gives the run's
  own logits.
- Refusals are one line with exit status 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import _train_helpers as helpers
import numpy as np
import pytest
from safetensors.numpy import load_file

from posenc import data as data_lib
from posenc.hf import load_pretrained, read_spec
from posenc.models.restore import load_model
from posenc.runs.evaluate import load_eval
from posenc.workdir import RunDir

GOLDEN = Path(__file__).resolve().parent / "hf" / "golden"
# Decoder-only golden folders (T5, BERT and RoBERTa: tests/hf/test_rundirs.py); one per family in
# the default suite (about 0.4 s each), the other variants in the slow step.
FAST = ("llama", "gpt_neox", "gpt2", "bloom", "opt", "gemma3", "olmo3")
DECODERS = [
    name if name in FAST else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(os.listdir(GOLDEN))
    # T5, BERT, RoBERTa: tests/hf/test_export.py; Phi-3 exports as Llama: its own test below.
    if not name.endswith("t5") and name not in ("bert", "roberta") and not name.startswith("phi3")
]
WORDS = "def add return the quick brown fox jumps over lazy dog a b".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A textdir folder of short documents in the golden tokenizer's words."""
    root = tmp_path_factory.mktemp("hf")
    rng = np.random.default_rng(0)
    for i in range(9):
        lines = [" ".join(rng.choice(WORDS, size=10)) for _ in range(30)]
        path = root / "texts" / f"doc{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _ok(*argv: str) -> str:
    code, out, err = helpers.run_cli(*argv)
    assert code == 0, err
    return out


def _import(folder: Path, workdir: Path, *flags: str) -> None:
    _ok("import-hf", str(folder), "--workdir", str(workdir), *flags)


def assert_same_folder(exported: Path, golden: Path) -> None:
    """``exported`` holds ``golden``'s model: the same tensors (names, dtypes, bits) and a config
    posenc reads as the same model."""
    family, spec, _ = read_spec(str(golden))
    family_out, spec_out, _ = read_spec(str(exported))
    assert family_out.name == family.name
    assert (spec_out.model, spec_out.encoding, spec_out.train_len) == (
        spec.model,
        spec.encoding,
        spec.train_len,
    )
    assert spec_out.hparams == spec.hparams
    assert spec_out.layers == spec.layers  # per-layer kinds, each with its window and RoPE
    want, got = load_file(golden / "model.safetensors"), load_file(exported / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        unread = UNREAD_ROWS.get(name, 0)
        np.testing.assert_array_equal(got[name][unread:], array[unread:], err_msg=name)
        assert not got[name][:unread].any(), name


# Rows of a table the model never reads (OPT's position table starts at row 2), which posenc
# does not keep and writes as zeros.
UNREAD_ROWS = {"model.decoder.embed_positions.weight": 2}


def _with_tokenizer(tmp_path: Path, name: str) -> Path:
    """The golden folder ``name`` with the golden Llama's small tokenizer where it has none
    (every golden model has 96 ids; --no-tokenizer's bytes need 257 and are refused)."""
    import shutil

    folder = tmp_path / f"{name}_hf"
    shutil.copytree(GOLDEN / name, folder, ignore=shutil.ignore_patterns("*.npz"))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        if not (folder / file).exists():
            shutil.copyfile(GOLDEN / "llama" / file, folder / file)
    return folder


@pytest.mark.parametrize("name", DECODERS)
def test_import_then_export_gives_transformers_folder_back(tmp_path, name):
    workdir, out = tmp_path / "run", tmp_path / "out"
    _import(_with_tokenizer(tmp_path, name), workdir)
    _ok("export-hf", "--workdir", str(workdir), "--out", str(out))
    assert_same_folder(out, GOLDEN / name)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == json.loads((GOLDEN / name / "config.json").read_text()).get(
        "model_type"
    ) or (name == "mistral" and config["model_type"] == "llama")


@pytest.mark.parametrize("name", ["phi3", pytest.param("phi3_longrope", marks=pytest.mark.slow)])
def test_phi3_exports_as_llama_with_its_fused_rows_split(tmp_path, name):
    workdir, out = tmp_path / "run", tmp_path / "out"
    _import(_with_tokenizer(tmp_path, name), workdir)
    _ok("export-hf", "--workdir", str(workdir), "--out", str(out))
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    _, spec, _ = read_spec(str(GOLDEN / name))
    _, spec_out, _ = read_spec(str(out))
    assert (spec_out.model, spec_out.hparams, spec_out.train_len) == (
        spec.model,
        spec.hparams,
        spec.train_len,
    )
    want, got = load_file(GOLDEN / name / "model.safetensors"), load_file(out / "model.safetensors")
    for i in range(spec.model.num_layers):
        at = f"model.layers.{i}."
        fused = {
            "self_attn.qkv_proj.weight": ("q_proj", "k_proj", "v_proj"),
            "mlp.gate_up_proj.weight": ("gate_proj", "up_proj"),
        }
        for name_, parts in fused.items():
            where = at + name_.split(".")[0] + "."
            split = np.concatenate([got[where + p + ".weight"] for p in parts])
            np.testing.assert_array_equal(split, want[at + name_])
    unfused = {k for k in want if "qkv_proj" not in k and "gate_up_proj" not in k}
    for key in unfused:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def _reference_losses(
    corpus: Path, data_dir: Path, lengths, max_tokens: int, model=None
) -> list[float]:
    """Mean cross entropy of ``model`` (default the golden Llama) on the validation text,
    tokenised with the golden Llama's tokenizer through the ``tokenizers`` library (the
    end-of-text token after each document), cut by hand into non-overlapping windows of each
    length."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(GOLDEN / "llama" / "tokenizer.json"))
    eos = tokenizer.token_to_id("</s>")
    stream = helpers.stream(data_dir, spec=f"textdir:{corpus / 'texts'}")
    cuts = np.flatnonzero(np.asarray(stream) == data_lib.SEP_ID)
    starts = np.concatenate([[0], cuts + 1])
    documents = [
        bytes(np.asarray(stream[a:b], np.uint8)).decode("utf-8")
        for a, b in zip(starts, [*cuts, len(stream)], strict=True)
        if b > a
    ]
    ids = np.concatenate(
        [[*tokenizer.encode(d, add_special_tokens=False).ids, eos] for d in documents]
    )
    if model is None:
        model, _ = load_pretrained(str(GOLDEN / "llama"))
    forward = helpers.jit_forward(model)
    losses = []
    for length in lengths:
        n = min((len(ids) - 1) // length, max_tokens // length)
        windows = np.stack([ids[i * length : i * length + length + 1] for i in range(n)])
        logits = forward(windows[:, :-1])
        losses.append(float(helpers.cross_entropy(logits, windows[:, 1:]).mean()))
    return losses


@pytest.mark.slow
def test_cli_import_eval_at_1x_and_2x_export(tmp_path, corpus):
    """import-hf (with its tokenizer) -> posenc eval at 32 and 64 tokens (the model's
    max_position_embeddings and twice it) -> export-hf; and a fine-tune from the import."""
    workdir, out, data_dir = tmp_path / "run", tmp_path / "out", tmp_path / "data"
    _import(
        GOLDEN / "llama",
        workdir,
        f"--data=textdir:{corpus / 'texts'}",
        f"--config.data.data_dir={data_dir}",
    )
    config = RunDir(str(workdir)).read_config()
    assert config.train.seq_len == 32 and config.model.vocab_size == 96
    assert config.data.tokenizer == f"hf:{workdir / 'tokenizer'}"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (workdir / "tokenizer" / name).read_bytes() == (GOLDEN / "llama" / name).read_bytes()

    _ok("eval", "--workdir", str(workdir), "--lengths=32,64", "--max-tokens=256", "--output=x.json")
    report = load_eval(str(workdir), "x.json")
    results = {r["length"]: r for r in report["results"]}
    assert sorted(results) == [32, 64]
    want = _reference_losses(corpus, data_dir, (32, 64), 256)
    for length, loss in zip((32, 64), want, strict=True):
        assert results[length]["tokens"] == 256
        np.testing.assert_allclose(results[length]["loss"], loss, rtol=1e-5)

    _ok("export-hf", "--workdir", str(workdir), "--out", str(out))
    assert_same_folder(out, GOLDEN / "llama")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (GOLDEN / "llama" / name).read_bytes()

    # Fine-tuning: a new run from the imported parameters, on the model's own tokens.
    tuned = tmp_path / "tuned"
    _ok(
        "train",
        "--config",
        str(workdir / "config.json"),
        "--init-from",
        str(workdir),
        "--workdir",
        str(tuned),
        "--config.train.steps=2",
        "--config.train.batch_size=2",
        "--config.train.progress=False",
        "--config.optim.warmup_steps=1",
        "--config.eval.lengths=32",
        "--config.eval.max_tokens=64",
    )
    init = json.loads((tuned / "init.json").read_text())
    assert init["step"] == 1 and os.path.samefile(init["init_from"], workdir)
    assert load_eval(str(tuned))["results"][0]["tokens"] == 64


@pytest.mark.slow  # about 35 s a family: posenc eval at two lengths, twice
@pytest.mark.parametrize("name", ["cohere2", "smollm3_window"])
def test_imported_per_layer_model_evaluates_and_scales_its_rope_layers(tmp_path, corpus, name):
    """issue 32: posenc eval of an imported Cohere2 or SmolLM3 (RoPE on some layers, none and
    a window of 8 on others) at 32 and 64 tokens (max_position_embeddings and twice it) scores
    what the model's logits (transformers', tests/hf/test_golden.py) give on windows cut here;
    with --config.encoding.hparams.scaling=linear at evaluation, what the same weights with that
    scaling on their RoPE layers give (the NoPE layers have no rotation to scale), which differs."""
    import dataclasses

    from posenc.hf import convert
    from posenc.hf.load import read_spec

    workdir, data_dir = tmp_path / "run", tmp_path / "data"
    _import(
        _with_tokenizer(tmp_path, name),
        workdir,
        f"--data=textdir:{corpus / 'texts'}",
        f"--config.data.data_dir={data_dir}",
    )
    assert RunDir(str(workdir)).read_config().layers.pattern  # RoPE and NoPE kinds
    family, spec, reader = read_spec(str(GOLDEN / name))
    scaled = dataclasses.replace(spec, hparams={**spec.hparams, "scaling": "linear", "factor": 2.0})
    args = ["eval", "--workdir", str(workdir), "--lengths=32,64", "--max-tokens=256"]
    cases = {
        "plain.json": ((), load_pretrained(str(GOLDEN / name))[0]),
        "linear.json": (
            (
                "--config.encoding.hparams.scaling=linear",
                "--config.encoding.hparams.factor=2.0",
            ),
            convert.fill(family, scaled, reader),
        ),
    }
    losses = {}
    for output, (flags, model) in cases.items():
        _ok(*args, f"--output={output}", *flags)
        results = {r["length"]: r for r in load_eval(str(workdir), output)["results"]}
        want = _reference_losses(corpus, data_dir, (32, 64), 256, model)
        for length, loss in zip((32, 64), want, strict=True):
            assert results[length]["tokens"] == 256
            np.testing.assert_allclose(results[length]["loss"], loss, rtol=1e-5)
        losses[output] = want
    assert abs(losses["linear.json"][1] - losses["plain.json"][1]) > 1e-3


# posenc-trained models and the family each is exported as.
TRAINED = {
    "rope": ("gpt_neox", ()),  # posenc's defaults: LayerNorm, GELU with biases, scaled table
    "alibi": ("bloom", ("model.embed_norm=True", "model.mlp_dim=128")),
    "learned": ("gpt2", ("model.mlp_dim=128",)),
}
# issue 32: per-layer models (layer patterns of RoPE and NoPE kinds, windows of 8 tokens).
_LLAMA_PARTS = ("model.norm=rmsnorm", "model.mlp=swiglu", "model.mlp_bias=False")
TRAINED_PATTERNS = {
    "rope_nope": (  # a NoPE layer after a RoPE one, both with Llama's parts: SmolLM3
        "smollm3",
        (
            *_LLAMA_PARTS,
            "model.num_layers=2",
            "layers.pattern=('rope', 'nope')",
            "layers.kinds={'rope': {}, 'nope': {'encoding': 'nope'}}",
        ),
    ),
    "rnope_swa": (  # RNoPE-SWA on Cohere's parts, interleaved RoPE: Cohere2
        "cohere2",
        (
            "model.norm=layernorm_nobias",
            "model.residual=parallel_shared_norm",
            "model.mlp=swiglu",
            "model.mlp_bias=False",
            "model.output_logit_scale=0.5",
            "encoding.hparams.layout=interleaved",
            "model.num_layers=3",
            "layers.pattern=('local', 'local', 'global')",
            "layers.kinds={'local': {'window': 'sliding:8'}, 'global': {'encoding': 'nope'}}",
        ),
    ),
    "qkv_bias_windows": (  # q/k/v biases, a sliding window on the second layer: Qwen2
        "qwen2",
        (
            *_LLAMA_PARTS,
            "model.qkv_bias=True",
            "model.num_layers=2",
            "layers.pattern=('full', 'local')",
            "layers.kinds={'full': {}, 'local': {'window': 'sliding:8'}}",
        ),
    ),
    "qk_norm_windows": (  # RMS QK-norm, a sliding window on the second layer: Qwen3
        "qwen3",
        (
            *_LLAMA_PARTS,
            "model.qk_norm=rms",
            "model.num_layers=2",
            "layers.pattern=('full', 'local')",
            "layers.kinds={'full': {}, 'local': {'window': 'sliding:8'}}",
        ),
    ),
}


def _train(tmp_path: Path, corpus: Path, encoding: str) -> tuple[Path, Path]:
    family, overrides = {**TRAINED, **TRAINED_PATTERNS}[encoding]
    workdir, out = tmp_path / encoding, tmp_path / f"{encoding}_hf"
    config = helpers.tiny_config(
        tmp_path / "data",
        f"data.source=textdir:{corpus / 'texts'}",
        f"encoding.name={'rope' if encoding in TRAINED_PATTERNS else encoding}",
        "train.steps=3",
        "eval.lengths=16",
        *overrides,
    )
    from posenc.runs.train import train

    train(config, str(workdir))
    _ok("export-hf", "--workdir", str(workdir), "--out", str(out))
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    return workdir, out


@pytest.mark.slow
@pytest.mark.parametrize("encoding", [*sorted(TRAINED), *TRAINED_PATTERNS])
def test_trained_model_exported_gives_its_logits(tmp_path, corpus, encoding):
    workdir, out = _train(tmp_path, corpus, encoding)
    tokens = np.random.default_rng(1).integers(0, 257, size=(2, 24))
    want = np.asarray(helpers.jit_forward(load_model(str(workdir)))(tokens))
    model, _ = load_pretrained(str(out))
    got = np.asarray(helpers.jit_forward(model)(tokens))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    try:  # an addition where transformers is installed; tests/hf/check_export.py is the record
        import torch
        import transformers
    except ImportError:
        return
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        theirs = reference(torch.from_numpy(tokens)).logits.numpy()
    np.testing.assert_allclose(theirs, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _error(*argv: str) -> str:
    code, _, err = helpers.run_cli(*argv)
    assert code == 2, err
    return helpers.one_line_error(err, argv[0])


def test_import_refusals_are_one_line(tmp_path):
    assert "has no tokenizer.json" in _error(
        "import-hf", str(GOLDEN / "gpt_neox_sequential"), "--workdir", str(tmp_path / "a")
    )
    assert "has no tokenizer.json" in _error(
        "import-hf", str(GOLDEN / "t5"), "--workdir", str(tmp_path / "b")
    )
    assert "huggingface-cli download" in _error(
        "import-hf", str(tmp_path / "nowhere"), "--workdir", str(tmp_path / "c")
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_export_refuses_a_model_no_family_holds(tmp_path):
    """posenc's default ALiBi model has no embedding norm (BLOOM's): each family's lack is named,
    before any checkpoint is read."""
    run = RunDir(str(tmp_path / "run"))
    run.record_config(helpers.tiny_config(tmp_path / "data", "encoding.name=alibi"))
    line = _error("export-hf", "--workdir", run.path, "--out", str(tmp_path / "out"))
    assert "bloom: model.mlp_dim=64 (needs 128), model.embed_norm=False (needs True)" in line
    assert "gpt2: encoding 'alibi'" in line and not (tmp_path / "out").exists()


def test_a_moved_or_copied_import_reads_its_own_tokenizer(tmp_path):
    """issue 36: ``data.tokenizer`` was ``hf:<absolute path>``, so a moved run stopped working
    and a copied one read the original's files. It is ``hf:tokenizer``, resolved against the
    run directory (by ``RunDir.read_config`` and by ``--config <run>/config.json``); an older
    run's absolute path is still read as it is."""
    import shutil

    import posenc
    from posenc.runs.config import load_config

    first = tmp_path / "first"
    _import(GOLDEN / "llama", first)
    recorded = json.loads((first / "config.json").read_text())["data"]["tokenizer"]
    assert recorded == "hf:tokenizer"
    moved = tmp_path / "moved"
    shutil.move(str(first), str(moved))
    copied = tmp_path / "copied"
    shutil.copytree(moved, copied)
    # The copy's own tokenizer differs from the original's: one more word, so one more id.
    tok = json.loads((copied / "tokenizer" / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["zebra"] = max(vocab.values()) + 1
    (copied / "tokenizer" / "tokenizer.json").write_text(json.dumps(tok))
    for run in (moved, copied):
        want = f"hf:{run / 'tokenizer'}"
        assert RunDir(str(run)).read_config().data.tokenizer == want
        assert load_config(str(run / "config.json")).data.tokenizer == want
        assert posenc.load_run(str(run)).tokenizer.folder == str(run / "tokenizer")
    sizes = [posenc.load_run(str(r)).tokenizer.vocab_size for r in (moved, copied)]
    assert sizes[1] == sizes[0] + 1
    # An older import's absolute path is kept.
    fields = json.loads((moved / "config.json").read_text())
    fields["data"]["tokenizer"] = f"hf:{copied / 'tokenizer'}"
    (moved / "config.json").write_text(json.dumps(fields))
    assert RunDir(str(moved)).read_config().data.tokenizer == f"hf:{copied / 'tokenizer'}"


def test_hostile_folders_are_one_line_refusals_of_the_cli(tmp_path):
    """issue 36: a broken safetensors file, a malformed rope_scaling, a corrupt tokenizer.json,
    --no-tokenizer on 96 ids and a base config of another kind each end ``posenc import-hf``
    with one line and exit status 2 (tracebacks before), and no run is written."""
    cases = {}
    broken = _with_tokenizer(tmp_path / "broken", "llama")
    (broken / "model.safetensors").write_bytes(b"12345")
    cases["broken"] = (broken, (), "model.safetensors")
    rope = _with_tokenizer(tmp_path / "rope", "llama")
    fields = json.loads((rope / "config.json").read_text())
    fields.pop("rope_parameters")
    fields["rope_scaling"] = {"type": "linear"}
    (rope / "config.json").write_text(json.dumps(fields))
    cases["rope"] = (rope, (), "'factor'")
    tokenizer = _with_tokenizer(tmp_path / "tokenizer", "llama")
    (tokenizer / "tokenizer.json").write_text("{not json")
    cases["tokenizer"] = (tokenizer, (), "tokenizer.json")
    cases["bytes"] = (GOLDEN / "llama", ("--no-tokenizer",), "257")
    base = str(Path(__file__).resolve().parents[1] / "configs" / "translation.py") + ":base"
    cases["kind"] = (GOLDEN / "llama", ("--config", base), "model.assembly='lm'")
    for name, (folder, flags, said) in cases.items():
        workdir = tmp_path / f"run_{name}"
        line = _error("import-hf", str(folder), "--workdir", str(workdir), *flags)
        assert said in line, (name, line)
        assert not (workdir / "config.json").exists(), name
