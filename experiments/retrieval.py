"""Passkey retrieval trained from scratch, by encoder, at 1-8x the training length.

(a) ``--variant tiny`` (CPU): every registered encoder (or ``--encoders``) is trained on
``synthetic:passkey`` with ``configs/retrieval.py:tiny`` (Landmark Attention's passkey prompt at
248-288 byte tokens, the key at a uniform depth), then ``posenc retrieval`` scores it at 288,
576, 1152 and 2304 tokens and five depths. Each run's ``retrieval.*`` files sit in its work
directory; ``report.md`` in ``--workdir`` puts them side by side (mean score by length, RULER's
effective length, score against length, each encoder's heat map by length x depth).

    python experiments/retrieval.py --variant tiny --encoders rope,alibi,nope,t5
    # about 2.5 CPU minutes per encoder (1200 steps of 8 prompts); reruns skip finished runs

``--variant bench``: the cost of one passkey trial at 4k and 16k tokens for a tiny (untrained)
model per encoder: trials per second (batch 1, after a compiling warm-up) and the bytes XLA's
compiled greedy program needs (``memory_analysis``: arguments, outputs and temporaries), which
grows linearly in L where the prefill runs on the blocked attention path.

    python experiments/retrieval.py --variant bench --encoders rope,alibi,t5

(b) Real checkpoints (PI / YaRN's passkey table) need no training: import a Llama-family model
(``posenc import-hf``), then one command per setting, e.g.::

    posenc retrieval --workdir runs/llama2-7b --tasks passkey \\
        --lengths 4096,8192,16384,32768 --depths 0,0.25,0.5,0.75,1 --trials 50
    posenc retrieval --workdir runs/llama2-7b --tasks passkey \\
        --lengths 8192,16384,32768,65536,131072 --trials 50 \\
        --config.encoding.hparams.scaling=yarn --config.encoding.hparams.factor=32 \\
        --config.encoding.hparams.original_max_len=4096
    posenc report runs/          # the retrieval section compares them

For comparison, YaRN (Peng et al. 2023) Table 5 reports 99.4 % passkey accuracy for Llama 2 7B
fine-tuned with YaRN s=32 at a 128k context; Position Interpolation (Chen et al. 2023) reports
that its extended models retrieve the passkey at their extended windows while the models
extended by direct fine-tuning do not beyond a modest length. (Without a YaRN fine-tune,
``--config.encoding.hparams.scaling=yarn`` on the base model is YaRN's zero-shot setting.)
"""

from __future__ import annotations

import argparse
import os

from posenc import encodings
from posenc.report import write_report
from posenc.retrieval.rundir import retrieval_workdir
from posenc.runs.config import apply_overrides, load_config
from posenc.runs.train import train
from posenc.workdir import RunDir, retrieval_names

CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "retrieval.py"
)
VARIANTS = {
    "tiny": {
        "config": "tiny",
        "lengths": (288, 576, 1152, 2304),  # 1, 2, 4, 8 x train.seq_len
        "depths": (0.0, 0.25, 0.5, 0.75, 1.0),
        "trials": 10,
    },
}


BENCH_LENGTHS = (4096, 16384)


def bench(encoders: list[str], trials: int = 3) -> list[dict]:
    """Trials per second and compiled bytes of one passkey trial per encoder and length."""
    import time

    import jax
    import numpy as np
    from flax import nnx

    from posenc.benchmark.measure import compiled_memory
    from posenc.data import ByteTokenizer
    from posenc.decoding.lm import greedy_generate
    from posenc.models import build
    from posenc.retrieval import evaluate_retrieval, model_generator

    rows = []
    for name in encoders:
        config = apply_overrides(
            load_config(f"{CONFIG}:tiny"),
            [f"encoding.name={name!r}", "data.source='pystdlib'", "train.max_position=32768"],
        )
        model = build(config)
        graphdef, state = nnx.split(model)
        for length in BENCH_LENGTHS:
            run = dict(generate=model_generator(model), tokenizer=ByteTokenizer(), depths=(0.5,))
            run.update(task_names=("passkey",), lengths=(length,), batch_size=1, stop_id=256)
            evaluate_retrieval(**run, trials=1)  # compiles
            start = time.perf_counter()
            evaluate_retrieval(**run, trials=trials)
            seconds = time.perf_counter() - start
            generate = jax.jit(lambda s, p, g=graphdef: greedy_generate(nnx.merge(g, s), p, 10))
            prompts = jax.ShapeDtypeStruct((1, length), np.int32)
            memory = compiled_memory(generate.lower(state, prompts).compile())
            rows.append(
                {"encoding": name, "length": length, "trials_per_second": trials / seconds} | memory
            )
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=(*VARIANTS, "bench"), default="tiny")
    parser.add_argument("--workdir", help="output directory (default runs/retrieval_<variant>)")
    parser.add_argument(
        "--encoders", help="comma-separated encoder names (default: every registered encoder)"
    )
    args = parser.parse_args(argv)
    if args.variant == "bench":
        bench(args.encoders.split(",") if args.encoders else ["rope", "alibi"])
        return 0
    variant = VARIANTS[args.variant]
    workdir = args.workdir or os.path.join("runs", f"retrieval_{args.variant}")
    names = args.encoders.split(",") if args.encoders else list(encodings.names())
    for name in names:
        run_dir = os.path.join(workdir, name)
        config = apply_overrides(
            load_config(f"{CONFIG}:{variant['config']}"), [f"encoding.name={name!r}"]
        )
        train(config, run_dir)  # resumes, or returns at once when finished
        if os.path.exists(RunDir(run_dir).file(retrieval_names({})["json"])):
            continue
        try:
            record = retrieval_workdir(
                run_dir,
                tasks=("passkey",),
                lengths=variant["lengths"],
                depths=variant["depths"],
                trials=variant["trials"],
                progress=True,
            )
        except ValueError as e:  # an encoder greedy decoding refuses (not cacheable)
            print(f"{name}: not scored: {e}")
            continue
        print(f"{name}: effective length {record['effective_length']}")
    for path in write_report(workdir, metric="exact_match"):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
