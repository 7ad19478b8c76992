"""Imported BERT, RoBERTa and T5 models are run directories of the kinds posenc trains: a masked-LM
run and a translation run.

The reference is transformers (the golden logits of tests/hf/golden, make_golden.py) and the
``tokenizers`` library called directly, never posenc's own output: ``posenc.load_run`` of the
imported directory gives transformers' logits, ``posenc eval`` scores what the model's logits
(equal to transformers', tests/hf/test_golden.py) give on windows and pairs tokenised here by hand,
and export from the run directory writes transformers' folder back. The golden folders carry no
tokenizer, so each test adds a word-level ``tokenizer.json`` of the corpus's words with the
family's special tokens (BERT's ``[CLS] [SEP] [MASK]``, RoBERTa's ``<s> </s> <mask>``, T5's
``<pad> </s>``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from test_export import assert_same_model_folder

import posenc
from posenc.cli import main
from posenc.data.masking import corrupt
from posenc.hf import load_pretrained
from posenc.hf.rundir import export_hf, import_hf
from posenc.runs.evaluate import load_eval

GOLDEN = Path(__file__).resolve().parent / "golden"
WORDS = "def add return the quick brown fox jumps over lazy dog a b".split()
# family -> (special tokens in id order, tokenizer_config.json); ids follow the golden configs
# (BERT pads with 0, RoBERTa with 1, T5 with 0 and ends with 1).
SPECIALS = {
    "bert": (
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]"),
    ),
    "roberta": (
        ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>")
        | dict(pad_token="<pad>", mask_token="<mask>", unk_token="<unk>"),
    ),
    "t5": (
        ["<pad>", "</s>", "<unk>"],
        dict(eos_token="</s>", pad_token="<pad>", unk_token="<unk>"),
    ),
}


def word_tokenizer(folder: Path, family: str) -> None:
    """A word-level ``tokenizer.json`` (specials, then :data:`WORDS`) with the family's
    post-processor (BERT's and RoBERTa's row framing) and its ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials, config = SPECIALS[family]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    tok = Tokenizer(
        models.WordLevel(vocab, unk_token=[s for s in specials if "unk" in s.lower()][0])
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if family == "bert":
        tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    elif family == "roberta":
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def with_tokenizer(tmp_path: Path, name: str) -> Path:
    """The golden folder ``name`` copied with a word-level tokenizer of its family."""
    folder = tmp_path / f"{name}_hf"
    shutil.copytree(GOLDEN / name, folder, ignore=shutil.ignore_patterns("*.npz"))
    word_tokenizer(folder, "t5" if name.endswith("t5") else name)
    return folder


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """A textdir folder of documents in :data:`WORDS`, and a parallel folder (``train.en`` /
    ``train.de`` ...: each target the source's words reversed)."""
    root = tmp_path_factory.mktemp("texts")
    rng = np.random.default_rng(0)
    for i in range(9):
        lines = [" ".join(rng.choice(WORDS, size=10)) for _ in range(30)]
        (root / "texts").mkdir(exist_ok=True)
        (root / "texts" / f"doc{i}.txt").write_text("\n".join(lines) + "\n")
    (root / "pairs").mkdir()
    for split, n in (("train", 20), ("valid", 6), ("test", 6)):
        src = [" ".join(rng.choice(WORDS, size=rng.integers(3, 9))) for _ in range(n)]
        (root / "pairs" / f"{split}.en").write_text("\n".join(src) + "\n")
        tgt = [" ".join(reversed(s.split())) for s in src]
        (root / "pairs" / f"{split}.de").write_text("\n".join(tgt) + "\n")
    return root


def _close(got, want) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["bert", pytest.param("roberta", marks=pytest.mark.slow)])
def test_masked_lm_import_is_a_masked_lm_run(tmp_path, name):
    """config: a masked-LM run on the tokenizer; load_run: transformers' logits; export from the
    run directory: transformers' folder back."""
    workdir = tmp_path / "run"
    import_hf(str(with_tokenizer(tmp_path, name)), str(workdir))
    run = posenc.load_run(str(workdir))
    config = run.config
    assert config.train.objective == "masked_lm" and not config.model.causal
    assert config.data.tokenizer == f"hf:{workdir / 'tokenizer'}"
    golden = np.load(GOLDEN / name / "golden.npz")
    _close(run.logits(golden["ids_24"]), golden["logits_24"])
    export_hf(str(workdir), str(tmp_path / "out"))
    assert_same_model_folder(str(tmp_path / "out"), str(GOLDEN / name))
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_bert_imported_before_the_table_was_kept_exports_token_type_1(tmp_path):
    """issue 36: a BERT run imported before its token-type table was kept in pretrained.json
    exports it from pretrained_parts.safetensors (every row minus row 0), so position plus
    token type s is the original's for both types (the table was written as zeros)."""
    from safetensors.numpy import load_file

    workdir, out = tmp_path / "run", tmp_path / "out"
    import_hf(str(with_tokenizer(tmp_path, "bert")), str(workdir))
    record = json.loads((workdir / "pretrained.json").read_text())
    del record["extra"]["token_type_table"]  # as an older import wrote it
    (workdir / "pretrained.json").write_text(json.dumps(record))
    export_hf(str(workdir), str(out))
    want, got = (
        load_file(GOLDEN / "bert" / "model.safetensors"),
        load_file(out / "model.safetensors"),
    )
    pos, types = (f"bert.embeddings.{n}_embeddings.weight" for n in ("position", "token_type"))
    assert np.abs(want[types][1] - want[types][0]).max() > 0.1
    for s in (0, 1):
        np.testing.assert_allclose(
            got[pos] + got[types][s], want[pos] + want[types][s], rtol=1e-6, atol=1e-6
        )


