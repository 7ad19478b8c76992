"""posenc.analysis: attention by distance and attention entropy, against explicit references.

The probabilities of the reference path come out of ``attend(implementation="einsum")`` itself,
given one-hot values (``v[s] = e_s``, so the output row is the probability row); the statistics
are then formed in numpy, pair by pair, and compared with the blocked, device-reduced sums. That
every other path (blocked, xla, cudnn) computes the reference's attention is the contract
battery's (tests/test_testing.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import _train_helpers as helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.analysis import attention_sums, model_attention_sums
from posenc.analysis.buckets import COARSE, FINE, distance_buckets
from posenc.analysis.output import coarse
from posenc.analysis.run import summarize
from posenc.attention.core import attend, reference_logits
from posenc.encodings import Dims
from posenc.layers.config import ModelConfig
from posenc.layers.params import values
from posenc.models.lm import Transformer
from posenc.runs.config import apply_overrides, load_config
from posenc.workdir import RunDir, analysis_names

H, DH = 2, 8
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=H * DH)
# Shaw's value term does not change the probabilities; off, the one-hot values read them.
HPARAMS = {"shaw": {"max_distance": 3, "values": False}, "t5": {"num_buckets": 8}}
# The eight of the issue, and xPos, whose rotation reads the whole window's positions.
ENCODERS = ["rope", "alibi", "t5", "shaw", "xl", "forgetting", "cope", "nope", "xpos"]
T, BLOCK = 11, 4  # blocks 0-3, 4-7 and 7-10 (the last overlaps the one before it)

_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@functools.cache
def _encoder(name, bidirectional=False):
    hparams = dict(HPARAMS.get(name, {}))
    if bidirectional and name == "t5":
        hparams["bidirectional"] = True
    enc = encodings.get(name, **hparams).bind(DIMS)
    with jax.ensure_compile_time_eval():
        params = {n: np.asarray(x) for n, x in enc.init(jax.random.key(1), DIMS).items()}
    # Learned tables start near zero; make them matter.
    std = getattr(enc, "init_std", None)
    params = {n: (x / std * 0.5 if std and n != "w_r" else x) for n, x in params.items()}
    return enc, params


def _inputs(seed=0, b=3):
    r = np.random.default_rng(seed)
    q = jnp.asarray(r.standard_normal((b, T, H, DH)), jnp.float32)
    k = jnp.asarray(r.standard_normal((b, T, H, DH)), jnp.float32)
    x = jnp.asarray(r.standard_normal((b, T, H * DH)), jnp.float32)
    pos = jnp.asarray(5 + np.arange(T))[None]  # offset positions: relative encoders ignore it
    return q, k, x, pos


def _naive_sums(probs, logits, weights, causal):
    """The statistics pair by pair: ``(weight [H, n_d], logit [H, n_d], pairs [n_d],
    entropy [H, T], keys [T])`` with distance ``d`` in column ``d - d_min``."""
    d_min = 0 if causal else -(T - 1)
    weight, logit = np.zeros((H, T - d_min)), np.zeros((H, T - d_min))
    pairs, entropy, keys = np.zeros(T - d_min), np.zeros((H, T)), np.zeros(T)
    for b, w in enumerate(weights):
        for i in range(T):
            seen = range(i + 1) if causal else range(T)
            keys[i] = len(seen)
            for j in seen:
                weight[:, i - j - d_min] += w * probs[b, :, i, j]
                logit[:, i - j - d_min] += w * logits[b, :, i, j]
                pairs[i - j - d_min] += w
            p = probs[b, :, i, list(seen)]  # [n, H]
            entropy[:, i] += w * -(p * np.log(np.maximum(p, 1e-300))).sum(0)
    return weight, logit, pairs, entropy, keys


def _sums_and_reference(enc, params, q, k, x, pos, weights, causal):
    """The blocked sums; the einsum path's probabilities (read through one-hot values,
    ``v[s] = e_s``: the output row is the probability row) and the whole window's logits at
    once (the blocks slice queries, positions and decays); one compiled program."""
    sums = attention_sums(
        q, k, encoding=enc, params=params, q_pos=pos, k_pos=pos, causal=causal, inputs=x,
        weights=weights, block_size=BLOCK,
    )  # fmt: skip
    v = jnp.broadcast_to(jnp.eye(T)[None, :, None, :], (q.shape[0], T, H, T))
    out = attend(
        q, k, v, encoding=enc, params=params, q_pos=pos, k_pos=pos, causal=causal,
        implementation="einsum", inputs=x,
    )  # fmt: skip
    q_rot, k_rot = enc.rotate(params, q, k, pos, pos) if "rotate" in enc.hooks else (q, k)
    decay = None
    if "log_decay" in enc.hooks:
        c = jnp.cumsum(enc.log_decay(params, x).astype(jnp.float32), axis=1)
        decay = (c, c)
    logits, _ = reference_logits(
        q_rot, k_rot, encoding=enc, params=params, q_pos=pos, k_pos=pos, causal=causal,
        head_dim=DH, decay=decay,
    )  # fmt: skip
    return sums, out.transpose(0, 2, 1, 3), logits  # probabilities [B, H, T, S]


@pytest.mark.parametrize(
    "name, causal",
    [(name, True) for name in ENCODERS] + [("t5", False), ("xl", False), ("alibi", False)],
    ids=[*ENCODERS, "t5-bidirectional", "xl-bidirectional", "alibi-bidirectional"],
)
def test_sums_equal_the_reference_pair_by_pair(name, causal):
    enc, params = _encoder(name, bidirectional=not causal)
    q, k, x, pos = _inputs()
    weights = jnp.asarray([1.0, 0.5, 0.0])  # the last window is padding
    compute = _jit(functools.partial(_sums_and_reference, enc, causal=causal))
    sums, probs, logits = compute(params, q, k, x, pos, weights)
    probs, logits = np.asarray(probs, np.float64), np.asarray(logits, np.float64)
    # The logits are the ones the probabilities were made from.
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(logits, -1)), probs, atol=2e-6)
    expected = _naive_sums(probs, logits, np.asarray(weights), causal)
    got = [sums.weight, sums.logit, sums.pairs, sums.entropy, sums.keys]
    names = ["weight", "logit", "pairs", "entropy", "keys"]
    for what, a, b in zip(names, got, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=2e-5, err_msg=what)
    assert float(sums.windows) == 1.5


def test_alibi_logits_are_its_formula():
    """The mean logit at distance d of ALiBi without content (q = 0) is exactly -m_h d."""
    enc, params = _encoder("alibi")
    _, k, _, pos = _inputs()
    sums = _jit(functools.partial(attention_sums, encoding=enc, block_size=BLOCK))(
        jnp.zeros_like(k), k, params=params, q_pos=pos, k_pos=pos
    )
    slopes = np.asarray(encodings.alibi_slopes(H))
    mean = np.asarray(sums.logit) / np.asarray(sums.pairs)
    np.testing.assert_allclose(mean, -slopes[:, None] * np.arange(T)[None], rtol=1e-6)


def test_uniform_attention_summarizes_to_the_uniform_baseline():
    """NoPE with zero queries attends uniformly: every bucket's weight is the uniform column,
    every row's entropy is log n (ratio 1); at the training length and at a longer one."""
    enc, params = _encoder("nope")
    for length in (T, 40):
        k = jnp.ones((2, length, H, DH))
        pos = jnp.arange(length)[None]
        sums = _jit(functools.partial(attention_sums, encoding=enc, block_size=8))(
            jnp.zeros_like(k), k, params=params, q_pos=pos, k_pos=pos
        )
        host = jax.tree.map(lambda a: np.asarray(a, np.float64)[None], sums)  # one layer
        record = summarize(host, length, causal=True)
        assert record["windows"] == 2 and record["tokens"] == 2 * length
        np.testing.assert_allclose(record["weight"][0][0], record["uniform"], rtol=1e-5)
        np.testing.assert_allclose(record["normalized_entropy"], [[1.0, 1.0]], rtol=1e-5)
        log_n = np.log(np.arange(1, length + 1)).mean()
        np.testing.assert_allclose(record["entropy"], [[log_n, log_n]], rtol=1e-5)
        assert record["log_keys"] == pytest.approx(log_n)
        # Pairs per bucket: 2 windows x (L - d) pairs at each distance d of the bucket.
        for (lo, hi), n in zip(record["buckets"], record["pairs"], strict=True):
            assert n == 2 * sum(length - d for d in range(lo, hi + 1))
        _, means = coarse(record, "weight")  # octave buckets: still uniform
        np.testing.assert_allclose(means[0, 0], coarse(record, "uniform")[1], rtol=1e-5)


