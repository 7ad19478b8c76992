"""posenc.report.curves: training curves grouped by configuration, seeds as a spread."""

from __future__ import annotations

import os
import statistics

import pytest

from posenc.report import curves
from posenc.workdir import write_json


def _point(sweep_dir, name, encoding, seed, losses):
    point = os.path.join(sweep_dir, name)
    os.makedirs(point)
    write_json(
        os.path.join(point, "config.json"),
        {"seed": seed, "encoding": {"name": encoding}, "train": {"progress": False}},
    )
    with open(os.path.join(point, "metrics.jsonl"), "w") as f:
        for step, loss in losses.items():
            f.write(f'{{"step": {step}, "loss": {loss}}}\n')
    return {"dir": name, "status": "done"}


@pytest.fixture
def sweep(tmp_path):
    points = [
        _point(tmp_path, "a0", "rope", 0, {10: 3.0, 20: 2.0}),
        _point(tmp_path, "a1", "rope", 1, {10: 3.2, 20: 2.4}),
        _point(tmp_path, "b0", "learned", 0, {10: 3.5, 20: 2.9}),
        _point(tmp_path, "b1", "learned", 1, {10: 3.7, 20: 3.1, 30: 2.5}),
    ]
    write_json(os.path.join(tmp_path, "sweep.json"), {"points": points})
    return str(tmp_path)


def test_points_equal_but_for_the_seed_form_one_curve(sweep):
    found = curves.find_curves(sweep)
    assert [c.label for c in found] == ["encoding.name=rope", "encoding.name=learned"]
    rope, learned = found
    assert rope.steps() == [10, 20] and learned.steps() == [10, 20], "steps every seed logged"
    mean, spread, n = rope.at(20)
    assert (mean, n) == (pytest.approx(2.2), 2)
    assert spread == pytest.approx(statistics.stdev([2.0, 2.4]))
    assert learned.at(30) == (2.5, None, 1)


def test_the_table_gives_mean_and_spread_per_step(sweep):
    table = curves.loss_table(curves.find_curves(sweep), [10, 20], digits=2)
    assert table[0].split("|")[1:-1] == [
        " step ",
        " encoding.name=rope ",
        " encoding.name=learned ",
    ]
    row = [cell.strip() for cell in table[3].split("|")[1:-1]]
    assert row == ["20", "2.20 ± 0.28", "3.00 ± 0.14"]


def test_the_plot_is_written(sweep, tmp_path):
    path = str(tmp_path / "curves.png")
    curves.plot_curves(path, curves.find_curves(sweep), "test")
    assert os.path.getsize(path) > 1000


def test_a_sweep_without_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run `posenc sweep` first"):
        curves.find_curves(str(tmp_path))
    write_json(os.path.join(tmp_path, "sweep.json"), {"points": [{"dir": "x"}]})
    with pytest.raises(FileNotFoundError, match="has logged metrics.jsonl"):
        curves.find_curves(str(tmp_path))


def test_the_convergence_report_has_a_table_and_a_plot_per_panel(sweep, tmp_path):
    out = str(tmp_path / "out")
    paths = curves.convergence_report(out, [("panel one", sweep), ("panel two", sweep)])
    text = open(paths[0]).read()
    assert text.count("| step |") == 2 and "## panel one" in text and "## panel two" in text
    assert [os.path.basename(p) for p in paths[1:]] == ["curves_1.png", "curves_2.png"]
    # Default steps: quarters of the steps both curves logged (10 and 20 here).
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("|  ")]
    assert rows == ["10", "20", "10", "20"]


def test_labels_leave_out_hyperparameters_that_only_one_encoder_has():
    learned = {"encoding.name": "learned", "encoding.hparams.max_len": 64, "seed": 0}
    rope = {"encoding.name": "rope", "encoding.hparams.max_len": None, "seed": 0}
    assert curves._labels([learned, rope]) == ["encoding.name=learned", "encoding.name=rope"]
    # ... but keep one that tells two configurations of the same encoder apart.
    short = {**learned, "encoding.hparams.max_len": 32}
    assert curves._labels([learned, short, rope]) == [
        "encoding.hparams.max_len=64, encoding.name=learned",
        "encoding.hparams.max_len=32, encoding.name=learned",
        "encoding.hparams.max_len=None, encoding.name=rope",
    ]


def test_the_curves_plot_has_no_offset_notation(tmp_path, monkeypatch):
    """Losses close together over steps in the tens of thousands: matplotlib's default ticks
    read ``+2e4`` and ``+1.01e3`` (offset notation); the plot writes the numbers themselves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [_point(tmp_path, "a0", "rope", 0, {20000 + i: 1010 + i / 100 for i in range(5)})]
    write_json(os.path.join(tmp_path, "sweep.json"), {"points": points})
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    curves.plot_curves(str(tmp_path / "c.png"), curves.find_curves(str(tmp_path)), "t")
    (fig,) = figures
    fig.canvas.draw()
    (ax,) = fig.axes
    assert ax.xaxis.get_offset_text().get_text() == ""
    assert ax.yaxis.get_offset_text().get_text() == ""
