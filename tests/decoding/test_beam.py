"""Beam search: exhaustive enumeration on a tiny vocabulary, a naive transcription of the
algorithm, and greedy search as arg max."""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
import pytest

from posenc.decoding.beam import beam_search, length_penalty
from posenc.decoding.greedy import greedy_search

EOS = 1


def _table(seed: int, slots: int, vocab: int) -> np.ndarray:
    """Next-token logits per (slot, token at the slot, batch row): a 'model' whose state is
    nothing, so the search's bookkeeping alone is tested."""
    return np.random.default_rng(seed).normal(0, 2.0, (slots, vocab, 2, vocab)).astype(np.float32)


def _step(table):
    table = jnp.asarray(table)

    def step(tokens, slot, state):
        rows = state["row"]  # [N]: which batch row a beam belongs to (reordered by the search)
        logits = table[slot, tokens[:, slot], rows]  # [N, V]
        return logits, state

    return step


def _log_probs(table, row, seq, start_token):
    """log p of each token of ``seq`` after ``start_token`` in batch row ``row``."""
    lp, prev = [], start_token
    for slot, tok in enumerate(seq):
        logits = table[slot, prev, row].astype(np.float64)
        lp.append(logits[tok] - np.log(np.exp(logits - logits.max()).sum()) - logits.max())
        prev = tok
    return lp


def _hypotheses(vocab, max_len):
    """Every finished output: ends at its first EOS, or has max_len tokens without one."""
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(vocab), repeat=n):
            if EOS in seq[:-1]:
                continue
            if seq[-1] == EOS or n == max_len:
                yield seq


def _score(table, row, seq, alpha):
    return sum(_log_probs(table, row, seq, 0)) / ((5 + len(seq)) / 6) ** alpha


def _search(table, k, alpha, max_len, batch=2):
    tokens = jnp.zeros((batch, max_len + 1), jnp.int32)
    state = {"row": jnp.repeat(jnp.arange(batch), k)}
    return beam_search(
        _step(table),
        state,
        tokens,
        start=0,
        beam_size=k,
        alpha=alpha,
        max_len=max_len,
        eos_id=EOS,
    )


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_a_wide_enough_beam_finds_the_exhaustive_ranking(alpha):
    vocab, max_len = 3, 4
    table = _table(0, max_len, vocab)
    k = vocab ** (max_len - 1)  # every prefix stays alive: the search is exhaustive
    seqs, scores = _search(table, k, alpha, max_len)
    for row in range(2):
        ranked = sorted(
            ((_score(table, row, h, alpha), h) for h in _hypotheses(vocab, max_len)),
            reverse=True,
        )
        np.testing.assert_allclose(scores[row], [s for s, _ in ranked[:k]], rtol=1e-5)
        best = ranked[0][1]
        got = [int(t) for t in seqs[row, 0]]
        assert got[: len(best)] == list(best)
        assert all(t == EOS for t in got[len(best) :])  # padded with EOS after the end


def _naive_beam(table, row, k, alpha, max_len):
    """Textbook beam search (Wu et al. 2016 scoring), one batch row, plain Python."""
    alive = [((), 0.0)]
    finished = []
    for n in range(1, max_len + 1):
        cands = []
        for seq, lp in alive:
            prev = seq[-1] if seq else 0
            logits = table[n - 1, prev, row].astype(np.float64)
            logp = logits - logits.max() - math.log(np.exp(logits - logits.max()).sum())
            cands += [(seq + (t,), lp + logp[t]) for t in range(len(logp))]
        cands.sort(key=lambda c: -c[1])
        cands = cands[: 2 * k]
        ended = [c for c in cands if c[0][-1] == EOS or n == max_len]
        finished = sorted(
            finished + [(s, lp / length_penalty(n, alpha).item()) for s, lp in ended],
            key=lambda c: -c[1],
        )[:k]
        alive = [c for c in cands if not (c[0][-1] == EOS or n == max_len)][:k]
        if len(finished) == k and alive:
            if alive[0][1] / length_penalty(max_len, alpha).item() < finished[-1][1]:
                break
    return finished


@pytest.mark.parametrize("seed,k,alpha", [(1, 1, 0.6), (2, 2, 0.6), (3, 4, 0.0), (4, 3, 1.0)])
def test_beam_search_equals_a_naive_transcription(seed, k, alpha):
    vocab, max_len = 7, 6
    table = _table(seed, max_len, vocab)
    seqs, scores = _search(table, k, alpha, max_len)
    for row in range(2):
        expected = _naive_beam(table, row, k, alpha, max_len)
        np.testing.assert_allclose(
            scores[row, : len(expected)], [s for _, s in expected], rtol=1e-5
        )
        got = [int(t) for t in seqs[row, 0]]
        assert got[: len(expected[0][0])] == list(expected[0][0])


