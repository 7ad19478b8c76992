"""Token-bucketed pair batches: contents, determinism per (seed, step), epochs, shapes, padding."""

import numpy as np
import pytest

from posenc.data import (
    ByteVocab,
    PairBatches,
    bucket_boundaries,
    encode_pairs,
    eval_pair_batches,
    get_parallel_source,
)

VOCAB = ByteVocab()


@pytest.fixture(scope="module")
def default_train():
    return encode_pairs(get_parallel_source("parallel:default").pairs("train"), VOCAB)


@pytest.fixture(scope="module")
def small():
    pairs = get_parallel_source("parallel:default").pairs("validation")
    return pairs, encode_pairs(pairs, VOCAB)


def decode_row(ids, mask):
    return bytes(int(i) for i in ids[mask] if i < 256).decode()


def test_batch_rows_hold_the_pairs_with_bos_eos_and_masks(small):
    pairs, data = small
    batches = PairBatches(data, 1024, seed=0, row_multiple=4)
    batch = batches.batch(3)
    assert set(batch) == {"src", "src_mask", "tgt_in", "tgt_out", "tgt_mask", "index"}
    rows, s_len = batch["src"].shape
    assert rows % 4 == 0 and batch["tgt_in"].shape == batch["tgt_out"].shape
    assert batch["src"].dtype == np.int32 and batch["src_mask"].dtype == bool
    for r, i in enumerate(batch["index"]):
        if i < 0:  # an empty row: all padding
            assert not batch["src_mask"][r].any() and not batch["tgt_mask"][r].any()
            continue
        src, tgt = pairs[i]
        n, m = len(src.encode()), len(tgt.encode())
        assert decode_row(batch["src"][r], batch["src_mask"][r]) == src
        assert batch["src"][r, n] == VOCAB.eos_id and batch["src_mask"][r].sum() == n + 1
        assert batch["tgt_in"][r, 0] == VOCAB.bos_id
        assert batch["tgt_out"][r, m] == VOCAB.eos_id and batch["tgt_mask"][r].sum() == m + 1
        np.testing.assert_array_equal(batch["tgt_in"][r, 1 : m + 1], batch["tgt_out"][r, :m])
        assert decode_row(batch["tgt_out"][r], batch["tgt_mask"][r]) == tgt
        assert (batch["src"][r, n + 1 :] == VOCAB.pad_id).all(), "padding on the right"


def test_batches_are_a_pure_function_of_seed_and_step(small):
    _, data = small
    steps = [0, 7, 3, 250, 1, 7]
    first = PairBatches(data, 1024, seed=5)
    a = {s: first.batch(s) for s in steps}
    second = PairBatches(data, 1024, seed=5)  # a resumed run: a fresh object, another order
    for s in reversed(steps):
        for key, value in second.batch(s).items():
            np.testing.assert_array_equal(value, a[s][key])
    other = PairBatches(data, 1024, seed=6)
    assert any(not np.array_equal(other.batch(s)["index"], a[s]["index"]) for s in steps), (
        "the seed matters"
    )


def test_every_kept_pair_once_per_epoch_and_shapes_bounded(small):
    _, data = small
    batches = PairBatches(data, 1024, seed=1, max_src_len=90, row_multiple=2)
    kept = np.flatnonzero(data.src_lengths <= 90)
    np.testing.assert_array_equal(batches.kept, kept)
    n = batches.batches_per_epoch
    for epoch in (0, 1):
        seen = np.concatenate([batches.batch(epoch * n + k)["index"] for k in range(n)])
        seen = seen[seen >= 0]
        np.testing.assert_array_equal(np.sort(seen), kept)  # each kept pair exactly once
    orders = [np.concatenate([batches.batch(e * n + k)["index"] for k in range(n)]) for e in (0, 1)]
    assert not np.array_equal(orders[0], orders[1]), "each epoch is shuffled anew"
    shapes = {
        batches.batch(k)["src"].shape + batches.batch(k)["tgt_in"].shape[1:] for k in range(n)
    }
    assert shapes <= set(batches.shapes)
    assert len(batches.shapes) <= len(bucket_boundaries(91, 8, 1.1))
    assert all(rows % 2 == 0 and rows * max(s, t) <= 1024 for rows, s, t in batches.shapes)


def test_padding_report_counts_the_batches_and_is_small_on_the_default_corpus(default_train):
    batches = PairBatches(default_train, 2048, seed=0)
    report = batches.padding_report()
    # Count the slots of an actual epoch.
    src_slots = tgt_slots = src_tokens = tgt_tokens = 0
    for k in range(batches.batches_per_epoch):
        b = batches.batch(k)
        src_slots += b["src"].size
        tgt_slots += b["tgt_out"].size
        src_tokens += int(b["src_mask"].sum())
        tgt_tokens += int(b["tgt_mask"].sum())
    assert (report["src_slots"], report["tgt_slots"]) == (src_slots, tgt_slots)
    assert (report["src_tokens"], report["tgt_tokens"]) == (src_tokens, tgt_tokens)
    assert report["padding"] == pytest.approx(
        1 - (src_tokens + tgt_tokens) / (src_slots + tgt_slots)
    )
    # The budget: at most about 10 % of the slots are padding (measured: 7.4 %).
    assert report["padding"] < 0.10
    assert report["shapes"] <= 40
    short = PairBatches(default_train, 2048, seed=0, max_src_len=64).padding_report()
    assert short["pairs"] == int(np.sum(default_train.src_lengths <= 64))
    assert short["padding"] < 0.10  # measured: 8.9 %


def test_process_shares_make_up_the_global_batch(small):
    _, data = small
    whole = PairBatches(data, 1024, seed=2, row_multiple=4)
    parts = [
        PairBatches(data, 1024, seed=2, row_multiple=4, process_index=i, process_count=2)
        for i in range(2)
    ]
    for step in (0, 9):
        for key, value in whole.batch(step).items():
            joined = np.concatenate([p.batch(step)[key] for p in parts])
            np.testing.assert_array_equal(joined, value)


def test_eval_batches_cover_the_split_once_and_restore_order(small):
    pairs, data = small
    for targets in (True, False):
        batches = eval_pair_batches(data, 1024, targets=targets, row_multiple=2)
        out = [None] * len(pairs)
        for b in batches:
            assert ("tgt_in" in b) == targets and len(b["index"]) % 2 == 0
            for r, i in enumerate(b["index"]):
                if i >= 0:
                    assert out[i] is None
                    out[i] = decode_row(b["src"][r], b["src_mask"][r])
        assert out == [s for s, _ in pairs]
        shapes = {b["src"].shape for b in batches}
        assert len(shapes) <= len(bucket_boundaries(int(data.src_lengths.max()) + 1, 8, 1.1))
        lengths = [b["src"].shape[1] for b in batches]
        assert lengths == sorted(lengths), "sorted by length"


def test_refusals(small):
    _, data = small
    with pytest.raises(ValueError, match=r"data.max_src_len=3 .* keeps none of the 1000"):
        PairBatches(data, 1024, seed=0, max_src_len=3)
    with pytest.raises(
        ValueError, match="row multiple 3 must be a positive multiple of the process"
    ):
        PairBatches(data, 1024, seed=0, row_multiple=3, process_count=2)
    with pytest.raises(ValueError, match="train.tokens_per_batch must be positive"):
        PairBatches(data, 0, seed=0)
