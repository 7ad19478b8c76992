"""What the harness asks of a posenc run, computed without the harness: the numeric core of
:class:`posenc.harness.model.PosencLM` (importable without ``lm_eval``).

:class:`HarnessScorer` wraps a loaded run (:func:`posenc.load_run`) and answers the harness's
three requests on token ids:

- :meth:`~HarnessScorer.continuations`: for ``(context, continuation)`` ids, the sum of the
  continuation's next-token log-probabilities and whether each of its tokens is the arg max. The
  sequence ``context + continuation`` keeps its last ``max_length + 1`` tokens (the harness's
  Hugging Face model truncates the same way); it is scored as one window at positions
  ``0 .. T - 1``, padded at the end to a bucket length (a power of two, at most ``max_length``) so
  that few programs compile. A causal model's outputs at the real positions do not read the
  padding; an encoder that reads the window's extent (xPos's centre of the key positions)
  scores the sequence as part of the padded window, as ``posenc eval`` scores it in a window of
  ``eval.lengths``.
- :meth:`~HarnessScorer.rolling`: the per-token losses of a whole document, by ``posenc eval``'s
  own windows (:mod:`posenc.kinds.stream`): the stream ``[prefix] + document`` is cut into
  windows of ``max_length`` (non-overlapping, or sliding with the run's ``eval.stride`` when its
  ``eval.mode`` is ``"sliding"``: the first window scores every target, later ones the last
  ``stride``), each at positions ``0 .. L - 1``. The last window is padded to ``L``; it scores
  its real targets as ``posenc eval`` would in a longer stream. So every document token gets the
  loss ``posenc eval`` gives it on the stream ``[prefix] + document`` (which ``posenc eval``
  scores whole when ``len(document)`` is a multiple of the window), where the harness's Hugging
  Face model instead shifts its last window back to a full one.
- :meth:`~HarnessScorer.generate`: posenc's cached greedy decoding
  (:func:`posenc.decoding.lm.greedy_generate`) of ``num_new`` tokens after each prompt, prompts of
  equal length batched together (a batch shares one prompt length: there is no padding mask).

``prefix``: the token a document or an empty context starts from: the tokenizer's beginning of
text where it has one (``bos_id``), else its document separator (the byte tokenizer's 256, GPT-2's
``<|endoftext|>``), which is what precedes every document in ``posenc eval``'s streams.

The losses are those of :meth:`posenc.runs.trained.TrainedRun.token_losses`: the model's hidden
states, then the logits a chunk at a time (``model.loss_chunk``: no ``[B, T, V]`` logits), with
batches of ``rows`` windows sized from ``eval.memory_budget`` as ``posenc eval`` sizes them
(:func:`posenc.devices.budget.eval_rows`) unless a batch size is given.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc import kinds
from posenc.decoding.lm import greedy_generate, layer_encodings
from posenc.devices import budget as budget_lib
from posenc.kinds.common import eval_mem_len, eval_positions
from posenc.models.lm import Transformer

_MIN_BUCKET = 16  # the shortest padded window of a continuation's scoring


def prefix_token(tokenizer) -> int:
    """The token a document or an empty context starts from (module docstring)."""
    bos = getattr(tokenizer, "bos_id", None)
    return int(bos if bos is not None else tokenizer.sep_id)


def check_run(run) -> None:
    """Raises a one-line ``ValueError`` unless the harness can score ``run``: a causal language
    model (its kind predicts the next token) read one window at a time."""
    kind = kinds.kind_of(run.config)
    if (
        not kind.predicts_next
        or not isinstance(run.model, Transformer)
        or not run.config.model.get("causal", True)
    ):
        raise ValueError(
            f"{run.workdir} is a {kind.name} run ({kind.chosen_by}); the harness scores causal "
            "language models (next-token log-probabilities and greedy generation)"
        )
    if eval_mem_len(run.config):
        raise ValueError(
            f"{run.workdir} carries Transformer-XL memory at evaluation (eval.mem_len="
            f"{eval_mem_len(run.config)}); the harness scores one window at a time: pass "
            "eval.mem_len=0 among the model args"
        )
    if eval_positions(run.config) != "contiguous":
        raise ValueError(
            f"{run.workdir} evaluates at randomized positions (eval.positions); the harness "
            "scores at positions 0 .. T - 1: pass eval.positions=contiguous among the model args"
        )


def check_max_length(run, max_length: int) -> None:
    """Raises a one-line ``ValueError`` when a layer's encoder cannot represent ``max_length``
    positions (a learned table shorter than that)."""
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
    for _, encoding in layer_encodings(run.model):
        try:
            encoding.check_length(max_length)
        except ValueError as e:
            raise ValueError(
                f"max_length={max_length} is beyond what {run.workdir} can score: {e}"
            ) from None


def _bucket(length: int, most: int) -> int:
    """The padded window of a sequence of ``length`` tokens: the next power of two (at least
    :data:`_MIN_BUCKET`), at most ``most``."""
    return min(most, max(_MIN_BUCKET, 1 << (max(length, 1) - 1).bit_length()))


class HarnessScorer:
    """The harness's requests on token ids, for one loaded run (module docstring).

    Args:
      run: a :class:`posenc.runs.trained.TrainedRun` of a causal LM.
      max_length: the scoring window (tokens a window reads).
      batch_size: windows per batch; None: sized from ``eval.memory_budget`` per window length.
    """

    def __init__(self, run, max_length: int, batch_size: int | None = None):
        check_run(run)
        check_max_length(run, max_length)
        self.run = run
        self.max_length = int(max_length)
        self.batch_size = batch_size
        self.prefix = prefix_token(run.tokenizer)
        e = run.config.eval
        self.stride = int(e.stride) if e.mode == "sliding" and e.stride else self.max_length
        self.stride = min(self.stride, self.max_length)
        graphdef, self._state = nnx.split(run.model)
        self._params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self._state))
        self._param_bytes = sum(
            int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(self._state)
        )
        self._budget = None
        self._score = jax.jit(lambda state, t, y: _window_scores(nnx.merge(graphdef, state), t, y))

    def rows(self, length: int) -> int:
        """Windows per batch at ``length`` (``batch_size``, or sized as ``posenc eval`` sizes
        them from ``eval.memory_budget``)."""
        if self.batch_size is not None:
            return self.batch_size
        if self._budget is None:
            self._budget = budget_lib.memory_budget(
                self.run.config.eval.get("memory_budget"), self._param_bytes
            )
        config = self.run.model.config
        return budget_lib.eval_rows(
            config, self._param_bytes, length, self._budget, 1, self._params
        )

    def _score_windows(
        self, inputs: np.ndarray, targets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Losses (float64) and arg-max hits of ``[N, L]`` windows, in batches of fixed shape."""
        n, length = inputs.shape
        vocab = self.run.model.config.vocab_size
        if n and max(int(inputs.max()), int(targets.max())) >= vocab:
            raise ValueError(
                f"the text holds token id {max(int(inputs.max()), int(targets.max()))}, outside "
                f"the model's vocabulary [0, {vocab}) (model.vocab_size): {self.run.workdir}'s "
                "tokenizer (data.tokenizer) does not spell this text"
            )
        rows = max(1, min(self.rows(length), n))
        losses, hits = [], []
        for start in range(0, n, rows):
            x, y = inputs[start : start + rows], targets[start : start + rows]
            pad = rows - len(x)
            if pad:  # a fixed shape: one program per (rows, length)
                x = np.concatenate([x, np.zeros((pad, length), x.dtype)])
                y = np.concatenate([y, np.zeros((pad, length), y.dtype)])
            loss, hit = jax.device_get(self._score(self._state, jnp.asarray(x), jnp.asarray(y)))
            losses.append(np.asarray(loss, np.float64)[: rows - pad])
            hits.append(np.asarray(hit)[: rows - pad])
        return np.concatenate(losses), np.concatenate(hits)

    def continuations(
        self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[tuple[float, bool]]:
        """``(sum of log-probabilities, every token the arg max)`` of each continuation given
        its context (ids; an empty context becomes ``[prefix]``), in the order given."""
        items = []
        for context, continuation in pairs:
            context, continuation = list(context) or [self.prefix], list(continuation)
            if not continuation:
                raise ValueError("an empty continuation has no log-likelihood to score")
            whole = (context + continuation)[-(self.max_length + 1) :]
            items.append((whole, min(len(continuation), len(whole) - 1)))
        out: list[tuple[float, bool] | None] = [None] * len(items)
        by_bucket: dict[int, list[int]] = {}
        for i, (whole, _) in enumerate(items):
            by_bucket.setdefault(_bucket(len(whole) - 1, self.max_length), []).append(i)
        for length, indices in sorted(by_bucket.items()):
            inputs = np.zeros((len(indices), length), np.int32)
            targets = np.zeros((len(indices), length), np.int32)
            for row, i in enumerate(indices):
                whole = items[i][0]
                inputs[row, : len(whole) - 1] = whole[:-1]
                targets[row, : len(whole) - 1] = whole[1:]
            losses, hits = self._score_windows(inputs, targets)
            for row, i in enumerate(indices):
                whole, scored = items[i]
                end = len(whole) - 1
                span = slice(end - scored, end)
                out[i] = (-float(losses[row, span].sum()), bool(hits[row, span].all()))
        return out

    def windows(self, tokens: Sequence[int]) -> list[tuple[int, int]]:
        """``(start, first scored position)`` of each window over ``[prefix] + tokens`` (module
        docstring): window ``k`` reads stream positions ``start .. start + L - 1`` and scores
        the targets at window positions ``first ..`` that the stream has."""
        targets = len(tokens)  # the stream [prefix] + tokens has this many targets
        length, stride = self.max_length, self.stride
        out, start = [(0, 0)], 0
        while start + length < targets:
            start += stride
            out.append((start, length - stride))
        return out

    def rolling(self, documents: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Per-token losses (nats, float64 ``[len(document)]``) of each document (ids), by
        ``posenc eval``'s windows (module docstring)."""
        length = self.max_length
        plan = []  # (document, start, first scored, real targets in the window)
        for d, tokens in enumerate(documents):
            stream = np.asarray([self.prefix, *tokens], np.int32)
            for start, first in self.windows(tokens):
                plan.append((d, stream, start, first, min(length, len(stream) - 1 - start)))
        inputs = np.zeros((len(plan), length), np.int32)
        targets = np.zeros((len(plan), length), np.int32)
        for row, (_, stream, start, _, real) in enumerate(plan):
            inputs[row, :real] = stream[start : start + real]
            targets[row, :real] = stream[start + 1 : start + 1 + real]
        out = [np.zeros(len(tokens), np.float64) for tokens in documents]
        if not plan:
            return out
        losses, _ = self._score_windows(inputs, targets)
        for row, (d, _, start, first, real) in enumerate(plan):
            # Window position p's target is document token start + p (the stream's start + p + 1).
            out[d][start + first : start + real] = losses[row, first:real]
        return out

    def generate(self, prompts: Sequence[Sequence[int]], num_new: int) -> list[np.ndarray]:
        """``num_new`` greedy tokens after each prompt (ids; an empty one becomes
        ``[prefix]``; a longer one than ``max_length - num_new`` keeps its last tokens), prompts
        of one length batched ``rows`` at a time."""
        if num_new < 1:
            raise ValueError(f"max_gen_toks must be a positive integer, got {num_new!r}")
        room = self.max_length - num_new
        if room < 1:
            raise ValueError(
                f"max_gen_toks={num_new} leaves no room for a prompt in max_length="
                f"{self.max_length}; lower max_gen_toks or raise max_length"
            )
        prompts = [(list(p) or [self.prefix])[-room:] for p in prompts]
        out: list[np.ndarray | None] = [None] * len(prompts)
        by_length: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_length.setdefault(len(p), []).append(i)
        for length, indices in sorted(by_length.items()):
            rows = max(1, min(self.rows(length + num_new), len(indices)))
            for start in range(0, len(indices), rows):
                chunk = indices[start : start + rows]
                batch = np.asarray([prompts[i] for i in chunk], np.int32)
                tokens = np.asarray(greedy_generate(self.run.model, batch, int(num_new)))
                for row, i in enumerate(chunk):
                    out[i] = tokens[row]
        return out


def _window_scores(model: Transformer, inputs: jax.Array, targets: jax.Array):
    """``[B, L]`` next-token losses and arg-max hits of windows ``inputs`` -> ``targets``."""
    hidden = model.hidden_states(inputs, None)
    scored = model.token_losses(hidden, targets, correct=True)
    return scored.loss, scored.correct
