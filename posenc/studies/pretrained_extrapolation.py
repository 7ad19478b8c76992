"""How far past their training length pretrained models hold, with and without RoPE scaling.

The comparison of position interpolation (Chen et al. 2023), NTK-aware scaling, dynamic NTK,
YaRN (Peng et al. 2023) and Llama 3.1's frequency bands on released checkpoints: each model is
scored at ``1 .. 8 x L`` tokens (``L``: the length it was trained at, from its config), zero-shot:

- RoPE models (Llama, Mistral, Qwen2, GPT-NeoX / Pythia) as released and under each scaling mode
  as an evaluation-time override (``posenc eval``'s), with ``factor = s`` (default the largest
  multiple) and ``original_max_len = L``; a model released with a ``rope_scaling`` is scored "as
  released" in the first row; a model with layers of several kinds (Gemma 3, OLMo 3, SmolLM3,
  Cohere2) is scaled on its global RoPE layers alone (:func:`rope_scopes`), as those models are
  released;
- the others (ALiBi: BLOOM; learned: GPT-2; T5's bias) as they are; a learned table has no row
  past its length, so those cells stay empty.

Every model is a local folder: a Hugging Face model (imported once with ``posenc import-hf`` into
``<workdir>/<name>``, scoring the experiment's text with the model's own tokenizer) or a posenc
run directory (scored on its own data). Nothing downloads. Every evaluation is kept in its run
directory as ``eval-<settings>.json`` and skipped when run again.

Outputs in the work directory (named apart from ``posenc report``'s, which reads the imported runs
there too): ``extrapolation.md`` (perplexity by model, method and multiple of ``L``),
``extrapolation.csv`` and ``extrapolation.png`` (one line per model and method).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from posenc import encodings
from posenc.runs.config import apply_overrides
from posenc.studies.rope_extension import LABELS, evaluated, scaling_overrides
from posenc.workdir import RunDir

# RoPE's zero-shot methods (None: the model as released).
ROPE_METHODS = (None, "linear", "ntk", "dynamic", "yarn", "llama3")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What is scored.

    Attributes:
      multiples: evaluation lengths as multiples of each model's training length ``L``.
      factor: RoPE scaling's ``s``; None: the largest multiple.
      train_len: ``L`` for every model instead of the one its config states (small test models).
      max_tokens: tokens scored per length (0: the whole split).
      batch_tokens: tokens per evaluation batch; None: the run's own ``eval.batch_tokens``
        (unset: batches sized from the memory budget, docs/evaluation.md).
      methods: the RoPE methods (names of :data:`ROPE_METHODS`; None is always scored).
    """

    multiples: tuple[int, ...] = (1, 2, 4, 8)
    factor: int | None = None
    train_len: int | None = None
    max_tokens: int = 0
    batch_tokens: int | None = None
    methods: tuple[str | None, ...] = ROPE_METHODS

    def __post_init__(self):
        if not self.multiples or any(not isinstance(m, int) or m < 1 for m in self.multiples):
            raise ValueError(f"multiples must be positive integers, got {self.multiples!r}")
        unknown = [m for m in self.methods if m not in ROPE_METHODS]
        if unknown:
            raise ValueError(
                f"unknown RoPE method {unknown[0]!r}; known: {[m for m in ROPE_METHODS if m]}"
            )

    @property
    def scaling_factor(self) -> int:
        return self.factor or max(self.multiples)


@dataclasses.dataclass
class Row:
    """One model under one method: perplexity (and loss) by multiple of ``L``."""

    model: str
    method: str
    train_len: int
    results: dict[int, dict[str, Any]]  # multiple -> the evaluation's result at that length


def prepare(model: str, workdir: str, data: str | None, data_dir: str | None) -> str:
    """The run directory of ``model``: itself when it is a posenc run, else its import under
    ``workdir`` (made once, scoring ``data``)."""
    if RunDir(model).has_checkpoints():
        return model
    from posenc.hf import read_spec
    from posenc.hf.rundir import import_hf

    run_dir = os.path.join(workdir, os.path.basename(os.path.normpath(model)))
    if not RunDir(run_dir).has_checkpoints():
        family, spec, _ = read_spec(model)
        if spec.assembly != "lm" or not spec.model.causal:
            raise ValueError(
                f"{model} is a {family.name} model, not a causal LM: perplexity by length is a "
                "causal LM's; import it with posenc import-hf and score it with posenc eval (a "
                "masked-LM or translation run)"
            )
        if data is None:
            raise ValueError(
                f"{model} is not a posenc run directory: give the text it scores (--data, e.g. "
                "tfds:pg19 or textdir:<folder>)"
            )
        overrides = [f"data.data_dir={data_dir}"] if data_dir else []
        import_hf(model, run_dir, data=data, overrides=overrides)
    return run_dir


