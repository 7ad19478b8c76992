"""Classification evaluation: every example read whole in its length bucket gives the outputs
the model gives it alone, and the metrics are those of these outputs (a regression here)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_classify_run import CONFIG, SHRINK

from posenc.data.classify_batching import encode_row
from posenc.kinds import classification as classify
from posenc.kinds import classification_metrics as classify_metrics
from posenc.models import build
from posenc.runs.config import apply_overrides, load_config, validate


@pytest.mark.slow  # about 6 s of CPU: three compilations of the tiny model
def test_buckets_read_each_example_whole_and_overall_truncates(tmp_path):
    rng = np.random.default_rng(1)
    rows = [
        ("a" * int(n), "b" * int(m), f"{rng.normal():.3f}") for n, m in rng.integers(1, 20, (10, 2))
    ]
    for split in ("train", "validation"):
        lines = ["text\ttext_b\tlabel", *("\t".join(r) for r in rows)]
        (tmp_path / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    config = apply_overrides(
        load_config(f"{CONFIG}:tiny"),
        [*SHRINK, f"data.source='tsv:{tmp_path}'", "model.num_labels=1", "eval.lengths=16,32"],
    )
    validate(config)
    source, classes = classify.open_data(config)
    model = build(config)
    fields = classify.evaluate_classifier(
        model, config, source, classes, (16, 32), split="validation"
    )

    # One example per call, padded to 48 tokens (the battery's classifier check shows padding
    # is exact): one compilation instead of one per length.
    run = nnx.jit(lambda m, ids, segs, mask: m(ids, segs, mask))

    def alone(max_len):
        out = []
        for a, b, _ in rows:
            ids, segs = encode_row(
                np.frombuffer(a.encode(), np.uint8).astype(np.int32),
                np.frombuffer(b.encode(), np.uint8).astype(np.int32),
                max_len,
            )
            pad = 48 - len(ids)
            mask = np.arange(48)[None] < len(ids)
            ids, segs = np.pad(ids, (0, pad))[None], np.pad(segs, (0, pad))[None]
            out.append(
                float(run(model, jnp.asarray(ids), jnp.asarray(segs), jnp.asarray(mask))[0, 0])
            )
        return np.array(out)

    labels = np.array([float(r[2]) for r in rows])
    lengths = np.array([len(a) + len(b) + 3 for a, b, _ in rows])
    whole = alone(32)  # every row here has at most 41 tokens: the 32 bucket truncates some
    short = lengths <= 16
    first, second = fields["results"]
    assert (first["examples"], second["examples"]) == (short.sum(), (~short).sum())
    assert second["truncated"] == (lengths > 32).sum()
    expected = classify_metrics.regression_metrics(labels[~short], whole[~short])
    assert second["mse"] == pytest.approx(expected["mse"], rel=1e-4)
    assert second["pearson"] == pytest.approx(expected["pearson"], rel=1e-4, abs=1e-6)
    at_train = classify_metrics.regression_metrics(labels, alone(16))
    assert fields["overall"]["mse"] == pytest.approx(at_train["mse"], rel=1e-4)
    assert fields["overall"]["truncated"] == (lengths > 16).sum()
    assert fields["metric"] == "pearson" and fields["classes"] is None


@pytest.mark.slow  # about 3 s of CPU: a model and its compilation
def test_lengths_a_learned_table_cannot_read_are_unrepresentable_and_not_counted_twice(tmp_path):
    rows = [("a" * n, "0" if n % 2 else "1") for n in (3, 5, 8, 20, 25)]  # 5 .. 27 tokens
    for split in ("train", "validation"):
        lines = ["text\tlabel", *("\t".join(r) for r in rows)]
        (tmp_path / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    config = apply_overrides(
        load_config(f"{CONFIG}:tiny"),
        [*SHRINK, f"data.source='tsv:{tmp_path}'", "encoding.name=learned",
         "encoding.hparams.max_len=16", "eval.lengths=16,32"],
    )  # fmt: skip
    validate(config)
    source, classes = classify.open_data(config)
    fields = classify.evaluate_classifier(
        build(config), config, source, classes, (16, 32), split="validation"
    )
    first, second = fields["results"]
    assert first["examples"] == 3 and first["truncated"] == 0, "only rows of <= 16 tokens"
    assert second == {"length": 32, "lo": 16, "label": "1x-2x", "unrepresentable": True,
                      "examples": 2}  # fmt: skip
    assert fields["overall"]["examples"] == 5 and fields["overall"]["truncated"] == 2
