"""ALiBi Table 2 (Press et al. 2022): train the founding encoders at L, evaluate at 1-16 x L.

Runs the sweep ``configs/sweeps/alibi_table2.py:<variant>`` (skipping finished points, resuming
interrupted ones), writes the report and prints its table::

    python experiments/alibi_table2.py --variant tiny            # 2-core CPU, ~4 minutes
    python experiments/alibi_table2.py --variant gpu              # one GPU, ~10 minutes
    python experiments/alibi_table2.py --variant paper \\
        --config.data.source=textdir:/data/wikitext-103          # the paper's model size

Extra ``--config.<field>=<value>`` arguments apply to every point (as with ``posenc sweep``).
"""

import sys

from _sweep_script import main

if __name__ == "__main__":
    sys.exit(main("alibi_table2", __doc__.splitlines()[0]))
