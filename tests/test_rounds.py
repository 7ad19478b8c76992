"""posenc.benchmark.rounds: the interleaving order, the fastest of each slot's repeats, and
ratios to the baseline taken within each round (no JAX: the figures are fake clocks)."""

from __future__ import annotations

import statistics

import pytest

from posenc.benchmark import rounds


def _fake(figures_seconds, log):
    """Calls that log ``(encoder, figure)`` and return the next of their scripted seconds."""
    scripts = {key: iter(values) for key, values in figures_seconds.items()}

    def call(key):
        def fn():
            log.append(key)
            return next(scripts[key])

        return fn

    return {key: call(key) for key in figures_seconds}


def test_rounds_rotate_the_encoders_figure_by_figure_and_keep_each_slots_fastest_run():
    encoders = ["nope", "a", "b"]
    # Two repeats per slot and two rounds: four scripted runs per (encoder, figure).
    script = {(e, f): [2.0, 1.0, 5.0, 3.0] for e in encoders for f in ("train", 16)}
    log = []
    seconds, loads = rounds.time_rounds(_fake(script, log), encoders, rounds=2, repeats=2)
    assert len(loads) == 3  # per round, and once after the last
    # Round 0: nope a b for each figure; round 1 rotated: a b nope. Each slot called twice.
    slots = log[::2]
    assert log[1::2] == slots
    assert slots == [
        *[(e, "train") for e in ("nope", "a", "b")],
        *[(e, 16) for e in ("nope", "a", "b")],
        *[(e, "train") for e in ("a", "b", "nope")],
        *[(e, 16) for e in ("a", "b", "nope")],
    ]
    assert all(times == [1.0, 3.0] for times in seconds.values())  # min of each slot's pair


def test_ratios_are_taken_within_each_round():
    """A round where the machine is twice as slow for everyone changes no ratio, though the
    medians of the seconds alone would put the encoders at another ratio."""
    seconds = {
        ("nope", 16): [1.0, 2.0, 4.0],
        ("shaw", 16): [1.5, 3.0, 6.0],  # 1.5x NoPE in every round
        ("t5", 16): [4.0, 1.0, 1.0],
    }
    rows = {row["encoder"]: row for row in rounds.summarise(seconds, "nope")}
    assert rows["shaw"]["ratio_median"] == rows["shaw"]["ratio_min"] == 1.5
    assert rows["shaw"]["median"] == 3.0 and rows["shaw"]["max"] == 6.0
    assert rows["t5"]["ratio_median"] == pytest.approx(statistics.median([4.0, 0.5, 0.25]))
    assert (rows["t5"]["ratio_min"], rows["t5"]["ratio_max"]) == (0.25, 4.0)
    assert rows["nope"]["ratio_median"] == 1.0
