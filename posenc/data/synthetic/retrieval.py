"""The retrieval tasks as ``synthetic:`` training sources: passkey and RULER's needle tasks whose
haystack needs no text source (``niah_single_1`` and ``vt``: noise; ``niah_multikey_2`` and
``niah_multikey_3``: distractor needles), so a small model can learn retrieval in range on a CPU
and be scored beyond its training length with ``posenc retrieval``.

An example of length ``L`` is the prompt :mod:`posenc.retrieval` builds at ``L`` byte tokens
(the document separator that precedes the target included), with the needle at a depth uniform
in [0, 1]: the input is its first ``L - 1`` bytes, the target the answer after a space and
before a full stop (``" 12345."``, ``" 1234567."``, a UUID), so digits the model might emit
after the answer cannot extend the number read back. Lengths below the task's longest fixed
part (:func:`min_length`) hold no example.
"""

from __future__ import annotations

import functools

import numpy as np

from posenc.data.tokenizer import SEP_ID, ByteTokenizer

# The retrieval tasks that are also synthetic training tasks.
TRAINABLE = ("passkey", "niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt")


@functools.cache
def _haystack():
    from posenc.retrieval.prompt import Haystack

    return Haystack(ByteTokenizer())


@functools.cache
def min_length(name: str) -> int:
    """The shortest length (bytes, separator included) that holds every example of ``name``."""
    from posenc.retrieval import prompt, tasks

    return prompt.fixed_tokens(ByteTokenizer(), tasks.draw(tasks.get(name), None), (), (SEP_ID,))


def max_target(name: str) -> int:
    """The longest target of ``name``: its longest answer, a space and a full stop."""
    from posenc.retrieval import tasks

    return len(target(tasks.draw(tasks.get(name), None).answers))


def target(answers) -> str:
    """The target text of an example's answers."""
    return " " + ", ".join(answers) + "."


def example(name: str, rng: np.random.Generator, length: int) -> tuple[str, str]:
    """One ``(input, target)`` pair of retrieval task ``name`` at ``length`` byte tokens."""
    from posenc.retrieval import prompt, tasks

    task = tasks.get(name)
    drawn = tasks.draw(task, rng)
    depth = float(rng.uniform(0.0, 1.0))
    built = prompt.build(task, drawn, length, depth, _haystack(), rng, suffix=(SEP_ID,))
    text = built.ids[:-1].astype(np.uint8).tobytes().decode("ascii")
    return text, target(drawn.answers)


def generator(name: str):
    """``(rng, length) -> (input, target)`` for the task registry."""
    return functools.partial(example, name)
