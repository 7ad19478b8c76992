"""Transformer-XL segment recurrence (Dai et al. 2019, Sec. 3.2): the model with memory.

The equivalence: with ``mem_len`` covering every earlier segment, the memory the model carries
holds exactly the states a single pass over all the segments computes for them (each cached
state was computed with the whole of its own past), so scoring segment after segment with
memory must give the logits of one full pass. With a shorter memory the segments see less and
the logits differ (checked too, so the equality is not vacuous).
"""

from __future__ import annotations

import _train_helpers as helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import data as data_lib
from posenc import encodings
from posenc.kinds.stream import evaluate
from posenc.layers.config import ModelConfig
from posenc.models import memory as memory_lib
from posenc.models.lm import Transformer
from posenc.models.losses import token_loss
from posenc.runs.config import validate
from posenc.runs.evaluate import evaluate_workdir
from posenc.runs.train import Trainer, train
from posenc.workdir.metrics import read_metrics

T = 4  # segment length
SEGMENTS = 3


def _model(name: str, mem_len: int, **config) -> Transformer:
    hparams = {"max_len": 64} if name == "learned" else {}
    cfg = ModelConfig(
        vocab_size=32,
        num_layers=2,
        model_dim=16,
        num_heads=2,
        mlp_dim=32,
        dtype="float32",
        attention_impl="einsum",
        mem_len=mem_len,
        **config,
    )
    return Transformer(cfg, encodings.get(name, **hparams), rngs=nnx.Rngs(0))


def _tokens(batch: int = 2, length: int = SEGMENTS * T) -> jax.Array:
    return jax.random.randint(jax.random.key(1), (batch, length), 0, 32)


def _by_segments(model: Transformer, tokens: jax.Array, mem_len: int | None = None):
    memory = memory_lib.empty_memory(model, tokens.shape[0])
    logits = []
    for start in range(0, tokens.shape[1], T):
        out, memory = memory_lib.forward(
            model, tokens[:, start : start + T], memory, mem_len=mem_len
        )
        logits.append(out)
    return jnp.concatenate(logits, axis=1), memory


# One encoder per attention hook (content logits, bias, log decay, contextual logits) in the
# default suite; every registered encoder (rotate and embed ones too) in the slow one.
HOOK_EXAMPLES = ("xl", "alibi", "forgetting", "cope")
EVERY_OTHER = tuple(n for n in encodings.names() if n not in HOOK_EXAMPLES)


@pytest.mark.parametrize(
    "name", [*HOOK_EXAMPLES, *(pytest.param(n, marks=pytest.mark.slow) for n in EVERY_OTHER)]
)
def test_memory_covering_the_past_equals_one_full_pass(name):
    model = _model(name, mem_len=(SEGMENTS - 1) * T)
    tokens = _tokens()
    if "embed_tokens" in model.encoding.hooks:  # reads neighbouring tokens: refused
        with pytest.raises(ValueError, match="embed_tokens"):
            memory_lib.forward(model, tokens[:, :T], memory_lib.empty_memory(model, 2))
        return
    full = model(tokens)
    segmented, memory = _by_segments(model, tokens)
    np.testing.assert_allclose(segmented, full, rtol=2e-5, atol=2e-5, err_msg=name)
    assert memory.shape == (2, 2, (SEGMENTS - 1) * T, 16)