def test_distance_buckets():
    assert distance_buckets(0, 20, FINE).tolist() == [
        [0, 0], [1, 1], [2, 2], [3, 3], [4, 4], [5, 5], [6, 6], [7, 7], [8, 9], [10, 11],
        [12, 13], [14, 15], [16, 19], [20, 20],
    ]  # fmt: skip
    assert distance_buckets(-5, 5, COARSE).tolist() == [
        [-5, -4], [-3, -2], [-1, -1], [0, 0], [1, 1], [2, 3], [4, 5],
    ]  # fmt: skip
    # Fine buckets nest in coarse ones (the markdown table's octaves are sums of them).
    fine, octaves = distance_buckets(0, 5000, FINE), distance_buckets(0, 5000, COARSE)
    assert set(octaves[:, 0]) <= set(fine[:, 0]) and set(octaves[:, 1]) <= set(fine[:, 1])


def test_memory_grows_with_the_block_not_the_square_of_the_length():
    """At 4096 tokens the compiled statistics hold far less than one [H, T, S] float32 array."""
    enc, params = _encoder("alibi")
    length = 4096
    shape = jax.ShapeDtypeStruct((1, length, H, DH), jnp.float32)
    pos = jax.ShapeDtypeStruct((1, length), jnp.int32)
    fn = functools.partial(attention_sums, encoding=enc, params=params, block_size=64)
    compiled = jax.jit(fn).lower(shape, shape, q_pos=pos, k_pos=pos).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    square = H * length * length * 4
    assert temp < square / 8, (temp, square)


