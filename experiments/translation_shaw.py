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

Cost on a 2-core CPU (measured 2026-11-24, the machine shared with other jobs, load 4-12): one
tiny point with the earlier settings (``data.bucket_step`` 1.2, evaluation buckets 1.1) took
12 min 10 s: 5 min 36 s of training, of which about 2.5 min compiling the step for 17 bucket
shapes (about 20 s each), and 6 min 19 s of evaluation, mostly compiling the scoring and the
beam search for 32 + 32 shapes of the 500 sentences. So the tiny variant now uses
``data.bucket_step`` 1.5 (7 training shapes; 24 % of the slots padding instead of 14 %, about
12 % more work per step) and ``eval.bucket_step`` 2.0 (4 + 4 shapes in 9 batches; the outputs
do not depend on the buckets, padding being masked exactly): evaluation fell to about 2 min.
Steps stay at 800 (the loss still falls at 800). The script also keeps JAX's persistent
compilation cache in ``<workdir>/compile_cache`` (``--compile-cache``): the second seed of a
point (no dropout in tiny, so the same computation) loads the compiled steps, 3-5 s a shape
instead of 17-27 s. The tiny variant leaves out k = 256 (see the sweep config).
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
