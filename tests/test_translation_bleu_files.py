"""The scores in a translation run's ``eval.json`` recomputed with sacreBLEU from the files: the
hypotheses ``posenc eval`` wrote and the references in the corpus folder (slow: trains a tiny
run for about 30 s and decodes its validation split).

The corpus makes the run's outputs worth scoring: four source words, each always translated to
its own sentence, so that 120 steps learn a prefix of each and BLEU lands far from 0 and 100 and
depends on which hypothesis is scored against which reference (an order or detokenisation slip
between the scored and the written outputs shows).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import _train_helpers as helpers
import pytest
import sacrebleu

from posenc.workdir.run import hypotheses_name

pytestmark = pytest.mark.slow

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "translation.py") + ":tiny"
SENTENCES = {
    "red": "the red cat sat on the mat .",
    "blue": "a blue dog ran to the big tree .",
    "green": "green frogs sing all night long .",
    "gold": "one gold coin is in the box .",
}


def _corpus(folder: Path) -> None:
    """``train.en/de`` (64 pairs) and ``valid.en/de`` (8): a source is its word 1-3 times."""
    folder.mkdir()
    rng = random.Random(0)
    words = list(SENTENCES)
    splits = {"train": [rng.choice(words) for _ in range(64)], "valid": words + words[::-1]}
    for split, keys in splits.items():
        sources = [" ".join([key] * rng.randint(1, 3)) for key in keys]
        (folder / f"{split}.en").write_text("\n".join(sources) + "\n")
        (folder / f"{split}.de").write_text("\n".join(SENTENCES[k] for k in keys) + "\n")


def test_eval_json_scores_are_sacrebleu_of_the_written_hypotheses(tmp_path):
    corpus, run = tmp_path / "corpus", str(tmp_path / "run")
    _corpus(corpus)
    flags = [
        "--config.model.num_layers=1",
        "--config.model.model_dim=32",
        "--config.model.num_heads=2",
        "--config.model.mlp_dim=64",
        "--config.train.tokens_per_batch=256",
        "--config.train.steps=120",
        "--config.train.checkpoint_every=1000",
        "--config.train.progress=False",
        "--config.optim.warmup_steps=2",
        "--config.optim.learning_rate=0.01",
        f"--config.data.source=parallel:{corpus}",
        "--config.data.src_lang=en",
        "--config.data.tgt_lang=de",
        "--config.data.bucket_step=2.0",  # few bucket shapes: few compilations
        "--config.eval.bucket_step=2.0",
        "--config.eval.beam_size=2",
        "--config.eval.max_len_offset=8",
    ]
    code, _, err = helpers.run_cli(
        "train", "--config", CONFIG, "--workdir", run, *flags, "--no-eval"
    )
    assert code == 0, err
    code, _, err = helpers.run_cli("eval", "--workdir", run)
    assert code == 0, err

    report = json.loads((Path(run) / "eval.json").read_text())
    hypotheses = (Path(run) / hypotheses_name("eval.json")).read_text().split("\n")
    assert hypotheses[-1] == ""  # one line each, newline-terminated
    hypotheses = hypotheses[:-1]
    references = (corpus / "valid.de").read_text().split("\n")[:-1]
    assert len(hypotheses) == len(references) == report["sentences"] == 8

    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    overall = report["overall"]
    assert 5.0 < bleu.score < 95.0, (bleu.score, hypotheses)  # a score that can be wrong
    assert overall["bleu"] == pytest.approx(bleu.score, abs=1e-9)
    assert overall["length_ratio"] == pytest.approx(bleu.ratio, abs=1e-9)
    assert overall["brevity_penalty"] == pytest.approx(bleu.bp, abs=1e-9)
    intl = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="intl")
    assert overall["bleu_intl"] == pytest.approx(intl.score, abs=1e-9)
    assert overall["chrf"] == pytest.approx(
        sacrebleu.corpus_chrf(hypotheses, [references]).score, abs=1e-9
    )
    assert sum(row["sentences"] for row in report["results"]) == 8
    # The comparison sees which hypothesis goes with which reference.
    shifted = sacrebleu.corpus_bleu(hypotheses[1:] + hypotheses[:1], [references]).score
    assert abs(shifted - bleu.score) > 1.0, (shifted, bleu.score)