@pytest.mark.parametrize("name", ["xl", "t5"])
def test_model_layers_read_their_own_queries_keys_and_parameters(name):
    """Layer 1 of a 2-layer grouped-query model: the queries and keys of its own projections
    of its own input, and its own encoder parameters (xl) or the shared ones (t5)."""
    config = ModelConfig(
        vocab_size=32, num_layers=2, model_dim=32, num_heads=4, num_kv_heads=2, mlp_dim=64,
        dtype="float32",
    )  # fmt: skip
    model = Transformer(config, encodings.get(name), rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 12)), jnp.int32)

    def both(model, tokens):
        got = model_attention_sums(model, tokens, block_size=5)
        pos = jnp.arange(12)[None]
        block = model.blocks[1]
        x = model.blocks[0](model.embed_inputs(tokens, pos), pos, model.shared())
        h = block.attn_norm(x)
        q, k, _ = block.attn.qkv(h)
        params = model.shared() if block.pos_params is None else values(block.pos_params)
        want = attention_sums(
            q, jnp.repeat(k, 2, axis=2), encoding=model.encoding, params=params, q_pos=pos,
            k_pos=pos, inputs=h, block_size=12,
        )  # fmt: skip
        return got, want

    graphdef, state = nnx.split(model)
    got, want = _jit(lambda state, tokens: both(nnx.merge(graphdef, state), tokens))(state, tokens)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a)[1], np.asarray(b), rtol=2e-5, atol=2e-5)


