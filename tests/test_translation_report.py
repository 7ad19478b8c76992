"""posenc.report.translation from hand-made eval.json files: runs on different data get a table
each, named by their data, and the tables by source length show each bucket's sentences."""

from __future__ import annotations

import csv
import os

from posenc.report import write_report
from posenc.workdir import write_json

MODEL = {"num_layers": 2, "num_encoder_layers": 2, "model_dim": 32, "num_heads": 4,
         "mlp_dim": 64, "head_dim": None, "norm": "layernorm", "dtype": "float32",
         "num_params": 1000}  # fmt: skip


def _run(root, name, encoding, data, bleu, sentences=(4, 3), seed=0):
    """A translation run's eval.json: ``data`` = (source, src_lang, tgt_lang, sha256)."""
    source, src, tgt, sha = data
    d = os.path.join(root, name)
    os.makedirs(d)
    results, lo = [], 0
    for (hi, label, multiple), n, b in zip(
        ((64, "<=1x", 1), (128, "1x-2x", 2)), sentences, (bleu, bleu / 2), strict=True
    ):
        results.append({"length": hi, "lo": lo, "hi": hi, "label": label, "max_multiple": multiple,
                        "sentences": n, "src_tokens": 10 * n, "bleu": b, "bleu_intl": b,
                        "chrf": b, "length_ratio": 1.0, "brevity_penalty": 1.0})  # fmt: skip
        lo = hi
    write_json(
        os.path.join(d, "eval.json"),
        {"encoding": encoding, "encoding_hparams": {}, "objective": "translation", "task": None,
         "train_seq_len": 64, "train_steps": 10, "checkpoint_step": 10, "finished": True,
         "seed": seed, "model": MODEL, "mode": "nonoverlapping", "positions": "contiguous",
         "device": "1 x cpu", "changes": {},
         "data": {"source": source, "split": "validation", "spec": source, "src_lang": src,
                  "tgt_lang": tgt, "content_sha256": sha},
         "vocab": {"kind": "bytes", "vocab_size": 259}, "split": "validation",
         "sentences": sum(sentences), "train_max_src_len": 64,
         "decoding": {"beam_size": 4, "alpha": 0.6, "max_len_offset": 50},
         "teacher_forced": {"loss": 1.0, "perplexity": 2.7, "accuracy": 0.5, "tokens": 100},
         "overall": {"sentences": sum(sentences), "bleu": bleu, "bleu_intl": bleu, "chrf": bleu,
                     "length_ratio": 1.0, "signatures": {"bleu": "nrefs:1|tok:13a"}},
         "results": results},
    )  # fmt: skip


EN_DE = ("parallel:default", "en", "de", "a" * 64)
EN_FR = ("parallel:/data/enfr", "en", "fr", "b" * 64)


def _rows(section: str) -> dict[str, str]:
    """The table rows of a report section by their first cell."""
    rows = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 2:
            rows[cells[1].strip()] = line
    return rows


def test_runs_on_different_data_get_a_table_each_named_by_the_data(tmp_path):
    root = str(tmp_path)
    _run(root, "rope_de", "rope", EN_DE, 30.0)
    _run(root, "alibi_fr", "alibi", EN_FR, 10.0)
    paths = write_report(root)
    md = open(paths[0]).read()
    # One section per data set, each naming its data, holding only that data's runs.
    de = md.index("## Data: `parallel:default` (en → de)")
    fr = md.index("## Data: `parallel:/data/enfr` (en → fr)")
    first, second = sorted((de, fr))
    sections = {de: md[de:fr] if de < fr else md[de:], fr: md[fr:de] if fr < de else md[fr:]}
    assert first > 0 and second > first
    de_rows, fr_rows = _rows(sections[de]), _rows(sections[fr])
    assert "rope" in de_rows and "alibi" not in de_rows and "30.00" in de_rows["rope"]
    assert "alibi" in fr_rows and "rope" not in fr_rows and "10.00" in fr_rows["alibi"]
    # Each data set's plot of its own.
    plots = [p for p in paths if p.endswith(".png")]
    assert len(plots) == 2 and len(set(plots)) == 2
    # report.csv's rows name the data.
    with open(paths[1]) as f:
        table = {row["configuration"]: row for row in csv.DictReader(f)}
    assert set(table) == {"rope [parallel:default en-de]", "alibi [parallel:/data/enfr en-fr]"}


def test_the_same_source_with_other_content_is_another_data_set(tmp_path):
    """The same spec read from two data directories (other content): not seeds of one column."""
    root = str(tmp_path)
    _run(root, "one", "rope", EN_DE, 30.0)
    _run(root, "two", "rope", (*EN_DE[:3], "c" * 64), 20.0)
    md = open(write_report(root)[0]).read()
    assert md.count("## Data: `parallel:default` (en → de") == 2
    assert "sha256 aaaaaaaaaaaa" in md and "sha256 cccccccccccc" in md


def test_one_data_set_keeps_one_table_and_buckets_show_their_sentences(tmp_path):
    root = str(tmp_path)
    _run(root, "rope", "rope", EN_DE, 30.0, sentences=(4, 3))
    _run(root, "alibi", "alibi", EN_DE, 20.0, sentences=(4, 3))
    md = open(write_report(root)[0]).read()
    assert "## Data:" not in md and md.count("## BLEU") == 1
    rows = _rows(md[md.index("## By source length") :])
    assert "<=1x (<= 64), 4 sentences" in rows and "1x-2x (<= 128), 3 sentences" in rows
