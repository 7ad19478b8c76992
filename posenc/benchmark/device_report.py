"""The device check's report as markdown (:mod:`posenc.benchmark.device`): a header with the
device, versions, the FLOP formula, the peak and the issue's targets, then one part per section,
each present with its status even when it did not run; ratios to NoPE and to the peer."""

from __future__ import annotations

from typing import Any


def markdown(data: dict[str, Any]) -> str:
    """The report as markdown: a header, then one part per section (each present, with its
    status, even when it did not run)."""
    m = data["meta"]
    s = data["sections"]
    device = (
        f"{m.get('device_count', '?')} x {m.get('device_kind', '?')} ({m.get('platform', '?')})"
    )
    lines = [
        f"# Device check{' (dry run)' if m['dry_run'] else ''}: {device}",
        "",
        f"- date {m['date']}, host {m['host']}, python {m['python']}, jax "
        f"{m.get('jax_version', '?')}, flax {m.get('flax_version', '?')}; peer "
        f"{_versions(m.get('peer_versions'))}; wall {m.get('wall_s', '?')} s of {m['budget_s']} s",
        f"- size `{m['size']}` (posenc.benchmark.settings.SIZES), {m['warmup']} warm-up and "
        f"{m['steps']} timed steps; evaluation: one window (batch 1) at {m['eval_lengths']}, "
        f"median of {m['eval_repeats']}",
        f"- MFU: FLOPs per token {m['flops_per_token']}; peak "
        + (
            f"{m['peak_tflops_per_device']} TFLOP/s per device (bf16 dense)"
            if m.get("peak_tflops_per_device")
            else "unknown (MFU omitted)"
        ),
        f"- compile: {m.get('compile_helpers', 0)} helper process(es) compiled the later "
        "encoders' programs ahead into a shared persistent cache (their autotuning shares the "
        "GPU with the measurements); posenc's `compile (s)` is then the cache's load",
        "- memory: XLA's compiled memory analysis of each program (posenc); "
        "torch.cuda.max_memory_allocated (x-transformers)",
        "- targets (issue 35), not results until measured: " + "; ".join(m["targets"]),
        "",
        f"## Preflight: {s['preflight']['status']}",
        "",
    ]
    pre = s["preflight"]
    if pre.get("error"):
        lines.append(f"- {pre['error']}")
    if "required" in pre:
        lines.append(
            f"- required: {', '.join(pre['required'])}; missing: "
            f"{', '.join(pre['missing']) or 'none'}"
        )
    if pre.get("optional_missing"):
        lines.append(
            f"- not importable (the peer is skipped): {', '.join(pre['optional_missing'])}"
        )
    lines += _tests_part(data) + _train_part(data) + _eval_part(data) + _peer_part(data)
    from posenc.benchmark.report import paths_table

    lines += ["", "## Attention paths"] + (
        paths_table(data["train"] + data["eval"]) or ["", "none measured"]
    )
    return "\n".join(lines) + "\n"


def _versions(v: dict[str, str] | None) -> str:
    return ", ".join(f"{k} {x}" for k, x in v.items()) if v else "not run"


def _status(data: dict[str, Any], name: str) -> str:
    sec = data["sections"][name]
    took = f" ({sec['seconds']} s)" if "seconds" in sec else ""
    return f"{sec['status']}{took}"


def _tests_part(data: dict[str, Any]) -> list[str]:
    sec = data["sections"]["tests"]
    lines = ["", f"## GPU-only tests: {_status(data, 'tests')}", ""]
    if sec.get("command"):
        lines.append(f"- selection: `pytest {sec['command']}`, {sec.get('collected', 0)} collected")
    if sec.get("counts") is not None:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(sec["counts"].items())) or "none"
        lines.append(f"- outcomes: {counts}; not run: {sec.get('not_run', 0)}")
    for row in data["tests"]:
        if row["outcome"] not in ("passed",):
            lines.append(f"- {row['outcome']}: `{row['id']}` {row['message']}")
    return lines


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}" if value and base else "-"