def _recorded(tmp_path: Path, spec: str, *overrides: str) -> str:
    """A work directory holding only a config (refusals come before any checkpoint is read)."""
    config = apply_overrides(load_config(spec), [f"data.data_dir={tmp_path}", *overrides])
    workdir = tmp_path / "run"
    RunDir(workdir).record_config(config)
    return str(workdir)


@pytest.mark.parametrize(
    "spec, overrides, field",
    [
        (helpers.TINY_SPEC, ["model.attention_impl=linear"], "model.attention_impl='linear'"),
        (helpers.TINY_SPEC, ["model.mem_len=16"], "--config.eval.mem_len=0"),
        (helpers.TINY_SPEC, ["data.source=synthetic:parity_check"], "data.source"),
        ("configs/translation.py:tiny", [], "model.assembly='encoder_decoder'"),
    ],
    ids=["linear", "memory", "task", "encoder_decoder"],
)
def test_cli_refuses_runs_without_decoder_softmax_attention(tmp_path, spec, overrides, field):
    workdir = _recorded(tmp_path, str(helpers.REPO / spec), *overrides)
    code, _, err = helpers.run_cli("analyze", "--workdir", workdir)
    assert code == 2
    line = helpers.one_line_error(err, "analyze")
    assert field in line, line


def test_analysis_names():
    assert analysis_names({})["json"] == "attention.json"
    assert set(analysis_names({}).values()) == {
        "attention.json", "attention.md", "attention.csv", "attention_entropy.csv",
        "attention.png", "attention_entropy.png",
    }  # fmt: skip
    named = analysis_names({"encoding.hparams.scaling": "yarn"})
    assert named["csv"].startswith("attention-scaling-yarn__h") and named["csv"].endswith(".csv")


# A pattern model: layer 0 RoPE with a sliding window of 4, RMS QK-norm before the rotation,
# sinks and a soft cap; layer 1 ALiBi, full attention, sinks. Its attention is transcribed
# below in float64 numpy.
PATTERN_T, WINDOW, CAP, EPS = 12, 4, 3.0, 1e-6


def _pattern_model():
    from posenc.attention.options import AttentionOptions
    from posenc.layers.pattern import LayerKind

    config = ModelConfig(
        vocab_size=32, num_layers=2, model_dim=32, num_heads=4, mlp_dim=64, dtype="float32",
        norm_eps=EPS,
    )  # fmt: skip
    local = AttentionOptions(
        window=f"sliding:{WINDOW}", sinks=True, qk_norm="rms", softcap=CAP,
        prefix="layers.kinds.local",
    )  # fmt: skip
    kinds = (
        LayerKind("local", encodings.get("rope"), local),
        LayerKind("global", encodings.get("alibi"), AttentionOptions(sinks=True)),
    )
    model = Transformer(config, encodings.get("nope"), rngs=nnx.Rngs(0), layers=kinds)
    r = np.random.default_rng(3)
    for block in model.blocks:  # learned values away from their initial constants
        for name, p in block.attn_params.items():
            p[...] = jnp.asarray(r.uniform(0.5, 1.5, p.shape) * (1 if "norm" in name else -2))
    return model


