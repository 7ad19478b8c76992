"""Translation metrics: sacreBLEU BLEU (13a and intl), chrF, and the per-length-bucket table."""

import math

import pytest
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from sacrebleu.tokenizers.tokenizer_intl import TokenizerV14International

from posenc.kinds.translation_metrics import corpus_scores, length_bucket_table, length_buckets


def test_perfect_and_empty_hypotheses():
    refs = ["The cat sat on the mat.", "A dog barked twice at the moon."]
    perfect = corpus_scores(refs, refs)
    for key in ("bleu", "bleu_intl", "chrf"):
        assert perfect[key] == pytest.approx(100.0)
    assert perfect["length_ratio"] == 1.0 and perfect["brevity_penalty"] == 1.0
    empty = corpus_scores(["", ""], refs)
    for key in ("bleu", "bleu_intl", "chrf"):
        assert empty[key] == 0.0
    assert empty["length_ratio"] == 0.0


def test_bleu_by_hand_from_its_definition():
    # Every n-gram of the hypothesis matches (precisions 1); it is 5 tokens for 6 in the
    # reference, so BLEU = BP = exp(1 - 6/5).
    short = corpus_scores(["a b c d e"], ["a b c d e f"])
    assert short["bleu"] == pytest.approx(100 * math.exp(1 - 6 / 5))
    assert short["length_ratio"] == pytest.approx(5 / 6)
    # Same length (BP = 1), last word wrong: n-gram precisions 4/5, 3/4, 2/3, 1/2.
    wrong = corpus_scores(["a b c d x"], ["a b c d e"])
    assert wrong["bleu"] == pytest.approx(100 * (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25)


def test_intl_and_13a_tokenisations_differ_as_documented():
    # mteval-v14's international tokenisation splits Unicode punctuation from words; 13a only
    # splits ASCII punctuation, so German quotation marks stay attached.
    assert TokenizerV14International()("„Hallo“, sagte er.") == "„ Hallo “ , sagte er ."
    assert Tokenizer13a()("„Hallo“, sagte er.") == "„Hallo“ , sagte er ."
    scores = corpus_scores(["„Hallo“, sagte er."], ["Hallo, sagte er."])
    assert scores["bleu"] != scores["bleu_intl"]
    sig = scores["signatures"]
    assert "tok:13a" in sig["bleu"] and "tok:intl" in sig["bleu_intl"]
    assert "nc:6" in sig["chrf"] and "case:mixed" in sig["bleu"]


def test_length_buckets_and_table():
    assert length_buckets(10, 35) == [(0, 10), (10, 20), (20, 40)]
    assert length_buckets(10, 3) == [(0, 10)]
    lengths = [4, 10, 11, 20, 35]
    refs = ["one two three four", "five six seven eight", "nine ten", "x y z w", "p q r s"]
    hyps = [refs[0], refs[1], "", "x y z w", "p q"]
    table = length_bucket_table(lengths, hyps, refs, train_max_src_len=10)
    assert [b["label"] for b in table["buckets"]] == ["<=1x", "1x-2x", "2x-4x"]
    first, second, third = table["buckets"]
    assert (first["sentences"], first["bleu"], first["length_ratio"]) == (
        2,
        pytest.approx(100),
        1.0,
    )
    assert first["src_tokens"] == 14
    # Bucket (10, 20]: one empty output (length 0) and one perfect 4-word output.
    assert second["sentences"] == 2 and second["length_ratio"] == pytest.approx(4 / 6)
    # Bucket (20, 40]: a 2-word output for a 4-word reference: truncation shows in the ratio.
    assert third["length_ratio"] == pytest.approx(0.5)
    assert third["brevity_penalty"] == pytest.approx(math.exp(1 - 4 / 2))
    assert table["overall"]["sentences"] == 5
    assert table["overall"] == corpus_scores(hyps, refs)


def test_refusals():
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        corpus_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="3 source lengths for 2 hypotheses"):
        length_bucket_table([1, 2, 3], ["a", "b"], ["a", "b"], 4)
    with pytest.raises(ValueError, match="training max source length must be positive"):
        length_buckets(0, 5)


def test_empty_sources_fall_in_the_first_bucket():
    """A source of 0 tokens (an empty line) is within the training length: the ``<=1x`` bucket
    holds every sentence when all are within it, and its scores are the overall ones."""
    refs = ["one two three four", "", "five six seven", "eight nine"]
    hyps = ["one two three four", "nothing here", "five six", "eight nine"]
    table = length_bucket_table([4, 0, 3, 2], hyps, refs, train_max_src_len=4)
    [first] = table["buckets"]
    assert first["sentences"] == 4 == table["overall"]["sentences"]
    for key in ("bleu", "bleu_intl", "chrf", "length_ratio"):
        assert first[key] == table["overall"][key]
    assert sum(b["sentences"] for b in table["buckets"]) == len(refs)


def test_an_empty_length_bucket_is_reported_without_scores():
    # sacreBLEU states no signature for a metric that scored nothing; a bucket with no sentence
    # (a long bucket past every evaluated source) must not stop the table.
    table = length_bucket_table([3, 30], ["a b c", "d e"], ["a b c", "d e f"], 4)
    counts = {row["label"]: row["sentences"] for row in table["buckets"]}
    assert counts == {"<=1x": 1, "1x-2x": 0, "2x-4x": 0, "4x-8x": 1}
    empty = [row for row in table["buckets"] if row["sentences"] == 0]
    assert empty and all(row["bleu"] is None and row["chrf"] is None for row in empty)
    assert table["overall"]["sentences"] == 2 and table["overall"]["signatures"]["bleu"]
