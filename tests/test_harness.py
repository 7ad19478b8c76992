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


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return helpers.build_pystdlib(tmp_path_factory.mktemp("harness_data"))


def _train(data_dir, workdir, *overrides):
    from posenc.runs.train import train

    config = helpers.tiny_config(data_dir, "train.steps=4", "train.checkpoint_every=4", *overrides)
    train(config, str(workdir))
    return str(workdir)


@pytest.fixture(scope="session")
def run_dir(data_dir, tmp_path_factory):
    """One tiny RoPE run (length 16), shared by every test here."""
    return _train(data_dir, tmp_path_factory.mktemp("harness_run") / "rope")


@pytest.fixture(scope="session")
def lm(run_dir):
    return get_model("posenc").create_from_arg_string(f"workdir={run_dir},batch_size=4")


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


def test_loglikelihood_is_the_sum_of_posenc_log_probs(lm, run_dir):
    run = load_run(run_dir)
    pairs = [
        ("def add(a, b):", " return a + b"),
        ("import os ", "path"),  # a trailing space moves to the continuation
        ("", "class A:"),  # an empty context: the document separator
        ("x = 1\n" * 5, "y = 2"),  # longer than max_length + 1: the last 17 tokens kept
    ]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got = lm.loglikelihood(requests, disable_tqdm=True)
    for pair, (logp, greedy) in zip(pairs, got, strict=True):
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


@pytest.mark.parametrize("mode", ["nonoverlapping", "sliding"])
def test_loglikelihood_rolling_is_posenc_eval_on_the_same_document(lm, run_dir, mode):
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
        run, harness = load_run(run_dir), lm
    want = _posenc_eval_loss(run, stream, SEQ_LEN, mode, stride)
    (got,) = harness.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert -got == pytest.approx(want, rel=1e-5)


def test_rolling_tail_scores_as_a_longer_stream_would(run_dir):
    """A document whose tail does not fill a window: each token's loss is the one posenc eval
    gives it on a longer stream (the padded last window reads no padding)."""
    run = load_run(run_dir)
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


def test_generate_until_is_greedy_generate_cut_at_the_stop_sequence(lm, run_dir):
    run = load_run(run_dir)
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


def test_harness_refusals(run_dir, tmp_path, data_dir):
    # Not a run directory.
    with pytest.raises(Exception, match="config.json|not a|work directory"):
        get_model("posenc").create_from_arg_string(f"workdir={tmp_path}")
    # A model argument posenc does not know.
    with pytest.raises(ValueError, match="model argument 'pretrained'"):
        get_model("posenc").create_from_arg_string(f"workdir={run_dir},pretrained=gpt2")
    # An override evaluation may not change.
    with pytest.raises(ValueError, match="model.num_layers"):
        get_model("posenc").create_from_arg_obj({"workdir": run_dir, "model.num_layers": 3})
    # Sampling.
    lm = get_model("posenc").create_from_arg_string(f"workdir={run_dir}")
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until([Instance("generate_until", {}, ("a", {"do_sample": True}), 0)])
    # max_length past a learned position table.
    config = helpers.tiny_config(data_dir, "encoding.name=learned", "encoding.hparams.max_len=32")
    learned = types.SimpleNamespace(model=helpers.initial_model(config), workdir="runs/learned")
    check_max_length(learned, 32)
    with pytest.raises(ValueError, match=r"max_length=64 is beyond what runs/learned can score"):
        check_max_length(learned, 64)
    # A masked-LM run (its kind predicts no next token).
    masked = helpers.tiny_config(data_dir, "train.objective=masked_lm", "model.causal=False")
    fake = types.SimpleNamespace(config=masked, model=None, workdir="runs/mlm")
    with pytest.raises(ValueError, match="runs/mlm is a masked_lm run .* causal language models"):
        check_run(fake)


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
