"""Labelled sources and BERT rows: tsv: folders read and refused row by row, labels, the
embedded text-order task, truncation, batches."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from posenc.data import DataNotFoundError
from posenc.data.classify_batching import (
    CLS_ID,
    ClassifyBatches,
    encode_examples,
    encode_row,
    eval_batches,
)
from posenc.data.labelled import encode_labels, get_labelled_source, label_classes
from posenc.data.labelled_default import CLASSES, text_order_examples
from posenc.data.tokenizer import SEP_ID


def _folder(tmp_path, train, validation, test=None):
    for name, text in (("train", train), ("validation", validation), ("test", test)):
        if text is not None:
            (tmp_path / f"{name}.tsv").write_text(text)
    return f"tsv:{tmp_path}"


PAIRS = "id\ttext\ttext_b\tlabel\n1\ta b\tc\t10\n2\td\te f\t2\n3\tg\th\t10\n"


def test_tsv_pairs_read_with_integer_classes_in_numeric_order(tmp_path):
    spec = _folder(tmp_path, PAIRS, "text\ttext_b\tlabel\nx\ty\t2\n")
    source = get_labelled_source(spec)
    train = source.examples("train")
    assert source.pair and source.splits == ("train", "validation")
    assert [(e.text, e.text_b, e.label) for e in train][1] == ("d", "e f", "2")
    classes = label_classes(source, train)
    assert classes == ("2", "10"), "integers in numeric order, not string order"
    assert encode_labels(train, classes, "train").tolist() == [1, 0, 1]
    assert encode_labels(source.examples("validation"), classes, "validation").tolist() == [0]


def test_class_names_sorted_and_regression_reads_numbers(tmp_path):
    spec = _folder(tmp_path, "text\tlabel\na\tpos\nb\tneg\n", "text\tlabel\nc\tpos\n")
    source = get_labelled_source(spec)
    assert label_classes(source, source.examples("train")) == ("neg", "pos")
    spec = _folder(tmp_path, "text\tlabel\na\t3.8\nb\t0\n", "text\tlabel\nc\t1.5\n")
    out = encode_labels(get_labelled_source(spec).examples("train"), None, "train")
    assert out.dtype == np.float32 and out.tolist() == pytest.approx([3.8, 0.0])


@pytest.mark.parametrize(
    "train,validation,split,match",
    [
        ("text\tlab\na\t1\n", "text\tlabel\n", "train", r"train.tsv, line 1: no column 'label'"),
        (PAIRS, "text\tlabel\nx\t2\n", "validation", r"validation.tsv, line 1: no column 'text_b'"),
        ("text\tlabel\na\t1\nb\n", "text\tlabel\n", "train", r"train.tsv, line 3: 1 tab-separat"),
        ("text\tlabel\na\t1\nb\t\n", "text\tlabel\n", "train", r"train.tsv, line 3: empty label"),
        (
            "text\tlabel\na\t1\n",
            "text\tlabel\nb\t1\nc\t7\n",
            "validation",
            r"validation.tsv, line 3",
        ),
    ],
)
def test_bad_rows_are_refused_in_one_line_naming_file_and_line(
    tmp_path, train, validation, split, match
):
    source = get_labelled_source(_folder(tmp_path, train, validation))
    with pytest.raises(ValueError, match=match) as err:
        examples = source.examples(split)
        encode_labels(examples, label_classes(source, source.examples("train")), split)
    assert "\n" not in str(err.value)


def test_unseen_label_and_non_numeric_regression_name_the_row(tmp_path):
    source = get_labelled_source(_folder(tmp_path, "text\tlabel\na\tyes\n", "text\tlabel\nb\tno\n"))
    with pytest.raises(ValueError, match=r"validation.tsv, line 2: label 'no' is not among.*yes"):
        encode_labels(source.examples("validation"), ("yes",), "validation")
    with pytest.raises(ValueError, match=r"train.tsv, line 2: label 'yes' is not a number"):
        encode_labels(source.examples("train"), None, "train")


def test_missing_folder_file_and_test_split_say_what_to_do(tmp_path):
    with pytest.raises(DataNotFoundError, match="no folder .*train.tsv and validation.tsv"):
        get_labelled_source(f"tsv:{tmp_path / 'nope'}")
    (tmp_path / "train.tsv").write_text("text\tlabel\na\t1\n")
    with pytest.raises(DataNotFoundError, match=r"no .*validation.tsv; the folder holds"):
        get_labelled_source(f"tsv:{tmp_path}")
    (tmp_path / "validation.tsv").write_text("text\tlabel\na\t1\n")
    with pytest.raises(DataNotFoundError, match=r"no test split: add .*test.tsv"):
        get_labelled_source(f"tsv:{tmp_path}").examples("test")
    with pytest.raises(ValueError, match="not a labelled source"):
        get_labelled_source("pystdlib")


def test_an_unlabelled_test_split_reads_as_unlabelled(tmp_path):
    spec = _folder(tmp_path, "text\tlabel\na\t1\n", "text\tlabel\nb\t1\n", "text\nc\n")
    test = get_labelled_source(spec).examples("test")
    assert encode_labels(test, ("1",), "test").tolist() == [-1]


def test_text_order_examples_hold_the_same_bytes_either_way():
    words = b" ".join(b"w%d" % (i % 37) + b"x" * (i % 5) for i in range(3000))
    stream = np.frombuffer(words, np.uint8).astype(np.uint16)
    examples = text_order_examples(stream, 400, (16, 62), seed=0, where="t")
    again = text_order_examples(stream, 400, (16, 62), seed=0, where="t")
    assert [e.text for e in examples] == [e.text for e in again]
    counts = collections.Counter(e.label for e in examples)
    assert set(counts) == set(CLASSES) and abs(counts["reversed"] - 200) < 40
    for e in examples:
        assert 16 <= len(e.text.encode()) <= 62
        assert e.text != e.text[::-1], "a palindrome has no order to tell"
    long = text_order_examples(stream, 400, (16, 254), seed=1, where="t")
    sizes = np.array([len(e.text) for e in long])
    assert (sizes <= 64).mean() > 0.3 and (sizes > 128).mean() > 0.2, "log-uniform lengths"


def test_rows_follow_bert_and_truncate_the_longer_text():
    ids, segs = encode_row(np.array([1, 2]), None, max_len=None)
    assert ids.tolist() == [CLS_ID, 1, 2, SEP_ID] and segs.tolist() == [0, 0, 0, 0]
    ids, segs = encode_row(np.arange(1, 6), np.array([9, 9]), max_len=8)
    # budget 5 = 8 - 3 specials: a (5) loses 2 tokens; b (2) keeps both.
    assert ids.tolist() == [CLS_ID, 1, 2, 3, SEP_ID, 9, 9, SEP_ID]
    assert segs.tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    # 8 and 4 tokens in a budget of 6: a shrinks to 4, then they shrink in turn (b first on a tie).
    ids, _ = encode_row(np.arange(1, 9), np.arange(11, 15), max_len=9)
    assert ids.tolist() == [CLS_ID, 1, 2, 3, SEP_ID, 11, 12, 13, SEP_ID]


def _encoded(n):
    from posenc.data.labelled import Example

    examples = [Example("x" * (i + 1), None, str(i % 2), "") for i in range(n)]
    return encode_examples(examples, np.arange(n) % 2)


def test_training_batches_visit_each_example_once_per_epoch_and_split_over_processes():
    data = _encoded(12)
    whole = ClassifyBatches(data, seq_len=8, global_batch=4, seed=3)
    seen = np.concatenate([whole.indices(step) for step in range(3)])
    assert sorted(seen.tolist()) == list(range(12)), "one epoch = every example once"
    assert whole.indices(3).tolist() != seen[:4].tolist(), "the next epoch is reshuffled"
    halves = [
        ClassifyBatches(data, 8, 4, 3, process_index=p, process_count=2).indices(1) for p in (0, 1)
    ]
    assert np.concatenate(halves).tolist() == whole.indices(1).tolist()
    batch = whole.batch(0)
    assert batch["inputs"].shape == (4, 8) and batch["mask"].sum(1).max() == 8, "truncated"
    assert (batch["inputs"][:, 0] == CLS_ID).all()


def test_eval_batches_put_each_example_in_its_length_bucket():
    data = _encoded(12)  # rows of 3 .. 14 tokens
    seen = {}
    for k, indices, batch in eval_batches(data, [4, 8, 12], batch_tokens=16):
        assert batch["inputs"].shape[1] == [4, 8, 12][k]
        for i in indices[indices >= 0]:
            seen[int(i)] = k
    lengths = data.lengths
    assert sorted(seen) == list(range(12))
    assert all(seen[i] == (0 if n <= 4 else 1 if n <= 8 else 2) for i, n in enumerate(lengths))


def test_a_header_repeated_in_the_body_is_skipped_with_a_warning_naming_the_line(tmp_path):
    """Two files concatenated (cat a.tsv b.tsv > train.tsv): the second header is not a row
    whose label is the column name 'label'."""
    from posenc.data.labelled import RepeatedHeaderWarning

    body = "text\tlabel\na\tpos\nb\tneg\n"
    source = get_labelled_source(_folder(tmp_path, body + " text \t label \nc\tpos\n", body))
    with pytest.warns(RepeatedHeaderWarning, match=r"train.tsv, line 4 repeats the header"):
        train = source.examples("train")
    assert [(e.text, e.label) for e in train] == [("a", "pos"), ("b", "neg"), ("c", "pos")]
    assert label_classes(source, train) == ("neg", "pos")


def test_text_that_is_not_utf8_names_file_and_line(tmp_path):
    (tmp_path / "train.tsv").write_bytes("text\tlabel\nok\tpos\nSchön\tneg\n".encode("latin-1"))
    (tmp_path / "validation.tsv").write_text("text\tlabel\nb\tpos\n")
    with pytest.raises(ValueError, match=r"train.tsv is not UTF-8 text \(line 3") as err:
        get_labelled_source(f"tsv:{tmp_path}").examples("train")
    assert "\n" not in str(err.value)
    (tmp_path / "train.tsv").write_bytes("tëxt\tlabel\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"train.tsv is not UTF-8 text \(line 1"):
        get_labelled_source(f"tsv:{tmp_path}")


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-Infinity"])
def test_a_regression_label_that_is_not_finite_names_the_row(tmp_path, value):
    spec = _folder(tmp_path, f"text\tlabel\na\t1.5\nb\t{value}\n", "text\tlabel\nc\t1\n")
    examples = get_labelled_source(spec).examples("train")
    with pytest.raises(ValueError, match=rf"train.tsv, line 3: label '{value}' is not a finite"):
        encode_labels(examples, None, "train")
