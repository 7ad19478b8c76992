"""posenc.data.summary: every file of every split listed with its size, the split rule stated,
evaluation splits too small to measure flagged (by posenc data prepare and by evaluation)."""

import warnings

import pytest

from posenc.cli import main
from posenc.data import prepare, summary
from posenc.runs.config import check_eval_lengths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Six files of known sizes (split by hash: no split folders), prepared."""
    root = tmp_path_factory.mktemp("summary")
    folder = root / "texts"
    folder.mkdir()
    sizes = {}
    for i in range(6):
        text = f"document {i} " * (200 * (i + 1))
        (folder / f"doc{i}.txt").write_text(text)
        sizes[f"doc{i}.txt"] = len(text.encode())
    return folder, root / "data", sizes, prepare(f"textdir:{folder}", root / "data")


def test_every_file_is_listed_under_its_split_with_its_size(corpus):
    folder, _, sizes, source = corpus
    lines, _ = summary.describe(source)
    text = "\n".join(lines)
    split_of = {rel: split for split, rels in source.files.items() for rel in rels}
    assert sorted(split_of) == sorted(sizes)
    current = None
    for line in lines[1:]:
        if not line.startswith("      ") and ":" in line:
            current = line.split(":")[0].strip()
        elif line.strip().startswith("doc"):
            name, size = line.split()[0], int(line.split("(")[1].split()[0].replace(",", ""))
            assert split_of[name] == current and size == sizes[name]
    for split, rels in source.files.items():
        # One byte-level token per byte, plus the separator after each document.
        tokens = sum(sizes[r] for r in rels) + len(rels)
        assert source.info()["splits"][split]["tokens"] == tokens
        assert f"  {split}: {tokens:,} tokens, {len(rels)} file" in text
    assert "rule: whole files, by a hash (sha256) of each file's relative path" in text


def test_thin_splits_follow_the_stated_rule():
    info = {"splits": {"validation": {"tokens": 129}, "test": {"tokens": 128}}}
    # (129 - 1) // 32 = 4 windows: enough; (128 - 1) // 32 = 3: flagged.
    (line,) = summary.thin_splits(info, longest=32)
    assert line.startswith("the test split holds 128 tokens: 3 windows of 32 tokens, fewer than 4")
    assert summary.thin_lengths(129, [16, 32, 33, 64, 200]) == [33, 64]  # 3, 2 windows
    with pytest.warns(summary.ThinSplitWarning, match=r"\(3 at L = 33, 2 at L = 64; fewer"):
        check_eval_lengths(129, [32, 33, 64], "validation")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_eval_lengths(129, [8, 32], "validation")  # no warning


def test_data_info_prints_the_splits_and_warns(corpus, capsys):
    folder, data_dir, sizes, source = corpus
    argv = ["data", "info", f"textdir:{folder}", "--data-dir", str(data_dir)]
    assert main([*argv, "--longest", "100000"]) == 0
    out, err = capsys.readouterr()
    for name, size in sizes.items():
        assert f"{name} ({size:,} bytes)" in out
    smallest = min(("validation", "test"), key=lambda s: source.info()["splits"][s]["tokens"])
    assert f"posenc: warning: the {smallest} split holds" in err and "fewer than 4" in err
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "doc0.txt" in out and "fewer than 4" not in err


def test_an_evaluation_file_repeating_a_training_file_is_named(tmp_path):
    from posenc.data.files import split_by_hash

    folder = tmp_path / "texts"
    folder.mkdir()
    names = [f"n{i}.txt" for i in range(40)]
    split = split_by_hash(names)
    copy, original = split["validation"][0], split["train"][0]
    for i, name in enumerate(names):
        (folder / name).write_text(f"text {i} " * 50)
    (folder / copy).write_text((folder / original).read_text())
    other = split["train"][1]  # same size as the copy, other bytes: not a repeat
    (folder / other).write_text((folder / original).read_text().replace("text", "TEXT"))
    _, lines = summary.describe(prepare(f"textdir:{folder}", tmp_path / "data"))
    repeats = [line for line in lines if "byte for byte" in line]
    assert repeats == [
        f"1 file(s) of the validation split repeat a train file byte for byte ({copy} = "
        f"{original}): the model trains on that text; remove the copies"
    ]
