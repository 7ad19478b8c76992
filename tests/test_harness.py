"""The posenc model of lm-evaluation-harness (:mod:`posenc.harness`) gives posenc's own numbers.

Each harness request is checked against an independent computation on one tiny trained run:
``loglikelihood`` against float64 numpy log-probabilities of the run's logits; ``loglikelihood_
rolling`` against ``posenc eval``'s scoring of the same stream (:func:`posenc.kinds.stream.
evaluate`); ``generate_until`` against :func:`posenc.decoding.lm.greedy_generate` cut at the stop
sequence by hand. The harness's command line (slow) runs a local task written here (JSON data and
a task YAML through ``--include_path``; nothing is downloaded) and writes its results file under
the run, which ``posenc report`` tables per encoder.
"""

from __future__ import annotations

import glob
import json
import os
import types
from pathlib import Path

import _train_helpers as helpers
import numpy as np
import pytest
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

import posenc.harness  # noqa: F401  (registers "posenc"; the harness extra is installed in CI)
from posenc.decoding.lm import greedy_generate
from posenc.harness.scoring import HarnessScorer, check_max_length, check_run
from posenc.kinds import stream as stream_lib
from posenc.runs.trained import load_run

SEQ_LEN = 16
SEP = 256  # the byte tokenizer's document separator: the prefix of a document


def _train(data_dir, workdir, *overrides):
    from posenc.runs.train import train

    config = helpers.tiny_config(data_dir, "train.steps=4", "train.checkpoint_every=4", *overrides)
    train(config, str(workdir))
    return str(workdir)


@pytest.fixture(scope="module")
def run_dir(data_dir, tmp_path_factory):
    """One tiny RoPE run (length 16), shared by every test here."""
    return _train(data_dir, tmp_path_factory.mktemp("harness_run") / "rope")


@pytest.fixture(scope="module")
def lm(run_dir):
    return get_model("posenc").create_from_arg_string(f"workdir={run_dir},batch_size=4")


@pytest.fixture(scope="module")
def run(lm):
    return lm.run  # the run the harness model loaded (posenc.load_run)


def _log_probs(run, tokens: np.ndarray) -> np.ndarray:
    """float64 log-probability of each ``tokens[t + 1]`` given ``tokens[:t + 1]`` (``[T - 1]``)."""
    logits = np.asarray(run.logits(tokens), np.float64)[:-1]
    logits -= logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(logits).sum(-1))
    return logits[np.arange(len(tokens) - 1), tokens[1:]] - log_z, logits.argmax(-1)


def _expected_loglikelihood(run, context: str, continuation: str, max_length: int):
    # The harness's split: trailing spaces move to the continuation; an empty context is SEP.
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx = [SEP] if context == "" else list(context.encode())
    whole = np.asarray(ctx + list(continuation.encode()), np.int32)[-(max_length + 1) :]
    n = len(continuation.encode())
    logp, argmax = _log_probs(run, whole)
    hits = argmax[-n:] == whole[-n:]
    return float(logp[-n:].sum()), bool(hits.all())


@pytest.mark.slow
def test_loglikelihood_is_the_sum_of_posenc_log_probs(lm, run):
    pairs = [  # 12 tokens each (the reference compiles once), and one cut to the last 17
        ("def f(a,", " b):"),
        ("import os ", "sy"),  # a trailing space moves to the continuation
        ("", "class A(B):"),  # an empty context: the document separator
        ("x = 1\n" * 5, "y = 2"),  # longer than max_length + 1: the last 17 tokens kept
    ]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got = lm.loglikelihood(requests, disable_tqdm=True)
    for pair, (logp, greedy) in zip(pairs, got, strict=True):
        assert len(pair[0] + pair[1]) + (pair[0] == "") in (12, 35)
        want, want_greedy = _expected_loglikelihood(run, *pair, SEQ_LEN)
        assert logp == pytest.approx(want, abs=1e-4, rel=1e-5), pair
        assert greedy == want_greedy
    # The greedy flag is true for a continuation that is the model's own arg max.
    context = np.asarray(list(b"def f"), np.int32)
    best = int(np.asarray(run.logits(context))[-1].argmax())
    scorer = HarnessScorer(run, SEQ_LEN, batch_size=2)
    ((logp, greedy),) = scorer.continuations([(list(context), [best])])
    assert greedy and logp == pytest.approx(_log_probs(run, np.append(context, best))[0][-1])


