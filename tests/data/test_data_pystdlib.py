"""pystdlib: file selection, deterministic disjoint split, content hash, cache."""

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from posenc.data import ByteTokenizer, get_source, storage
from posenc.data.files import content_sha256, split_by_hash
from posenc.data.pystdlib import PyStdlibSource, list_stdlib_files, stdlib_root

EXCLUDED = [
    "test/test_os.py",
    "test/support/helper.py",
    "pkg/tests/data.py",
    "idlelib/idle_test/test_x.py",
    "idlelib/idle_test/mock.py",
    "pkg/test_thing.py",
    "site-packages/thirdparty.py",
    "config-3.11-x86_64-linux-gnu/python-config.py",
    "_sysconfigdata__linux.py",
    "notes.txt",
    ".hidden.py",
]


def _fake_stdlib(root: Path, n: int = 80) -> list[str]:
    """Writes n modules plus files that must be excluded; returns the included paths."""
    included = []
    for i in range(n):
        rel = f"mod{i:03d}.py" if i % 3 else f"pkg{i % 4}/sub{i:03d}.py"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# module {i} ✓\nVALUE = {i}\n")
        included.append(rel)
    for rel in EXCLUDED:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("EXCLUDED = True\n")
    return sorted(included)


def test_listing_excludes_tests_site_packages_and_build_config(tmp_path):
    included = _fake_stdlib(tmp_path)
    assert list_stdlib_files(tmp_path) == included


def test_split_is_deterministic_disjoint_and_complete(tmp_path):
    included = _fake_stdlib(tmp_path)
    a = PyStdlibSource(tmp_path / "d1", root=tmp_path)
    b = PyStdlibSource(tmp_path / "d2", root=tmp_path)
    assert a.files == b.files
    assert a.files == split_by_hash(reversed(included))  # Order of listing is irrelevant.
    sets = [set(a.files[s]) for s in ("train", "validation", "test")]
    assert sets[0].isdisjoint(sets[1]) and sets[0].isdisjoint(sets[2])
    assert sets[1].isdisjoint(sets[2])
    assert set().union(*sets) == set(included)
    assert all(sets), "every split gets files"
    assert len(sets[0]) > len(sets[1]) and len(sets[0]) > len(sets[2])


def test_split_stream_is_encoded_files_in_sorted_order(tmp_path):
    _fake_stdlib(tmp_path)
    src = PyStdlibSource(tmp_path / "data", root=tmp_path)
    for split in src.splits:
        texts = [(tmp_path / rel).read_text() for rel in src.files[split]]
        stream = src.split_stream(split)
        assert stream.dtype == np.uint16
        np.testing.assert_array_equal(stream, ByteTokenizer().encode_documents(texts))


def test_content_hash_tracks_content_not_location(tmp_path):
    root_a, root_b = tmp_path / "a", tmp_path / "b"
    _fake_stdlib(root_a)
    _fake_stdlib(root_b)
    data = tmp_path / "data"
    a = PyStdlibSource(data, root=root_a)
    assert PyStdlibSource(data, root=root_b).content_sha256 == a.content_sha256
    (root_b / "mod001.py").write_text("# changed\n")
    changed = PyStdlibSource(data, root=root_b)
    assert changed.content_sha256 != a.content_sha256
    assert changed.cache_dir != a.cache_dir
    (root_b / "mod001.py").write_text((root_a / "mod001.py").read_text())
    (root_b / "mod001.py").rename(root_b / "mod001_renamed.py")
    assert PyStdlibSource(data, root=root_b).content_sha256 != a.content_sha256


def test_content_hash_framing_distinguishes_boundaries():
    assert content_sha256([("a", b"bc")]) != content_sha256([("ab", b"c")])
    assert content_sha256([("a", b"x"), ("b", b"")]) != content_sha256([("a", b"xb")])


def test_info_is_json_and_counts_match(tmp_path):
    _fake_stdlib(tmp_path)
    src = PyStdlibSource(tmp_path / "data", root=tmp_path)
    info = json.loads(json.dumps(src.info()))
    assert info["spec"] == "pystdlib"
    assert info["content_sha256"] == src.content_sha256
    for split in ("train", "validation", "test"):
        assert info["splits"][split]["files"] == len(src.files[split])
        assert info["splits"][split]["tokens"] == len(src.split_stream(split))


def test_second_open_loads_cache_without_rebuilding(tmp_path, monkeypatch):
    _fake_stdlib(tmp_path)
    first = PyStdlibSource(tmp_path / "data", root=tmp_path)
    train = np.array(first.split_stream("train"))

    def fail(*args, **kwargs):
        raise AssertionError("cache was rebuilt")

    monkeypatch.setattr(storage, "write_stream", fail)
    second = PyStdlibSource(tmp_path / "data", root=tmp_path)
    np.testing.assert_array_equal(second.split_stream("train"), train)


def test_concurrent_builds_agree_and_leave_no_temp_files(tmp_path):
    _fake_stdlib(tmp_path / "lib")
    data = tmp_path / "data"
    results, errors = [], []

    def build():
        try:
            results.append(
                np.array(PyStdlibSource(data, root=tmp_path / "lib").split_stream("train"))
            )
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=build) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    assert not [p for p in data.rglob("*") if ".tmp-" in p.name]


def test_real_stdlib(tmp_path):
    src = get_source("pystdlib", data_dir=tmp_path)
    info = src.info()
    counts = {s: info["splits"][s]["files"] for s in src.splits}
    assert sum(counts.values()) > 300
    assert counts["validation"] > 0 and counts["test"] > 0
    for split in src.splits:
        for rel in src.files[split]:
            parts = rel.split("/")
            assert not {"test", "tests", "idle_test", "site-packages"} & set(parts), rel
            assert not parts[-1].startswith("test_"), rel
    assert "os.py" in set().union(*map(set, src.files.values()))
    assert str(stdlib_root()) == info["root"]
    assert info["splits"]["train"]["tokens"] > 1_000_000


def test_missing_root_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        PyStdlibSource(tmp_path / "data", root=tmp_path / "nope")


def test_split_by_hash_fills_every_split_of_small_folders():
    for n in (3, 4, 7):
        files = [f"f{i}.txt" for i in range(n)]
        split = split_by_hash(files)
        assert all(split[s] for s in ("train", "validation", "test")), (n, split)
        assert sorted(sum(split.values(), [])) == sorted(files)
        assert split == split_by_hash(list(reversed(files)))
    two = split_by_hash(["a", "b"])
    assert sorted(sum(two.values(), [])) == ["a", "b"]
