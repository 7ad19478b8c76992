"""What an attention window and a layer pattern cost at evaluation, in interleaved rounds.

Two claims of the window design (:mod:`posenc.attention.options`, the ``blocked`` path visiting
only the key tiles a window reaches) are measured here rather than in a timed test:

- a sliding window of ``W`` costs ``O(L x W)``: scoring ``L`` tokens (one window, batch 1) with
  ``model.window="sliding:W"`` against scoring the same number of tokens as ``L / W`` windows of
  ``W`` tokens with full attention (one batch): the ratio of their seconds per token, which the
  design wants within 1.3x (context: full attention over ``L`` tokens, the quadratic cost the
  window avoids);
- a pattern adds no cost beyond its layers' own: a model of ``local, local, local, global``
  layers (``config.layers``) against the same model with every layer local and with every
  layer global, ``pattern / (3/4 all-local + 1/4 all-global)``, all scored at one length.

Each figure is compiled first, then timed once per round in an order rotated every round
(:func:`posenc.benchmark.rounds.time_rounds`), each slot the fastest of ``eval_repeats`` runs;
the ratios are taken within each round, so a slow round slows both sides. Memory is XLA's
compiled analysis of each figure's scoring program (arguments, outputs and temporaries). The
command is ``experiments/throughput.py --window W``.
"""

from __future__ import annotations

import pathlib
import statistics
from typing import Any

from posenc.benchmark import rounds as rounds_lib
from posenc.benchmark.measure import compiled_memory
from posenc.benchmark.settings import Settings, make_config
from posenc.workdir import write_json

PATTERN = ("local", "local", "local", "global")


