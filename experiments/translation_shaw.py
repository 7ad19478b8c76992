"""Shaw et al. 2018: translation BLEU by relative clip distance k and key/value ablation.

Relative positions only, k from 0 to 256 (Table 2), the key and value terms ablated (Table 3),
beside absolute sinusoids.

Runs the sweep ``configs/sweeps/translation_shaw.py:<variant>``, writes the report (BLEU 13a and
intl, chrF and length ratio per point, mean and spread over seeds; BLEU by source length with a
plot) and prints it::

    python experiments/translation_shaw.py --variant tiny     # 2-core CPU, embedded corpus
    python experiments/translation_shaw.py --variant paper    # WMT14 En-De, prepared with TFDS

``--metric`` picks what the by-source-length table shows (bleu, bleu_intl, chrf, length_ratio);
extra ``--config.<field>=<value>`` arguments apply to every point.
"""

import sys

from _sweep_script import main

if __name__ == "__main__":
    sys.exit(
        main(
            "translation_shaw",
            __doc__.splitlines()[0],
            variants=("tiny", "paper"),
            metrics=("bleu", "bleu_intl", "chrf", "length_ratio"),
        )
    )