@pytest.mark.slow  # about 10 s: T5 runs eagerly through load_run and export
def test_encoder_decoder_import_is_a_translation_run(tmp_path):
    """config: a translation run whose vocabulary is the tokenizer; load_run's model gives
    transformers' logits; export from the run directory: transformers' folder back."""
    workdir = tmp_path / "run"
    import_hf(str(with_tokenizer(tmp_path, "t5")), str(workdir))
    run = posenc.load_run(str(workdir))
    config = run.config
    assert config.model.assembly == "encoder_decoder" and config.data.source == "parallel:default"
    assert config.data.vocab == f"hf:{workdir / 'tokenizer'}"
    golden = np.load(GOLDEN / "t5" / "golden.npz")
    got = run.model(jnp.asarray(golden["src_12"]), jnp.asarray(golden["tgt_12"]))
    _close(np.asarray(got), golden["logits_12"])
    with pytest.raises(ValueError, match="call run.model directly"):
        run.logits(golden["src_12"])
    export_hf(str(workdir), str(tmp_path / "out"))
    assert_same_model_folder(str(tmp_path / "out"), str(GOLDEN / "t5"))


def _stream(folder: Path, texts: Path, data_dir: Path) -> tuple[np.ndarray, object]:
    """The validation documents tokenised by the tokenizers library, the separator after
    each (BERT has no end-of-text token: its [SEP])."""
    from tokenizers import Tokenizer

    from posenc import data as data_lib

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    stream = np.asarray(
        data_lib.get_source(f"textdir:{texts / 'texts'}", data_dir).split_stream("validation")
    )
    cuts = np.flatnonzero(stream == data_lib.SEP_ID)
    starts = np.concatenate([[0], cuts + 1])
    docs = [
        bytes(stream[a:b].astype(np.uint8)).decode() for a, b in zip(starts, cuts, strict=False)
    ]
    sep = tok.token_to_id("[SEP]")
    return np.concatenate([[*tok.encode(d, add_special_tokens=False).ids, sep] for d in docs]), tok


@pytest.mark.slow  # about 10 s: posenc eval at two lengths
def test_imported_bert_evaluates_as_a_masked_lm(tmp_path, texts):
    """posenc eval: the masked loss of windows cut by hand from the tokenizers library's stream,
    corrupted by BERT's rule with the tokenizer's [MASK] (id 4) and its 18 ids as random
    replacements, scored by the model's logits."""
    folder, workdir, data_dir = with_tokenizer(tmp_path, "bert"), tmp_path / "run", tmp_path / "d"
    import_hf(
        str(folder),
        str(workdir),
        data=f"textdir:{texts / 'texts'}",
        overrides=[f"data.data_dir={str(data_dir)!r}"],
    )
    assert main(["eval", "--workdir", str(workdir), "--lengths=16,32", "--output=x.json"]) == 0
    results = {r["length"]: r for r in load_eval(str(workdir), "x.json")["results"]}
    ids, tok = _stream(folder, texts, data_dir)
    forward = load_pretrained(str(folder))[0]
    for length in (16, 32):
        n = (len(ids) - 1) // length
        windows = np.stack([ids[i * length : (i + 1) * length] for i in range(n)])
        rows = [corrupt(w, (0, 3, length, i * length), 18, 4) for i, w in enumerate(windows)]
        inputs, chosen = (np.stack(x) for x in zip(*rows, strict=True))
        losses = _cross_entropy(forward(jnp.asarray(inputs)), windows)
        assert results[length]["tokens"] == chosen.sum()
        np.testing.assert_allclose(results[length]["loss"], losses[chosen].mean(), rtol=1e-5)


