"""Prompts of an exact length in the model's own tokens, with the needle at an exact depth.

A prompt is token pieces laid end to end (the haystack cut at token positions, as Kamradt's
needle-in-a-haystack code inserts the needle into the tokenised context)::

    prefix  head  filler[0:p1]  needle_1  filler[p1:p2]  needle_2 ...  filler[..:F]  tail  suffix

``head``, ``tail`` and each needle are encoded on their own; the filler is ``F`` tokens of the
task's haystack, tokenised once per tokenizer and source (:class:`Haystack`) and cut. With ``L``
the requested length and ``fixed`` the tokens of everything but the filler, ``F = L - fixed``
(a length below ``fixed`` is refused in one line), so the prompt holds exactly ``L`` tokens. A
needle at depth ``d`` follows ``round(d * F)`` filler tokens; needles at one position keep
their drawn order. For the passkey the filler after the key starts again at the beginning of
the repeated text (Landmark's ``garbage_inf[:n_suffix]``).

cwe and fwe have no needle and no filler: their context is a list of drawn items
(:attr:`posenc.retrieval.tasks.Draw.items`), the longest that fits ``L`` (a binary search over
the item count, each candidate tokenised whole), completed to exactly ``L`` tokens by space
tokens after it.

RULER's QA tasks have documents instead of filler: the question's own documents and distractors,
``"Document {i}:\n{text}"`` joined by blank lines, as many whole documents as fit ``L`` (the
same search over their count), the answering document after ``round(depth * (n - g))`` of the
``n - g`` distractors; the context is completed to exactly ``L`` tokens by the next distractor
document (its ``"Document {n+1}:"`` line and text, continued by the following ones if it is
short), cut at a token.

``prefix`` holds the tokenizer's beginning-of-text id where it has one (``bos_id``; counted in
``L``), ``suffix`` the separator a run trained on the ``synthetic:`` retrieval tasks reads
between prompt and answer (counted in ``L`` too).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from posenc.retrieval import qa as _qa
from posenc.retrieval import tasks as _tasks
from posenc.retrieval.tasks import Draw, Task

# Distractor lines drawn at a time for a "needle" haystack.
_LINES = 64


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One trial's prompt.

    Attributes:
      ids: int32 ``[L]``, the token ids.
      needle_starts: the index in ``ids`` of each needle's first token (the draw's order).
      answer_start: ``needle_starts[draw.answer_needle]``.
      filler: ``F``, the haystack tokens in the prompt.
      fixed: ``L - F``, the tokens of everything else.
    """

    ids: np.ndarray
    needle_starts: tuple[int, ...]
    answer_start: int
    filler: int
    fixed: int


def check_depth(depth: Any) -> float:
    """``depth`` as a float; a one-line ``ValueError`` unless it is a number in [0, 1]."""
    if isinstance(depth, bool) or not isinstance(depth, int | float | np.number):
        raise ValueError(f"retrieval depth must be a number in [0, 1], got {depth!r}")
    if not 0.0 <= float(depth) <= 1.0 or math.isnan(float(depth)):
        raise ValueError(
            f"retrieval depth {depth!r} is outside [0, 1] (a fraction of the context: 0 = start, "
            "1 = end)"
        )
    return float(depth)


def _ids(tokenizer: Any, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text), np.int64)


