"""The README's and docs/ pages' code runs: the README's sweep template loads and validates,
docs/api.md's Python API section runs against a tiny trained run."""

import pytest
from _train_helpers import REPO

from posenc.runs import sweep


def readme_block(heading: str, language: str = "python", page: str = "README.md") -> str:
    """The first ``language`` code block of the section under ``heading`` of ``page`` (the
    README, or a page under docs/)."""
    lines = (REPO / page).read_text().splitlines()
    start = lines.index(heading) + 1
    block, inside = [], None
    for line in lines[start:]:
        if inside is None and line.startswith("#"):
            break  # the next heading: the section has no such block
        if line.startswith("```"):
            if inside == language:
                return "\n".join(block) + "\n"
            inside = line[3:].strip() if inside is None else None
        elif inside == language:
            block.append(line)
    raise AssertionError(f"no {language} block under {heading!r}")


def test_the_sweep_template_is_a_valid_sweep(tmp_path, monkeypatch):
    path = tmp_path / "my_sweep.py"
    path.write_text(readme_block("## Your question, end to end"))
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


def test_the_python_api_section_runs_on_a_trained_run(tmp_path, monkeypatch):
    import json

    import numpy as np
    from _train_helpers import build_pystdlib, tiny_config

    import posenc
    from posenc.models.restore import load_model
    from posenc.runs.train import train
    from posenc.workdir import eval_file_name

    config = tiny_config(build_pystdlib(tmp_path / "data"), "encoding.name=rope", "train.steps=2")
    train(config, str(tmp_path / "runs" / "rope"))
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(readme_block("## Loading a trained run", page="docs/api.md"), scope)  # noqa: S102 - the README's own code

    run, yarn, tokens, logits = scope["run"], scope["yarn"], scope["tokens"], scope["logits"]
    assert (run.step, run.finished, run.changes) == (2, True, {})
    # The losses are the cross entropy of the logits, computed here from the definition.
    shifted = logits[:-1] - logits[:-1].max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    naive = -log_probs[np.arange(len(tokens) - 1), tokens[1:]]
    np.testing.assert_allclose(scope["losses"], naive, rtol=1e-5, atol=1e-6)
    direct = np.asarray(load_model("runs/rope")(tokens[None].astype(np.int32)))[0]
    np.testing.assert_allclose(logits, direct, rtol=1e-5, atol=1e-5)
    # YaRN changed the model's positions past L, not its parameters.
    window = scope["window"]
    assert not np.allclose(yarn.logits(window), run.logits(window))
    changes = {
        "encoding.hparams.scaling": "yarn",
        "encoding.hparams.factor": 8,
        "encoding.hparams.original_max_len": 16,
    }
    assert yarn.changes == changes
    report = scope["report"]
    written = json.loads((tmp_path / "runs" / "rope" / report["file"]).read_text())
    assert written["changes"] == {**changes, "eval.lengths": [16, 128]}
    assert report["file"] == eval_file_name({**changes, "eval.lengths": (16, 128)})
    assert [r["length"] for r in written["results"]] == [16, 128]
    for bad, field in (
        ({"encoding.hparams.base": 5.0}, "base"),
        (["model.num_layers=2"], "num_layers"),
    ):
        with pytest.raises(ValueError, match=f"evaluation cannot change .*{field}"):
            posenc.load_run("runs/rope", bad)
