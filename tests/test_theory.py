"""Tests for posenc.analysis.theory: RoFormer's long-term decay bound (arXiv 2104.09864, Sec.
3.4.3)."""

from __future__ import annotations

import cmath
import csv
import importlib.util
import pathlib

import numpy as np
import pytest

from posenc.analysis.theory import rope_partial_sums, rope_relative_upper_bound, rope_thetas

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "roformer_decay.py"


def _naive_partial_sums(distances, dim, base):
    """S_j for j = 1..dim/2 by two Python loops over complex scalars."""
    thetas = [base ** (-2.0 * i / dim) for i in range(dim // 2)]
    rows = []
    for r in distances:
        s, row = 0j, []
        for theta in thetas:
            s += cmath.exp(1j * float(r) * theta)
            row.append(s)
        rows.append(row)
    return np.array(rows, dtype=np.complex128)


def _load_script():
    spec = importlib.util.spec_from_file_location("roformer_decay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_thetas_follow_base_power_minus_2i_over_d():
    thetas = rope_thetas(8, 10000.0)
    assert thetas.shape == (4,)
    assert thetas.dtype == np.float64
    np.testing.assert_allclose(thetas, [1.0, 0.1, 0.01, 0.001], rtol=1e-15)


@pytest.mark.parametrize("dim", [2, 6, 64, 128])
def test_partial_sums_equal_naive_double_loop(dim):
    rng = np.random.default_rng(dim)
    base = float(rng.uniform(10.0, 1e6))
    # Integers, negatives and fractions: the definition holds for any real distance.
    distances = np.concatenate(
        [[0.0], rng.integers(-5000, 5000, size=12), rng.uniform(-300.0, 300.0, size=12)]
    )
    got = rope_partial_sums(distances, dim, base)
    want = _naive_partial_sums(distances, dim, base)
    assert got.shape == (distances.size, dim // 2)
    assert got.dtype == np.complex128
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    # The bound is the mean of |S_j|, computed the slow way too.
    np.testing.assert_allclose(
        rope_relative_upper_bound(distances, dim, base),
        np.abs(want).mean(axis=1),
        rtol=1e-12,
    )


@pytest.mark.parametrize("dim", [2, 4, 10, 64, 128, 256])
def test_bound_at_distance_zero_is_mean_of_j(dim):
    # r = 0: every term is 1, |S_j| = j, mean over j = 1..d/2 is (d/2 + 1) / 2.
    half = dim // 2
    assert rope_relative_upper_bound(0, dim)[0] == pytest.approx((half + 1) / 2, rel=1e-15)


def test_bound_is_even_and_largest_at_zero():
    r = np.arange(1, 3001)
    pos = rope_relative_upper_bound(r)
    neg = rope_relative_upper_bound(-r)
    np.testing.assert_allclose(pos, neg, rtol=1e-12)
    assert np.all(pos < rope_relative_upper_bound(0)[0])


def test_paper_figure_values_d128_base10000():
    # Golden values from _naive_partial_sums (Python complex loop), d = 128, base 10000.
    # A theta exponent of 2(i+1)/d or 2i/(d-2) instead of 2i/d moves these in the 3rd digit.
    golden = {
        1: 31.53816614265808,
        10: 17.95413713708483,
        50: 12.629452488319242,
        100: 10.227329948505133,
        250: 6.548179031941596,
    }
    got = rope_relative_upper_bound(list(golden), dim=128, base=10000.0)
    np.testing.assert_allclose(got, list(golden.values()), rtol=1e-10)


def test_paper_long_term_decay_d128_base10000():
    bound = rope_relative_upper_bound(np.arange(251), dim=128, base=10000.0)
    near, far = bound[:21].mean(), bound[200:].mean()
    # The paper's claim: far-apart pairs have a much smaller bound than near ones.
    assert far < 0.3 * bound[0]
    assert far < 0.5 * near
    # ...and by how much. With theta_i = base^(-i/d) (the exponent off by 2) the curve
    # drops faster: near ~15.2, far ~4.2; with base 1000, near ~17.9, far ~5.4.
    assert 19.0 < near < 21.0
    assert 7.0 < far < 9.0
    # Oscillating, not monotone: the decay is only on average.
    assert np.any(np.diff(bound) > 0)


def test_abel_summation_identity_and_bound():
    rng = np.random.default_rng(0)
    dim = 64
    half = dim // 2
    distances = rng.uniform(-2000.0, 2000.0, size=50)
    sums = rope_partial_sums(distances, dim)  # [N, d/2]: column i holds S_{i+1}
    phases = np.exp(1j * distances[:, None] * rope_thetas(dim)[None, :])  # [N, d/2]
    bound = rope_relative_upper_bound(distances, dim)
    monotone = np.sort(rng.uniform(0.0, 3.0, size=half))[::-1]
    complex_h = rng.normal(size=half) + 1j * rng.normal(size=half)
    for h in (monotone, -monotone, complex_h):
        logit = phases @ h  # [N]: sum_i h_i e^{i r theta_i}
        diffs = np.diff(np.append(h, 0.0))  # h_{i+1} - h_i with h_{d/2} = 0
        np.testing.assert_allclose(logit, -(sums @ diffs), rtol=1e-9, atol=1e-9)
        envelope = np.abs(diffs).max() * half * bound  # max|dh| * sum_j |S_j|
        assert np.all(np.abs(logit) <= envelope * (1 + 1e-12))
        # The bound is attained at r = 0 only for very special h; generically it is slack.
        assert np.abs(logit).max() < envelope.max()


def test_abel_bound_needs_the_boundary_term():
    # Constant h: all interior differences vanish, yet the logit at r = 0 is d/2 * h. The
    # bound holds only because h_{d/2} = 0 makes the last difference -h.
    dim = 16
    h = np.full(dim // 2, 2.0)
    logit = abs(h.sum())
    assert np.abs(np.diff(h)).max() == 0.0
    envelope = 2.0 * (dim // 2) * rope_relative_upper_bound(0, dim)[0]
    assert logit <= envelope


def test_larger_base_decays_more_slowly():
    bases = (10000.0, 500000.0, 1000000.0)
    r = np.arange(2**16 + 1)
    bounds = [rope_relative_upper_bound(r, 128, b) for b in bases]
    for d in (50, 250):
        values = [b[d] for b in bounds]
        assert values == sorted(values) and len(set(values)) == 3, (d, values)
    # Pointwise the curves cross (they oscillate); octave averages are strictly ordered.
    for k in range(16):
        band = slice(2**k, 2 ** (k + 1))
        means = [b[band].mean() for b in bounds]
        assert means[0] < means[1] < means[2], (k, means)


def test_blocked_computation_matches_single_block():
    # More rows than one internal block, so the block seam is exercised.
    r = np.arange(20000) * 3.7
    whole = rope_relative_upper_bound(r, 32, 500.0)
    pieces = np.concatenate(
        [rope_relative_upper_bound(r[i : i + 997], 32, 500.0) for i in range(0, r.size, 997)]
    )
    assert whole.shape == (20000,)
    np.testing.assert_array_equal(whole, pieces)


@pytest.mark.parametrize("dim", [0, 1, 3, 127, -2, 2.0, 2.5, True, "128"])
def test_bad_dim_raises(dim):
    with pytest.raises(ValueError, match=r"dim must be an even integer >= 2"):
        rope_thetas(dim)
    with pytest.raises(ValueError, match=r"dim must be an even integer >= 2"):
        rope_relative_upper_bound([0, 1], dim=dim)


@pytest.mark.parametrize("base", [0.0, -10000.0, float("nan"), float("inf"), "big"])
def test_bad_base_raises(base):
    with pytest.raises(ValueError, match=r"base must be a finite number > 0"):
        rope_thetas(8, base)
    with pytest.raises(ValueError, match=r"base must be a finite number > 0"):
        rope_partial_sums([0, 1], 8, base)


@pytest.mark.parametrize(
    ("distances", "message"),
    [
        (np.zeros((2, 3)), "1-D array"),
        ([1 + 2j], "real numbers"),
        ([0.0, float("nan")], "finite"),
    ],
)
def test_bad_distances_raise(distances, message):
    with pytest.raises(ValueError, match=message):
        rope_relative_upper_bound(distances)


def test_script_writes_csv_equal_to_library(tmp_path, capsys):
    script = _load_script()
    out = tmp_path / "decay"
    argv = ["--out", str(out), "--max-distance", "60", "--long-max-distance", "300"]
    assert script.main([*argv, "--dim", "32", "--bases", "10000,500000"]) == 0

    with (out / "roformer_fig2.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["distance", "base_10000", "base_500000"]
    table = np.array(rows[1:], dtype=np.float64)
    np.testing.assert_array_equal(table[:, 0], np.arange(61))
    for col, base in ((1, 10000.0), (2, 500000.0)):
        np.testing.assert_array_equal(
            table[:, col], rope_relative_upper_bound(np.arange(61), 32, base)
        )

    long = np.loadtxt(out / "roformer_decay_long.csv", delimiter=",", skiprows=1)
    assert long.shape == (301, 3)
    np.testing.assert_array_equal(long[:61], table)

    for name in ("roformer_fig2.png", "roformer_decay_bases.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "8.500" in printed  # (d/2 + 1) / 2 at distance 0 for d = 32
    assert "r=250" not in printed  # beyond --max-distance


@pytest.mark.parametrize("bad", [["--bases", "10000,-1"], ["--dim", "7"], ["--bases", "x"]])
def test_script_rejects_bad_arguments(tmp_path, bad):
    script = _load_script()
    with pytest.raises(SystemExit) as excinfo:
        script.main(["--out", str(tmp_path), *bad])
    assert excinfo.value.code == 2