def test_greedy_search_takes_the_arg_max_and_stops_at_eos():
    vocab, max_len = 5, 6
    table = _table(5, max_len, vocab)
    tokens = jnp.zeros((2, max_len + 1), jnp.int32)
    state = {"row": jnp.arange(2)}
    out, logits = greedy_search(
        _step(table), state, tokens, start=0, max_len=max_len, eos_id=EOS, return_logits=True
    )
    for row in range(2):
        prev, ended = 0, False
        for n in range(max_len):
            want = EOS if ended else int(np.argmax(table[n, prev, row]))
            assert int(out[row, n]) == want
            if not ended:
                np.testing.assert_array_equal(logits[row, n], table[n, prev, row])
            ended = ended or want == EOS
            prev = want


def test_bad_arguments_are_refused():
    table = _table(0, 3, 3)
    with pytest.raises(ValueError, match="beam size must be a positive integer"):
        _search(table, 0, 0.6, 3)
    with pytest.raises(ValueError, match="slots"):
        beam_search(
            _step(table),
            {"row": jnp.zeros(2, jnp.int32)},
            jnp.zeros((1, 3), jnp.int32),
            start=0,
            beam_size=2,
            alpha=0.6,
            max_len=3,
            eos_id=EOS,
        )
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        _search(table, 2, -1.0, 3)


# -- per-row length limits (``limits``: a translation decodes each sentence to its source's length
# + 50) against references that know nothing of the batching ------------------------------------


def _rows_table(seed: int, slots: int, vocab: int, rows: int) -> np.ndarray:
    """:func:`_table` with ``rows`` batch rows."""
    rng = np.random.default_rng(seed)
    return rng.normal(0, 2.0, (slots, vocab, rows, vocab)).astype(np.float32)


def _search_limited(table, k, alpha, max_len, limits):
    batch = table.shape[2]
    tokens = jnp.zeros((batch, max_len + 1), jnp.int32)
    state = {"row": jnp.repeat(jnp.arange(batch), k)}
    return beam_search(
        _step(table),
        state,
        tokens,
        start=0,
        beam_size=k,
        alpha=alpha,
        max_len=max_len,
        eos_id=EOS,
        limits=jnp.asarray(limits, jnp.int32),
    )


def _assert_row(seqs, scores, row, expected, max_len):
    """Row ``row``'s hypotheses are ``expected`` ``[(tokens, score)]`` in order, each padded with
    EOS to ``max_len``; the slots past them stay empty (the search's -1e7)."""
    np.testing.assert_allclose(scores[row, : len(expected)], [s for _, s in expected], rtol=1e-5)
    assert (np.asarray(scores[row, len(expected) :]) <= -1e6).all()
    for i, (seq, _) in enumerate(expected):
        assert [int(t) for t in seqs[row, i]] == list(seq) + [EOS] * (max_len - len(seq)), (row, i)


@pytest.mark.parametrize("alpha", [0.6])
def test_per_row_limits_give_the_exhaustive_ranking_under_each_rows_own_limit(alpha):
    # A beam wide enough to be exhaustive: each row's k best are those of every output of at most
    # its own limit tokens (cut at the limit without EOS, or ended by EOS), enumerated one row at
    # a time; a limit above max_len is max_len.
    vocab, max_len, limits = 3, 4, [1, 2, 4, 9]
    table = _rows_table(6, max_len, vocab, len(limits))
    k = vocab ** (max_len - 1)
    seqs, scores = _search_limited(table, k, alpha, max_len, limits)
    for row, limit in enumerate(limits):
        ranked = sorted(
            ((_score(table, row, h, alpha), h) for h in _hypotheses(vocab, min(limit, max_len))),
            reverse=True,
        )[:k]
        _assert_row(seqs, scores, row, [(h, s) for s, h in ranked], max_len)


@pytest.mark.parametrize("seed,k,alpha", [(8, 2, 0.6), (10, 3, 1.0)])
def test_per_row_limits_equal_a_naive_search_of_each_row_to_its_limit(seed, k, alpha):
    # The textbook search of one row with max_len = that row's limit, row by row, against one
    # batched search whose rows stop at different limits.
    vocab, max_len, limits = 7, 6, [2, 6, 4, 1, 50]
    table = _rows_table(seed, max_len, vocab, len(limits))
    seqs, scores = _search_limited(table, k, alpha, max_len, limits)
    for row, limit in enumerate(limits):
        expected = _naive_beam(table, row, k, alpha, min(limit, max_len))
        _assert_row(seqs, scores, row, expected, max_len)
