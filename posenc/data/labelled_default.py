"""``labelled:default``: the embedded labelled task, text order, built from the embedded corpus.

Each example is a snippet of Python standard-library source (the ``pystdlib`` corpus, each
split from that split's files), its words (runs of non-space characters) joined by single
spaces, and labelled ``original`` (as written) or ``reversed`` (the same characters in reverse
order), half and half. Both texts hold exactly the same bytes, so a model that cannot tell
positions apart (NoPE in a bidirectional encoder, whose pooled output is a function of the bag
of tokens) is at chance, 50 %: the task measures the use of position and nothing else, and a
model that reads relative order anywhere in the text (``def`` against ``fed``) solves it. It
works offline, like ``pystdlib``.

(Reversing the order of whole words instead, which keeps each word's spelling, is a harder
task of the same kind: a 2-layer width-64 model trained for 400 steps stays at chance on it.)

Train short, test long is built in: training snippets have 16-62 bytes (at most 64 tokens
with ``[CLS]`` and ``[SEP]``), validation and test snippets 16-254 bytes, log-uniformly, so
that a classifier trained at 64 tokens is evaluated within its length (1x) and at 2x and 4x.
The examples are a function of the corpus content alone (fixed seeds per split).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from posenc.data.labelled_base import DEFAULT_SPEC, Example, LabelledSource, examples_sha256
from posenc.data.pystdlib import PyStdlibSource
from posenc.data.tokenizer import SEP_ID

CLASSES = ("original", "reversed")
# Examples per split, and the byte lengths of their texts (inclusive).
COUNTS = {"train": 16_384, "validation": 2048, "test": 2048}
TRAIN_BYTES = (16, 62)
EVAL_BYTES = (16, 254)
_SEEDS = {"train": 101, "validation": 102, "test": 103}
_VERSION = 2


def text_order_examples(
    stream: np.ndarray, count: int, lengths: tuple[int, int], seed: int, where: str
) -> list[Example]:
    """``count`` text-order examples from a token ``stream`` (bytes and document separators).

    Args:
      stream: ``[N]`` byte ids with :data:`SEP_ID` between documents.
      count: examples to draw.
      lengths: the (smallest, largest) text length in bytes; training draws uniformly, a range
        wider than 4x log-uniformly (each doubling of length equally often).
      seed: the draw's seed.
      where: the split's name for :attr:`Example.where`.

    Returns:
      The examples, labels alternating at random (half ``reversed``).
    """
    rng = np.random.default_rng(seed)
    lo, hi = lengths
    examples: list[Example] = []
    attempts = 0
    while len(examples) < count:
        attempts += 1
        if attempts > 20 * count:
            raise ValueError(f"{where}: too little text to draw {count} text-order examples")
        if hi > 4 * lo:
            target = int(np.exp(rng.uniform(np.log(lo), np.log(hi + 1))))
        else:
            target = int(rng.integers(lo, hi + 1))
        start = int(rng.integers(0, max(1, len(stream) - 4 * hi)))
        chunk = np.asarray(stream[start : start + 4 * hi])
        cut = np.flatnonzero(chunk == SEP_ID)  # stay inside one document
        chunk = chunk[: cut[0]] if cut.size else chunk
        words = bytes(chunk.astype(np.uint8)).decode("utf-8", "ignore").split()[1:]  # [0]: cut
        text = ""
        for word in words:
            longer = f"{text} {word}" if text else word
            if len(longer.encode("utf-8")) > target:
                break
            text = longer
        if len(text.encode("utf-8")) < lo or text == text[::-1]:
            continue  # too short, or a palindrome (no order to tell)
        label = CLASSES[int(rng.integers(0, 2))]
        if label == "reversed":
            text = text[::-1]
        examples.append(Example(text, None, label, f"{where} example {len(examples)}"))
    return examples


class TextOrderSource(LabelledSource):
    """The embedded text-order task (module docstring).

    Args:
      data_dir: the data directory (the ``pystdlib`` streams' cache).
      root: the standard-library folder (tests pass a small one); default the running Python's.
    """

    pair = False
    splits = ("train", "validation", "test")

    def __init__(self, data_dir: Path, root: Path | None = None):
        self.spec = DEFAULT_SPEC
        self.corpus = PyStdlibSource(data_dir, root=root)
        self._cache: dict[str, list[Example]] = {}

    def classes(self) -> tuple[str, ...]:
        return CLASSES

    def examples(self, split: str) -> list[Example]:
        split = self.check_split(split)
        if split not in self._cache:
            lengths = TRAIN_BYTES if split == "train" else EVAL_BYTES
            stream = self.corpus.split_stream(split)
            self._cache[split] = text_order_examples(
                stream, COUNTS[split], lengths, _SEEDS[split], f"{self.spec} {split}"
            )
        return list(self._cache[split])

    def info(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "kind": "text-order",
            "version": _VERSION,
            "corpus_sha256": self.corpus.content_sha256,
            "pair": False,
            "examples": dict(COUNTS),
            "train_bytes": list(TRAIN_BYTES),
            "eval_bytes": list(EVAL_BYTES),
            "sha256": examples_sha256([("validation", self.examples("validation"))]),
        }