def _lengths(config: ml_collections.ConfigDict, plan: Plan) -> dict[int, int]:
    """``{multiple: length}`` the model's encoder can read (a learned table ends)."""
    train_len = plan.train_len or config.train.seq_len
    encoding = encodings.get(config.encoding.name, **config.encoding.hparams.to_dict())
    out = {}
    for multiple in plan.multiples:
        try:
            encoding.check_length(multiple * train_len)
        except ValueError:
            continue
        out[multiple] = multiple * train_len
    return out


def rope_scopes(config: ml_collections.ConfigDict) -> list[str]:
    """Where an evaluation-time RoPE scaling goes: the config sections (``encoding``,
    ``layers.kinds.<kind>``) whose ``hparams`` are a RoPE the scaling applies to. Without a
    layer pattern, the model's encoder when it is RoPE and attends to the whole context (not
    Mistral's window). With one, the RoPE of the layers that
    attend to the whole context, as the published models that scale do (Gemma 3's and OLMo 3's
    global layers): a windowed layer never sees a distance past its window, so it keeps its
    RoPE. A global kind with its own encoder is scaled alone; one on the model's encoder scales
    that (every layer on it). A model with no global RoPE layer has no scope (scored as
    released)."""
    section = config.get("layers")
    pattern = tuple(section.get("pattern", ())) if section is not None else ()
    if not pattern:
        full = config.model.window == "full"
        return ["encoding"] if config.encoding.name == "rope" and full else []
    scopes = []
    for name in dict.fromkeys(pattern):
        fields = section.kinds[name]
        window = fields.get("window") or config.model.window
        encoder = fields.get("encoding") or None
        if window != "full" or (encoder or config.encoding.name) != "rope":
            continue
        scope = f"layers.kinds.{name}" if encoder else "encoding"
        if scope not in scopes:
            scopes.append(scope)
    return scopes


def scope_overrides(
    scopes: Sequence[str], method: str | None, factor: int, train_len: int
) -> list[str]:
    """The overrides that put each scope's RoPE (:func:`rope_scopes`) under ``method``."""
    return [
        scope + o.removeprefix("encoding")  # scaling_overrides names the model's encoder
        for scope in scopes
        for o in scaling_overrides(method, factor, train_len)
    ]


def _hparams(config: ml_collections.ConfigDict, scope: str) -> dict[str, Any]:
    node = config
    for part in scope.split("."):
        node = node[part]
    hparams = node.get("hparams")
    return hparams.to_dict() if hparams is not None else {}


def score_model(
    run_dir: str, name: str, plan: Plan, data_dir: str | None, progress: bool = True
) -> list[Row]:
    """Every method's :class:`Row` for one run directory."""
    config = RunDir(run_dir).read_config()
    train_len = plan.train_len or config.train.seq_len
    lengths = _lengths(config, plan)
    common = [
        f"eval.lengths={','.join(map(str, lengths.values()))}",
        f"eval.max_tokens={plan.max_tokens}",
        "eval.mode=nonoverlapping",
    ]
    if plan.batch_tokens is not None:
        common.append(f"eval.batch_tokens={plan.batch_tokens}")
    if data_dir:
        common.append(f"data.data_dir={data_dir}")
    scopes = rope_scopes(config)
    rope = bool(scopes)
    released = any(_hparams(config, scope).get("scaling") for scope in scopes)
    methods = [m for m in plan.methods if m] if rope else []
    rows = []
    for method in [None, *methods]:
        scaling = scope_overrides(scopes, method, plan.scaling_factor, train_len)
        settings = apply_overrides(config, common + scaling)
        if progress:
            print(f"{name}: {LABELS[method]} at {list(lengths.values())}", flush=True)
        report = evaluated(run_dir, settings, progress)
        by_length = {r["length"]: r for r in report["results"]}
        label = "as released" if method is None and released else LABELS[method]
        if method is None and not rope:
            # A per-layer model without a global RoPE layer (Cohere2) is as released; another
            # model is named by its encoder (learned, alibi, t5).
            layered = tuple(config.layers.get("pattern", ())) if "layers" in config else ()
            label = "as released" if layered else config.encoding.name
        results = {m: by_length[length] for m, length in lengths.items() if length in by_length}
        rows.append(Row(name, label, train_len, results))
    return rows