def _rope64(x, pos):
    """RoPE, GPT-NeoX's half layout, base 10000: ``[B, T, H, D]`` float64."""
    d = x.shape[-1]
    theta = 10000.0 ** (-np.arange(d // 2) * 2.0 / d)
    angle = pos[:, :, None, None] * theta  # [1, T, 1, D/2]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    cos, sin = np.cos(angle), np.sin(angle)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _pattern_attention64(layer, q, k, learned):
    """Layer ``layer``'s logits (what the softmax reads, ``[B, H, T, T]``, masked pairs NaN)
    and probabilities, float64, from its projected ``q`` and ``k``."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    t, d = q.shape[1], q.shape[-1]
    pos = np.arange(t)[None].astype(np.float64)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = j <= i
    if layer == 0:
        rms = lambda x, s: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * s  # noqa: E731
        q = _rope64(rms(q, np.asarray(learned["q_norm"], np.float64)), pos)
        k = _rope64(rms(k, np.asarray(learned["k_norm"], np.float64)), pos)
        visible = visible & (i - j < WINDOW)
    logits = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d)
    if layer == 0:
        logits = CAP * np.tanh(logits / CAP)
    else:  # ALiBi: -m_h (i - j)
        slopes = np.asarray(encodings.alibi_slopes(q.shape[2]), np.float64)
        logits = logits - slopes[:, None, None] * (i - j)
    sinks = np.asarray(learned["sinks"], np.float64)[None, :, None, None]
    e = np.where(visible, np.exp(logits), 0.0)
    probs = e / (e.sum(-1, keepdims=True) + np.exp(sinks))
    return np.where(visible, logits, np.nan), probs, visible


def test_pattern_layers_are_analysed_as_the_model_attends():
    """Each layer of a pattern model (a window, QK-norm, sinks and a soft cap on one kind, another
    encoder on the other) is analysed with its own encoder and options: the model's own
    attention (attend with the block's options, one-hot values) gives the float64
    transcription's probabilities, and the analysis's sums are those probabilities' and
    logits', pair by pair."""
    model = _pattern_model()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, PATTERN_T)), jnp.int32)
    t = PATTERN_T

    def run(model, tokens):
        sums = model_attention_sums(model, tokens, block_size=5)
        pos = jnp.arange(t)[None]
        x = model.embed_inputs(tokens, pos)
        shared = model.layer_shared()
        v = jnp.broadcast_to(jnp.eye(t)[None, :, None, :], (2, t, 4, t))
        layers = []
        for block, own in zip(model.blocks, shared, strict=True):
            x_next, cache = block.forward(x, pos, own)
            q, _, _ = block.attn.qkv(cache.h)
            k = block.attn.repeat_kv(cache.k)
            probs = attend(
                q, k, v, encoding=block.encoding, params=own, q_pos=pos, k_pos=pos,
                implementation="einsum", **block._options(),
            )  # fmt: skip
            layers.append((q, k, probs.transpose(0, 2, 1, 3), values(block.attn_params)))
            x = x_next
        return sums, layers

    graphdef, state = nnx.split(model)
    sums, layers = _jit(lambda s, tok: run(nnx.merge(graphdef, s), tok))(state, tokens)
    for layer, (q, k, model_probs, learned) in enumerate(layers):
        logits, probs, visible = _pattern_attention64(layer, q, k, learned)
        # The transcription is the model's attention (sinks: rows sum to less than 1).
        np.testing.assert_allclose(np.asarray(model_probs), probs, atol=2e-6)
        assert probs.sum(-1).max() < 1 - 1e-3
        weight, logit = np.zeros((4, t)), np.zeros((4, t))
        pairs, entropy, keys = np.zeros(t), np.zeros((4, t)), visible.sum(-1)
        for b in range(2):
            for i in range(t):
                for j in np.flatnonzero(visible[i]):
                    weight[:, i - j] += probs[b, :, i, j]
                    logit[:, i - j] += logits[b, :, i, j]
                    pairs[i - j] += 1
                p = probs[b, :, i, visible[i]]  # [n, H]
                entropy[:, i] += -(p * np.log(p)).sum(0)
        got = [np.asarray(x)[layer] for x in (sums.weight, sums.logit, sums.pairs)]
        got += [np.asarray(sums.entropy)[layer], np.asarray(sums.keys)[layer]]
        names = ["weight", "logit", "pairs", "entropy", "keys"]
        for what, a, b in zip(names, got, [weight, logit, pairs, entropy, keys], strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=f"{layer} {what}")
    # The window: layer 0 has no pair at distance >= 4, layer 1 has them all.
    assert np.asarray(sums.pairs)[0, WINDOW:].sum() == 0 and np.asarray(sums.pairs)[1, -1] == 2