def _posenc_eval_loss(run, stream: np.ndarray, length: int, mode: str, stride: int) -> float:
    """Summed loss ``posenc eval`` reports for ``stream`` at ``length`` (every target scored)."""
    (result,) = stream_lib.evaluate(
        run.model, stream, [length], mode=mode, stride=stride, batch_tokens=4 * length
    )
    assert result["unscored_tokens"] == 0
    return result["loss"] * result["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["nonoverlapping", "sliding"])
def test_loglikelihood_rolling_is_posenc_eval_on_the_same_document(lm, run, run_dir, mode):
    stride = SEQ_LEN if mode == "nonoverlapping" else 4
    # 32 = 2 * 16 = 16 + 4 * 4 targets: posenc eval scores every one at either stride.
    text = "def f(x):\n    return x * 2  # ok\n"[:32]
    assert len(text) == 32
    stream = np.asarray([SEP, *text.encode()], np.int32)
    if mode == "sliding":
        run = load_run(run_dir, {"eval.mode": "sliding", "eval.stride": stride})
        harness = get_model("posenc").create_from_arg_obj(
            {"workdir": run_dir, "eval.mode": "sliding", "eval.stride": stride}
        )
    else:
        harness = lm
    want = _posenc_eval_loss(run, stream, SEQ_LEN, mode, stride)
    (got,) = harness.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert -got == pytest.approx(want, rel=1e-5)


@pytest.mark.slow
def test_rolling_tail_scores_as_a_longer_stream_would(run):
    """A document whose tail does not fill a window: each token's loss is the one posenc eval
    gives it on a longer stream (the padded last window reads no padding)."""
    scorer = HarnessScorer(run, SEQ_LEN, batch_size=2)
    tokens = list(b"for i in range(10):\n    pass")  # 28 tokens: one window and 12
    (losses,) = scorer.rolling([tokens])
    stream = np.asarray([SEP, *tokens], np.int32)
    want = []
    for start in range(0, len(tokens), SEQ_LEN):
        window = stream[start : start + SEQ_LEN + 1]
        logp, _ = _log_probs(run, window)
        want += list(-logp)
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_generate_until_is_greedy_generate_cut_at_the_stop_sequence(lm, run):
    prompt = "import os\n"
    ids = np.asarray([list(prompt.encode())], np.int32)
    full = np.asarray(greedy_generate(run.model, ids, 10))[0]
    full = [t for t in full[: list(full).index(SEP)]] if SEP in full else list(full)
    text = run.decode(full)
    assert text, "the tiny model generated nothing before the separator"
    stop = text[len(text) // 2]  # a stop sequence the output contains
    want = text[: text.index(stop)]
    got = lm.generate_until(
        [
            Instance("generate_until", {}, (prompt, {"until": [stop], "max_gen_toks": 10}), 0),
            Instance("generate_until", {}, (prompt, {"until": ["\x00"], "max_gen_toks": 10}), 1),
        ]
    )
    assert got == [want, text]


def test_refusals_before_anything_loads(tmp_path, data_dir):
    from flax import nnx

    from posenc.models.build import build

    # Not a run directory.
    with pytest.raises(Exception, match=str(tmp_path)):
        get_model("posenc").create_from_arg_string(f"workdir={tmp_path}")
    # A model argument posenc does not know; no workdir.
    with pytest.raises(ValueError, match="model argument 'pretrained' is not one posenc knows"):
        get_model("posenc").create_from_arg_string(f"workdir={tmp_path},pretrained=gpt2")
    with pytest.raises(ValueError, match="workdir is required"):
        get_model("posenc").create_from_arg_string("max_length=64")
    # max_length past a learned position table (the model's shapes are enough).
    config = helpers.tiny_config(data_dir, "encoding.name=learned", "encoding.hparams.max_len=32")
    model = nnx.eval_shape(lambda: build(config))
    learned = types.SimpleNamespace(model=model, workdir="runs/learned")
    check_max_length(learned, 32)
    with pytest.raises(ValueError, match=r"max_length=64 is beyond what runs/learned can score"):
        check_max_length(learned, 64)
    # A masked-LM run: its kind predicts no next token.
    masked = helpers.tiny_config(data_dir, "train.objective=masked_lm", "model.causal=False")
    fake = types.SimpleNamespace(config=masked, model=None, workdir="runs/mlm")
    with pytest.raises(ValueError, match="runs/mlm is a masked_lm run .* causal language models"):
        check_run(fake)
    # Translation and classification runs, by their kind.
    from posenc.runs.config import load_config

    for spec, kind in (("translation.py:tiny", "translation"), ("classify.py:tiny", "classif")):
        config = load_config(str(helpers.REPO / "configs" / spec))
        fake = types.SimpleNamespace(config=config, model=None, workdir="runs/x")
        with pytest.raises(ValueError, match=f"runs/x is a {kind}"):
            check_run(fake)


@pytest.mark.slow
def test_refusals_of_a_loaded_run(lm, run_dir):
    # An override evaluation may not change.
    with pytest.raises(ValueError, match="model.num_layers"):
        get_model("posenc").create_from_arg_obj({"workdir": run_dir, "model.num_layers": 3})
    # Sampling.
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until([Instance("generate_until", {}, ("a", {"do_sample": True}), 0)])
    # Ids the model's vocabulary does not have (a tokenizer that is not the model's).
    with pytest.raises(ValueError, match=r"token id 300, outside .* \[0, 257\)"):
        lm.scorer.continuations([([1, 2], [300])])


def test_rolling_windows_are_posenc_evals():
    """The windows over ``[prefix] + document`` are ``posenc eval``'s (posenc.data.eval_windows)
    where the document fills them, and continue them past its end otherwise."""
    from posenc import data as data_lib

    for length, stride in [(16, 16), (16, 4), (8, 3), (5, 5)]:
        scorer = types.SimpleNamespace(max_length=length, stride=stride)
        for n in range(1, 60):
            windows = HarnessScorer.windows(scorer, list(range(n)))
            scored = np.zeros(n, int)
            for start, first in windows:
                scored[start + first : min(start + length, n)] += 1
            assert (scored == 1).all(), (length, stride, n)  # every token once
            if n >= length and (n - length) % stride == 0:  # posenc eval scores it whole
                ev = data_lib.eval_windows(np.zeros(n + 1), length, stride=stride)
                assert ev.dropped_tokens == 0 and ev.num_windows == len(windows)
                assert [s for s, _ in windows] == [k * stride for k in range(ev.num_windows)]


def test_stop_sequences_cut_the_text():
    from posenc.data.tokenizer import ByteTokenizer
    from posenc.harness.model import cut_at_stop

    tok = ByteTokenizer()
    ids = list(b"abc\ndef;ghi") + [SEP] + list(b"jkl")
    assert cut_at_stop(tok, ids, ()) == "abc\ndef;ghi"  # the separator ends a document
    assert cut_at_stop(tok, ids, (";", "\n")) == "abc"  # the first stop in the text wins
    assert cut_at_stop(tok, ids, ("jkl",)) == "abc\ndef;ghi"


def test_report_section_reads_results_under_the_runs(tmp_path):
    """A results file as the harness writes it, under two runs of a sweep folder."""
    from posenc.report.harness import harness_section

    for name, acc in (("rope", 0.25), ("alibi", 0.75)):
        run = tmp_path / name
        (run / "harness" / "model").mkdir(parents=True)
        config = {"encoding": {"name": name}, "train": {"seq_len": 16}}
        (run / "config.json").write_text(json.dumps(config))
        results = {
            "results": {"t": {"alias": "t", "acc,none": acc, "acc_stderr,none": 0.1}},
            "config": {"model": "posenc", "model_args": {"workdir": str(run)}},
        }
        path = run / "harness" / "model" / "results_2026-01-01T00-00-00.json"
        path.write_text(json.dumps(results))
        newer = dict(results, results={"u": {"alias": "u", "bits_per_byte,none": 2 * acc}})
        (path.parent / "results_2026-01-02T00-00-00.json").write_text(json.dumps(newer))
    md = harness_section(str(tmp_path))
    assert "| run | t: acc | u: bits_per_byte |" in md
    assert "| alibi [train 16; alibi] | 0.75 ± 0.1 | 1.5 |" in md
    assert "| rope [train 16; rope] | 0.25 ± 0.1 | 0.5 |" in md


# -- the command line and the report (slow: the harness's own run of a task)

MC_YAML = """\
task: posenc_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""

MC_DOCS = [
    {"question": "def add(a, b):\n    return", "choices": [" a + b", " zzz"], "answer": 0},
    {"question": "import", "choices": [" os", " )))"], "answer": 0},
    {"question": "for i in", "choices": [" range(3):", " ~~"], "answer": 1},
]


def _write_task(folder: Path, dataset_path: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    text = MC_YAML.format(data=data)
    if dataset_path:
        text = text.replace("dataset_path: json", f"dataset_path: {dataset_path}")
        text = text.replace("task: posenc_mc", "task: posenc_remote")
    (folder / "task.yaml").write_text(text)
    return folder


def _expected_acc(run_dir: str) -> float:
    run = load_run(run_dir)
    right = 0
    for doc in MC_DOCS:
        scores = [
            _expected_loglikelihood(run, doc["question"], choice, SEQ_LEN)[0]
            for choice in doc["choices"]
        ]
        right += int(np.argmax(scores) == doc["answer"])
    return right / len(MC_DOCS)


@pytest.mark.slow
def test_harness_cli_writes_results_and_report_tables_them(data_dir, tmp_path):
    sweep = tmp_path / "sweep"
    runs = {
        name: _train(data_dir, sweep / name, f"encoding.name={name}") for name in ("rope", "alibi")
    }
    tasks = _write_task(tmp_path / "tasks")
    for workdir in runs.values():
        code, out, err = helpers.run_cli(
            "harness",
            "run",
            "--model",
            "posenc",
            "--model_args",
            f"workdir={workdir},batch_size=2",
            "--tasks",
            "posenc_mc",
            "--include_path",
            str(tasks),
        )
        assert code == 0, err
        (path,) = glob.glob(
            os.path.join(workdir, "harness", "**", "results_*.json"), recursive=True
        )
        results = json.load(open(path))
        assert results["results"]["posenc_mc"]["acc,none"] == pytest.approx(_expected_acc(workdir))
    from posenc.report import write_report

    paths = write_report(str(sweep))
    report = open(paths[0]).read()
    assert "## lm-evaluation-harness" in report
    for name, workdir in runs.items():
        acc = json.load(
            open(
                glob.glob(os.path.join(workdir, "harness", "**", "results_*.json"), recursive=True)[
                    0
                ]
            )
        )["results"]["posenc_mc"]["acc,none"]
        (row,) = [line for line in report.splitlines() if line.startswith(f"| {name} [")]
        assert f"{acc:.4g}" in row


@pytest.mark.slow
def test_harness_cli_without_cached_data_is_one_line(run_dir, tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    tasks = _write_task(tmp_path / "remote", dataset_path="posenc-tests/not-cached")
    code, out, err = helpers.run_cli(
        "harness",
        "--model",
        "posenc",
        "--model_args",
        f"workdir={run_dir}",
        "--tasks",
        "posenc_remote",
        "--include_path",
        str(tasks),
        "--output_path",
        str(tmp_path / "out"),
    )
    line = helpers.one_line_error(err, "harness")
    assert "posenc_remote is not available offline" in line and "--include_path" in line
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_an_imported_run_with_its_own_tokenizer(tmp_path):
    """``posenc import-hf`` of the tiny golden GPT-2 (a learned table of 64 positions): the
    harness tokenizes with the model's tokenizer, an empty context is its beginning of text, and
    a window past the table is refused."""
    workdir = str(tmp_path / "gpt2")
    golden = helpers.REPO / "tests" / "hf" / "golden" / "gpt2"
    code, _, err = helpers.run_cli("import-hf", str(golden), "--workdir", workdir)
    assert code == 0, err
    lm = get_model("posenc").create_from_arg_string(f"workdir={workdir}")
    run, tok = lm.run, lm.run.tokenizer
    assert lm.max_length == 64 and lm.prefix_token_id == tok.bos_id
    pairs = [("hello", " world"), ("", "hello world")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    for (context, continuation), (logp, _) in zip(pairs, got, strict=True):
        whole = list(tok.encode(context + continuation))
        ctx = list(tok.encode(context)) if context else []
        n = len(whole) - len(ctx)
        tokens = np.asarray(([tok.bos_id] if not context else []) + whole, np.int32)
        want = _log_probs(run, tokens)[0][-n:].sum()
        assert logp == pytest.approx(want, abs=1e-4)
    with pytest.raises(ValueError, match="max_length=65 is beyond what .* can score: .*max_len=64"):
        get_model("posenc").create_from_arg_string(f"workdir={workdir},max_length=65")
