"""textdir: prepared into a TFDS array_record data set, read back through tfds.data_source."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from posenc.data import ByteTokenizer, DataNotFoundError, get_source, prepare
from posenc.data.textdir import TextdirSource

DOCS = {
    "a.txt": "first document\n",
    "nested/deeper/b.txt": "héllo wörld ✓ 日本語 🙂\n",
    "notes.md": "# a markdown file counts as text\n",
    "empty.txt": "",
}


def _write_folder(root: Path, n_extra: int = 30) -> dict[str, str]:
    docs = dict(DOCS)
    for i in range(n_extra):
        docs[f"extra/e{i:02d}.txt"] = f"extra document {i}\n" * (i + 1)
    for rel, text in docs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return docs


def test_end_to_end_through_tfds_array_record(tmp_path):
    import tensorflow_datasets as tfds

    folder = tmp_path / "corpus"
    docs = _write_folder(folder)
    data = tmp_path / "data"
    with pytest.warns(UserWarning, match=r"skipped 2 files.*image.bin"):
        src = prepare(f"textdir:{folder}", data)
    assert isinstance(src, TextdirSource)
    assert "tensorflow" not in sys.modules, "TFDS must work without TensorFlow"

    shards = sorted(p.name for p in src.tfds_dir.rglob("*.array_record-*"))
    assert shards == [
        f"posenc_textdir-{s}.array_record-00000-of-00001" for s in ("test", "train", "validation")
    ]
    assert (
        json.loads(next(src.tfds_dir.rglob("dataset_info.json")).read_text())["fileFormat"]
        == "array_record"
    )

    assigned = [rel for split in src.splits for rel in src.files[split]]
    assert sorted(assigned) == sorted(docs), "every text file in exactly one split"
    for split in ("train", "validation", "test"):
        # Read back through TFDS itself, as another program would.
        ds = tfds.data_source("posenc_textdir", split=split, data_dir=str(src.tfds_dir))
        texts = [ds[i]["text"].decode("utf-8") for i in range(len(ds))]
        assert texts == [docs[rel] for rel in src.files[split]]
        np.testing.assert_array_equal(
            src.split_stream(split), ByteTokenizer().encode_documents(texts)
        )

    info = json.loads(json.dumps(src.info()))
    assert info["skipped_files"] == 2 and info["layout"] == "hash"
    assert sum(info["splits"][s]["files"] for s in src.splits) == len(docs)
    assert info["splits"]["train"]["tokens"] == len(src.split_stream("train"))


def test_reopen_uses_prepared_data_and_changes_make_a_new_one(tmp_path, monkeypatch):
    folder = tmp_path / "corpus"
    _write_folder(folder, n_extra=5)
    data = tmp_path / "data"
    with pytest.warns(UserWarning):
        first = get_source(f"textdir:{folder}", data)
    train = np.array(first.split_stream("train"))

    from posenc.data.textdir_builder import PosencTextdir

    def fail(*args, **kwargs):
        raise AssertionError("prepared twice")

    monkeypatch.setattr(PosencTextdir, "download_and_prepare", fail)
    again = get_source(f"textdir:{folder}", data)
    assert again.root == first.root
    np.testing.assert_array_equal(again.split_stream("train"), train)

    monkeypatch.undo()
    (folder / "a.txt").write_text("first document, edited and longer\n")
    with pytest.warns(UserWarning):
        edited = get_source(f"textdir:{folder}", data)
    assert edited.root != first.root
    assert edited.content_sha256 != first.content_sha256


def test_split_folders_define_the_splits(tmp_path):
    folder = tmp_path / "corpus"
    layout = {
        "train/x.txt": "train x\n",
        "train/sub/y.txt": "train y\n",
        "valid/v.txt": "valid v\n",
        "test/t.txt": "test t\n",
        "README.txt": "outside the split folders\n",
    }
    for rel, text in layout.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    with pytest.warns(UserWarning, match="README.txt"):
        src = get_source(f"textdir:{folder}", tmp_path / "data")
    assert src.meta["layout"] == "split_dirs"
    assert src.files == {
        "train": ["train/sub/y.txt", "train/x.txt"],
        "validation": ["valid/v.txt"],
        "test": ["test/t.txt"],
    }
    assert ByteTokenizer().decode_documents(src.split_stream("validation")) == ["valid v\n", ""]


def test_missing_split_folder_gives_clear_error(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "a.txt").write_text("only training text\n")
    src = get_source(f"textdir:{folder}", tmp_path / "data")
    assert src.splits == ("train",)
    with pytest.raises(ValueError, match=r"no 'validation' split.*\['train'\]"):
        src.split_stream("validation")


def test_missing_folder_and_not_prepared(tmp_path):
    with pytest.raises(DataNotFoundError, match="not a folder"):
        get_source(f"textdir:{tmp_path / 'nope'}", tmp_path / "data")
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("text\n")
    with pytest.raises(DataNotFoundError, match="posenc data prepare textdir:"):
        TextdirSource(tmp_path / "data", folder, prepare_if_missing=False)
    (folder / "a.txt").write_bytes(b"\x00\x01")
    with pytest.warns(UserWarning), pytest.raises(DataNotFoundError, match="no UTF-8 text"):
        get_source(f"textdir:{folder}", tmp_path / "data")


def test_a_file_or_a_folder_too_small_to_split_is_one_clear_error(tmp_path):
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "a.txt").write_text("some text\n" * 100)
    with pytest.raises(ValueError, match=r"has 1 text file\(s\) and no train/.*at least 3") as info:
        get_source(f"textdir:{folder}", tmp_path / "data")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "data" / "posenc" / "textdir").exists() or not any(
        (tmp_path / "data" / "posenc" / "textdir").glob("*/tfds/*")
    ), "nothing was prepared"
    with pytest.raises(ValueError, match=r"is a file; textdir: takes a folder"):
        get_source(f"textdir:{folder / 'a.txt'}", tmp_path / "data")
    # With split folders one file per split is enough.
    for split in ("train", "validation"):
        (folder / split).mkdir()
        (folder / split / "b.txt").write_text(f"{split} text\n" * 100)
    with pytest.warns(UserWarning, match=r"1 files outside the split folders"):
        source = get_source(f"textdir:{folder}", tmp_path / "data")
    assert source.splits == ("train", "validation")
