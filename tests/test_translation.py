"""Translation decoding and scoring: beam search through the caches equals beam search by full
recomputation, outputs come back in order within their length limits, and the teacher-forced
loss is the direct cross entropy."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.data.pair_batching import encode_pairs, eval_pair_batches
from posenc.data.vocab import ByteVocab
from posenc.decoding.beam import beam_search
from posenc.kinds import translation
from posenc.layers.config import ModelConfig
from posenc.models.encdec import EncoderDecoder
from posenc.runs.config import apply_overrides, load_config, validate

VOCAB = ByteVocab()
TRANSLATION_CONFIG = os.path.join(os.path.dirname(__file__), os.pardir, "configs", "translation.py")
PAIRS = [
    ("the cat", "die Katze"),
    ("a dog sleeps", "ein Hund schläft"),
    ("hi", "hallo"),
    ("the small red house stands here", "das kleine rote Haus steht hier"),
]


def _model(name="rope", seed=0) -> EncoderDecoder:
    config = ModelConfig(
        vocab_size=VOCAB.vocab_size,
        num_layers=2,
        model_dim=32,
        num_heads=2,
        mlp_dim=48,
        dtype="float32",
    )
    return EncoderDecoder(config, encodings.get(name), rngs=nnx.Rngs(seed))


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) for n in ("rope", "t5", "sinusoidal")]
)
def test_cached_beam_search_equals_recomputation(name):
    """The search over the decoder's caches picks what a search that reruns the whole decoder
    over the prefix at every step picks (scores to 1e-5)."""
    model = _model(name)
    batch = eval_pair_batches(encode_pairs(PAIRS[:2], VOCAB), 4096, targets=False)[0]
    src, mask = jnp.asarray(batch["src"]), jnp.asarray(batch["src_mask"])
    b, k, max_len = src.shape[0], 3, 12
    encoded, mask = model.encode(src, mask)
    cross = model.cross_caches(jnp.repeat(encoded, k, 0), jnp.repeat(mask, k, 0))
    positions = jnp.arange(max_len + 1)[None]
    tokens = jnp.zeros((b, max_len + 1), jnp.int32).at[:, 0].set(VOCAB.bos_id)

    def cached(tokens, slot, caches):
        logits, caches = model.decode(tokens, slot, positions, caches, cross)
        return logits[:, 0], caches

    def recomputed(tokens, slot, state):
        logits, _ = model.decode_forward(tokens, cross)
        return jax.lax.dynamic_index_in_dim(logits, slot, axis=1, keepdims=False), state

    args = dict(start=0, beam_size=k, alpha=0.6, max_len=max_len, eos_id=VOCAB.eos_id)
    seqs_c, scores_c = beam_search(cached, model.empty_caches(b * k, max_len + 1), tokens, **args)
    seqs_r, scores_r = beam_search(recomputed, jnp.zeros((b * k,)), tokens, **args)
    np.testing.assert_array_equal(seqs_c, seqs_r)
    np.testing.assert_allclose(scores_c, scores_r, rtol=1e-5)


@pytest.mark.slow
def test_translations_come_back_in_order_and_within_their_limits():
    model = _model()
    pairs = PAIRS[1:3]  # two buckets: the outputs are sorted back into order
    offset = 5
    together = translation.translate_ids(
        model, encode_pairs(pairs, VOCAB), VOCAB, beam_size=2, max_len_offset=offset
    )
    for i, (src, _) in enumerate(pairs):
        alone = translation.translate_ids(
            model, encode_pairs([pairs[i]], VOCAB), VOCAB, beam_size=2, max_len_offset=offset
        )
        assert together[i] == alone[0]  # rows are independent; the order is the input's
        assert len(together[i]) <= len(src.encode()) + offset  # a byte gives at most a char
    # Sources of 12 and 31 bytes: two buckets with eval.bucket_step 1.1, one (padded to 32)
    # with 4.0; the padding is masked, so the outputs are the same.
    encoded = encode_pairs([PAIRS[1], PAIRS[3]], VOCAB)
    fine, coarse = (
        translation.translate_ids(
            model, encoded, VOCAB, beam_size=2, max_len_offset=offset, bucket_step=step
        )
        for step in (1.1, 4.0)
    )
    assert len(eval_pair_batches(encoded, 4096, targets=False, bucket_step=4.0)) == 1
    assert coarse == fine


def test_teacher_forced_loss_is_the_direct_cross_entropy():
    model = _model()
    chosen = PAIRS[1:3]
    got = translation.teacher_forced(model, encode_pairs(chosen, VOCAB), 4096)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, t: nnx.merge(graphdef, state)(s, t))
    total, count = 0.0, 0
    for src, tgt in chosen:
        s = np.append(VOCAB.encode(src), VOCAB.eos_id)[None]
        t = VOCAB.encode(tgt)
        t_in = np.concatenate([[VOCAB.bos_id], t])[None]
        t_out = np.append(t, VOCAB.eos_id)
        logits = np.asarray(forward(jnp.asarray(s), jnp.asarray(t_in)), np.float64)[0]
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        total -= logp[np.arange(len(t_out)), t_out].sum()
        count += len(t_out)
    assert got["tokens"] == count
    np.testing.assert_allclose(got["loss"], total / count, rtol=1e-5)


def test_bad_decoding_settings_are_refused():
    model = _model()
    [batch] = eval_pair_batches(encode_pairs(PAIRS[:1], VOCAB), 4096, targets=False)
    with pytest.raises(ValueError, match=r"^eval\.beam_size must be a positive integer"):
        translation.decode_batch(model, batch, VOCAB, beam_size=0, alpha=0.6, max_len_offset=5)
    with pytest.raises(ValueError, match=r"^eval\.max_len_offset must be a positive integer"):
        translation.decode_batch(model, batch, VOCAB, beam_size=2, alpha=0.6, max_len_offset=0)


@pytest.mark.parametrize(
    "override, match",
    [
        ("data.bucket_step=1.0", r"^data\.bucket_step must be a number in \(1, 4\], got 1\.0$"),
        ("eval.bucket_step=5.0", r"^eval\.bucket_step must be a number in \(1, 4\], got 5\.0$"),
        ("train.label_smoothing=1.0", r"^train\.label_smoothing must be in \[0, 1\)"),
        ("eval.alpha=-1.0", r"^eval\.alpha must be a finite number >= 0"),
        ("model.mem_len=4", r"^model\.mem_len must be 0 for model\.assembly='encoder_decoder'$"),
    ],
)
def test_bad_translation_configs_are_refused_in_one_line(override, match):
    config = apply_overrides(load_config(f"{TRANSLATION_CONFIG}:tiny"), [override])
    with pytest.raises(ValueError, match=match):
        validate(config)


def test_decoding_stops_at_a_learned_position_table():
    """A decoder with a learned table of 16 positions and a limit (source + 50) far past it: the
    output stops at the table (16 tokens) instead of reading NaN rows (which gave NaN logits and
    id 0, NUL bytes), and greedy decoding equals an arg max loop over the teacher-forced decoder
    within the table."""
    table = 16
    config = ModelConfig(
        vocab_size=VOCAB.vocab_size, num_layers=1, model_dim=32, num_heads=2, mlp_dim=48
    )
    model = EncoderDecoder(config, encodings.get("learned", max_len=table), rngs=nnx.Rngs(3))
    [batch] = eval_pair_batches(encode_pairs([("a cat", "")], VOCAB), 4096, targets=False)
    greedy = translation.decode_batch(
        model, batch, VOCAB, beam_size=1, alpha=0.6, max_len_offset=50
    )
    # The naive reference: the decoder over the whole prefix, one arg max at a time.
    src, mask = jnp.asarray(batch["src"][:1]), jnp.asarray(batch["src_mask"][:1])
    forward = jax.jit(lambda t: model(src, t, src_mask=mask))
    tokens = [VOCAB.bos_id]
    while len(tokens) <= table and tokens[-1] != VOCAB.eos_id:
        padded = np.full((1, table), VOCAB.pad_id, np.int32)
        padded[0, : len(tokens)] = tokens
        logits = np.asarray(forward(jnp.asarray(padded)))[0, len(tokens) - 1]
        assert np.isfinite(logits).all()
        tokens.append(int(logits.argmax()))
    want = tokens[1:]
    got = [int(t) for t in greedy[0]]
    assert got[: len(want)] == want
    assert all(t == VOCAB.eos_id for t in got[len(want) :])  # nothing past the table
    beam = translation.decode_batch(model, batch, VOCAB, beam_size=2, alpha=0.6, max_len_offset=50)
    text = VOCAB.decode(beam[0])
    assert "\x00" not in text and len(VOCAB.encode(text)) <= table


def test_a_source_past_a_learned_table_is_refused_before_any_decoding(monkeypatch):
    """Outputs are decoded shortest sources first: a source the encoder's table cannot hold is
    refused before the others are decoded (minutes of work), naming the sentence."""
    config = ModelConfig(
        vocab_size=VOCAB.vocab_size, num_layers=1, model_dim=32, num_heads=2, mlp_dim=48
    )
    model = EncoderDecoder(config, encodings.get("learned", max_len=16), rngs=nnx.Rngs(0))
    calls = []
    monkeypatch.setattr(translation, "decode_batch", lambda *a, **k: calls.append(1))
    pairs = encode_pairs([("short", ""), ("x" * 40, ""), ("fifteen bytes..", "")], VOCAB)
    with pytest.raises(ValueError, match=r"^sentence 2 of 3 has 41 source tokens \(with its EOS\)"):
        translation.translate_ids(model, pairs, VOCAB, beam_size=1)
    assert calls == []
    # 15 bytes + EOS fit the 16 rows exactly: not refused.
    fits = encode_pairs([("fifteen bytes..", "")], VOCAB)
    monkeypatch.setattr(
        translation, "decode_batch", lambda m, b, v, **k: np.full((1, 1), v.eos_id, np.int32)
    )
    assert translation.translate_ids(model, fits, VOCAB, beam_size=1) == [""]
