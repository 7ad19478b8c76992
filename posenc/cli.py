"""The ``posenc`` command line: a thin layer over the library.

    posenc train --config configs/base.py:tiny --config.encoding.name=alibi --workdir runs/alibi
    posenc eval --workdir runs/alibi --lengths 64,256,1024
    posenc data prepare textdir:/path/to/texts
    posenc sweep --config configs/sweeps/alibi_table2.py:tiny --workdir runs/table2
    posenc report runs/table2
    posenc analyze --workdir runs/alibi --lengths 64,1024
    posenc retrieval --workdir runs/alibi --tasks passkey,niah_single_1 --lengths 256,1024
    posenc plan --config configs/base.py --devices 8 --device-memory 80GB --config.mesh.fsdp=8
    posenc harness run --model posenc --model_args workdir=runs/alibi --tasks my_task

Config overrides are given as ``--config.<field>=<value>`` (any number, applied in order).
Errors are one line on stderr (exit status 2; 3 when training diverged; 130 when interrupted);
``POSENC_TRACEBACK=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import warnings
from collections.abc import Sequence

_OVERRIDE_PREFIX = "--config."


def _split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separates ``--config.a.b=v`` (or ``--config.a.b v``) overrides from the other arguments."""
    rest, overrides = [], []
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(_OVERRIDE_PREFIX):
            body = arg[len(_OVERRIDE_PREFIX) :]
            if "=" not in body:
                if i + 1 >= len(argv):
                    # Exit status 2, like every other usage error (argparse's convention).
                    print(f"posenc: error: {arg} needs a value ({arg}=VALUE)", file=sys.stderr)
                    raise SystemExit(2)
                body = f"{body}={argv[i + 1]}"
                i += 1
            overrides.append(body)
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def _int_list(text: str, parse=int, what: str = "integers") -> tuple[int, ...]:
    try:
        values = tuple(parse(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one value ({what})")
    return values


def _float_list(text: str) -> tuple[float, ...]:
    return _int_list(text, float, "numbers")


def _load(spec: str, overrides: Sequence[str]):
    from posenc.runs.config import apply_overrides, load_config

    return apply_overrides(load_config(spec), overrides)


def _positive_int(text: str, what: str = "a step") -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected {what} >= 1, got {text!r}")
    return value


def _count(text: str) -> int:
    return _positive_int(text, "an integer")


def _length(text: str) -> int:
    return _positive_int(text, "a length in tokens")


def _cmd_train(args, overrides) -> int:
    from posenc import kinds
    from posenc.runs.evaluate import evaluate_workdir
    from posenc.runs.train import train

    if args.init_from:
        overrides = [*overrides, f"train.init_from={os.path.abspath(args.init_from)!r}"]
    config = _load(args.config, overrides)
    if args.drop_positions:
        from posenc.runs.drope import drop_positions

        config = drop_positions(config)
    config = kinds.kind_of(config).prepare(config)  # as train completes it, for the evaluation
    kind = kinds.kind_of(config)
    result = train(config, args.workdir, stop_at=args.stop_at)
    if result.resumed_from is not None:
        print(f"resumed from step {result.resumed_from}")
    if result.history:
        print(f"step {result.step}: train loss {result.history[-1]['loss']:.4f}")
    if not args.no_eval and result.step == config.train.steps:
        print(f"evaluating {args.workdir} at {kind.describe_evaluation(config)}")
        report = evaluate_workdir(
            args.workdir, overrides=config, model=result.model, step=result.step
        )
        _print_summary(kind.eval_summary(report, args.workdir, "train"))
    return 0


def _print_summary(summary: str | None) -> None:
    if summary is not None:
        print(summary)


def _cmd_eval(args, overrides) -> int:
    from posenc import kinds
    from posenc.runs.config import apply_overrides
    from posenc.runs.evaluate import evaluate_workdir
    from posenc.workdir import RunDir

    config = RunDir(args.workdir).read_config()
    extra = list(overrides)
    if args.lengths:
        extra.append(f"eval.lengths={args.lengths!r}")
    for flag, field in (
        ("split", "split"),
        ("mode", "mode"),
        ("stride", "stride"),
        ("max_tokens", "max_tokens"),
    ):
        value = getattr(args, flag)
        if value is not None:
            extra.append(f"eval.{field}={value!r}")
    config = apply_overrides(config, extra)
    if args.tasks:  # the retrieval request is refused (if it is) before perplexity runs
        from posenc.retrieval.rundir import check_retrieval

        check_retrieval(
            args.workdir,
            tasks=args.tasks,
            lengths=args.lengths,
            overrides=overrides,
            qa_data=args.qa_data,
        )
    kind = kinds.kind_of(config)
    print(kind.announce_evaluation(config, args.workdir))
    report = evaluate_workdir(args.workdir, overrides=config, output=args.output)
    if not report["finished"]:
        print(
            f"note: scored checkpoint step {report['checkpoint_step']} of "
            f"{report['train_steps']} (training has not finished)"
        )
    print(f"wrote {os.path.join(args.workdir, report['file'])}")
    _print_summary(kind.eval_summary(report, args.workdir, "eval"))
    if args.tasks:
        _eval_retrieval(args, overrides, report["file"])
    return 0


def _eval_retrieval(args, overrides, report_name: str) -> None:
    """``posenc eval --tasks``: retrieval at the evaluation's lengths, its scores added to the
    report just written, its cells and trials in the retrieval files beside it."""
    from posenc.retrieval.rundir import attach_to_eval, retrieval_workdir, summary_lines

    print(f"retrieval: {', '.join(args.tasks)}")
    record = retrieval_workdir(
        args.workdir,
        tasks=args.tasks,
        lengths=args.lengths,
        overrides=overrides,
        progress=True,
        qa_data=args.qa_data,
    )
    attach_to_eval(args.workdir, report_name, record)
    print("\n".join(summary_lines(record, args.workdir)))
    print(f"added the retrieval scores to {os.path.join(args.workdir, report_name)}")


def _cmd_analyze(args, overrides) -> int:
    from posenc.analysis import analyze_workdir, summary_lines

    extra = list(overrides)
    if args.split:
        extra.append(f"eval.split={args.split!r}")
    given = {"tokens": args.tokens, "block_size": args.block_size}  # None: the library's default
    print(f"analysing the attention of {args.workdir}")
    record = analyze_workdir(
        args.workdir,
        lengths=args.lengths,
        overrides=extra,
        progress=True,
        **{name: value for name, value in given.items() if value is not None},
    )
    print("\n".join(summary_lines(record, args.workdir)))
    return 0


def _cmd_retrieval(args, overrides) -> int:
    from posenc.retrieval.rundir import retrieval_workdir, summary_lines

    print(f"retrieval on {args.workdir}: {', '.join(args.tasks)}")
    record = retrieval_workdir(
        args.workdir,
        tasks=args.tasks,
        lengths=args.lengths,
        depths=args.depths,
        trials=args.trials,
        seed=args.seed,
        haystack=args.haystack,
        batch_size=args.batch_size,
        threshold=args.threshold,
        overrides=overrides,
        progress=True,
        qa_data=args.qa_data,
    )
    print("\n".join(summary_lines(record, args.workdir)))
    return 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.replace(" ", "").split(",") if x)


def _qa_data(text: str) -> dict[str, str]:
    """``--qa-data squad=<file or tfds:name>,hotpotqa=<file>``."""
    pairs = [x.split("=", 1) for x in text.split(",") if x.strip()]
    if not pairs or any(len(p) != 2 or not p[1].strip() for p in pairs):
        raise argparse.ArgumentTypeError(
            f"expected squad=<file or tfds:name>,hotpotqa=<file>, got {text!r}"
        )
    return {k.strip(): v.strip() for k, v in pairs}


_QA_HELP = (
    "the QA tasks' data (qa_1, qa_2): squad=<SQuAD json or tfds:squad/v2.0>,hotpotqa=<HotpotQA "
    "distractor json> (default SQuAD from a prepared tfds:squad/v2.0; see docs/retrieval.md)"
)


def _cmd_data_prepare(args, overrides) -> int:
    from posenc import data

    if _is_parallel(args):
        source = data.prepare_parallel(
            args.spec, args.data_dir, src_lang=args.src_lang, tgt_lang=args.tgt_lang
        )
        return _show_parallel(source, args)
    source = data.prepare(args.spec, data_dir=args.data_dir, text_field=args.text_field)
    return _show_source(source, args)


def _cmd_data_info(args, overrides) -> int:
    from posenc import data

    if _is_parallel(args):
        source = data.get_parallel_source(
            args.spec, args.data_dir, src_lang=args.src_lang, tgt_lang=args.tgt_lang
        )
        return _show_parallel(source, args)
    source = data.get_source(args.spec, data_dir=args.data_dir, text_field=args.text_field)
    return _show_source(source, args)


def _is_parallel(args) -> bool:
    """Whether `posenc data` names a translation source: `parallel:...`, languages given, or a
    TFDS builder whose features are one `Translation` (WMT, TED, ...). Building a TFDS builder
    object reads its registered class only; nothing downloads here."""
    if args.spec.startswith("parallel:") or args.src_lang or args.tgt_lang:
        return True
    if not args.spec.startswith("tfds:"):
        return False
    from posenc.data.base import resolve_data_dir
    from posenc.data.tfds_source import import_tfds, tfds_builder

    tfds = import_tfds()
    try:
        builder = tfds_builder(args.spec[len("tfds:") :], resolve_data_dir(args.data_dir))
    except Exception:  # an unknown builder: the text path says so in its own words
        return False
    return isinstance(builder.info.features, tfds.features.Translation)


def _show_parallel(source, args) -> int:
    """A parallel source's languages and pairs per split, or its info as JSON."""
    for split in source.splits:  # reads (and caches the counts of) every split once
        source.pairs(split)
    info = source.info()
    if args.json:
        print(json.dumps(_brief(info), indent=2))
        return 0
    print(f"{info['spec']}: {info['src_lang']} -> {info['tgt_lang']}")
    for split, entry in info["splits"].items():
        dropped = entry.get("dropped_empty", 0)
        print(
            f"  {split}: {entry['pairs']:,} pairs" + f" ({dropped:,} empty dropped)" * bool(dropped)
        )
    if "content_sha256" in info:
        print(f"  content sha256 {info['content_sha256']}")
    return 0


def _show_source(source, args) -> int:
    """The splits (files, sizes, tokens) and their rule, or the source's info as JSON; and a
    warning per evaluation split too small to measure at --longest."""
    from posenc.data import summary

    lines, thin = summary.describe(source, longest=args.longest)
    print(json.dumps(_brief(source.info()), indent=2) if args.json else "\n".join(lines))
    for line in thin:
        print(f"posenc: warning: {line}", file=sys.stderr)
    return 0


def _brief(info: dict) -> dict:
    return {k: v for k, v in info.items() if not isinstance(v, list) or len(v) <= 16}


def _cmd_plan(args, overrides) -> int:
    from posenc.runs.plan import PARTS, PlanFailed, parse_bytes, plan

    config = _load(args.config, overrides)
    memory = parse_bytes(args.device_memory) if args.device_memory else None
    parts = (args.only,) if args.only else PARTS
    try:
        planned = plan(config, args.devices, memory, parts, progress=True)
    except PlanFailed as e:  # the child's crash or kill, already one line
        print(f"posenc plan: error: {e}", file=sys.stderr)
        return 1
    print(planned.table())
    return 0


def _cmd_sweep(args, overrides) -> int:
    from posenc.runs.sweep import plan_sweep, run_sweep

    only = args.only or ()
    if args.list:
        print(plan_sweep(args.config, args.workdir, overrides=overrides, only=only))
        return 0
    summary = run_sweep(
        args.config,
        args.workdir,
        overrides=overrides,
        jobs=args.jobs,
        only=only,
        compile_cache=args.compile_cache,
    )
    return 0 if all(p["status"] != "failed" for p in summary) else 1


def _cmd_report(args, overrides) -> int:
    from posenc.report import write_report

    paths = write_report(args.sweep_dir, metric=args.metric)
    for path in paths:
        print(f"wrote {path}")
    return 0


def _cmd_import_hf(args, overrides) -> int:
    from posenc.hf.rundir import import_hf

    record = import_hf(
        args.hf_dir,
        args.workdir,
        data=args.data,
        dtype=args.dtype,
        param_dtype=args.param_dtype,
        tokenizer=not args.no_tokenizer,
        base=args.config,
        overrides=overrides,
        strict=args.strict,
    )
    print(
        f"imported {record['family']} model {args.hf_dir} ({record['tensors']} tensors) into "
        f"{args.workdir}; evaluate it with: posenc eval --workdir {args.workdir} --lengths ..."
    )
    return 0


def _cmd_export_hf(args, overrides) -> int:
    from posenc.hf.rundir import export_hf

    result = export_hf(args.workdir, args.out, dtype=args.dtype)
    print(
        f"wrote {args.out} as a {result['family']} model (checkpoint step {result['step']}, "
        f"{len(result['files'])} files); transformers loads it with from_pretrained({args.out!r})"
    )
    return 0


def _add_kind_commands(sub) -> None:
    """The verbs the run kinds add (:meth:`posenc.kinds.RunKind.commands`), after the common
    verbs that read a trained run."""
    from posenc import kinds

    for kind in kinds.kinds():
        for command in kind.commands():
            p = sub.add_parser(command.name, help=command.help, description=command.description)
            command.add_arguments(p)
            p.set_defaults(
                func=command.run, writes=command.writes, takes_overrides=command.overrides
            )


_HARNESS = "harness"


def _cmd_harness(args, overrides) -> int:
    from posenc.harness.cli import run_cli

    return run_cli(args.lm_eval_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posenc",
        description="Compare positional encodings for transformers: train short, test long.",
        epilog="Config fields are overridden with --config.<field>=<value>, e.g. "
        "--config.encoding.name=alibi --config.train.steps=1000. "
        "See configs/base.py for every field. "
        "A work directory is used by one process at a time (a second one is refused with the "
        "holder's pid; the lock of a process that died is taken over). Checkpoints are "
        "verified against checksums before they are restored; a damaged one is reported and "
        "the newest intact one used.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "train",
        help="train one encoder (resuming from the work directory), then evaluate it",
        description="Train the run a config describes in --workdir, resuming from its newest "
        "intact checkpoint if there is one; then evaluate at eval.lengths and write eval.json. "
        "Resuming needs the same config (logging, checkpoint cadence, eval and the process "
        "layout may change) and the same data (data.json's stream hashes). The work directory "
        "is locked while training: a second process on it is refused.",
    )
    p.add_argument(
        "--config", required=True, help="config file[:variant], e.g. configs/base.py:tiny"
    )
    p.add_argument(
        "--workdir", required=True, help="run directory (checkpoints, metrics, eval.json)"
    )
    p.add_argument("--no-eval", action="store_true", help="train only")
    p.add_argument(
        "--stop-at", type=_positive_int, default=None, help="stop after this step (resume later)"
    )
    p.add_argument(
        "--init-from",
        metavar="WORKDIR",
        default=None,
        help="start from another run's parameters (its newest intact checkpoint) with a fresh "
        "optimizer, e.g. to fine-tune at a longer length (sets train.init_from)",
    )
    p.add_argument(
        "--drop-positions",
        action="store_true",
        help="DroPE (Gelberg et al. 2026): continue the --init-from run with its positional "
        "encoder dropped: encoding nope (every layer kind's too), the source's encoder "
        "parameters left behind, the change recorded in init.json (sets "
        "train.drop_positions); train.steps is the recalibration's budget",
    )
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "plan",
        help="compile a run for a mesh and report each device's memory, before running it",
        description="Compile the training step and the longest evaluation batch of a config "
        "for --devices devices on its mesh (--config.mesh.fsdp=..., mesh.tensor, ...), on "
        "virtual CPU devices when this machine has another count, and print the parameters, "
        "optimizer state, temporaries and peak of one device, and whether they fit in "
        "--device-memory. Nothing runs. A translation run's training step is planned at its "
        "longest bucket of pairs (its data is read).",
    )
    p.add_argument(
        "--config", required=True, help="config file[:variant], e.g. configs/base.py:tiny"
    )
    p.add_argument(
        "--devices", type=_count, default=None, help="devices of the mesh (default: this host's)"
    )
    p.add_argument(
        "--device-memory",
        default=None,
        help="memory of one device, e.g. 80GB (10^9 bytes) or 80GiB (default: this host's "
        "device when --devices is not given, else no verdict)",
    )
    p.add_argument(
        "--only",
        choices=("train", "eval"),
        default=None,
        help="plan only the training step, or only the evaluation (a model that is only "
        "evaluated: no optimizer state); default both",
    )
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser(
        "eval",
        help="evaluate a trained work directory at any lengths, without retraining",
        description="Evaluate the newest intact checkpoint of --workdir (its parameters only), "
        "recording the step scored and whether training had finished. Defaults come from the "
        "run's config; flags and overrides may change only what cannot change what was "
        "trained: the eval section (--lengths, --split, --mode, --stride, --max-tokens, "
        "--config.eval.*), the attention path (--config.model.attention_impl, "
        "--config.model.attention_block_size), data.data_dir and the hyperparameters the "
        "encoder declares safe at evaluation (e.g. xl's clamp_len); anything else (another "
        "encoder, model size, data set) is refused. With the run's own settings the result is "
        "eval.json; under changed settings it is written beside it, as "
        "eval-<changed settings>.json, recording the changes.",
    )
    p.add_argument("--workdir", required=True, help="a trained run directory")
    p.add_argument("--lengths", type=_int_list, help="window lengths, e.g. 512,1024,4096")
    p.add_argument("--split", choices=("validation", "test"), help="split to score")
    p.add_argument("--mode", choices=("nonoverlapping", "sliding"), help="window mode")
    p.add_argument("--stride", type=int, help="sliding mode: tokens scored per window")
    p.add_argument("--max-tokens", type=int, help="score at most this many tokens per length")
    p.add_argument(
        "--tasks",
        type=_names,
        default=None,
        help="also score retrieval tasks at the same lengths (passkey, niah_single_1, ...; see "
        "posenc retrieval): their scores go into the report, cells and trials into "
        "retrieval.json / retrieval.jsonl (retrieval-<settings>.* for other tasks, lengths or "
        "evaluation settings)",
    )
    p.add_argument("--qa-data", type=_qa_data, default=None, help=_QA_HELP)
    p.add_argument(
        "--output",
        default=None,
        help="a .json file name written in the work directory, never one of the run's own "
        "files (config.json, data.json, metrics.jsonl, ...) (default eval.json for the run's "
        "own settings, eval-<changed settings>.json otherwise)",
    )
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser(
        "analyze",
        help="attention by distance and attention entropy of a trained run, as tables and plots",
        description="Read the newest intact checkpoint of a decoder-only run and, on its "
        "evaluation windows at each length (the training length and beyond), reduce every "
        "layer's softmax attention, computed with the encoder's own hooks in query blocks "
        "(memory grows as L x block): the mean attention weight and mean logit by relative "
        "distance i - j per layer and head, and the entropy of the attention rows and its "
        "ratio to log(visible keys), the 'attention dilution' of extrapolation failures. "
        "Writes attention.json, attention.md, attention.csv, attention_entropy.csv, "
        "attention.png and attention_entropy.png in the work directory (attention-<settings>.* "
        "under changed evaluation settings, e.g. --config.encoding.hparams.scaling=yarn, or "
        "other --lengths or --tokens than the defaults). "
        "Runs with linear attention, encoder-decoders, algorithmic tasks and Transformer-XL "
        "memory (--config.eval.mem_len=0 analyses windows without it) are refused.",
    )
    p.add_argument("--workdir", required=True, help="a trained run directory")
    p.add_argument(
        "--lengths", type=_int_list, help="window lengths (default the run's evaluation lengths)"
    )
    p.add_argument(
        "--tokens",
        type=_count,
        default=None,
        help="tokens analysed per length: the first max(1, N // L) windows (default 16384)",
    )
    p.add_argument("--split", choices=("validation", "test"), help="split (default eval.split)")
    p.add_argument(
        "--block-size",
        type=_count,
        default=None,
        help="queries per block; memory grows as L x block (default 128)",
    )
    p.set_defaults(func=_cmd_analyze)

    p = sub.add_parser(
        "retrieval",
        help="passkey and needle-in-a-haystack accuracy by context length and needle depth",
        description="Score greedy retrieval of the newest intact checkpoint of a decoder-only "
        "run (trained, or imported from Hugging Face) with its own tokenizer: Landmark "
        "Attention's passkey prompt and RULER's needle-in-a-haystack tasks (niah_single_1..3, "
        "niah_multikey_1..3, niah_multivalue, niah_multiquery; vt, variable tracking; cwe and "
        "fwe, common and frequent words extraction; qa_1 and qa_2, SQuAD and HotpotQA "
        "question answering), prompts of exactly each length in the model's tokens with the "
        "needle at each depth. "
        "Evaluation-time overrides apply "
        "(e.g. --config.encoding.hparams.scaling=yarn). Writes retrieval.json, retrieval.jsonl "
        "(every trial: prompt, answer, output), retrieval.md, retrieval.png (heat map) and "
        "retrieval_length.png in the work directory (retrieval-<settings>.* under changed "
        "evaluation settings or other tasks, lengths, depths, trials, seed, haystack or "
        "threshold than the defaults, so no retrieval replaces another), with RULER's "
        "effective length.",
    )
    p.add_argument("--workdir", required=True, help="a run directory")
    p.add_argument(
        "--tasks",
        type=_names,
        default=("passkey",),
        help="comma-separated task names (default passkey)",
    )
    p.add_argument(
        "--lengths", type=_int_list, help="prompt lengths in tokens (default the eval lengths)"
    )
    p.add_argument(
        "--depths",
        type=_float_list,
        default=(0.0, 0.25, 0.5, 0.75, 1.0),
        help="needle depths, fractions of the context in [0, 1] (default 0,0.25,0.5,0.75,1)",
    )
    p.add_argument("--trials", type=_count, default=10, help="trials per length and depth")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts (default 0)")
    p.add_argument(
        "--haystack",
        default=None,
        help="text source of essay haystacks (pystdlib, textdir:<folder>, tfds:<name>; default "
        "the run's data source, or pystdlib for a synthetic run)",
    )
    p.add_argument("--batch-size", type=_count, default=16, help="trials decoded together")
    p.add_argument(
        "--threshold",
        type=float,
        default=85.6,
        help="effective length threshold in percent, in [0, 100] (default RULER's 85.6)",
    )
    p.add_argument("--qa-data", type=_qa_data, default=None, help=_QA_HELP)
    p.set_defaults(func=_cmd_retrieval)

    _add_kind_commands(sub)

    dtypes = ("float32", "bfloat16", "float16")
    p = sub.add_parser(
        "import-hf",
        help="import a local Hugging Face model folder as a posenc run directory",
        description="Read a local Hugging Face model folder (config.json, model.safetensors or "
        "its shards and index, tokenizer.json) and write a run directory that posenc eval, "
        "posenc report, posenc.load_run and posenc train --init-from accept. Families: Llama "
        "(Llama 2/3/3.1/3.2, Mistral, Qwen2), Phi-3, GPT-NeoX/Pythia, GPT-2, OPT, BLOOM "
        "(causal-LM runs), BERT and RoBERTa (masked-LM runs), T5 and Flan-T5 (translation runs, "
        "base config configs/translation.py:base). --config.<field>=<value> overrides the "
        "base run config (e.g. data.data_dir, eval.lengths); the model, encoding and "
        "train.seq_len are the pretrained model's. Nothing downloads: fetch the folder with "
        "your own tools. A config.json field that transformers' config class of the model_type "
        "consumes and posenc does not map is refused (it may change the model); any other "
        "field (unk_token_id, _model_name_or_path, quantization_config of float weights, ...) "
        "no transformers model of that type reads, so it is ignored: recorded in "
        "pretrained.json and reported in one warning (--strict refuses it).",
    )
    p.add_argument("hf_dir", help="the model's folder")
    p.add_argument("--workdir", required=True, help="the run directory to create")
    p.add_argument(
        "--data",
        default=None,
        help="data.source that posenc eval scores (default pystdlib; parallel:default for an "
        "encoder-decoder such as T5)",
    )
    p.add_argument("--dtype", choices=dtypes, default="float32", help="compute dtype (model.dtype)")
    p.add_argument(
        "--param-dtype", choices=dtypes, default=None, help="checkpoint dtype (default float32)"
    )
    p.add_argument(
        "--no-tokenizer",
        action="store_true",
        help="import the weights without the model's tokenizer.json (text is then bytes)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="base run config file[:variant] (default configs/base.py; "
        "configs/translation.py:base for an encoder-decoder)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="also refuse config.json fields no transformers model of the type reads (by "
        "default they are ignored, recorded in pretrained.json and reported)",
    )
    p.set_defaults(func=_cmd_import_hf)

    p = sub.add_parser(
        "export-hf",
        help="write a run's model as a Hugging Face folder (transformers loads it)",
        description="Write the newest intact checkpoint of --workdir as a Hugging Face folder "
        "(config.json, model.safetensors, tokenizer files): an imported run as its family, a "
        "posenc-trained one as the family that holds its options (RoPE: Llama or GPT-NeoX; "
        "learned: GPT-2; ALiBi with model.embed_norm: BLOOM; t5: T5).",
    )
    p.add_argument("--workdir", required=True, help="a trained or imported run directory")
    p.add_argument("--out", required=True, help="a new (or empty) folder to write")
    p.add_argument("--dtype", choices=dtypes, default="float32", help="dtype of the tensors")
    p.set_defaults(func=_cmd_export_hf)

    p = sub.add_parser(
        _HARNESS,
        add_help=False,
        help="run EleutherAI's lm-evaluation-harness with the posenc model registered",
        description="posenc harness <lm_eval arguments>: lm_eval's own command line (run, ls, "
        "validate; run when none is given) with --model posenc known; --model_args "
        "workdir=<run>[,max_length=N,batch_size=N,max_gen_toks=N,<config field>=<value>]. "
        "Results go to <workdir>/harness/ unless --output_path is given. Needs the harness "
        "extra (pip install 'posenc[harness]').",
    )
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="lm_eval's arguments")
    p.set_defaults(func=_cmd_harness)

    p = sub.add_parser("data", help="prepare or inspect data sources")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    splits = (
        "; then print each split's files (largest first, with sizes), bytes and tokens, and the "
        "rule that assigned the files (textdir: without train/, validation/, test/ subfolders, "
        "whole files by a hash of their relative path, ~90/5/5 %)"
    )
    for name, func, text in (
        ("prepare", _cmd_data_prepare, "prepare a data source once (textdir:, tfds:, pystdlib)"),
        ("info", _cmd_data_info, "print a prepared source's splits, sizes and content hash"),
    ):
        q = data_sub.add_parser(name, help=text, description=text + splits)
        q.add_argument(
            "spec",
            help="pystdlib | textdir:<path> | tfds:<name>[/<config>] | parallel:<dir|default>",
        )
        # The underscore spellings are what DataNotFoundError's messages print (TFDS's style).
        q.add_argument(
            "--data-dir",
            "--data_dir",
            default=None,
            help="default $POSENC_DATA_DIR or ~/.cache/posenc/data",
        )
        q.add_argument(
            "--text-field",
            "--text_field",
            default=None,
            help="tfds: the text feature (default text)",
        )
        for side in ("src", "tgt"):
            q.add_argument(
                f"--{side}-lang",
                f"--{side}_lang",
                default=None,
                help=f"translation sources: the {side} language (default the source's)",
            )
        q.add_argument(
            "--longest",
            type=_length,
            default=1024,
            metavar="L",
            help="the longest evaluation length you plan (default 1024): a validation or test "
            "split with fewer than 4 windows of L tokens is flagged as too small to measure",
        )
        q.add_argument("--json", action="store_true", help="print the source's info as JSON")
        q.set_defaults(func=func)

    p = sub.add_parser(
        "sweep",
        help="run every point of a sweep config (skips finished points, resumes others)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Run each point of a sweep config in its own work directory under --workdir. A sweep config is
a Python file with get_config() (the base run config) and get_sweep() (a list of points, each
a dict of dotted overrides; posenc.runs.sweep.product builds a grid), e.g.:

    from posenc.runs.config import load_config
    from posenc.runs.sweep import product

    def get_config():
        return load_config("configs/base.py:tiny")

    def get_sweep():
        return product(**{"encoding.name": ["alibi", "rope"], "seed": [0, 1]})

Finished points are skipped, interrupted ones resumed, failures recorded without stopping the
rest. The sweep directory and each point's directory are locked while in use; with --jobs > 1
the point processes end when the sweep ends, however it ends. Ctrl-C stops the sweep; run the
same command to resume.

--config.<field>=<value> overrides apply to every point, e.g. --config.train.steps=200
--config.data.source=textdir:/my/texts. They are checked against every point before the first
one starts: an unknown field, a value that makes a point invalid, or a field the points set
themselves (narrow the sweep with --only instead) is refused in one line.""",
    )
    p.add_argument("--config", required=True, help="sweep config file[:variant]")
    p.add_argument("--workdir", required=True, help="directory holding one folder per point")
    p.add_argument("--jobs", type=int, default=1, help="points run at a time (processes)")
    p.add_argument(
        "--only",
        action="append",
        metavar="FIELD=VALUE[,VALUE...]",
        help="run only the points whose config has one of these values at FIELD, e.g. "
        "--only encoding.name=alibi,rope --only seed=0 (repeatable: all must hold); the other "
        "points stay in sweep.json, unrun",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="print the points (to run, finished, left out by --only) after the same checks, "
        "and run nothing",
    )
    p.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="JAX's persistent compilation cache in DIR, shared by the points: a point that "
        "repeats another's model and shapes (another seed) loads its compiled steps instead of "
        "compiling them, e.g. --compile-cache WORKDIR/compile_cache",
    )
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser(
        "report",
        help="tables (markdown, CSV) and plots from a sweep directory",
        description="Gather every evaluation of every run under a directory (each eval.json "
        "and each eval-<changes>.json that posenc eval wrote under changed settings) into "
        "tables laid out like ALiBi's Tables 2-3 (one column per configuration and evaluation, "
        "named by what the evaluation changed, e.g. 'rope (yarn x8)'; seeds averaged) and "
        "plots of the metric against evaluation length.",
    )
    p.add_argument(
        "sweep_dir", help="a directory written by posenc sweep, a folder of runs, or one run"
    )
    p.add_argument(
        "--metric",
        choices=(
            "perplexity",
            "bits_per_byte",
            "loss",
            "accuracy",
            "exact_match",
            "sequence_accuracy",
            "f1",
            "matthews",
            "pearson",
            "spearman",
        ),
        default="perplexity",
        help="accuracy: masked-LM runs (train.objective=masked_lm), or algorithmic-task runs "
        "(data.source=synthetic:<task>; their default), with exact_match (greedy generation) "
        "and sequence_accuracy; classification runs (model.assembly=classifier) default to "
        "their task's GLUE metric (accuracy, f1, matthews, pearson, spearman)",
    )
    p.set_defaults(func=_cmd_report)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """posenc's own warnings (a damaged checkpoint) as one line; others as Python prints them."""
    if category.__module__.startswith("posenc"):
        print(f"posenc: warning: {message}", file=sys.stderr if file is None else file)
    else:
        _show_warning(message, category, filename, lineno, file, line)


_show_warning = warnings.showwarning


# The common verbs that take --config.<field>=<value> overrides (a kind's verb says itself).
_TAKE_OVERRIDES = ("train", "eval", "sweep", "analyze", "import-hf", "retrieval", "plan")

_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_FULL = (errno.ENOSPC, errno.EDQUOT)
# What each command writes where, for the message about a directory it cannot write to.
_WRITES = {
    "train": "its config, checkpoints, metrics and lock file in the work directory",
    "eval": "its lock file and its report in the work directory",
    "sweep": "its records, and each point's run, in the sweep directory",
    "report": "its tables and plots in the directory it reports on",
    "analyze": "its lock file, tables and plots in the work directory",
    "data": "the prepared data in the data directory",
    "import-hf": "the run's config, checkpoint and tokenizer in the work directory",
    "export-hf": "config.json, safetensors and tokenizer files in the output folder",
}


def _os_error_line(command: str, error: OSError, writes: str | None = None) -> str | None:
    """One line for an operating system refusing a write: not writable, or out of space;
    ``writes``: what the command writes where (default from :data:`_WRITES`)."""
    if error.errno not in _NOT_WRITABLE + _FULL or not error.filename:
        return None
    path = os.path.abspath(os.fsdecode(error.filename))
    folder, name = os.path.dirname(path), os.path.basename(path)
    if error.errno in _FULL:
        return (
            f"cannot write {name} in {folder}: {error.strerror}; what was written before is "
            "intact: free some space and run the same command again (a run resumes from its "
            "last checkpoint)"
        )
    fix = (
        "it is on a read-only file system: work on a copy elsewhere"
        if error.errno == errno.EROFS
        else f"give yourself write permission (chmod -R u+w {folder}) or work on a copy"
    )
    return (
        f"cannot write {name} in {folder} ({error.strerror}): posenc {command} writes "
        f"{writes or _WRITES.get(command, 'there')}; {fix}"
    )


def _out_of_memory(error: BaseException) -> bool:
    if "jax" not in sys.modules:  # nothing ran on a device
        return False
    from posenc.devices.fits import is_out_of_memory

    return is_out_of_memory(error)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv[:1] == [_HARNESS]:  # lm_eval's arguments, passed on as they are
        rest, overrides = [], []
        args = argparse.Namespace(command=_HARNESS, func=_cmd_harness, lm_eval_args=argv[1:])
    else:
        rest, overrides = _split_overrides(argv)
        args = parser.parse_args(rest)
    if overrides and not getattr(args, "takes_overrides", args.command in _TAKE_OVERRIDES):
        parser.error(f"--config.* overrides do not apply to `posenc {args.command}`")
    if not os.environ.get("POSENC_TRACEBACK"):
        warnings.showwarning = _one_line_warning
    try:
        return args.func(args, overrides)
    except (ValueError, FileNotFoundError) as e:
        if os.environ.get("POSENC_TRACEBACK"):
            raise
        print(f"posenc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:  # posenc.runs.train.NonFiniteLossError
        if os.environ.get("POSENC_TRACEBACK"):
            raise
        print(f"posenc {args.command}: training diverged: {e}", file=sys.stderr)
        return 3
    except OSError as e:  # a directory that is not writable, a full disk
        line = _os_error_line(args.command, e, getattr(args, "writes", None))
        if os.environ.get("POSENC_TRACEBACK") or line is None:
            raise
        print(f"posenc {args.command}: error: {line}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - an allocator's failure, whatever raised it
        if os.environ.get("POSENC_TRACEBACK") or not _out_of_memory(e):
            raise
        print(
            f"posenc {args.command}: error: ran out of memory ({_first_line(e)}); lower "
            "train.batch_size or eval.batch_tokens/eval.memory_budget (task runs: "
            "eval.examples), model.loss_chunk, train.seq_len or eval.lengths, or "
            "model.attention_block_size",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        if os.environ.get("POSENC_TRACEBACK"):
            raise
        print(
            f"posenc {args.command}: interrupted; run the same command again to resume from "
            "the last checkpoint",
            file=sys.stderr,
        )
        return 130
    finally:
        warnings.showwarning = _show_warning


if __name__ == "__main__":
    sys.exit(main())
