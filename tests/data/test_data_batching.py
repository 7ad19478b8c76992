"""TrainWindows and eval_windows: determinism, sharding, every token scored exactly once."""

import numpy as np
import pytest

from posenc.data import EvalWindows, TrainWindows, eval_windows


def _stream(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 257, size=n).astype(np.uint16)


def test_train_batch_shapes_dtypes_and_next_token_targets():
    stream = _stream(1000)
    tw = TrainWindows(stream, seq_len=16, global_batch=8, seed=3)
    batch = tw.batch(0)
    assert batch["inputs"].shape == batch["targets"].shape == (8, 16)
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    for row, start in enumerate(tw.global_starts(0)):
        np.testing.assert_array_equal(batch["inputs"][row], stream[start : start + 16])
        np.testing.assert_array_equal(batch["targets"][row], stream[start + 1 : start + 17])


def test_train_windows_depend_only_on_seed_and_step():
    stream = _stream(5000)
    a = TrainWindows(stream, 32, 4, seed=7)
    b = TrainWindows(stream, 32, 4, seed=7)
    # Asking in a different order (as after a resume) gives the same batches.
    later_first = b.batch(9)
    np.testing.assert_array_equal(a.batch(9)["inputs"], later_first["inputs"])
    assert not np.array_equal(a.batch(9)["inputs"], a.batch(10)["inputs"])
    assert not np.array_equal(
        a.batch(9)["inputs"], TrainWindows(stream, 32, 4, 8).batch(9)["inputs"]
    )


def test_starts_cover_the_valid_range():
    stream = _stream(40)
    tw = TrainWindows(stream, seq_len=30, global_batch=64, seed=0)
    starts = np.concatenate([tw.global_starts(s) for s in range(50)])
    # Largest valid start leaves room for the last target: start + seq_len <= len - 1.
    assert starts.min() == 0 and starts.max() == 40 - 30 - 1
    tight = TrainWindows(_stream(11), seq_len=10, global_batch=2, seed=0)
    assert tight.global_starts(0).tolist() == [0, 0]


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_shards_concatenate_to_single_process_batch(process_count):
    stream = _stream(3000)
    whole = TrainWindows(stream, 20, 8, seed=11).batch(5)
    parts = [
        TrainWindows(stream, 20, 8, seed=11, process_index=i, process_count=process_count).batch(5)
        for i in range(process_count)
    ]
    for key in ("inputs", "targets"):
        assert parts[0][key].shape == (8 // process_count, 20)
        np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])


def test_train_errors_name_config_fields():
    with pytest.raises(ValueError, match=r"train\.seq_len=10.*data\.source.*has 10"):
        TrainWindows(_stream(10), seq_len=10, global_batch=1, seed=0)
    with pytest.raises(ValueError, match="multiple of the process count 3"):
        TrainWindows(_stream(100), seq_len=4, global_batch=8, seed=0, process_count=3)
    with pytest.raises(ValueError, match="process_index"):
        TrainWindows(
            _stream(100), seq_len=4, global_batch=8, seed=0, process_index=2, process_count=2
        )


def _scored_positions(w: EvalWindows) -> np.ndarray:
    """Stream positions of every scored target (target j of window k is at start_k + 1 + j)."""
    pos = w.starts[:, None] + 1 + np.arange(w.length)[None, :]
    return pos[w.mask > 0]


@pytest.mark.parametrize(
    ("n", "length", "stride"),
    [(101, 10, None), (100, 10, 10), (57, 8, 3), (64, 16, 1), (33, 32, 5), (1000, 64, 48)],
)
def test_every_target_scored_exactly_once(n, length, stride):
    stream = _stream(n)
    w = eval_windows(stream, length, stride)
    positions = _scored_positions(w)
    assert len(positions) == w.scored_tokens == int(w.mask.sum())
    # Exactly the contiguous positions 1..scored_tokens, each once.
    np.testing.assert_array_equal(np.sort(positions), np.arange(1, w.scored_tokens + 1))
    assert w.scored_tokens + w.dropped_tokens == n - 1
    assert 0 <= w.dropped_tokens < (stride or length)
    # Targets are the stream at the scored positions; inputs are the previous tokens.
    np.testing.assert_array_equal(w.targets[w.mask > 0], stream[positions])
    np.testing.assert_array_equal(w.inputs[w.mask > 0], stream[positions - 1])
    assert w.inputs.dtype == w.targets.dtype == np.int32 and w.mask.dtype == np.float32


