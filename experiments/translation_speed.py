"""Encoder-decoder cost: training throughput against a decoder-only model, cached beam search
against recomputation, the caches' memory, and the padding of token-bucketed batches.

Three measurements, each printed as a table and written to ``--out`` (JSON and Markdown):

1. **Training throughput.** ``posenc.runs.train.Trainer`` steps of the encoder-decoder (``N``
   encoder + ``N`` decoder blocks, width ``D``) on rows of ``S`` source and ``T`` target tokens,
   against the decoder-only LM with ``2N`` blocks of the same width on rows of ``S + T`` tokens:
   the same tokens through the same number of blocks. Reported: tokens per second of each and
   their ratio (decoder-only / encoder-decoder), per encoder.
2. **Beam search.** Beam 4 over 100 new tokens (EOS suppressed, so every hypothesis runs the
   whole length) through the decoder's key/value caches against a search that reruns the whole
   decoder over the token buffer at every step; seconds and the speed-up. Beside it the bytes of
   the self-attention caches for beams 1, 4, 8 and 50, 100, 200 slots (linear in both).
3. **Padding.** The share of padded slots of ``PairBatches`` on the embedded corpus (bytes and
   SentencePiece vocabularies; all sources and sources of at most 32 tokens).

Timings are robust to a shared, noisy machine: the two sides of each comparison alternate in
``--rounds`` rounds (``posenc.benchmark.rounds.time_rounds``), each round timing ``--steps``
calls of each, and the report gives the median per-call time and the median of the per-round
ratios, with their spread (min-max). Compilation is excluded (every function is compiled and
run once before timing).

    python experiments/translation_speed.py                  # 2-core CPU defaults
    python experiments/translation_speed.py --width 512 --layers 6 --rows 64 --src-len 64 \\
        --tgt-len 64 --encoders sinusoidal,rope,t5,shaw,alibi   # a GPU
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc import data as data_lib
from posenc import encodings
from posenc.benchmark.rounds import summarise, time_rounds
from posenc.decoding.beam import beam_search
from posenc.models import build
from posenc.runs.config import apply_overrides, load_config
from posenc.runs.train import Trainer

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs")


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--encoders", default="sinusoidal,learned,rope,t5,alibi,shaw,xl,nope")
    p.add_argument("--layers", type=int, default=2, help="N: encoder and decoder blocks each")
    p.add_argument("--width", type=int, default=128, help="model width D")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--rows", type=int, default=16, help="pairs per training batch")
    p.add_argument("--src-len", type=int, default=48)
    p.add_argument("--tgt-len", type=int, default=48)
    p.add_argument("--beam-rows", type=int, default=8, help="sources decoded at once")
    p.add_argument("--new-tokens", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed calls per side per round")
    p.add_argument("--out", default="runs/translation_speed")
    p.add_argument("--data-dir", default=None, help="data.data_dir (SentencePiece cache)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: train,beam,padding")
    return p.parse_args(argv)


def timed_rounds(calls: dict[str, Callable[[], Any]], args: argparse.Namespace) -> dict:
    """Each call compiled and warm, then timed per round by :func:`time_rounds` (the calls
    alternating within every round); per call its seconds per call and their spread."""
    for call in calls.values():
        jax.block_until_ready(call())

    def per_call(call):
        def seconds():
            start = time.perf_counter()
            for _ in range(args.steps):
                out = call()
            jax.block_until_ready(out)
            return (time.perf_counter() - start) / args.steps

        return seconds

    figures = {(name, "time"): per_call(call) for name, call in calls.items()}
    seconds, _ = time_rounds(figures, list(calls), args.rounds, repeats=1)
    return {row["encoder"]: row for row in summarise(seconds, baseline=list(calls)[-1])}


def _ratio(row: dict[str, Any]) -> dict[str, float]:
    """The median of the per-round ratios to the baseline, and their range."""
    return {"ratio": row["ratio_median"], "min": row["ratio_min"], "max": row["ratio_max"]}


def _configs(args: argparse.Namespace, encoder: str) -> tuple[Any, Any]:
    """The encoder-decoder's and the decoder-only model's configs, same width and block count."""
    shape = [
        f"model.model_dim={args.width}",
        f"model.num_heads={args.heads}",
        f"model.mlp_dim={4 * args.width}",
        "model.dropout=0.0",
        "model.dtype=float32",
        f"encoding.name={encoder}",
        "train.steps=1000",
    ]
    ed = apply_overrides(
        load_config(os.path.join(CONFIGS, "translation.py:tiny")),
        shape + [f"model.num_layers={args.layers}", f"model.num_encoder_layers={args.layers}"],
    )
    lm = apply_overrides(
        load_config(os.path.join(CONFIGS, "base.py:base")),
        shape
        + [
            f"model.num_layers={2 * args.layers}",
            f"model.vocab_size={ed.model.vocab_size}",
            f"train.seq_len={args.src_len + args.tgt_len}",
            f"train.batch_size={args.rows}",
        ],
    )
    return ed, lm


def _step_call(trainer: Trainer, batch: dict[str, np.ndarray]) -> Callable[[], Any]:
    """One training step per call; the state is carried (the step donates it)."""
    holder = {"state": trainer.init_state()}
    batch = trainer.global_batch(batch)

    def call():
        holder["state"], metrics = trainer.step(holder["state"], batch)
        return metrics["loss_sum"]

    return call


def training(args: argparse.Namespace, encoder: str) -> dict[str, Any]:
    """Tokens per second of the encoder-decoder and the decoder-only model on the same tokens."""
    ed_config, lm_config = _configs(args, encoder)
    rng = np.random.default_rng(0)
    rows, s, t = args.rows, args.src_len, args.tgt_len
    vocab = ed_config.model.vocab_size

    def ids(*shape):
        return rng.integers(0, 256, shape).astype(np.int32)

    ed_batch = {
        "src": ids(rows, s),
        "src_mask": np.ones((rows, s), bool),
        "tgt_in": ids(rows, t),
        "tgt_out": ids(rows, t),
        "tgt_mask": np.ones((rows, t), bool),
    }
    window = ids(rows, s + t + 1)
    lm_batch = {"inputs": window[:, :-1], "targets": window[:, 1:]}
    assert vocab > 256
    timed = timed_rounds(
        {
            "encoder_decoder": _step_call(Trainer(ed_config), ed_batch),
            "decoder_only": _step_call(Trainer(lm_config), lm_batch),  # the baseline
        },
        args,
    )
    tokens = rows * (s + t)
    return {
        "encoder": encoder,
        "tokens_per_step": tokens,
        "encoder_decoder_tokens_per_s": tokens / timed["encoder_decoder"]["median"],
        "decoder_only_tokens_per_s": tokens / timed["decoder_only"]["median"],
        "slowdown": _ratio(timed["encoder_decoder"]),
        "timed": timed,
    }


def beam(args: argparse.Namespace, encoder: str = "sinusoidal", k: int = 4) -> dict[str, Any]:
    """Beam-``k`` search over ``--new-tokens`` tokens, cached against recomputed."""
    config, _ = _configs(args, encoder)
    model = build(config)
    graphdef, state = nnx.split(model)
    b, n, s = args.beam_rows, args.new_tokens, args.src_len
    eos = 256  # the byte vocabulary's EOS, suppressed below
    rng = np.random.default_rng(1)
    src = jnp.asarray(rng.integers(0, 256, (b, s)), jnp.int32)
    mask = jnp.ones((b, s), bool)
    tokens = jnp.zeros((b, n + 1), jnp.int32).at[:, 0].set(257)
    positions = jnp.arange(n + 1)[None]

    def no_eos(logits):  # every hypothesis runs all n tokens
        return logits.at[:, eos].set(-1e9)

    def search(cached: bool):
        @jax.jit
        def run(state, src, mask, tokens):
            model = nnx.merge(graphdef, state)
            encoded, m = model.encode(src, mask)
            cross = model.cross_caches(jnp.repeat(encoded, k, 0), jnp.repeat(m, k, 0))

            def step_cached(tokens, slot, caches):
                logits, caches = model.decode(tokens, slot, positions, caches, cross)
                return no_eos(logits[:, 0]), caches

            def step_recomputed(tokens, slot, carry):
                logits, _ = model.decode_forward(tokens, cross)
                return no_eos(jax.lax.dynamic_index_in_dim(logits, slot, 1, False)), carry

            args_ = dict(start=0, beam_size=k, alpha=0.6, max_len=n, eos_id=eos)
            if cached:
                init = model.empty_caches(b * k, n + 1)
                return beam_search(step_cached, init, tokens, **args_)
            return beam_search(step_recomputed, jnp.zeros((b * k,)), tokens, **args_)

        return lambda: run(state, src, mask, tokens)

    cached, recomputed = search(True), search(False)
    same = bool(np.array_equal(np.asarray(cached()[0]), np.asarray(recomputed()[0])))
    timed = timed_rounds(
        {"recomputed": recomputed, "cached": cached},
        argparse.Namespace(rounds=args.rounds, steps=1),
    )
    memory = {}
    for beams in (1, 4, 8):
        for slots in (50, 100, 200):
            caches = jax.eval_shape(functools.partial(model.empty_caches, b * beams, slots))
            memory[f"beam{beams}_slots{slots}"] = sum(
                x.size * x.dtype.itemsize for x in jax.tree.leaves(caches)
            )
    return {
        "encoder": encoder,
        "rows": b,
        "beam": k,
        "new_tokens": n,
        "same_outputs": same,
        "speedup": _ratio(timed["recomputed"]),
        "timed": timed,
        "cache_bytes": memory,
    }


def padding(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The padded share of ``PairBatches`` slots on the embedded corpus."""
    source = data_lib.get_parallel_source("parallel:default")
    train = source.pairs("train")
    out = []
    for vocab_name, size in (("bytes", None), ("sentencepiece", 512)):
        kwargs = {"vocab_size": size, "data_dir": args.data_dir} if size else {}
        vocab = data_lib.make_vocab(vocab_name, train, **kwargs)
        encoded = data_lib.encode_pairs(train, vocab)
        for max_src_len in (None, 32):
            batches = data_lib.PairBatches(
                encoded, tokens_per_batch=2048, seed=0, max_src_len=max_src_len
            )
            report = batches.padding_report()
            out.append({"vocab": vocab_name, "max_src_len": max_src_len, **report})
    return out


