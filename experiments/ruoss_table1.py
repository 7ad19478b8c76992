"""Ruoss et al. 2023, Table 1's shape: algorithmic tasks x encodings, with and without randomized
positions, accuracy averaged over the lengths longer than any seen in training.

Runs the sweep ``configs/sweeps/ruoss_table1.py:<variant>`` (each point trained, then scored per
input length), writes the report (summary table, mean reciprocal rank, per-task tables and plots
of accuracy against length) and prints it::

    python experiments/ruoss_table1.py --variant tiny     # 2-core CPU
    python experiments/ruoss_table1.py --variant paper    # all 15 tasks, lengths 41-500

``--metric exact_match`` ranks by greedy generation instead of per-token accuracy. Extra
``--config.<field>=<value>`` arguments apply to every point (as with ``posenc sweep``).
"""

import sys

from _sweep_script import main

if __name__ == "__main__":
    sys.exit(
        main(
            "ruoss_table1",
            __doc__.splitlines()[0],
            variants=("tiny", "paper"),
            metrics=("accuracy", "exact_match", "sequence_accuracy", "loss"),
        )
    )
