"""The README's code runs: its sweep template loads and validates, its Python API section runs
against a tiny trained run."""

import re

import pytest
from _train_helpers import REPO

from posenc import sweep


def readme_block(heading: str, language: str = "python") -> str:
    """The first ``language`` code block of the README section under ``heading``."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(r"\n#{1,3} ", section, maxsplit=1)[0]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"no {language} block under {heading!r}"
    return match.group(1)


def test_the_sweep_template_is_a_valid_sweep(tmp_path, monkeypatch):
    path = tmp_path / "my_sweep.py"
    path.write_text(readme_block("### Sweeps and reports"))
    monkeypatch.chdir(REPO)  # the template names configs/base.py from the checkout
    overrides = ["train.steps=300", "data.source=pystdlib"]
    points, configs = sweep.load_sweep(str(path), overrides)
    assert {p["encoding.name"] for p in points} == {"alibi", "rope", "xl"} and len(points) == 9
    sweep.check_overrides(str(path), points, configs, overrides)
    assert all(c.train.seq_len == 128 and c.eval.lengths[-1] == 1024 for c in configs)
    plan = sweep.plan_sweep(str(path), str(tmp_path / "runs"), only=["encoding.name=alibi,rope"])
    assert plan.endswith("9 points, 6 to run in " + str(tmp_path / "runs"))
    bad = ["model.num_heads=7"]  # width 64 is not divisible by 7 heads
    with pytest.raises(ValueError, match="make 9 of 9 points invalid.*num_heads"):
        sweep.check_overrides(str(path), points, sweep.load_sweep(str(path), bad)[1], bad)
