"""The extrapolation table extended: every registered encoder, and RoPE and sinusoidal with
randomized positions, trained at L and evaluated at 1-16 x L (ALiBi Table 2's protocol).

Runs the sweep ``configs/sweeps/extrapolation.py:<variant>``, writes the report and prints its
table::

    python experiments/extrapolation_table.py --variant tiny     # 2-core CPU
    python experiments/extrapolation_table.py --variant gpu      # one GPU

Extra ``--config.<field>=<value>`` arguments apply to every point (as with ``posenc sweep``).
"""

import sys

from _sweep_script import main

if __name__ == "__main__":
    sys.exit(main("extrapolation", __doc__.splitlines()[0]))