def test_short_memory_differs_from_the_full_pass_and_keeps_the_last_states():
    model = _model("xl", mem_len=T // 2)
    tokens = _tokens()
    full = model(tokens)
    segmented, memory = _by_segments(model, tokens)
    np.testing.assert_allclose(segmented[:, :T], full[:, :T], rtol=2e-5, atol=2e-5)
    assert np.abs(segmented[:, T:] - full[:, T:]).max() > 1e-3
    assert memory.shape == (2, 2, T // 2, 16)
    # The memory of layer 0 is the embedded last tokens (the residual stream entering it).
    embedded = model.embed(tokens[:, -T // 2 :])  # scaled by sqrt(D)
    np.testing.assert_allclose(memory[0], embedded, rtol=1e-6)


def test_without_memory_the_call_is_unchanged():
    """The memory argument leaves the memoryless call alone: a zero-length memory gives the
    same logits as no memory, and a model with mem_len > 0 the same logits as mem_len = 0."""
    tokens = _tokens(length=T)
    plain = _model("rope", mem_len=0)(tokens)
    with_len = _model("rope", mem_len=8)(tokens)
    np.testing.assert_array_equal(plain, with_len)
    logits, memory = memory_lib.forward(_model("rope", mem_len=8), tokens, jnp.zeros((2, 2, 0, 16)))
    np.testing.assert_allclose(logits, plain, rtol=1e-6, atol=1e-6)
    assert memory.shape == (2, 2, T, 16)


def test_no_gradient_flows_into_memory():
    model = _model("xl", mem_len=T)
    tokens = _tokens(length=2 * T)
    _, memory = memory_lib.forward(model, tokens[:, :T], memory_lib.empty_memory(model, 2))
    graphdef, state = nnx.split(model)

    def loss(memory, state):
        logits, _ = memory_lib.forward(nnx.merge(graphdef, state), tokens[:, T:-1], memory)
        return token_loss(logits, tokens[:, T + 1 :]).mean()

    grad_memory, grad_params = jax.jit(jax.grad(loss, argnums=(0, 1)))(memory, state)
    assert not np.asarray(grad_memory).any()
    assert any(np.abs(g).max() > 0 for g in jax.tree.leaves(grad_params))
    # The memory matters to the loss (so the zero gradient is the stop-gradient's doing).
    loss = jax.jit(loss)
    assert abs(loss(memory, state) - loss(memory[:, ::-1], state)) > 1e-4


def test_bad_memory_and_mem_len_are_refused():
    with pytest.raises(ValueError, match=r"^model\.mem_len must be an integer >= 0"):
        _model("xl", mem_len=-1)
    model = _model("xl", mem_len=T)
    with pytest.raises(ValueError, match="memory must be"):
        memory_lib.forward(model, _tokens(length=T), jnp.zeros((1, 2, 3, 16)))


# --- training over consecutive segments ---------------------------------------------------------


def test_stream_segments_follow_each_row_forward_and_wrap():
    stream = np.arange(103, dtype=np.uint16)  # token = its index, so rows show where they read
    windows = data_lib.StreamSegments(stream, seq_len=4, global_batch=5, seed=3)
    part = 103 // 5  # 20 tokens per row: (20 - 1) // 4 = 4 segments before a row starts again
    assert windows.segments_per_row == 4
    first = windows.batch(0)["inputs"]
    for step in range(9):
        batch = windows.batch(step)
        expected = (first[:, :1] + (step % 4) * 4 + np.arange(4)) % 103
        np.testing.assert_array_equal(batch["inputs"], expected)
        np.testing.assert_array_equal(batch["targets"], (expected + 1) % 103)
        assert windows.memory_tokens(step, mem_len=6) == min(6, (step % 4) * 4)
    assert ((first[1:, 0] - first[:-1, 0]) % 103 == part).all()  # one part per row
    # Deterministic in the seed, another seed another rotation; processes split the rows.
    again = data_lib.StreamSegments(stream, seq_len=4, global_batch=5, seed=3)
    np.testing.assert_array_equal(again.batch(7)["inputs"], windows.batch(7)["inputs"])
    other = data_lib.StreamSegments(stream, seq_len=4, global_batch=5, seed=5)
    assert not np.array_equal(other.batch(0)["inputs"], first)
    with pytest.raises(ValueError, match="train.seq_len=30 with train.batch_size=5"):
        data_lib.StreamSegments(stream, seq_len=30, global_batch=5, seed=0)


@pytest.mark.slow
def test_a_training_step_carries_the_layer_inputs_of_the_previous_segment(data_dir):
    config = helpers.tiny_config(data_dir, "model.mem_len=24", "model.num_layers=2")
    trainer = Trainer(config)
    windows = trainer.windows(helpers.stream(data_dir, "train"))
    state = trainer.init_state()
    model0 = trainer.model(jax.tree.map(jnp.copy, state))
    batch0 = windows.batch(0)
    state, _ = trainer.step(state, trainer.global_batch(batch0), windows.memory_tokens(0, 24))
    _, expected = memory_lib.forward(
        model0, jnp.asarray(batch0["inputs"]), memory_lib.empty_memory(model0, 8)
    )
    assert state["memory"].shape == (2, 8, 24, 32)
    np.testing.assert_allclose(state["memory"][:, :, -16:], expected, rtol=1e-5, atol=1e-6)
    assert not np.asarray(state["memory"][:, :, :-16]).any()  # padding before 16 real states
    assert windows.memory_tokens(1, 24) == 16
    np.testing.assert_array_equal(windows.batch(1)["inputs"][:, 0], batch0["targets"][:, -1])


def test_train_order_chooses_the_windows(data_dir):
    stream = helpers.stream(data_dir, "train")
    for overrides, cls in [
        ((), data_lib.TrainWindows),
        (("train.order=consecutive",), data_lib.StreamSegments),
        (("model.mem_len=8",), data_lib.StreamSegments),
    ]:
        assert type(Trainer(helpers.tiny_config(data_dir, *overrides)).windows(stream)) is cls


@pytest.mark.slow
def test_resume_with_memory_is_exact(data_dir, tmp_path):
    """Interrupted while the memory is still filling (step 1 of mem_len = 1.5 segments) and
    once it is full: both continue bit-identically to the uninterrupted run."""
    config = helpers.tiny_config(
        data_dir, "model.mem_len=24", "train.steps=6", "train.checkpoint_every=100"
    )
    full = train(config, str(tmp_path / "full"))
    cut = str(tmp_path / "cut")
    for stop in (1, 4):
        assert train(config, cut, stop_at=stop).step == stop
    second = train(config, cut)
    assert (second.step, second.resumed_from) == (6, 4)
    helpers.assert_same_leaves(helpers.param_leaves(full.model), helpers.param_leaves(second.model))
    full_lines = helpers.strip_timing(read_metrics(str(tmp_path / "full")))
    assert helpers.strip_timing(read_metrics(cut)) == full_lines
    report = evaluate_workdir(cut, progress=False)
    assert report["mem_len"] == 24 and all(r["mem_len"] == 24 for r in report["results"])
    # The memory matters: the same run without it trains differently.
    plain = train(helpers.tiny_config(data_dir, "train.steps=6"), str(tmp_path / "plain"))
    assert helpers.strip_timing(plain.history) != full_lines


@pytest.mark.parametrize(
    "override, match",
    [
        ("model.mem_len=-1", r"^model\.mem_len must be an integer >= 0"),
        ("eval.mem_len=-2", r"^eval\.mem_len must be an integer >= 0"),
        ("train.positions=randomized", r"^model\.mem_len > 0 .* train\.positions='randomized'"),
        ("model.attention_impl=linear", r"^model\.mem_len > 0 .* model\.attention_impl='linear'"),
        ("train.order=random", r"^train\.order='random' with model\.mem_len=16"),
        ("train.order=shuffled", r"^train\.order must be one of"),
        ("encoding.name=conv", r"^model\.mem_len > 0 .* encoding\.name='conv'"),
    ],
)
def test_memory_config_errors_name_the_field(data_dir, override, match):
    config = helpers.tiny_config(data_dir, "model.mem_len=16", override)
    with pytest.raises(ValueError, match=match) as error:
        validate(config)
    assert "\n" not in str(error.value)


# --- evaluation with memory ---------------------------------------------------------------------


@pytest.mark.slow
def test_evaluation_with_memory_equals_one_pass_with_the_past_as_context():
    """One row, memory longer than the stream: window k is scored with windows 0..k-1 as its
    memory, which (see the module docstring) is one pass over the whole stream."""
    model = _model("xl", mem_len=0)
    stream = np.asarray(_tokens(batch=1, length=3 * T + 1)[0], np.uint16)
    [result] = evaluate(model, stream, [T], batch_tokens=T, mem_len=3 * T)
    assert (result["rows"], result["windows"], result["tokens"]) == (1, 3, 3 * T)
    logits = model(jnp.asarray(stream[None, :-1], jnp.int32))  # [1, 3T, V]
    losses = helpers.cross_entropy(logits, stream[None, 1:])[0].reshape(3, T)  # [window, pos]
    np.testing.assert_allclose(result["loss"], losses.mean(), rtol=1e-5)
    np.testing.assert_allclose(result["loss_by_position"], losses.mean(0), rtol=1e-4, atol=1e-5)
    # A shorter memory sees less: the same tokens score differently.
    [short] = evaluate(model, stream, [T], batch_tokens=T, mem_len=1)
    assert abs(short["loss"] - result["loss"]) > 1e-4
    # Several rows: each part of the stream is scored on its own, every target once.
    stream = np.asarray(_tokens(batch=1, length=40)[0], np.uint16)
    [rows] = evaluate(model, stream, [T], batch_tokens=3 * T, mem_len=T)
    assert (rows["rows"], rows["windows"], rows["tokens"]) == (3, 9, 36)
    assert rows["unscored_tokens"] == 39 - 36 and rows["unscored_by_max_tokens"] == 0


@pytest.mark.parametrize(
    "stream_len, batch_tokens, max_tokens, windows",
    [
        pytest.param(40 * T + 1, 8 * T, 4 * T, 4, marks=pytest.mark.slow),  # cap < a batch
        pytest.param(40 * T + 1, 8 * T, 12 * T, 12, marks=pytest.mark.slow),  # 1-2 windows/row
        (5 * T + 1, 8 * T, 0, 4),  # a split shorter than two windows per row: 2 rows of 2
    ],
)
def test_memory_changes_the_result_whenever_a_window_has_a_predecessor(
    stream_len, batch_tokens, max_tokens, windows
):
    """However the split and the caps cut it, rows hold consecutive windows (so mem_len is
    what it says), and the tokens scored are what was asked, never more."""
    model = _model("xl", mem_len=0)
    stream = np.asarray(_tokens(batch=1, length=stream_len)[0], np.uint16)
    kwargs = dict(batch_tokens=batch_tokens, max_tokens=max_tokens)
    [one] = evaluate(model, stream, [T], mem_len=1, **kwargs)
    [more] = evaluate(model, stream, [T], mem_len=2 * T, **kwargs)
    for r in (one, more):
        assert (r["windows"], r["tokens"]) == (windows, windows * T)
        assert r["rows"] < r["windows"], "some window has a predecessor"
        assert r["unscored_tokens"] == stream_len - 1 - windows * T
    assert abs(one["loss"] - more["loss"]) > 1e-4, "the memory is used"
