"""`posenc translate`'s input and output files: refused in one line before any decoding (a folder,
a missing folder, the run's own files), and one output line per input line, where lines end at
"\\n" only (as the parallel data reader splits them).

The decoding itself is replaced by a stub that records its calls: what is tested here is what the
command reads, refuses and writes, in seconds."""

from __future__ import annotations

import io
import json
import math
import os

import _train_helpers as helpers
import numpy as np
import pytest

from posenc.kinds import translation


@pytest.fixture
def decoded(monkeypatch):
    """Replaces the decoding with ``line -> "<" + line + ">"``; the list of calls' lines."""
    calls: list[list[str]] = []

    def fake(workdir, lines, **kwargs):
        calls.append(list(lines))
        return [f"<{line}>" for line in lines]

    monkeypatch.setattr(translation, "translate_workdir", fake)
    return calls


@pytest.fixture
def run(tmp_path):
    """A folder standing for a run directory: its config and an evaluation report."""
    path = tmp_path / "run"
    (path / "checkpoints").mkdir(parents=True)
    (path / "config.json").write_text('{"kept": true}')
    (path / "eval.json").write_text('{"bleu": 1}')
    return path


def _translate(run, *argv: str) -> tuple[int, str, str]:
    return helpers.run_cli("translate", "--workdir", str(run), *argv)


@pytest.mark.parametrize(
    "which, make, match",
    [
        ("--input", lambda p: p.mkdir(), "is a folder"),
        ("--input", lambda p: None, "does not exist"),
        ("--output", lambda p: p.mkdir(), "is a folder"),
        ("--output", lambda p: None, None),  # a new file: fine
    ],
)
def test_input_and_output_paths_are_checked_before_decoding(
    tmp_path, run, decoded, which, make, match
):
    path = tmp_path / "given"
    make(path)
    source = tmp_path / "src.txt"
    source.write_text("hello\n")
    args = ["--input", str(source), "--output", str(tmp_path / "out.txt")]
    args[args.index(which) + 1] = str(path)
    code, _, err = _translate(run, *args)
    if match is None:
        assert code == 0, err
        assert path.read_text() == "<hello>\n"
        return
    line = helpers.one_line_error(err, "translate")
    assert code == 2 and match in line and str(path) in line and which in line
    assert decoded == []  # refused before any decoding


def test_an_output_in_a_missing_folder_is_refused_before_decoding(tmp_path, run, decoded):
    source = tmp_path / "src.txt"
    source.write_text("hello\n")
    target = tmp_path / "missing" / "dir" / "x.txt"
    code, _, err = _translate(run, "--input", str(source), "--output", str(target))
    line = helpers.one_line_error(err, "translate")
    assert code == 2 and str(target.parent) in line and "does not exist" in line
    assert decoded == [] and not target.parent.exists()


@pytest.mark.parametrize(
    "name", ["config.json", "eval.json", "checkpoints/x.txt", "eval.hypotheses.txt", "posenc.lock"]
)
def test_the_runs_own_files_are_refused_as_output(tmp_path, run, decoded, name):
    source = tmp_path / "src.txt"
    source.write_text("hello\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    # Through a path that names the run differently (a ".." in it), as a user might.
    target = os.path.join(str(run), "checkpoints", os.pardir, name)
    code, _, err = _translate(run, "--input", str(source), "--output", target)
    line = helpers.one_line_error(err, "translate")
    assert code == 2 and "the run's own" in line and name.split("/")[0] in line
    assert decoded == []
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert json.loads((run / "config.json").read_text()) == {"kept": True}


def test_lines_end_at_newline_only_so_outputs_stay_aligned(tmp_path, run, decoded):
    # U+2028, U+0085, \v, \f and a lone \r are inside lines for the data reader; str.splitlines()
    # would split each and shift every later output line.
    lines = ["a\u2028b", "c\x85d", "e\x0bf\x0cg", "h\ri", "", "last"]
    source = tmp_path / "src.txt"
    source.write_bytes(("\n".join(lines[:3]) + "\r\n" + "\n".join(lines[3:]) + "\n").encode())
    out = tmp_path / "out.txt"
    code, _, err = _translate(run, "--input", str(source), "--output", str(out))
    assert code == 0, err
    assert decoded == [lines]
    written = out.read_bytes().decode().split("\n")
    assert written == [f"<{line}>" for line in lines] + [""]


def test_standard_input_is_split_the_same_way(run, decoded, monkeypatch):
    data = "x\u2028y\nz\n".encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    code, out, err = _translate(run)
    assert code == 0, err
    assert decoded == [["x\u2028y", "z"]]
    assert out.split("\n") == ["<x\u2028y>", "<z>", ""]


def test_an_output_holding_a_newline_stays_one_line(tmp_path, run, monkeypatch):
    monkeypatch.setattr(translation, "translate_workdir", lambda w, lines, **k: ["a\nb", "c"])
    source = tmp_path / "src.txt"
    source.write_text("one\ntwo\n")
    out = tmp_path / "out.txt"
    code, _, err = _translate(run, "--input", str(source), "--output", str(out))
    assert code == 0, err
    assert out.read_text().split("\n") == ["a b", "c", ""]


def test_input_that_is_not_utf8_is_named_with_its_line(tmp_path, run, decoded):
    source = tmp_path / "latin1.txt"
    source.write_bytes("ok\nSchöne Grüße\n".encode("latin-1"))
    code, _, err = _translate(run, "--input", str(source))
    line = helpers.one_line_error(err, "translate")
    assert code == 2 and str(source) in line and "line 2" in line and "UTF-8" in line
    assert decoded == []


def test_decoding_shows_its_progress_in_sentences(monkeypatch, capsys):
    """Decoding a split takes minutes: a bar on stderr counts the sentences decoded."""
    from posenc.data.pair_batching import encode_pairs
    from posenc.data.vocab import ByteVocab

    vocab = ByteVocab()
    pairs = encode_pairs([("a" * n, "") for n in (3, 30, 5, 60)], vocab)

    def fake(model, batch, vocab, **kwargs):  # every row decodes to "x"
        return np.full((batch["src"].shape[0], 2), [ord("x"), vocab.eos_id], np.int32)

    from flax import nnx

    from posenc import encodings
    from posenc.layers.config import ModelConfig
    from posenc.models.encdec import EncoderDecoder

    config = ModelConfig(vocab_size=vocab.vocab_size, num_layers=1, model_dim=32, num_heads=2)
    model = EncoderDecoder(config, encodings.get("rope"), rngs=nnx.Rngs(0))
    monkeypatch.setattr(translation, "decode_batch", fake)
    out = translation.translate_ids(model, pairs, vocab, bucket_step=1.1, progress=True)
    assert out == ["x"] * 4
    err = capsys.readouterr().err
    assert "decoding" in err and "4/4" in err and "sentence" in err
    translation.translate_ids(model, pairs, vocab, bucket_step=1.1)
    assert capsys.readouterr().err == ""  # off unless asked


@pytest.mark.parametrize("alpha", [math.inf, math.nan, -0.5])
def test_a_length_penalty_that_is_not_a_finite_number_is_refused_first(run, alpha):
    """``--alpha inf`` was accepted (``eval.alpha=inf`` is refused in the config)."""
    with pytest.raises(ValueError, match=r"^--alpha must be a finite number >= 0"):
        translation.translate_workdir(str(run), ["a house"], alpha=alpha)
