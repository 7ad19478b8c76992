"""STRING (An et al. 2024) as ``posenc eval`` overrides of RoPE (``encoding.hparams.string_shift``
and ``string_window``, eval-safe): on a trained tiny RoPE run and on an imported Llama (the golden
folder), the loss at every position nearer than the shift to its first key is RoPE's and the
loss past it changes; the evaluation records the change and a report column names it."""

from __future__ import annotations

from pathlib import Path

import _train_helpers as helpers
import numpy as np
import pytest

from posenc.report.runs import describe_changes
from posenc.runs.train import train
from posenc.workdir import RunDir

GOLDEN = Path(__file__).resolve().parent / "hf" / "golden"
WORDS = "def add return the quick brown fox jumps over lazy dog a b".split()


def _ok(*argv: str) -> str:
    code, out, err = helpers.run_cli(*argv)
    assert code == 0, err
    return out


def _evaluate(workdir: str, output: str, *flags: str) -> dict:
    """``posenc eval`` into ``output``; ``{length: result}``."""
    _ok("eval", "--workdir", workdir, f"--output={output}", *flags)
    report = RunDir(workdir).read_eval(output)
    return report, {r["length"]: r for r in report["results"]}


def _assert_rope_within_and_string_past(plain: dict, shifted: dict, shift: int) -> None:
    """Per length: the loss at positions ``< shift`` (every key nearer than S) equal, past it
    different somewhere, and the mean loss different."""
    for length, want in plain.items():
        got = shifted[length]
        before, after = np.asarray(want["loss_by_position"]), np.asarray(got["loss_by_position"])
        np.testing.assert_allclose(after[:shift], before[:shift], rtol=0, atol=2e-5)
        assert np.abs(after[shift:] - before[shift:]).max() > 1e-3, length
        assert got["loss"] != pytest.approx(want["loss"], rel=1e-6)


@pytest.fixture(scope="module")
def trained_rope(tmp_path_factory):
    data_dir = helpers.build_pystdlib(tmp_path_factory.mktemp("pystdlib"))
    workdir = str(tmp_path_factory.mktemp("rope") / "run")
    train(helpers.tiny_config(data_dir, "train.steps=2", "eval.lengths=16,64"), workdir)
    return workdir


def test_string_on_a_trained_rope_run(trained_rope):
    _, plain = _evaluate(trained_rope, "plain.json")
    flags = (
        "--config.encoding.hparams.string_shift=6",
        "--config.encoding.hparams.string_window=2",
    )
    report, shifted = _evaluate(trained_rope, "string.json", *flags)
    assert report["changes"] == {
        "encoding.hparams.string_shift": 6,
        "encoding.hparams.string_window": 2,
    }
    assert describe_changes("rope", report["changes"], 16) == "string S=6 W=2"
    _assert_rope_within_and_string_past(plain, shifted, 6)


def test_a_bad_string_override_is_one_line(trained_rope):
    code, _, err = helpers.run_cli(
        "eval", "--workdir", trained_rope, "--config.encoding.hparams.string_shift=6"
    )
    line = helpers.one_line_error(err, "eval")
    assert code == 2 and "encoding.hparams.string_window must be an integer in" in line, err


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


def test_string_on_an_imported_llama(tmp_path, corpus):
    """The golden Llama (trained length 32) imported, then scored at 32 and 64 tokens."""
    workdir = tmp_path / "run"
    _ok(
        "import-hf",
        str(GOLDEN / "llama"),
        "--workdir",
        str(workdir),
        f"--data=textdir:{corpus / 'texts'}",
        f"--config.data.data_dir={tmp_path / 'data'}",
    )
    lengths = ("--lengths=32,64", "--max-tokens=256")
    _, plain = _evaluate(str(workdir), "plain.json", *lengths)
    flags = (
        "--config.encoding.hparams.string_shift=12",
        "--config.encoding.hparams.string_window=4",
    )
    report, shifted = _evaluate(str(workdir), "string.json", *lengths, *flags)
    assert report["changes"]["encoding.hparams.string_shift"] == 12
    _assert_rope_within_and_string_past(plain, shifted, 12)