def _gib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _train_part(data: dict[str, Any]) -> list[str]:
    rows = data["train"]
    nope = next((r for r in rows if r["encoder"] == "nope" and "tokens_per_s" in r), {})
    lines = [
        "",
        f"## Training: {_status(data, 'train')}",
        "",
        "| encoder | path | tokens/s | vs NoPE | step (ms) | MFU | model TFLOP/s | memory "
        "| compile (s) | loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['encoder']} | {_why(r)} |" + " |" * 8)
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        lines.append(
            f"| {r['encoder']} | {r['path']} | {r['tokens_per_s']:,.0f} | "
            f"{_ratio(r['tokens_per_s'], nope.get('tokens_per_s'))} | "
            f"{1e3 * r['step_time_s']:.1f} | {mfu} | {r['model_tflops_per_s']:.3g} | "
            f"{_gib(r.get('compiled_bytes'))} | {r['compile_s']:.1f} | {r['loss']:.3f} |"
        )
    return lines


def _why(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return f"skipped: {row['skipped']}"
    return "error: " + str(row.get("error", "?")).replace("|", "/")[:200]


def _eval_part(data: dict[str, Any]) -> list[str]:
    rows = data["eval"]
    base = {r["length"]: r for r in rows if r["encoder"] == "nope" and "seconds" in r}
    lines = [
        "",
        f"## Evaluation, one window: {_status(data, 'eval')}",
        "",
        "| encoder | length | path | seconds | vs NoPE | memory | memory vs NoPE | compile (s) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "seconds" not in r:
            lines.append(f"| {r['encoder']} | {r['length']} | {_why(r)} |" + " |" * 5)
            continue
        b = base.get(r["length"], {})
        lines.append(
            f"| {r['encoder']} | {r['length']} | {r['path']} | {r['seconds']:.3f} | "
            f"{_ratio(r['seconds'], b.get('seconds'))} | {_gib(r.get('compiled_bytes'))} | "
            f"{_ratio(r.get('compiled_bytes'), b.get('compiled_bytes'))} | "
            f"{r['compile_s']:.1f} |"
        )
    return lines


def _peer_part(data: dict[str, Any]) -> list[str]:
    peer = data["peer"]
    ours = {r["encoder"]: r for r in data["train"] if "tokens_per_s" in r}
    lines = [
        "",
        f"## Peer (x-transformers, PyTorch): {_status(data, 'peer')}",
        "",
        "| encoder | path | tokens/s | posenc / peer | MFU | memory | compile (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    peak = data["meta"].get("peak_tflops_per_device")
    for r in peer["train"]:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['encoder']} | {_why(r)} |" + " |" * 5)
            continue
        mine = ours.get(r["encoder"], {})
        mfu = f"{100 * r['model_tflops_per_s'] / peak:.1f}%" if peak else "-"
        lines.append(
            f"| {r['encoder']} | {r['path']} | {r['tokens_per_s']:,.0f} | "
            f"{_ratio(mine.get('tokens_per_s'), r['tokens_per_s'])} | {mfu} | "
            f"{_gib(r.get('memory_bytes'))} | {r['compile_s']:.1f} |"
        )
    evals = {(r["encoder"], r["length"]): r for r in data["eval"] if "seconds" in r}
    lines += [
        "",
        "| encoder | length | seconds | posenc / peer (time) | memory |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in peer["eval"]:
        if "seconds" not in r:
            lines.append(f"| {r['encoder']} | {r['length']} | {_why(r)} |" + " |" * 2)
            continue
        mine = evals.get((r["encoder"], r["length"]), {})
        lines.append(
            f"| {r['encoder']} | {r['length']} | {r['seconds']:.3f} | "
            f"{_ratio(mine.get('seconds'), r['seconds'])} | {_gib(r.get('memory_bytes'))} |"
        )
    return lines