def _cross_entropy(logits, targets) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    return log_z - np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]


@pytest.mark.slow  # about 15 s: teacher forcing and greedy decoding of an encoder-decoder
def test_imported_t5_evaluates_as_a_translation_run(tmp_path, texts):
    """posenc eval: the teacher-forced loss of the validation pairs tokenised by the tokenizers
    library (source + </s> (1); the decoder reads <pad> (0, T5's start) + target and predicts
    target + </s>), scored by the model's logits; greedy outputs written per line."""
    from tokenizers import Tokenizer

    folder, workdir = with_tokenizer(tmp_path, "t5"), tmp_path / "run"
    import_hf(
        str(folder),
        str(workdir),
        data=f"parallel:{texts / 'pairs'}",
        overrides=["data.src_lang='en'", "data.tgt_lang='de'", "eval.beam_size=1"],
    )
    assert main(["eval", "--workdir", str(workdir)]) == 0
    report = load_eval(str(workdir))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model = load_pretrained(str(folder))[0]
    losses = []
    sources = (texts / "pairs" / "valid.en").read_text().splitlines()
    targets = (texts / "pairs" / "valid.de").read_text().splitlines()
    for src, tgt in zip(sources, targets, strict=True):
        s = [*tok.encode(src, add_special_tokens=False).ids, 1]
        t = tok.encode(tgt, add_special_tokens=False).ids
        logits = model(jnp.asarray([s]), jnp.asarray([[0, *t]]))[0]
        losses.extend(_cross_entropy(logits, [*t, 1]))
    assert report["teacher_forced"]["tokens"] == len(losses)
    np.testing.assert_allclose(report["teacher_forced"]["loss"], np.mean(losses), rtol=1e-5)
    assert len((workdir / "eval.hypotheses.txt").read_text().splitlines()) == len(sources)


# Folders with transformers' greedy continuation (make_golden.py's GREEDY).
GREEDY = (
    "llama",
    "llama_yarn",
    "gpt_neox",
    "gpt2",
    "bloom",
    # Past their 8-token windows: the local layers decode through window-sized caches.
    "gemma2",
    "gemma3",
    "olmo2",
    "olmo3",
)
# issue 32: windows of 8 (window-sized caches, posenc.decoding.window) on every layer (Mistral)
# or some (Qwen3's from max_window_layers on, SmolLM3's NoPE layers, Cohere2's RoPE layers).
GREEDY += ("mistral_window", "qwen3", "qwen3_window", "smollm3_window", "cohere2")


