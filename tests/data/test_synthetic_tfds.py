"""SCAN and PCFG of posenc.data.synthetic: the "prepare it" errors, and the one-character-per-word
mapping on hand-made records (no network, no prepared data)."""

from __future__ import annotations

import pytest

from posenc.data import DataNotFoundError, synthetic
from posenc.data.synthetic import tfds_tasks

# Hand-made SCAN records (Lake and Baroni 2018's grammar: "twice" repeats, "after" swaps order).
SCAN_RECORDS = [
    ("jump", "I_JUMP"),
    ("walk twice", "I_WALK I_WALK"),
    ("turn left", "I_TURN_LEFT"),
    ("run after look", "I_LOOK I_RUN"),
    ("jump opposite right", "I_TURN_RIGHT I_TURN_RIGHT I_JUMP"),
    ("look around left and walk thrice", " ".join(["I_TURN_LEFT I_LOOK"] * 4 + ["I_WALK"] * 3)),
]


@pytest.fixture
def empty_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_DATA_DIR", str(tmp_path))
    monkeypatch.delenv(tfds_tasks.PCFG_ENV, raising=False)
    tfds_tasks._scan_pool.cache_clear()
    tfds_tasks._pcfg_data.cache_clear()
    yield tmp_path
    tfds_tasks._scan_pool.cache_clear()
    tfds_tasks._pcfg_data.cache_clear()


def test_unprepared_data_raises_with_prepare_command(empty_data_dir):
    with pytest.raises(DataNotFoundError) as err:
        synthetic.example("scan", 10, 0, 0)
    message = str(err.value)
    assert "\n" not in message
    prepare = (
        f"posenc data prepare tfds:scan/length --text_field commands --data_dir {empty_data_dir}"
    )
    assert prepare in message
    assert (
        f"tfds build scan/length --data_dir={empty_data_dir} --file_format=array_record" in message
    )
    with pytest.raises(DataNotFoundError, match="PCFG SET is not in the TFDS catalog.*tfds build"):
        synthetic.examples("pcfg", 5, 2, 0)


def test_scan_symbols_table():
    assert tfds_tasks.scan_symbols(
        "jump around left twice and walk", "I_TURN_LEFT I_JUMP I_WALK"
    ) == (
        "jal2nw",
        "<JW",
    )
    assert len(set(synthetic.alphabet("scan"))) == 13 + 6
    with pytest.raises(ValueError, match="'fly' is not in posenc's SCAN table"):
        tfds_tasks.scan_symbols("fly", "I_FLY")


def test_scan_examples_from_records(empty_data_dir, monkeypatch):
    def fake_records(name, splits, fields, prepare):
        assert name == "scan/length" and fields == ("commands", "actions")
        yield from SCAN_RECORDS

    monkeypatch.setattr(tfds_tasks, "_read_records", fake_records)
    assert synthetic.example("scan", 2, 0, 0) in {("w2", "WW"), ("ufk", "KU")}
    assert synthetic.example("scan", 3, 5, 1) == ("jor", ">>J")
    assert synthetic.examples("scan", 11, 2, 0) == [("kalnw3", "<K<K<K<KWWW")] * 2
    pairs = {synthetic.example("scan", 2, 0, i) for i in range(40)}
    assert pairs == {("w2", "WW"), ("ufk", "KU")}
    with pytest.raises(ValueError, match="'scan' has no examples of length 4"):
        synthetic.example("scan", 4, 0, 0)
    batch = synthetic.eval_batch("scan", 3, 1, seed=0)
    assert batch["inputs"].shape == (1, 9 + 1 + 3)


def test_pcfg_examples_from_records(empty_data_dir, monkeypatch):
    records = [
        ("copy A1 B2", "A1 B2"),
        ("reverse A1 B2", "B2 A1"),
        ("append echo C3 , A1", "C3 C3 A1"),
    ]
    monkeypatch.setenv(tfds_tasks.PCFG_ENV, "my_pcfg/productivity")

    def fake_records(name, splits, fields, prepare):
        assert name == "my_pcfg/productivity" and fields == ("source", "target")
        yield from records

    monkeypatch.setattr(tfds_tasks, "_read_records", fake_records)
    # Sorted words: , A1 B2 C3 append copy echo reverse -> ! " # $ % & ' (
    assert synthetic.alphabet("pcfg") == "!\"#$%&'("
    # Length: the number of function words (Kazemnejad et al.'s productivity categories).
    one = {synthetic.example("pcfg", 1, 0, i) for i in range(30)}
    assert one == {('&"#', '"#'), ('("#', '#"')}
    assert synthetic.example("pcfg", 2, 0, 0) == ("%'$!\"", '$$"')
    assert synthetic.max_input_length("pcfg", 2) == 5
    assert synthetic.max_target_length("pcfg", 1) == 2
    with pytest.raises(ValueError, match="'pcfg' has no examples of length 3"):
        synthetic.example("pcfg", 3, 0, 0)


def test_pcfg_char_table_limit():
    assert tfds_tasks.pcfg_char_table(["b", "a"]) == {"a": "!", "b": '"'}
    assert len(tfds_tasks.PCFG_CHARS) == 189
    with pytest.raises(ValueError, match="190 distinct words"):
        tfds_tasks.pcfg_char_table([f"w{i}" for i in range(190)])