def test_summary_and_tables_group_layers_by_kind():
    """Uniform attention (NoPE, zero queries) under a different window per layer: each kind's
    statistics are over its own layers and visible pairs (weight = its uniform baseline,
    entropy / log n = 1, pairs counted by hand), and the tables name the kinds; without kinds
    the record and tables have none of it."""
    from posenc.analysis.output import distance_rows, entropy_rows, markdown
    from posenc.attention.options import AttentionOptions

    enc, params = _encoder("nope")
    length = 16
    k = jnp.ones((2, length, H, DH))
    pos = jnp.arange(length)[None]

    def layer_sums():
        return [
            attention_sums(
                jnp.zeros_like(k),
                k,
                encoding=enc,
                params=params,
                q_pos=pos,
                k_pos=pos,
                block_size=8,
                options=AttentionOptions(window=w),
            )  # fmt: skip
            for w in windows
        ]

    windows = ("sliding:3", "full", "sliding:3", "chunked:4")
    sums = jax.tree.map(
        lambda *x: np.stack([np.asarray(a, np.float64) for a in x]), *_jit(layer_sums)()
    )
    kinds = ["local", "global", "local", "chunk"]
    record = summarize(sums, length, causal=True, kinds=kinds)
    assert record["by_kind"]["local"]["layers"] == [0, 2]
    # Pairs at distance d over 2 windows: sliding:3 sees d < 3 from row d on; chunks of 4 see
    # d < 4 in each of the 4 chunks, 4 - d times; full sees every d.
    by_distance = {
        "local": [2 * (length - d) if d < 3 else 0 for d in range(length)],
        "chunk": [2 * 4 * (4 - d) if d < 4 else 0 for d in range(length)],
        "global": [2 * (length - d) for d in range(length)],
    }
    for name, kind in record["by_kind"].items():
        want = [sum(by_distance[name][lo : hi + 1]) for lo, hi in record["buckets"]]
        np.testing.assert_allclose(kind["pairs"], want)
        seen = np.asarray(kind["pairs"]) > 0
        uniform = np.asarray(kind["uniform"], np.float64)
        for head in np.asarray(kind["weight"], np.float64):
            np.testing.assert_allclose(head[seen], uniform[seen], rtol=1e-5)
        np.testing.assert_allclose(kind["normalized_entropy"], [1.0] * H, rtol=1e-5)
    # Each layer's weight is over its own pairs: the chunked layer's equals its kind's.
    np.testing.assert_allclose(
        np.asarray(record["weight"][3], np.float64),  # None (no pair) read as NaN
        np.asarray(record["by_kind"]["chunk"]["weight"], np.float64),
    )
    assert "by_kind" not in summarize(sums, length, causal=True)

    def wrap(r, **extra):
        return {
            "encoding": "nope", "changes": {}, "train_seq_len": length, "checkpoint_step": 1,
            "finished": True, "split": "validation", "positions": "contiguous",
            "num_heads": H, "num_layers": 4, "lengths": [r], **extra,
        }  # fmt: skip

    described = {"local": "local: nope, sliding:3", "global": "global: nope"}
    described["chunk"] = "chunk: nope, chunked:4"
    patterned = wrap(record, layer_kinds=kinds, kinds=described)
    text = "\n".join(markdown(patterned))
    assert "## Attention by layer kind" in text and "layer 1 (global) H / log n" in text
    assert "- `local` (layers 0, 2): local: nope, sliding:3" in text
    assert distance_rows(patterned)[0][:3] == ["length", "layer", "kind"]
    local_row = next(row for row in distance_rows(patterned)[1:] if row[1] == 2)
    assert local_row[2] == "local" and local_row[6] == record["by_kind"]["local"]["pairs"][0]
    assert entropy_rows(patterned)[1][2] == "local"
    plain = wrap(summarize(sums, length, causal=True))
    text = "\n".join(markdown(plain))
    assert "layer kind" not in text and "layer 1 H / log n" in text and "| uniform |" in text
    assert distance_rows(plain)[0][2] == "head" and entropy_rows(plain)[0][2] == "head"
