"""RoFormer Tables 2 and 5 (Su et al. 2021, Sec. 4.3-4.4): fine-tuning a masked-LM encoder for
classification, learned absolute positions (BERT) against RoPE (RoFormer), and classification
at longer inputs than training.

    python experiments/roformer_glue.py                      # tiny: 2-core CPU, ~10 minutes
    python experiments/roformer_glue.py --variant glue --task mrpc --data-dir ~/tfds

For each encoder (``--encoders``, default ``learned,rope``) and seed: a masked-LM pre-training
run (``configs/classify.py:mlm_tiny``, or ``mlm_base``), then two classification runs on the
same task, one fine-tuned from it (``train.init_from``) and one from scratch; each is
evaluated at the training length and per length bucket (1x, 2x, 4x the training length: Table
5's question, asked of one model), and ``report.md`` tables them.

- ``tiny``: the embedded text-order task (``labelled:default``, 50 % without positions),
  rows of 64 tokens; the learned table has 256 rows (BERT's is as long as its longest input),
  so the 2x and 4x buckets read rows it never trained, drawn on the token embeddings' scale
  (``--learned-init-std``, :data:`LEARNED_INIT_STD`).
- ``glue``: BERT-base's shape, ``tfds:glue/<task>`` (prepare it first: ``tfds build
  glue/<task> --data_dir=<dir> --file_format=array_record``), rows of 128 tokens;
  ``--pretrain-steps`` masked-LM steps on ``--pretrain-source`` (a prepared corpus; ``pystdlib``
  by default), or ``--init-from DIR`` to skip pre-training and fine-tune an existing masked-LM
  (or imported BERT) run of the same shape.

Runs resume where they stopped; finished ones are skipped. ``--config.<field>=<value>``
overrides apply to the classification runs.
"""

import argparse
import os
import sys
import time

from posenc.cli import _split_overrides
from posenc.kinds.classification import is_classifier
from posenc.report import write_report
from posenc.runs.config import apply_overrides, load_config
from posenc.runs.evaluate import evaluate_workdir
from posenc.runs.train import train
from posenc.workdir import RunDir

CONFIG = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "classify.py")
)
# The learned table's rows: 4x the tiny training length, so that every bucket can be read.
LEARNED_ROWS = {"tiny": 256, "glue": 512}
# The learned table's initial scale: that of the token embeddings, as in BERT (both tables
# N(0, 0.02)). posenc scales token embeddings by sqrt(D) (entries ~ N(0, 1)), so the encoder's
# default 0.02 would start positions 50x smaller than tokens: at the tiny scale they are then
# never learned (chance on the text-order task, the bag-of-bytes plateau of masked LM).
LEARNED_INIT_STD = 1.0


def _run(spec: str, workdir: str, overrides: list[str]) -> None:
    """Trains (or resumes) one run and evaluates it, unless its evaluation of the finished run
    exists already (a finished masked-LM run is restored and left as it is)."""
    config = apply_overrides(load_config(spec), overrides)
    done = os.path.isdir(workdir) and (RunDir(workdir).read_eval() or {}).get("finished")
    if done:
        return
    print(f"--- {workdir}", flush=True)
    result = train(config, workdir)
    if is_classifier(config):  # the masked-LM run needs no evaluation here
        evaluate_workdir(workdir, model=result.model, step=result.step, progress=False)


def main(argv: list[str] | None = None) -> int:
    rest, overrides = _split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("tiny", "glue"), default="tiny")
    parser.add_argument("--task", default="mrpc", help="GLUE task of --variant glue")
    parser.add_argument("--data-dir", help="data directory (TFDS GLUE, pystdlib caches)")
    parser.add_argument("--encoders", default="learned,rope")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--pretrain-steps", type=int, default=None)
    parser.add_argument("--pretrain-source", default="pystdlib")
    parser.add_argument("--init-from", help="a masked-LM run to fine-tune instead of pre-training")
    parser.add_argument("--learned-init-std", type=float, default=LEARNED_INIT_STD)
    parser.add_argument("--workdir", help="default runs/roformer_glue_<variant>[_<task>]")
    args = parser.parse_args(rest)
    glue = args.variant == "glue"
    workdir = args.workdir or os.path.join(
        "runs", f"roformer_glue_{args.variant}" + (f"_{args.task}" if glue else "")
    )
    cls_spec, mlm_spec = (
        (f"{CONFIG}:base", f"{CONFIG}:mlm_base")
        if glue
        else (
            f"{CONFIG}:tiny",
            f"{CONFIG}:mlm_tiny",
        )
    )
    data = [f"data.data_dir={args.data_dir!r}"] if args.data_dir else []
    start = time.perf_counter()
    for name in args.encoders.split(","):
        encoding = [f"encoding.name={name}"]
        if name == "learned":  # see LEARNED_INIT_STD
            encoding += [
                f"encoding.hparams.max_len={LEARNED_ROWS[args.variant]}",
                f"encoding.hparams.init_std={args.learned_init_std}",
            ]
        for seed in args.seeds.split(","):
            point = [*encoding, f"seed={seed}", *data]
            mlm = args.init_from or os.path.join(workdir, "mlm", f"{name}__seed-{seed}")
            if not args.init_from:
                steps = [f"train.steps={args.pretrain_steps}"] if args.pretrain_steps else []
                source = [f"data.source={args.pretrain_source!r}"] if glue else []
                _run(mlm_spec, mlm, [*point, *source, *steps])
            task = [f"data.source='tfds:glue/{args.task}'"] if glue else []
            if glue and args.task == "stsb":
                task.append("model.num_labels=1")
            elif glue and args.task.startswith("mnli"):
                task.append("model.num_labels=3")
            finetune = os.path.join(workdir, "classify")
            for init, extra in (
                ("mlm", [f"train.init_from={os.path.abspath(mlm)!r}"]),
                ("scratch", []),
            ):
                run_dir = os.path.join(finetune, f"{name}__{init}__seed-{seed}")
                _run(cls_spec, run_dir, [*point, *task, *extra, *overrides])
    paths = write_report(os.path.join(workdir, "classify"))
    with open(paths[0]) as f:
        print(f.read())
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