@pytest.mark.slow  # about 3 s each: 30 decoding steps compiled in one program
@pytest.mark.parametrize("name", GREEDY)
def test_generation_on_an_imported_run_is_transformers_greedy(tmp_path, name):
    """posenc's greedy decoding through its key/value cache, on the model of an imported run
    directory, continues 30 tokens past a 12-token prompt (to 42: beyond the 32 positions the
    RoPE and ALiBi models were trained at) as transformers' greedy decoding through its own cache
    does: the same tokens, from the same logits."""
    from posenc.decoding.lm import greedy_generate

    workdir, folder = tmp_path / "run", tmp_path / name
    # The golden Llama's tokenizer (96 ids, as every golden model): --no-tokenizer's bytes do
    # not fit and are refused.
    shutil.copytree(GOLDEN / name, folder, ignore=shutil.ignore_patterns("*.npz"))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        if not (folder / file).exists():
            shutil.copyfile(GOLDEN / "llama" / file, folder / file)
    import_hf(str(folder), str(workdir))
    golden = np.load(GOLDEN / name / "greedy.npz")
    model = posenc.load_run(str(workdir)).model
    tokens, logits = greedy_generate(
        model, jnp.asarray(golden["prompts"]), golden["tokens"].shape[1], return_logits=True
    )
    np.testing.assert_array_equal(np.asarray(tokens), golden["tokens"])
    _close(np.asarray(logits), golden["logits"])


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_classifier_rows_are_framed_as_the_tokenizer_frames_pairs(tmp_path, family):
    """The rows of a classifier on a pretrained tokenizer are that tokenizer's own encoding of
    the pair (the tokenizers library's ``encode(a, b)``: BERT's [CLS] a [SEP] b [SEP] with
    segments 0 and 1, RoBERTa's <s> a </s></s> b </s>), truncated as BERT truncates pairs
    (the library's ``longest_first``)."""
    from tokenizers import Tokenizer

    from posenc.data.classify_batching import encode_examples
    from posenc.data.hf_tokenizer import HFTokenizer
    from posenc.data.labelled import Example

    word_tokenizer(tmp_path, family)
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    pairs = [("the quick brown fox", "jumps over"), ("a b", None), ("def add a b return a", "b")]
    examples = [Example(a, b, "x", "test") for a, b in pairs]
    encoded = encode_examples(examples, np.zeros(3, np.int32), HFTokenizer(str(tmp_path)))
    batch = encoded.rows([0, 1, 2], 12)
    for row, (a, b) in enumerate(pairs):
        want = reference.encode(a, b) if b is not None else reference.encode(a)
        n = len(want.ids)
        assert batch["inputs"][row, :n].tolist() == want.ids
        assert batch["segments"][row, :n].tolist() == want.type_ids
        assert batch["mask"][row].sum() == n
    # At 8 tokens the longer text loses tokens from its end (the library's longest_first).
    reference.enable_truncation(8, strategy="longest_first")
    want = reference.encode(*pairs[2])
    assert encoded.rows([2], 8)["inputs"][0].tolist() == want.ids and len(want.ids) == 8


@pytest.mark.slow  # about 10 s: one training step of the classifier and its evaluation
def test_classifier_from_imported_bert_starts_as_bert(tmp_path):
    """posenc train --init-from <imported BERT> --config.train.inherit_model=True: the
    classifier takes BERT's model, tokenizer and token-type table (its segment embedding), and
    after one update at a learning rate of 1e-12 (as before its first) its final states on
    padded sentence pairs with segments 0 and 1 are transformers' (golden bert/states.npz,
    BertModel with token_type_ids and attention_mask); posenc.load_run loads the run."""
    folder, imported, tuned = with_tokenizer(tmp_path, "bert"), tmp_path / "bert", tmp_path / "cls"
    import_hf(str(folder), str(imported))
    tsv = tmp_path / "tsv"
    tsv.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("validation", 6)):
        rows = ["text\ttext_b\tlabel"]
        for i in range(n):
            a, b = (" ".join(rng.choice(WORDS, size=rng.integers(2, 8))) for _ in range(2))
            rows.append(f"{a}\t{b}\t{'yes' if i % 2 else 'no'}")
        (tsv / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    argv = [
        "train",
        "--config=configs/classify.py:tiny",
        f"--workdir={tuned}",
        f"--init-from={imported}",
        "--config.train.inherit_model=True",
        f"--config.data.source=tsv:{tsv}",
        f"--config.data.data_dir={tmp_path / 'data'}",
        "--config.train.seq_len=32",
        "--config.train.steps=1",
        "--config.train.batch_size=4",
        "--config.optim.learning_rate=1e-12",
        "--config.train.progress=False",
        "--config.eval.multiples=(1,)",
    ]
    assert main(argv) == 0
    init = json.loads((tuned / "init.json").read_text())
    assert init["pretrained_parts"] == ["['segment_embed']['embedding'].value"]
    run = posenc.load_run(str(tuned))
    assert run.config.model.assembly == "classifier" and run.config.encoding.name == "learned"
    assert run.config.data.tokenizer == f"hf:{imported / 'tokenizer'}"
    golden = np.load(GOLDEN / "bert" / "states.npz")
    states = run.model.encode(
        jnp.asarray(golden["ids"]), jnp.asarray(golden["types"]), jnp.asarray(golden["mask"])
    )
    real = golden["mask"]
    _close(np.asarray(states)[real], golden["states"][real])
    assert load_eval(str(tuned))["overall"]["examples"] == 6
