"""Translation metrics with sacreBLEU: corpus BLEU (two tokenisations), chrF, and the same per
source-length bucket (train short, test long for sequence-to-sequence).

- `bleu`: sacreBLEU's standard BLEU, the 13a tokeniser (mteval-v13a; sacreBLEU picks its own
  tokeniser for Chinese, Japanese and Korean targets), mixed case, exponential smoothing: the
  number to report today (Post 2018).
- `bleu_intl`: the same BLEU on the "intl" tokenisation (mteval-v14 `--international-
  tokenization`: Unicode punctuation and symbols split from words), which is what
  tensor2tensor's `t2t-bleu` (`bleu_hook.bleu_tokenize`) does; the WMT14 numbers of Vaswani et
  al. 2017 and of Shaw et al. 2018 are tokenised BLEU of that era, so this is the column to set
  beside them (still not identical: the papers also split compound words, `##AT##-##AT##`).
- `chrf`: sacreBLEU's chrF (character 6-grams, beta 2).

Each score is returned with its sacreBLEU signature string, which names the tokeniser, so a
table can say which is which. Nothing here counts n-grams itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF


def _metrics(tgt_lang: str | None) -> dict[str, Any]:
    return {
        "bleu": BLEU(trg_lang=tgt_lang or ""),
        "bleu_intl": BLEU(tokenize="intl"),
        "chrf": CHRF(),
    }


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses for {len(references)} references; one hypothesis "
            "per reference line, in order"
        )


def corpus_scores(
    hypotheses: Sequence[str], references: Sequence[str], tgt_lang: str | None = None
) -> dict[str, Any]:
    """Corpus BLEU (13a and intl), chrF and the output/reference length ratio.

    Args:
      hypotheses: detokenised system outputs, one per reference.
      references: detokenised references (one reference per sentence).
      tgt_lang: target language code; sacreBLEU uses it to pick the zh/ja/ko tokenisers.

    Returns:
      {"sentences", "bleu", "bleu_intl", "chrf" (0-100 floats), "length_ratio" (hypothesis over
      reference length in 13a tokens, the ratio in BLEU's brevity penalty), "brevity_penalty",
      "signatures": {"bleu", "bleu_intl", "chrf"}}; scores and signatures are None for no
      sentences (sacreBLEU states a signature only once a metric has scored a corpus).
    """
    _check(hypotheses, references)
    metrics = _metrics(tgt_lang)
    out: dict[str, Any] = {"sentences": len(hypotheses)}
    if not hypotheses:
        out.update(bleu=None, bleu_intl=None, chrf=None, length_ratio=None, brevity_penalty=None)
        out["signatures"] = None
        return out
    refs = [list(references)]
    scores = {name: m.corpus_score(list(hypotheses), refs) for name, m in metrics.items()}
    out.update({name: float(s.score) for name, s in scores.items()})
    out["length_ratio"] = float(scores["bleu"].ratio)
    out["brevity_penalty"] = float(scores["bleu"].bp)
    out["signatures"] = {name: str(m.get_signature()) for name, m in metrics.items()}
    return out


def length_buckets(train_max_src_len: int, longest: int) -> list[tuple[int, int]]:
    """Source-length buckets: `(0, L]` (the training range), `(L, 2L]`, `(2L, 4L]`, ... up to the
    bucket that holds `longest`.

    Args:
      train_max_src_len: L, the longest source seen in training (tokens).
      longest: the longest source to place.

    Returns:
      [(lo, hi), ...]: a source of length n is in the bucket with lo < n <= hi, except that the
      first bucket also holds n = 0 (an empty line is within the training length).
    """
    if train_max_src_len < 1:
        raise ValueError(f"training max source length must be positive, got {train_max_src_len}")
    edges = [(0, train_max_src_len)]
    while edges[-1][1] < longest:
        lo = edges[-1][1]
        edges.append((lo, 2 * lo))
    return edges


def length_bucket_table(
    src_lengths: Sequence[int] | np.ndarray,
    hypotheses: Sequence[str],
    references: Sequence[str],
    train_max_src_len: int,
    tgt_lang: str | None = None,
) -> dict[str, Any]:
    """BLEU, chrF and length ratio per source-length bucket (Neishi & Yoshinaga 2019's view).

    Args:
      src_lengths: each sentence's source length in tokens (without EOS).
      hypotheses: detokenised outputs.
      references: detokenised references.
      train_max_src_len: the longest training source (tokens): bucket 1 is within it, bucket 2
        up to twice it, then 4x, 8x, ...
      tgt_lang: target language code (see `corpus_scores`).

    Returns:
      {"train_max_src_len", "overall": corpus_scores(...), "buckets": [{"lo", "hi", "label"
      ("<=1x", "1x-2x", "2x-4x", ...), "max_multiple", "sentences", "src_tokens", "bleu",
      "bleu_intl", "chrf", "length_ratio", "brevity_penalty"}, ...]}; an empty bucket has
      sentences 0 and None scores. The signatures are in "overall".
    """
    _check(hypotheses, references)
    lengths = np.asarray(src_lengths, dtype=np.int64)
    if lengths.shape != (len(hypotheses),):
        raise ValueError(f"{lengths.size} source lengths for {len(hypotheses)} hypotheses")
    overall = corpus_scores(hypotheses, references, tgt_lang)
    rows = []
    longest = int(lengths.max()) if lengths.size else 0
    for lo, hi in length_buckets(train_max_src_len, longest):
        # The first bucket is [0, L]: an empty source (0 tokens) is within the training length,
        # so the buckets partition the split and "<=1x" equals "overall" when nothing is longer.
        members = np.flatnonzero(((lengths > lo) | (lo == 0)) & (lengths <= hi))
        scores = corpus_scores(
            [hypotheses[i] for i in members], [references[i] for i in members], tgt_lang
        )
        multiple = hi // train_max_src_len
        label = "<=1x" if lo == 0 else f"{multiple // 2}x-{multiple}x"
        rows.append(
            {
                "lo": lo,
                "hi": hi,
                "label": label,
                "max_multiple": multiple,
                "src_tokens": int(lengths[members].sum()),
                **{k: v for k, v in scores.items() if k != "signatures"},
            }
        )
    return {"train_max_src_len": train_max_src_len, "overall": overall, "buckets": rows}
