"""BERT's masked-LM corruption (posenc.data.masking): the 15/80/10/10 rule in statistics over
many draws, random replacements uniform over the real ids, determinism per (seed, step) and per
evaluation window, and multi-process rows equal to the single-process batch."""

import numpy as np
import pytest
from scipy import stats

from posenc.data import MASK_ID, MaskedLM, TrainWindows, eval_windows

TOKEN = 65  # every test window is this byte, so any other id in the inputs was put there


def _stream(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 257, size=n).astype(np.uint16)


@pytest.fixture(scope="module")
def draws():
    """4000 windows of 256 identical tokens (1,024,000 tokens) from 40 steps of 100 rows."""
    windows = np.full((100, 256), TOKEN, np.int32)
    batches = [MaskedLM(seed=5).train_batch(windows, step) for step in range(40)]
    inputs = np.concatenate([b["inputs"] for b in batches])
    chosen = np.concatenate([b["weights"] for b in batches]) == 1.0
    return inputs, chosen


def test_fifteen_percent_are_chosen_and_scored(draws):
    inputs, chosen = draws
    n = chosen.size
    # Bernoulli(0.15) per token: the fraction is within 5 standard errors (sqrt(p(1-p)/n)).
    bound = 5 * np.sqrt(0.15 * 0.85 / n)
    assert abs(chosen.mean() - 0.15) < bound, (chosen.mean(), bound)
    # Tokens not chosen are never touched.
    assert (inputs[~chosen] == TOKEN).all()


def test_chosen_tokens_are_80_percent_masked_10_random_10_kept(draws):
    inputs, chosen = draws
    picked = inputs[chosen]
    c = picked.size
    masked = (picked == MASK_ID).mean()
    # A random replacement equal to the original (1 in 257 of them) looks kept.
    random_seen = ((picked != MASK_ID) & (picked != TOKEN)).mean()
    kept_seen = (picked == TOKEN).mean()
    expected = {"masked": 0.8, "random": 0.1 * 256 / 257, "kept": 0.1 + 0.1 / 257}
    for name, got in (("masked", masked), ("random", random_seen), ("kept", kept_seen)):
        p = expected[name]
        bound = 5 * np.sqrt(p * (1 - p) / c)  # 5 standard errors of a share of c draws
        assert abs(got - p) < bound, (name, got, p, bound)


def test_random_replacements_are_uniform_over_the_real_ids(draws):
    inputs, chosen = draws
    replaced = inputs[chosen & (inputs != MASK_ID) & (inputs != TOKEN)]
    assert replaced.min() >= 0 and replaced.max() <= 256  # never the mask token 257
    counts = np.bincount(replaced, minlength=257)
    assert counts[TOKEN] == 0 and (np.delete(counts, TOKEN) > 0).all()  # every other real id
    assert counts[256] > 0  # the document separator is a real id
    # Uniform over the 256 ids other than TOKEN: a chi-square test at the 1e-4 level.
    observed = np.delete(counts, TOKEN)
    assert stats.chisquare(observed).pvalue > 1e-4


def test_masking_depends_only_on_seed_and_step():
    windows = _stream(40 * 32).reshape(40, 32).astype(np.int32)
    a = MaskedLM(seed=3).train_batch(windows, step=7)
    again = MaskedLM(seed=3).train_batch(windows, step=7)
    for key in ("inputs", "targets", "weights"):
        np.testing.assert_array_equal(a[key], again[key])
    np.testing.assert_array_equal(a["targets"], windows)  # the window itself, not shifted
    assert a["inputs"].dtype == a["targets"].dtype == np.int32 and a["weights"].dtype == np.float32
    for other in (MaskedLM(seed=3).train_batch(windows, 8), MaskedLM(4).train_batch(windows, 7)):
        assert not np.array_equal(a["weights"], other["weights"])


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_rows_concatenate_to_the_single_process_batch(process_count):
    stream = _stream(3000)
    seed, step, batch = 11, 5, 8

    def masked(index, count):
        tw = TrainWindows(stream, 24, batch, seed, process_index=index, process_count=count)
        first_row = tw.process_index * tw.local_batch
        return MaskedLM(seed).train_batch(tw.batch(step)["inputs"], step, first_row)

    whole = masked(0, 1)
    parts = [masked(i, process_count) for i in range(process_count)]
    for key in ("inputs", "targets", "weights"):
        np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])


def test_evaluation_masks_depend_on_the_window_not_the_batching():
    stream = _stream(16 * 13 + 1)
    windows = eval_windows(stream, 16)  # 13 windows
    lm = MaskedLM(seed=2)

    def by_window(batch_size, process_index=0, process_count=1):
        out = {}
        batches = windows.iter_batches(batch_size, process_index, process_count, with_starts=True)
        for raw in batches:
            batch = lm.eval_batch(raw, 16)
            for row, start in enumerate(raw["starts"]):
                if start < 0:  # a padding row: nothing chosen, nothing scored
                    assert batch["mask"][row].sum() == 0
                    continue
                np.testing.assert_array_equal(batch["targets"][row], stream[start : start + 16])
                out[int(start)] = (batch["inputs"][row], batch["mask"][row])
        return out

    one = by_window(5)  # 3 batches, the last with 2 padding rows
    assert sorted(one) == list(range(0, 16 * 13, 16))
    for other in (by_window(13), {**by_window(4, 0, 2), **by_window(4, 1, 2)}):
        assert sorted(other) == sorted(one)
        for start, (inputs, mask) in one.items():
            np.testing.assert_array_equal(other[start][0], inputs)
            np.testing.assert_array_equal(other[start][1], mask)
    chosen = np.concatenate([mask for _, mask in one.values()])
    assert 0 < chosen.mean() < 0.4  # about 15 % of 208 tokens


def test_evaluation_masks_keep_only_the_scored_positions():
    # Sliding windows score the last `stride` positions (all of window 0): the chosen ones there.
    stream = _stream(200)
    windows = eval_windows(stream, 32, stride=8)
    for raw in windows.iter_batches(4, with_starts=True):
        batch = MaskedLM(seed=0).eval_batch(raw, 32)
        assert ((batch["mask"] == 1.0) <= (raw["mask"] == 1.0)).all()
        later = raw["starts"] > 0
        assert (batch["mask"][later, :24] == 0).all()
