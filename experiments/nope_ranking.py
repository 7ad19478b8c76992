"""Kazemnejad et al. 2023 (NoPE): decoder-only models with NoPE, T5 bias, ALiBi, rotary and
absolute positions on algorithmic tasks, ranked by mean reciprocal rank over the tasks.

Runs the sweep ``configs/sweeps/nope_ranking.py:<variant>``, writes the report (summary table,
MRR, per-task tables and plots of exact match against length) and prints it::

    python experiments/nope_ranking.py --variant tiny     # 2-core CPU
    python experiments/nope_ranking.py --variant paper    # the paper's tasks, three seeds

The default metric is the paper's, exact match of greedy generation; ``--metric accuracy`` gives
per-token accuracy. Extra ``--config.<field>=<value>`` arguments apply to every point.
"""

import sys

from _sweep_script import main

if __name__ == "__main__":
    sys.exit(
        main(
            "nope_ranking",
            __doc__.splitlines()[0],
            variants=("tiny", "paper"),
            metrics=("exact_match", "accuracy", "sequence_accuracy", "loss"),
        )
    )