def _markdown(result: dict[str, Any]) -> str:
    md = [f"# Encoder-decoder cost ({result['device']})", ""]
    a = result["settings"]
    if result.get("training"):
        md += [
            f"## Training: {a['layers']} + {a['layers']} blocks against {2 * a['layers']} "
            f"decoder-only blocks, width {a['width']}, {a['rows']} rows of {a['src_len']} + "
            f"{a['tgt_len']} tokens",
            "",
            "| encoder | enc-dec tokens/s | decoder-only tokens/s | slowdown (round range) |",
            "|---|---|---|---|",
        ]
        for r in result["training"]:
            s = r["slowdown"]
            md.append(
                f"| {r['encoder']} | {r['encoder_decoder_tokens_per_s']:,.0f} | "
                f"{r['decoder_only_tokens_per_s']:,.0f} | {s['ratio']:.2f}x "
                f"({s['min']:.2f}-{s['max']:.2f}) |"
            )
        md.append("")
    if result.get("beam"):
        r = result["beam"]
        t, s = r["timed"], r["speedup"]
        md += [
            f"## Beam {r['beam']}, {r['rows']} sources, {r['new_tokens']} new tokens "
            f"({r['encoder']})",
            "",
            f"cached {t['cached']['median']:.3f} s, recomputed {t['recomputed']['median']:.3f}"
            f" s: {s['ratio']:.1f}x ({s['min']:.1f}-{s['max']:.1f}); same outputs: "
            f"{r['same_outputs']}",
            "",
            "Self-attention cache bytes (beam x slots):",
            "",
            "| beams | 50 slots | 100 slots | 200 slots |",
            "|---|---|---|---|",
        ]
        for beams in (1, 4, 8):
            cells = [f"{r['cache_bytes'][f'beam{beams}_slots{n}']:,}" for n in (50, 100, 200)]
            md.append(f"| {beams} | " + " | ".join(cells) + " |")
        md.append("")
    if result.get("padding"):
        md += ["## Padding of token-bucketed batches (2,048 tokens)", ""]
        md += ["| vocabulary | sources | padded share | shapes |", "|---|---|---|---|"]
        for r in result["padding"]:
            limit = "all" if r["max_src_len"] is None else f"<= {r['max_src_len']} tokens"
            md.append(
                f"| {r['vocab']} | {limit} | {100 * r['padding']:.1f} % | {r.get('shapes', '')} |"
            )
    return "\n".join(md) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(sys.argv[1:] if argv is None else argv)
    skip = set(filter(None, args.skip.split(",")))
    names = [n for n in args.encoders.split(",") if n]
    for name in names:
        encodings.get(name)  # an unknown encoder is refused before anything runs
    device = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
    result: dict[str, Any] = {"device": device, "settings": vars(args)}
    if "padding" not in skip:
        result["padding"] = padding(args)
        print(_markdown({**result, "settings": vars(args)}), flush=True)
    if "beam" not in skip:
        result["beam"] = beam(args)
    if "train" not in skip:
        result["training"] = []
        for name in names:
            result["training"].append(training(args, name))
            print(_markdown(result), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "translation_speed.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "translation_speed.md"), "w") as f:
        f.write(_markdown(result))
    print(_markdown(result))
    return result


if __name__ == "__main__":
    main()