def test_non_overlapping_windows_and_dropped_tail():
    stream = np.arange(26, dtype=np.uint16)
    w = eval_windows(stream, 8)
    assert w.starts.tolist() == [0, 8, 16]
    np.testing.assert_array_equal(w.inputs[1], np.arange(8, 16))
    np.testing.assert_array_equal(w.targets[1], np.arange(9, 17))
    assert w.scored_tokens == 24 and w.dropped_tokens == 1  # Position 25 has no window.
    assert w.capped_tokens == 0
    assert (w.mask == 1).all()


def test_sliding_scores_last_stride_targets_after_the_first_window():
    w = eval_windows(np.arange(20, dtype=np.uint16), length=8, stride=3)
    assert w.starts.tolist() == [0, 3, 6, 9]
    assert w.mask[0].tolist() == [1.0] * 8
    assert w.mask[2].tolist() == [0.0] * 5 + [1.0] * 3
    assert (w.scored_tokens, w.dropped_tokens) == (17, 2)


def test_stride_equal_to_length_is_non_overlapping():
    stream = _stream(203)
    a, b = eval_windows(stream, 25), eval_windows(stream, 25, stride=25)
    for key in ("inputs", "targets", "mask", "starts"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    assert (a.scored_tokens, a.dropped_tokens) == (b.scored_tokens, b.dropped_tokens)


def test_max_windows_caps_and_counts_the_rest_as_dropped():
    w = eval_windows(_stream(101), 10, max_windows=3)
    assert w.inputs.shape == (3, 10)
    assert (w.scored_tokens, w.dropped_tokens) == (30, 70)
    assert w.capped_tokens == 70  # 100 predictable tokens fill 10 windows: 7 were capped
    w = eval_windows(_stream(104), 10, stride=4, max_windows=3)  # windows at 0, 4, ..., 92
    assert (w.scored_tokens, w.capped_tokens, w.dropped_tokens) == (18, 84, 103 - 18)


@pytest.mark.parametrize("stride", [None, 4])
def test_iter_batches_pads_with_masked_rows(stride):
    stream = _stream(120)
    w = eval_windows(stream, 10, stride)
    batches = list(w.iter_batches(4))
    assert all(b["inputs"].shape == (4, 10) for b in batches)
    inputs = np.concatenate([b["inputs"] for b in batches])
    mask = np.concatenate([b["mask"] for b in batches])
    n = w.inputs.shape[0]
    np.testing.assert_array_equal(inputs[:n], w.inputs)
    np.testing.assert_array_equal(mask[:n], w.mask)
    assert not mask[n:].any() and not inputs[n:].any()
    assert mask.sum() == w.scored_tokens
    # Two processes: each gets half of every global batch, together the same rows.
    halves = [list(w.iter_batches(4, process_index=i, process_count=2)) for i in range(2)]
    for whole, h0, h1 in zip(batches, *halves, strict=True):
        np.testing.assert_array_equal(np.concatenate([h0["mask"], h1["mask"]]), whole["mask"])
        np.testing.assert_array_equal(
            np.concatenate([h0["targets"], h1["targets"]]), whole["targets"]
        )


def test_eval_works_on_memory_mapped_streams(tmp_path):
    from posenc.data import storage

    path = tmp_path / "s.npy"
    storage.write_stream(path, [b"abc" * 50, b"xyz" * 40])
    mm = storage.load_stream(path)
    w = eval_windows(mm, 16)
    np.testing.assert_array_equal(w.inputs, eval_windows(np.array(mm), 16).inputs)
    assert TrainWindows(mm, 16, 2, seed=0).batch(0)["inputs"].dtype == np.int32


def test_eval_errors_name_config_fields():
    with pytest.raises(ValueError, match=r"eval\.lengths.*length 100.*only 100 tokens"):
        eval_windows(_stream(100), 100)
    assert eval_windows(_stream(101), 100).scored_tokens == 100
    with pytest.raises(ValueError, match="stride 11"):
        eval_windows(_stream(100), 10, stride=11)
    with pytest.raises(ValueError, match="stride 0"):
        eval_windows(_stream(100), 10, stride=0)


def test_memory_segments_count_what_max_tokens_leaves_out():
    from posenc.data import memory_segments

    # 100 predictable tokens in 2 rows of 50: 5 windows of 10 each, 2 kept by the cap.
    m = memory_segments(_stream(101), 10, rows=2, max_tokens=40)
    assert (m.segments, m.scored_tokens, m.capped_tokens, m.dropped_tokens) == (2, 40, 60, 60)
    m = memory_segments(_stream(104), 10, rows=2)  # 103 = 2 x 51 + 1: each row a tail of 1
    assert (m.scored_tokens, m.capped_tokens, m.dropped_tokens) == (100, 0, 3)