class Haystack:
    """Filler tokens for one tokenizer: each kind tokenised once and cut (module docstring).

    Args:
      tokenizer: ``encode(text) -> ids`` and ``decode(ids) -> text`` (the run's tokenizer).
      text: ``() -> (name, byte stream)`` giving an ``essay`` haystack's text source (bytes with
        document separators, read lazily), or None when no task needs one.
      qa: ``dataset -> QAData``, the QA tasks' documents and questions
        (:func:`posenc.retrieval.qa.loader`), or None when no task needs them.
    """

    def __init__(
        self,
        tokenizer: Any,
        text: Callable[[], tuple[str, np.ndarray]] | None = None,
        qa: Callable[[str], _qa.QAData] | None = None,
    ):
        self.tokenizer = tokenizer
        self._text = text
        self.qa = qa
        self._cache: dict[str, np.ndarray] = {}
        self._complete: dict[str, bool] = {}

    def tokens(self, kind: str, n: int) -> np.ndarray:
        """The first ``n`` filler tokens of a ``passkey``, ``noise`` or ``essay`` haystack.

        Raises:
          ValueError: an ``essay`` source that holds fewer than ``n`` tokens (one line).
        """
        have = self._cache.get(kind)
        while have is None or (len(have) < n and not self._complete.get(kind, False)):
            have = self._extend(kind, max(2 * (0 if have is None else len(have)), n, 256))
        if len(have) < n:
            name, _ = self._text()
            raise ValueError(
                f"retrieval haystack {name} holds {len(have)} tokens in this tokenizer, fewer than "
                f"the {n} filler tokens asked for; use a larger text source (--haystack "
                "textdir:<folder> or a prepared tfds: corpus such as tfds:pg19) or shorter lengths"
            )
        return have[:n]

    def _extend(self, kind: str, n: int) -> np.ndarray:
        """Tokenises at least enough text for ``n`` tokens (or all there is)."""
        if kind in ("passkey", "noise"):
            join = " " if kind == "passkey" else "\n"
            per = max(1, len(_ids(self.tokenizer, _tasks.NOISE + join)))
            ids = _ids(self.tokenizer, join.join([_tasks.NOISE] * (n // per + 2)))
            self._complete[kind] = False
        elif kind == "essay":
            if self._text is None:
                raise ValueError("an essay haystack needs a text source (--haystack)")
            _, stream = self._text()
            take = min(len(stream), 8 * n + 1024)  # bytes; any tokenizer needs <= 8 per token
            raw = np.asarray(stream[:take]).astype(np.int64)
            raw[raw > 255] = 10  # document separators become newlines
            text = raw.astype(np.uint8).tobytes().decode("utf-8", errors="replace")
            ids = _ids(self.tokenizer, " ".join(text.split()))  # RULER's whitespace folding
            self._complete[kind] = take == len(stream)
        else:
            raise ValueError(f"filler kind must be passkey, noise or essay, got {kind!r}")
        self._cache[kind] = ids
        return ids

    def distractors(
        self, task: Task, rng: np.random.Generator, n: int, exclude: tuple[str, ...] = ()
    ) -> np.ndarray:
        """``n`` tokens of a ``needle`` haystack: fresh needles, one per line, none with a key in
        ``exclude`` (tokenised per trial: every trial has its own distractors)."""
        parts, total = [], 0
        while total < n:
            lines = [_tasks.distractor(task, rng, exclude) for _ in range(_LINES)]
            ids = _ids(self.tokenizer, "\n".join(lines) + "\n")
            parts.append(ids)
            total += len(ids)
        return np.concatenate(parts)[:n] if parts else np.zeros((0,), np.int64)


def pieces(
    tokenizer: Any, draw: Draw, prefix: Sequence[int] = (), suffix: Sequence[int] = ()
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """The token ids of a trial's fixed parts: ``prefix + head``, each needle, ``tail + suffix``.

    Raises:
      ValueError: a needle the tokenizer cannot encode (its answer does not decode back).
    """
    head = np.concatenate([np.asarray(prefix, np.int64), _ids(tokenizer, draw.head)])
    tail = np.concatenate([_ids(tokenizer, draw.tail), np.asarray(suffix, np.int64)])
    needles = [_ids(tokenizer, text) for text in draw.needles]
    for text, ids in zip(draw.needles, needles, strict=True):
        _check_encodable(tokenizer, text, ids, draw.answers)
    return head, needles, tail


def fixed_tokens(
    tokenizer: Any, draw: Draw, prefix: Sequence[int] = (), suffix: Sequence[int] = ()
) -> int:
    """The tokens of a trial's prompt without filler: the shortest length it fits."""
    head, needles, tail = pieces(tokenizer, draw, prefix, suffix)
    fixed = len(head) + len(tail) + sum(len(n) for n in needles)
    if draw.items is not None:  # the shortest list
        fixed += len(_ids(tokenizer, draw.items(draw.min_items)))
    if draw.documents is not None:  # the question's own documents
        fixed += len(_ids(tokenizer, _qa.context(draw.documents(draw.min_items, 0.0))))
    return fixed


def build(
    task: Task,
    draw: Draw,
    length: int,
    depth: float,
    haystack: Haystack,
    rng: np.random.Generator,
    *,
    prefix: Sequence[int] = (),
    suffix: Sequence[int] = (),
) -> Prompt:
    """The prompt of one trial at ``length`` tokens with its answer needle at ``depth``.

    Args:
      task: the task.
      draw: the trial's parts (:func:`posenc.retrieval.tasks.draw`).
      length: ``L``, the prompt's tokens.
      depth: in [0, 1], where the answer needle goes (a fraction of the filler before it).
      haystack: the filler source.
      rng: the trial's generator (a ``needle`` haystack's distractors).
      prefix, suffix: token ids before the head and after the tail (module docstring).

    Raises:
      ValueError: a depth outside [0, 1], a length shorter than the fixed parts, a haystack too
        small, a needle the tokenizer cannot encode; one line each.
    """
    depth = check_depth(depth)
    head, needles, tail = pieces(haystack.tokenizer, draw, prefix, suffix)
    if draw.items is not None:
        return _build_list(task, draw, length, haystack.tokenizer, head, tail)
    if draw.documents is not None:
        return _build_documents(task, draw, length, depth, haystack.tokenizer, head, tail)
    fixed = len(head) + len(tail) + sum(len(n) for n in needles)
    filler = int(length) - fixed
    if filler < 0:
        raise ValueError(
            f"retrieval length {length} is too short for {task.name}: its prompt without filler "
            f"takes {fixed} tokens in this tokenizer; use lengths >= {fixed}"
        )
    depths = list(draw.other_depths)
    if draw.ordered:  # a chain: the answer needle first, the others after it, in order
        depths = [depth + (1.0 - depth) * d for d in sorted(depths)]
    depths.insert(draw.answer_needle, depth)
    points = [round(d * filler) for d in depths]
    order = sorted(range(len(needles)), key=lambda i: (points[i], i))
    restart = task.haystack == "passkey"
    if task.haystack == "needle":
        hay = haystack.distractors(task, rng, filler, draw.keys)
    else:
        try:
            hay = haystack.tokens(task.haystack, filler)
        except ValueError as e:
            raise ValueError(f"retrieval length {length} ({task.name}): {e}") from None
    parts, starts, at, cursor = [head], [0] * len(needles), len(head), 0
    for i in order:
        cut = hay[: points[i] - cursor] if restart else hay[cursor : points[i]]
        parts += [cut, needles[i]]
        at += len(cut)
        starts[i] = at
        at += len(needles[i])
        cursor = points[i]
    parts += [hay[: filler - cursor] if restart else hay[cursor:filler], tail]
    ids = np.concatenate(parts).astype(np.int32)
    assert len(ids) == length, (len(ids), length)  # the construction above, not input
    return Prompt(ids, tuple(starts), starts[draw.answer_needle], filler, fixed)


def _build_list(
    task: Task, draw: Draw, length: int, tokenizer: Any, head: np.ndarray, tail: np.ndarray
) -> Prompt:
    """cwe's and fwe's prompt: ``head``, the longest list of ``draw.items`` that fits, space
    tokens up to ``length``, ``tail`` (module docstring)."""
    room = int(length) - len(head) - len(tail)

    def tokens(n: int) -> np.ndarray:
        return _ids(tokenizer, draw.items(n))

    lo, best = draw.min_items, tokens(draw.min_items)
    if len(best) > room:
        need = len(head) + len(tail) + len(best)
        raise ValueError(
            f"retrieval length {length} is too short for {task.name}: its shortest list with the "
            f"question takes {need} tokens in this tokenizer; use lengths >= {need}"
        )
    # The largest n that fits: doubling, then bisection (more items never take fewer tokens).
    hi, step = None, 1  # hi: the smallest n known not to fit
    while hi is None and (draw.max_items is None or lo < draw.max_items):
        n = lo + step if draw.max_items is None else min(lo + step, draw.max_items)
        ids = tokens(n)
        if len(ids) > room:
            hi = n
        else:
            lo, best, step = n, ids, 2 * step
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        ids = tokens(mid)
        if len(ids) <= room:
            lo, best = mid, ids
        else:
            hi = mid
    pad = room - len(best)
    if hi is None and pad > 0:  # the whole pool fits with room to spare
        raise ValueError(
            f"retrieval length {length} is too long for {task.name}: its whole word pool takes "
            f"{length - pad} tokens in this tokenizer; use lengths <= {length - pad}"
        )
    ids = np.concatenate([head, best, np.repeat(_space(tokenizer), pad), tail]).astype(np.int32)
    assert len(ids) == length, (len(ids), length)  # the construction above, not input
    return Prompt(ids, (), len(head), int(length) - len(head) - len(tail), len(head) + len(tail))


def _largest(lo: int, most: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in ``[lo, most]`` with ``fits(n)``, ``fits(lo)`` known true and
    ``fits`` monotone: doubling steps from ``lo``, then bisection."""
    hi, step = None, 1  # hi: the smallest n known not to fit
    while hi is None and lo < most:
        n = min(lo + step, most)
        if fits(n):
            lo, step = n, 2 * step
        else:
            hi = n
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _build_documents(
    task: Task,
    draw: Draw,
    length: int,
    depth: float,
    tokenizer: Any,
    head: np.ndarray,
    tail: np.ndarray,
) -> Prompt:
    """A QA prompt: ``head``, the most whole documents that fit, the next distractor document
    cut at a token so that the prompt holds exactly ``length`` tokens, ``tail`` (module
    docstring). Its ``answer_start`` is the context's first token (the answering document's
    start is not a token boundary of the whole context in every tokenizer)."""
    room = int(length) - len(head) - len(tail)
    sizes: dict[int, int] = {}

    def tokens(n: int) -> np.ndarray:
        ids = _ids(tokenizer, _qa.context(draw.documents(n, depth)))
        sizes[n] = len(ids)
        return ids

    g, most = draw.min_items, draw.max_items
    if len(tokens(g)) > room:
        need = len(head) + len(tail) + sizes[g]
        raise ValueError(
            f"retrieval length {length} is too short for {task.name}: the question with its own "
            f"documents takes {need} tokens in this tokenizer; use lengths >= {need}"
        )
    n = _largest(g, most, lambda k: len(tokens(k)) <= room)
    whole = tokens(n)
    # The rest: the following distractors, "Document {n+1}:" first, cut at the token that fills.
    rest, k = room - len(whole), 1
    cut = np.zeros((0,), np.int64)
    while len(cut) < rest:
        spare = draw.spare(n, k)
        if spare:
            cut = _ids(tokenizer, _qa.DOCUMENT_JOINER + _qa.context(spare, first=n + 1))
        if len(cut) < rest and len(spare) < k:  # every document is in, the context still short
            raise ValueError(
                f"retrieval length {length} is too long for {task.name}: all {most} documents "
                f"of its data take {length - rest + len(cut)} tokens in this tokenizer; use "
                f"lengths <= {length - rest + len(cut)} or more data"
            )
        k *= 2
    ids = np.concatenate([head, whole, cut[:rest], tail]).astype(np.int32)
    assert len(ids) == length, (len(ids), length)  # the construction above, not input
    return Prompt(ids, (), len(head), int(length) - len(head) - len(tail), len(head) + len(tail))


def _space(tokenizer: Any) -> np.ndarray:
    """The single token of a space (or of a newline) that completes a list prompt."""
    for text in (" ", "\n"):
        ids = _ids(tokenizer, text)
        if len(ids) == 1:
            return ids
    raise ValueError("the tokenizer has no single token for a space or a newline (cwe, fwe)")


def _check_encodable(tokenizer: Any, text: str, ids: np.ndarray, answers: Sequence[str]) -> None:
    """Refuses a needle whose answer does not survive the tokenizer (unknown characters)."""
    back = tokenizer.decode(ids)
    for answer in answers:
        if answer in text and answer not in back:
            raise ValueError(
                f"the tokenizer cannot encode the needle {text.strip()!r}: it decodes as "
                f"{back.strip()!r}, losing the answer {answer!r}; use a tokenizer that covers "
                "these characters"
            )