def window_cases(
    settings: Settings, encoder: str, window: int, length: int, pattern_length: int
) -> dict[str, tuple[Any, int, int]]:
    """The figures: name -> ``(config, window length, windows per batch)``.

    ``full@W`` (``length / window`` windows of ``window`` tokens, full attention), ``sliding@L``
    and ``full@L`` (one window of ``length``), and at ``pattern_length`` with ``len(PATTERN)``
    layers: ``pattern``, ``all-local`` and ``all-global``.
    """
    if window < 1 or length % window:
        raise ValueError(f"--window-length {length} must be a multiple of --window {window}")

    def config(layers: int | None = None, window_spec: str = "full"):
        c = make_config(settings, encoder)
        # A window may not exceed the training length (validate_layers); nothing is trained here.
        c.train.seq_len = max(c.train.seq_len, window)
        c.model.window = window_spec
        if layers is not None:
            c.model.num_layers = layers
        return c

    local = f"sliding:{window}"
    pattern = config(len(PATTERN))
    pattern.layers.pattern = PATTERN
    with pattern.layers.kinds.unlocked():  # an open section, as encoding.hparams
        pattern.layers.kinds.local = {"window": local}
        pattern.layers.kinds["global"] = {"window": "full"}
    return {
        f"full@{window}": (config(), window, length // window),
        f"sliding@{length}": (config(window_spec=local), length, 1),
        f"full@{length}": (config(), length, 1),
        "pattern": (pattern, pattern_length, 1),
        "all-local": (config(len(PATTERN), local), pattern_length, 1),
        "all-global": (config(len(PATTERN)), pattern_length, 1),
    }


def run_window_rounds(
    settings: Settings,
    rounds: int,
    encoder: str = "rope",
    window: int = 512,
    length: int = 16384,
    pattern_length: int | None = None,
) -> dict[str, Any]:
    """Compiles the figures of :func:`window_cases`, times them in ``rounds`` interleaved rounds.

    Returns:
      ``{"meta": ..., "rows": [...], "ratios": {...}}``: per figure its seconds per round,
      median, min, max and tokens/s; per claim its per-round ratios and their median, min, max.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    pattern_length = pattern_length or length
    cases = window_cases(settings, encoder, window, length, pattern_length)
    figures, tokens, paths, memory = {}, {}, {}, {}
    for name, (config, n, rows) in cases.items():
        rounds_lib._log(f"{name}: compiling ({rows} x {n} tokens)")
        scorer = rounds_lib._Eval(settings, encoder, n, config=config, rows=rows)
        figures[name, "eval"] = scorer.time
        tokens[name] = n * rows
        paths[name] = scorer.path
        memory[name] = compiled_memory(scorer.scorer.lower(rows, n).compile())
    names = list(cases)
    seconds, loads = rounds_lib.time_rounds(figures, names, rounds, settings.eval_repeats)
    per_round = {name: seconds[name, "eval"] for name in names}
    rows = []
    for name in names:
        times = per_round[name]
        rows.append(
            {
                "figure": name,
                "tokens": tokens[name],
                "path": paths[name],
                "layers": cases[name][0].model.num_layers,
                "seconds": times,
                **rounds_lib._spread("", times),
                "tokens_per_s": tokens[name] / statistics.median(times),
                **memory[name],
            }
        )
    per_token = {name: [s / tokens[name] for s in per_round[name]] for name in names}
    sliding, short = per_token[f"sliding@{length}"], per_token[f"full@{window}"]
    full_long = per_token[f"full@{length}"]
    share = PATTERN.count("local") / len(PATTERN)
    layers = [
        share * a + (1 - share) * b
        for a, b in zip(per_round["all-local"], per_round["all-global"], strict=True)
    ]
    ratios = {
        f"sliding@{length} / full@{window} per token": _ratios(sliding, short),
        f"full@{length} / full@{window} per token": _ratios(full_long, short),
        f"pattern / ({share:g} all-local + {1 - share:g} all-global)": _ratios(
            per_round["pattern"], layers
        ),
    }
    meta = rounds_lib._meta(settings, rounds, encoder, loads)
    meta.update(
        encoder=encoder, window=window, length=length, pattern_length=pattern_length,
        pattern=list(PATTERN),
    )  # fmt: skip
    return {"meta": meta, "rows": rows, "ratios": ratios}


def _ratios(a: list[float], b: list[float]) -> dict[str, Any]:
    values = [x / y for x, y in zip(a, b, strict=True)]
    return {"per_round": values, **rounds_lib._spread("", values)}


def markdown(report: dict[str, Any]) -> str:
    """The header, the figures (median seconds, min-max, tokens/s) and the ratios."""
    meta = report["meta"]
    model = meta["model"]
    lines = [
        f"{meta['date']}, {meta['device_kind']} ({meta['host_cpus']} CPUs, "
        f"{meta['cpus_usable']} usable), jax {meta['jax_version']}; size {meta['size']} "
        f"(width {model['model_dim']}, {model['num_heads']} heads, {model['dtype']}, "
        f"attention block {model['attention_block_size']}), encoder {meta['encoder']}, "
        f"window {meta['window']}; {meta['rounds']} interleaved rounds, fastest of "
        f"{meta['repeats_per_slot']} runs per slot; load average per round "
        f"{meta['load_average_1min']}.",
        "",
        "| figure | layers | tokens | path | seconds, median (min-max) | tokens/s | memory |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for row in report["rows"]:
        mib = row.get("compiled_bytes")
        lines.append(
            f"| {row['figure']} | {row['layers']} | {row['tokens']} | {row['path']} | "
            f"{row['median']:.3g} ({row['min']:.3g}-{row['max']:.3g}) | "
            f"{row['tokens_per_s']:.0f} | "
            + ("-" if mib is None else f"{mib / 2**20:.0f} MiB")
            + " |"
        )
    lines += ["", "| ratio | median (min-max) over rounds |", "|---|---:|"]
    for name, r in report["ratios"].items():
        lines.append(f"| {name} | {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: str | pathlib.Path) -> str:
    """Writes ``windows_<size>.json`` and ``windows_<size>.md`` to ``out``; returns the
    markdown."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"windows_{report['meta']['size']}"
    write_json(out / f"{stem}.json", report)
    text = markdown(report)
    (out / f"{stem}.md").write_text(text)
    return text
