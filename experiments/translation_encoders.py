"""Positional encodings in the translation Transformer, trained short, BLEU by source length.

Vaswani et al.'s Table 3 row (E), RoFormer's and Shaw et al.'s WMT14 rows, and the other
founding encoders.

Runs the sweep ``configs/sweeps/translation_encoders.py:<variant>``, writes the report (BLEU 13a
and intl, chrF and length ratio per encoder; BLEU by source length, within the training lengths
and beyond, with a plot) and prints it::

    python experiments/translation_encoders.py --variant tiny     # 2-core CPU, embedded corpus
    python experiments/translation_encoders.py --variant paper    # WMT14 En-De, prepared with TFDS

``--metric`` picks what the by-source-length table shows (bleu, bleu_intl, chrf, length_ratio);
extra ``--config.<field>=<value>`` arguments apply to every point.

The tiny run is ``translation_shaw.py``'s (its docstring says what it costs and why its length
buckets are coarse) trained on sources of at most 32 pieces; JAX's persistent compilation cache
in ``<workdir>/compile_cache`` (``--compile-cache``) serves a point's second seed.
"""

import sys

from _sweep_script import main

if __name__ == "__main__":
    sys.exit(
        main(
            "translation_encoders",
            __doc__.splitlines()[0],
            variants=("tiny", "paper"),
            metrics=("bleu", "bleu_intl", "chrf", "length_ratio"),
        )
    )