def run(
    models: Sequence[str],
    workdir: str,
    data: str | None,
    plan: Plan = Plan(),
    *,
    data_dir: str | None = None,
    progress: bool = True,
) -> list[str]:
    """Imports, scores and reports every model (module docstring).

    Args:
      models: Hugging Face model folders or posenc run directories.
      workdir: the experiment directory (imports and the report).
      data: the text source imported models score (``tfds:pg19``, ``textdir:<path>``, ...);
        None when every model is a posenc run directory (scored on its own data).
      plan: lengths and methods.
      data_dir: the data directory (None: posenc's default).
      progress: print what is being done.

    Returns:
      The report's files (extrapolation.md first).
    """
    os.makedirs(workdir, exist_ok=True)
    rows = []
    for model in models:
        run_dir = prepare(model, workdir, data, data_dir)
        name = os.path.basename(os.path.normpath(model))
        rows += score_model(run_dir, name, plan, data_dir, progress)
    return write_report(workdir, rows, plan, data)


def _cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "—"
    return f"{result['perplexity']:.2f}" if math.isfinite(result["perplexity"]) else "inf"


def write_report(workdir: str, rows: Sequence[Row], plan: Plan, data: str | None) -> list[str]:
    """``extrapolation.md``, ``extrapolation.csv`` and the plot of ``rows``."""
    multiples = plan.multiples
    md = [
        "# Pretrained models past their training length: perplexity",
        "",
        f"- Data: {data or 'each run its own'}; non-overlapping windows of m x L tokens, every "
        "token scored" + (f" (at most {plan.max_tokens} per length)." if plan.max_tokens else "."),
        f"- RoPE scaling zero-shot with factor s = {plan.scaling_factor} and original length L; "
        "other encoders as they are. — : the model cannot read that length (a learned table).",
        "",
        "| model | L | method | " + " | ".join(f"{m}x" for m in multiples) + " |",
        "|---|---:|---|" + "---:|" * len(multiples),
    ]
    for row in rows:
        cells = [_cell(row.results.get(m)) for m in multiples]
        md.append(f"| {row.model} | {row.train_len} | {row.method} | " + " | ".join(cells) + " |")
    plot = os.path.join(workdir, "extrapolation.png")
    _plot(plot, rows)
    md += ["", f"![perplexity against evaluation length]({os.path.basename(plot)})"]
    paths = [
        os.path.join(workdir, "extrapolation.md"),
        os.path.join(workdir, "extrapolation.csv"),
        plot,
    ]
    with open(paths[0], "w") as f:
        f.write("\n".join(md) + "\n")
    with open(paths[1], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["model", "train_len", "method", "multiple", "length", "loss", "perplexity"]
        )
        for row in rows:
            for m, r in sorted(row.results.items()):
                writer.writerow(
                    [
                        row.model,
                        row.train_len,
                        row.method,
                        m,
                        r["length"],
                        r["loss"],
                        r["perplexity"],
                    ]
                )
    return paths


def _plot(path: str, rows: Sequence[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Colour by method, marker and line style by model: a method reads the same on every model.
    methods = list(dict.fromkeys(row.method for row in rows))
    models = list(dict.fromkeys(row.model for row in rows))
    colors = plt.get_cmap("tab10")
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for row in rows:
        points = sorted(row.results.items())
        if points:
            marker, line = styles[models.index(row.model) % len(styles)]
            ax.plot(
                [m for m, _ in points],
                [r["perplexity"] for _, r in points],
                marker=marker,
                linestyle=line,
                color=colors(methods.index(row.method) % 10),
                label=f"{row.model}: {row.method}",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axvline(1, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("evaluation length / training length L")
    ax.set_ylabel("perplexity")
    ax.set_title("Pretrained models past their training length")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
