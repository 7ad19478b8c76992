"""The encoder contract battery (posenc.testing): every registered encoder x every check that
applies to it (a check that cannot run here, cudnn without an NVIDIA GPU, is a skip with its
reason), an encoder registered inside a test is picked up with no other edit, and each check
fails an encoder that breaks its promise."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings, testing
from posenc.attention import blocked as blocked_module
from posenc.attention import linear as linear_attention
from posenc.encodings import Encoding
from posenc.encodings.stick_breaking import StickBreaking
from posenc.testing import _harness, checks

# The encoder-decoder check builds and decodes a second model: one encoder per hook kind in the
# default suite, every registered encoder in the slow step.
ENCDEC_DEFAULT = ("sinusoidal", "rope", "t5", "shaw", "xl", "conv", "cope")
# The classifier check likewise: a rotation and a causal-only encoder's refusal in the default
# suite (about 3 s of CPU each), every registered encoder in the slow step.
CLASSIFIER_DEFAULT = ("rope", "cope")
# The pattern checks build two-layer pattern models per path and decode: an encoder placed as a
# kind's (RoPE) and one placed as the model's (sinusoidal, an input term) in the default suite;
# their training, and every registered encoder, in the slow step.
PATTERNS_DEFAULT = ("rope", "sinusoidal")
SLOW_EXCEPT = {
    "encoder_decoder": ENCDEC_DEFAULT,
    "classifier": CLASSIFIER_DEFAULT,
    "patterns": PATTERNS_DEFAULT,
    "pattern_trains": (),
    # The pallas kernel runs in Pallas's interpret mode off a GPU (10-15 s a case to compile):
    # tests/test_attention_pallas.py has one default case, the battery's in the slow step.
    "pallas": (),
}
# Where the cudnn cases (which skip without an NVIDIA GPU, so on every CI machine) do run.
CUDNN_ELSEWHERE = "runs in the prepared device check, experiments/device_check.py (issue 35)"


def _contract_cases():
    for name, check in testing.cases():
        slow = name not in SLOW_EXCEPT.get(check, (name,))
        yield pytest.param(name, check, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("name,check", _contract_cases())
def test_contract(name, check):
    try:
        testing.CHECKS[check](name)
    except testing.NotApplicable as why:  # the same reason for every encoder: -ra groups them
        pytest.skip(f"{why}; {CUDNN_ELSEWHERE}" if check == "cudnn" else str(why))


def test_checks_that_do_not_apply_are_not_cases_and_refuse_to_pass():
    cases = testing.cases()
    assert [name for name, check in cases if check == "carry"] == ["cope", "stick_breaking"]
    assert [name for name, check in cases if check == "unnormalized"] == ["stick_breaking"]
    assert [name for name, check in cases if check == "householder"] == ["path"]
    assert [name for name, check in cases if check == "augment"] == ["cape"]
    on_cudnn = {name for name, check in cases if check == "cudnn"}
    # Contextual logits, values, unnormalised weights, Householder products: the fused kernels
    # refuse them.
    assert on_cudnn == set(encodings.names()) - {"cope", "shaw", "stick_breaking", "path"}
    on_pallas = {name for name, check in cases if check == "pallas"}
    # The kernel computes content-free terms from positions only: content logits (Shaw, XL,
    # DAPE, DeBERTa, ...), values, decays, contextual logits and Householder products it refuses.
    assert {"alibi", "t5", "kerple_log", "fire", "dynamic_bias", "rope", "nope"} <= on_pallas
    assert not {"shaw", "xl", "cope", "stick_breaking", "path", "forgetting"} & on_pallas
    by_distance = {name for name, check in cases if check == "bias_by_distance"}
    assert by_distance == {"alibi", "t5", "kerple_log", "kerple_power", "dynamic_bias"}
    assert {name for name, check in cases if check == "reach"} == {"shaw", "t5"}
    assert [name for name, check in cases if check == "carry_limit"] == ["cope", "stick_breaking"]
    rotating = {name for name in encodings.names() if "rotate" in testing.resolve(name).hooks}
    assert {"rope", "xpos", "pope", "deberta", "hope", "fope", "truncated_rope"} <= rotating
    assert {name for name, check in cases if check == "key_lookback"} == rotating
    cheaper_tiles = {"bias_by_distance", "reach", "carry_limit"}
    every_other = set(testing.CHECKS) - {
        "carry",
        "unnormalized",
        "householder",
        "augment",
        "cudnn",
        "pallas",
        "key_lookback",
    }
    every_other -= cheaper_tiles
    for check in every_other:
        assert sum(c == check for _, c in cases) == len(encodings.names()), check
    with pytest.raises(testing.NotApplicable, match=r"carry does not apply.*'rope'.*no contex"):
        testing.check_carry("rope")
    with pytest.raises(testing.NotApplicable, match=r"unnormalized does not apply.*'rope'"):
        testing.check_unnormalized("rope")
    with pytest.raises(testing.NotApplicable, match=r"householder does not apply.*'rope'"):
        testing.check_householder("rope")
    with pytest.raises(testing.NotApplicable, match=r"augment does not apply.*'rope'"):
        testing.check_augment("rope")
    with pytest.raises(testing.NotApplicable, match=r"cudnn does not apply.*'shaw'.*value term"):
        testing.check_cudnn("shaw")
    with pytest.raises(testing.NotApplicable, match=r"pallas does not apply.*'shaw'.*content"):
        testing.check_pallas("shaw")
    with pytest.raises(testing.NotApplicable, match=r"bias_by_distance does not apply.*'fire'"):
        testing.check_bias_by_distance("fire")
    with pytest.raises(testing.NotApplicable, match=r"reach does not apply.*'alibi'"):
        testing.check_reach("alibi")
    with pytest.raises(testing.NotApplicable, match=r"carry_limit does not apply.*'rope'"):
        testing.check_carry_limit("rope")
    with pytest.raises(testing.NotApplicable, match=r"key_lookback does not apply.*'alibi'"):
        testing.check_key_lookback("alibi")
    not_run = testing.check_encoder("nope", checks=("declarations", "carry", "augment"))
    assert sorted(not_run) == ["augment", "carry"]


# -- a new encoder is tested the day it is registered ---------------------------------------


@pytest.mark.slow
def test_an_encoder_registered_in_one_decorator_is_picked_up_by_the_battery():
    with testing.temporary_registry():

        @encodings.register
        @dataclasses.dataclass(frozen=True)
        class LearnedRotary(Encoding):
            """RoPE with a learned frequency per channel pair (uses rotate's params)."""

            name = "throwaway-learned-rotary"
            paper = "a test"
            relative = True

            def param_shapes(self, dims):
                return {"log_freq": (dims.head_dim // 2,)}

            def init(self, rng, dims):
                (shape,) = self.param_shapes(dims).values()
                return {"log_freq": jax.random.uniform(rng, shape, jnp.float32, -4.0, 0.0)}

            def rotate(self, params, q, k, q_pos, k_pos):
                freq = jnp.exp(params["log_freq"])  # [Dh/2]

                def turn(x, pos):  # x: [B, T, H, Dh], pos: [B|1, T]
                    angle = pos.astype(jnp.float32)[:, :, None, None] * freq  # [B|1, T, 1, Dh/2]
                    a, b = jnp.split(x.astype(jnp.float32), 2, axis=-1)
                    c, s = jnp.cos(angle), jnp.sin(angle)
                    return jnp.concatenate([a * c - b * s, a * s + b * c], -1).astype(x.dtype)

                return turn(q, q_pos), turn(k, k_pos)

        picked = [check for name, check in testing.cases() if name == LearnedRotary.name]
        # rotate only, no declarations of cheaper tiles
        assert set(picked) == set(testing.CHECKS) - {
            "carry",
            "unnormalized",
            "householder",
            "augment",
            "bias_by_distance",
            "reach",
            "carry_limit",
        }
        testing.check_encoder(LearnedRotary.name, checks=tuple(picked))
    assert LearnedRotary.name not in encodings.names()  # the registry is restored


def test_the_readme_example_encoder_registers_and_keeps_the_contract(monkeypatch):
    readme = (pathlib.Path(__file__).parents[1] / "docs" / "encoders.md").read_text()
    section = readme[readme.index("## Adding an encoder") :]
    start = section.index("```python\n") + len("```python\n")
    source = section[start : section.index("\n```", start)]
    with testing.temporary_registry():
        module = types.ModuleType("readme_example")  # dataclasses look their module up
        monkeypatch.setitem(sys.modules, module.__name__, module)
        exec(compile(source, "docs/encoders.md", "exec"), module.__dict__)
        assert encodings.get_class("my_kerple_log") is module.MyKerpleLog
        for check in ("declarations", "param_shapes", "shift"):  # the cheap ones
            testing.CHECKS[check]("my_kerple_log")


# -- the checks have teeth: encoders that break a promise fail ------------------------------


@dataclasses.dataclass(frozen=True)
class PeeksAhead(Encoding):
    """Adds q_i . k_{j+1} to the logit of (i, j): the diagonal reads the next, future key."""

    name = "peeks-ahead"
    paper = "a test"
    relative = True

    def content_logits(self, params, q, k, q_pos, k_pos):
        return jnp.einsum("BTHD,BSHD->BHTS", q, jnp.roll(k, -1, axis=1))


@dataclasses.dataclass(frozen=True)
class AbsoluteBias(Encoding):
    """Declares relative = True but biases each key by a function of its absolute position."""

    name = "absolute-bias"
    paper = "a test"
    relative = True

    def bias(self, params, q_pos, k_pos):
        b, h = max(q_pos.shape[0], k_pos.shape[0]), self.bound_dims.num_heads
        bias = jnp.sin(0.7 * k_pos.astype(jnp.float32))[:, None, None, :]  # [B|1, 1, 1, S]
        return jnp.broadcast_to(bias, (b, h, q_pos.shape[-1], k_pos.shape[-1]))


@dataclasses.dataclass(frozen=True)
class SaysAbsolute(encodings.NoPE):
    """NoPE is shift invariant; declaring it absolute is wrong."""

    relative = False


@dataclasses.dataclass(frozen=True)
class BrokenPromise(Encoding):
    """``init`` disagrees with ``param_shapes``."""

    name = "broken-promise"
    paper = "a test"
    relative = True

    def param_shapes(self, dims):
        return {"w": (dims.num_heads, 4)}

    def init(self, rng, dims):
        return {"w": jnp.zeros((dims.num_heads, 3), jnp.float32)}


@dataclasses.dataclass(frozen=True)
class HalfPrecisionInit(BrokenPromise):
    name = "half-precision-init"

    def init(self, rng, dims):
        return {"w": jnp.zeros((dims.num_heads, 4), jnp.bfloat16)}


@dataclasses.dataclass(frozen=True)
class DoublesPerWindow(BrokenPromise):
    """``window_params`` doubles the weights: applied twice, it doubles them again."""

    name = "doubles-per-window"

    def init(self, rng, dims):
        return {"w": jnp.ones((dims.num_heads, 4), jnp.float32)}

    def window_params(self, params):
        return {"w": 2 * params["w"]}


@dataclasses.dataclass(frozen=True)
class ReshapesPerWindow(DoublesPerWindow):
    name = "reshapes-per-window"

    def window_params(self, params):
        return {"w": params["w"].reshape(-1)}


@dataclasses.dataclass(frozen=True)
class IndexBias(Encoding):
    """Biases by the key's index within the call, not its position: tiles see other indices."""

    name = "index-bias"
    paper = "a test"
    relative = True

    def bias(self, params, q_pos, k_pos):
        s = k_pos.shape[-1]
        return jnp.broadcast_to(-0.5 * jnp.arange(s, dtype=jnp.float32), (1, 1, 1, s))


def test_an_encoder_that_reads_a_future_key_fails_the_causality_check():
    with pytest.raises(AssertionError, match=r"'peeks-ahead'.*causal.*later inputs.*'einsum'"):
        testing.check_causal(PeeksAhead())


def test_a_wrong_relative_declaration_fails_the_shift_check():
    with pytest.raises(AssertionError, match=r"'absolute-bias'.*declares relative = True"):
        testing.check_shift(AbsoluteBias())
    with pytest.raises(AssertionError, match=r"'nope'.*declares relative = False"):
        testing.check_shift(SaysAbsolute())


def test_init_that_breaks_param_shapes_fails_the_shape_check():
    with pytest.raises(AssertionError, match=r"init returns \{'w': \(2, 3\)\}.*\{'w': \(2, 4\)\}"):
        testing.check_param_shapes(BrokenPromise())
    with pytest.raises(AssertionError, match="float32.*bfloat16"):
        testing.check_param_shapes(HalfPrecisionInit())


def test_window_params_that_change_shapes_or_are_not_idempotent_fail_the_shape_check():
    with pytest.raises(AssertionError, match="window_params must keep the parameters' names"):
        testing.check_param_shapes(ReshapesPerWindow())
    with pytest.raises(AssertionError, match="window_params must be idempotent"):
        testing.check_param_shapes(DoublesPerWindow())


@dataclasses.dataclass(frozen=True)
class FireByDistance(encodings.get_class("fire")):
    """FIRE's normaliser reads the query's position (past its threshold): not a function of the
    distance, whatever it declares."""

    bias_by_distance = True


@dataclasses.dataclass(frozen=True)
class AlibiWithReach(encodings.ALiBi):
    """ALiBi's penalty grows with every distance; no reach exists."""

    @property
    def reach(self):
        return 3


@dataclasses.dataclass(frozen=True)
class ShawReachTooShort(encodings.Shaw):
    """Shaw clips at max_distance; claiming a shorter reach is false for the keys between."""

    @property
    def reach(self):
        return self.max_distance - 2


@dataclasses.dataclass(frozen=True)
class CopeLimitTooLow(encodings.get_class("cope")):
    """CoPE's counts are clipped at max_pos - 1; below that the gates still move positions."""

    @property
    def carry_limit(self):
        return self.max_pos - 2.5


@dataclasses.dataclass(frozen=True)
class PathPeeking(encodings.get_class("path")):
    """PaTH whose maps read the next token's input: the future leaks into the products."""

    def householder(self, params, inputs):
        return super().householder(params, jnp.roll(inputs, -1, axis=1))


@dataclasses.dataclass(frozen=True)
class PathFlatBeta(encodings.get_class("path")):
    """PaTH whose beta has no head axis."""

    def householder(self, params, inputs):
        w, beta = super().householder(params, inputs)
        return w, beta[..., 0]


def test_a_householder_hook_that_reads_later_inputs_fails_its_check():
    with pytest.raises(AssertionError, match=r"'path'.*fails householder: householder on the fi"):
        testing.check_householder(PathPeeking())
    with pytest.raises(AssertionError, match=r"fails householder: householder must return"):
        testing.check_householder(PathFlatBeta())
    testing.check_householder("path")  # the registered one keeps it
    testing.check_householder(encodings.get("path", forget_gate=True, rank=0, conv_size=0))


def test_false_declarations_of_cheaper_tiles_fail_their_checks():
    """The blocked path trusts bias_by_distance and reach; each check catches a false one."""
    with pytest.raises(AssertionError, match=r"fails bias_by_distance: declares.*reads more than"):
        testing.check_bias_by_distance(FireByDistance(init_L=4.0))
    with pytest.raises(AssertionError, match=r"'alibi'.*fails reach: bias differs"):
        testing.check_reach(AlibiWithReach())
    with pytest.raises(AssertionError, match=r"'shaw'.*fails reach: content_logits differs"):
        testing.check_reach(ShawReachTooShort(max_distance=4))
    with pytest.raises(AssertionError, match=r"'cope'.*fails carry_limit: with every carry"):
        testing.check_carry_limit(CopeLimitTooLow(max_pos=4, init_std=0.5))


def test_a_false_key_lookback_fails_its_check():
    """Too small (the key offset declared as reading nothing) and too large (a cache would keep
    a slot for nothing) are both caught; the true values pass."""
    from posenc.encodings.truncated_rope import TruncatedRoPE

    def declaring(value):
        return type("Declared", (TruncatedRoPE,), {"key_lookback": property(lambda self: value)})

    testing.check_key_lookback(encodings.get("truncated_rope", key_offset=True))
    testing.check_key_lookback(encodings.get("truncated_rope"))
    with pytest.raises(AssertionError, match=r"changed rotated keys \[4, 5\].*allows only \[4\]"):
        testing.check_key_lookback(declaring(0)(key_offset=True))
    with pytest.raises(AssertionError, match="declares key_lookback = 2, but key 6"):
        testing.check_key_lookback(declaring(2)(key_offset=True))
    with pytest.raises(AssertionError, match="`key_lookback` must be an integer >= 0"):
        testing.check_declarations(declaring(-1)())


@pytest.mark.slow
def test_false_declarations_of_cheaper_tiles_make_the_blocked_path_differ():
    """What the declaration checks guard against: the path agreement, which compares the tiles
    that rely on them with the reference, catches a false reach and a false bias_by_distance
    too (compiling the blocked path: the slow step)."""
    with pytest.raises(AssertionError, match=r"fails paths_agree.*'blocked' differs"):
        testing.check_paths_agree(AlibiWithReach())
    with pytest.raises(AssertionError, match=r"fails paths_agree.*differs"):
        testing.check_paths_agree(FireByDistance(init_L=4.0))


def test_a_hook_that_depends_on_the_tile_fails_the_path_check():
    with pytest.raises(AssertionError, match=r"'index-bias'.*path 'blocked' differs"):
        testing.check_paths_agree(IndexBias())


@dataclasses.dataclass(frozen=True)
class SecretlyCausal(Encoding):
    """Claims to serve bidirectional attention but masks every key after the query itself."""

    name = "secretly-causal"
    paper = "a test"
    relative = True

    def bias(self, params, q_pos, k_pos):
        later = k_pos[:, None, None, :] > q_pos[:, None, :, None]  # [B|1, 1, T, S]
        return jnp.where(later, -1e9, 0.0)


@dataclasses.dataclass(frozen=True)
class IgnoresItsDeclaration(encodings.NoPE):
    """Declares causal_only but lets the model build without the mask."""

    causal_only = True

    def check_causal(self, causal):
        pass


@dataclasses.dataclass(frozen=True)
class CausalOnlyAsText(encodings.NoPE):
    causal_only = "yes"


@dataclasses.dataclass(frozen=True)
class QuietRefusal(encodings.NoPE):
    """Refuses bidirectional attention without saying which field to change."""

    name = "quiet-refusal"

    def check_causal(self, causal):
        if not causal:
            raise ValueError("no")


def test_bidirectional_check_catches_hidden_masks_and_ignored_declarations():
    with pytest.raises(AssertionError, match=r"'secretly-causal'.*bidirectional.*no later input"):
        testing.check_bidirectional(SecretlyCausal())
    with pytest.raises(AssertionError, match=r"causal only.*built with model.causal=False"):
        testing.check_bidirectional(IgnoresItsDeclaration())
    with pytest.raises(AssertionError, match=r"`causal_only` must be True or False"):
        testing.check_declarations(CausalOnlyAsText())
    with pytest.raises(AssertionError, match=r"'quiet-refusal'.*one line naming the field"):
        testing.check_bidirectional(QuietRefusal())
    testing.check_bidirectional("forgetting")  # causal only, and refused as declared


@dataclasses.dataclass(frozen=True)
class UnnormalizedNoPE(encodings.NoPE):
    """Declares unnormalised weights but leaves the logits as they are: exp(q . k) weights."""

    name = "unnormalized-nope"
    normalized = False


@dataclasses.dataclass(frozen=True)
class StickWithoutProduct(StickBreaking):
    """Stick-breaking that forgets the product over the later keys: weights sigmoid(z_ij)."""

    name = "stick-without-product"

    def contextual_logits(self, params, q, k, logits, carry):
        return jax.nn.log_sigmoid(logits) - logits, carry


@dataclasses.dataclass(frozen=True)
class NormalizedAsText(encodings.NoPE):
    normalized = "no"


def test_unnormalized_weights_that_can_exceed_one_fail_their_check():
    with pytest.raises(AssertionError, match=r"'unnormalized-nope'.*sum to [\d.]+ .*at most 1"):
        testing.check_unnormalized(UnnormalizedNoPE())
    with pytest.raises(AssertionError, match=r"'stick-without-product'.*at most 1"):
        testing.check_unnormalized(StickWithoutProduct())
    with pytest.raises(AssertionError, match=r"`normalized` must be True or False"):
        testing.check_declarations(NormalizedAsText())


def test_a_blocked_path_that_normalises_unnormalised_weights_fails_the_path_check(monkeypatch):
    def softmax_weights(enc, params, logits, v_blk, acc, extra, xs, ys, probe):
        p = jax.nn.softmax(logits, axis=-1)  # normalises each tile: no longer exp(logits)
        return acc + jnp.einsum("BHTS,BSHD->BTHD", p, v_blk), extra

    @dataclasses.dataclass(frozen=True)
    class Fresh(StickBreaking):  # a class of its own: the battery's compiled paths are cached
        pass

    monkeypatch.setattr(blocked_module, "_accumulate_unnormalized", softmax_weights)
    with pytest.raises(AssertionError, match=r"'stick_breaking'.*path 'blocked' differs"):
        testing.check_paths_agree(Fresh())


@dataclasses.dataclass(frozen=True)
class RelativeAsAField(Encoding):
    """Annotating a declaration in a dataclass subclass turns it into a hyperparameter."""

    name = "relative-as-a-field"
    paper = "a test"
    relative: bool = True


def test_a_declaration_written_as_a_field_fails_the_declarations_check():
    with pytest.raises(AssertionError, match=r"\['relative'\] became hyperparameters"):
        testing.check_declarations(RelativeAsAField())


def test_check_encoder_lists_every_failed_check():
    with pytest.raises(AssertionError) as info:
        testing.check_encoder(BrokenPromise(), checks=("declarations", "param_shapes"))
    message = str(info.value)
    assert message.startswith("1 of 2 contract checks failed")
    assert "- param_shapes:" in message and "- declarations" not in message
    assert testing.check_encoder("nope", checks=("declarations", "param_shapes")) == {}


def test_checks_refuse_a_bound_encoder():
    bound = encodings.get("nope").bind(testing.Settings().dims)
    with pytest.raises(ValueError, match="unbound"):
        testing.check_declarations(bound)


@dataclasses.dataclass(frozen=True)
class AugmentsIntegers(encodings.Sinusoidal):
    """An augment_positions hook without declaring continuous positions."""

    def augment_positions(self, params, positions, rng):
        return positions


@dataclasses.dataclass(frozen=True)
class RoundsItsPositions(encodings.Sinusoidal):
    """Declares continuous positions but truncates them."""

    continuous_positions = True

    def embed(self, params, positions):
        return super().embed(params, jnp.floor(positions))


@dataclasses.dataclass(frozen=True)
class IgnoresItsKey(encodings.Sinusoidal):
    """Augments by a constant: the training key changes nothing."""

    continuous_positions = True

    def augment_positions(self, params, positions, rng):
        return positions + (0.0 if rng is None else 3.0)


def test_augment_check_catches_undeclared_rounded_and_keyless_augmentation():
    with pytest.raises(AssertionError, match=r"augment_positions` hook needs continuous_positions"):
        testing.check_declarations(AugmentsIntegers())
    with pytest.raises(AssertionError, match=r"augment.*ignores fractional positions"):
        testing.check_augment(RoundsItsPositions())
    with pytest.raises(AssertionError, match=r"augment.*not a function of its key"):
        testing.check_augment(IgnoresItsKey())


# -- teeth for bf16, trains, extrapolates, cudnn and linear -----------------------------------


def _distance_bias(q, k, i, j):
    """``-(i - j)`` as content logits ``[B, H, T, S]`` from query and key positions ``i, j``."""
    bias = -(i[:, None, :, None] - j[:, None, None, :])
    return jnp.broadcast_to(bias, (q.shape[0], q.shape[2], q.shape[1], k.shape[1]))


@dataclasses.dataclass(frozen=True)
class BiasInComputeDtype(Encoding):
    """A distance bias -(i - j) taken as the difference of two large absolute terms in q's dtype:
    exact in float32; in bfloat16 each term rounds to a multiple of 4 or 8."""

    name = "bias-in-compute-dtype"
    paper = "a test"
    relative = True

    def content_logits(self, params, q, k, q_pos, k_pos):
        i, j = ((pos + 1000).astype(q.dtype) for pos in (q_pos, k_pos))
        return _distance_bias(q, k, i, j).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class BiasInFloat32(BiasInComputeDtype):
    """The same bias from the same terms in float32, whatever the compute dtype."""

    name = "bias-in-float32"

    def content_logits(self, params, q, k, q_pos, k_pos):
        i, j = ((pos + 1000).astype(jnp.float32) for pos in (q_pos, k_pos))
        return _distance_bias(q, k, i, j)


def test_a_bias_computed_in_bfloat16_fails_the_bf16_check():
    with pytest.raises(AssertionError, match=r"'bias-in-compute-dtype'.*bf16.*far from float32"):
        testing.check_bf16(BiasInComputeDtype())
    testing.check_bf16(BiasInFloat32())  # the same bias kept in float32 passes


@dataclasses.dataclass(frozen=True)
class LearnedPowerBias(Encoding):
    """-|i - j|^p with a learned exponent p per head, written exp(p log |i - j|): finite, but
    d/dp = |d|^p log |d| is 0 x (-inf) = NaN at distance 0, so the first Adam step makes the
    parameters NaN."""

    name = "learned-power-bias"
    paper = "a test"
    relative = True

    def param_shapes(self, dims):
        return {"p": (dims.num_heads,)}

    def init(self, rng, dims):
        return {"p": jnp.ones((dims.num_heads,), jnp.float32)}

    def bias(self, params, q_pos, k_pos):
        distance = jnp.abs(q_pos[:, None, :, None] - k_pos[:, None, None, :]).astype(jnp.float32)
        return -jnp.exp(params["p"][None, :, None, None] * jnp.log(distance))


def test_gradients_that_are_nan_or_no_update_at_all_fail_the_training_check():
    with pytest.raises(AssertionError, match=r"'learned-power-bias'.*trains.*non-finite"):
        testing.check_trains(LearnedPowerBias())
    # An encoder cannot stop the other parameters' gradients (the embedding, MLP and output
    # layers still learn), so the other half is shown with every update stopped.
    frozen = testing.Settings(learning_rate=0.0)
    with pytest.raises(AssertionError, match=r"'nope'.*8 Adam steps did not lower the loss"):
        testing.check_trains("nope", frozen)


def test_an_encoder_whose_parameters_get_no_gradient_fails_the_training_check():
    # T5 with its bias table's gradient stopped: the embedding, attention and MLP still learn, so
    # the loss falls by 10 % as before; the check must see that the encoder's table never moves.
    t5 = type(testing.resolve("t5"))

    @dataclasses.dataclass(frozen=True)
    class FrozenT5(t5):
        name = "frozen-t5"

        def bias(self, params, q_pos, k_pos):
            return super().bias(jax.lax.stop_gradient(params), q_pos, k_pos)

    hparams = {**testing.HPARAMS["t5"]}
    losses, _ = _harness.train_losses(FrozenT5(**hparams), testing.Settings())
    assert losses[-1] < 0.9 * losses[0]  # what the check asserted alone: it would pass
    with pytest.raises(
        AssertionError,
        match=r"'frozen-t5'.*trains.*encoder parameters "
        r"\['shared_pos_params/table'\] get a zero gradient",
    ):
        testing.check_trains(FrozenT5(**hparams))


@dataclasses.dataclass(frozen=True)
class NaNPastItsLength(Encoding):
    """sqrt(max_len - 1 - p) as an embedding: NaN at positions past the training length, with no
    check_length to refuse them."""

    name = "nan-past-its-length"
    paper = "a test"
    relative = False
    param_scope = "shared"
    max_len: int = 12

    def embed(self, params, positions):
        d = self.bound_dims.model_dim
        value = jnp.sqrt((self.max_len - 1 - positions).astype(jnp.float32))  # [B|1, T]
        return jnp.broadcast_to(value[..., None], (*value.shape, d))


def test_nan_past_the_training_length_fails_the_extrapolation_check():
    with pytest.raises(AssertionError, match=r"extrapolates: built for 12 tokens, non-finite .*48"):
        testing.check_extrapolates(NaNPastItsLength())
    testing.check_extrapolates(NaNPastItsLength(max_len=48))  # finite up to 48 tokens


@dataclasses.dataclass(frozen=True)
class BiasTooLargeForCudnn(Encoding):
    """A relative bias of 300 - |i - j| / 2: cuDNN takes the bias in bfloat16, whose spacing at
    300 is 2, so the distance term is rounded away; the reference adds it in float32."""

    name = "bias-too-large-for-cudnn"
    paper = "a test"
    relative = True

    def bias(self, params, q_pos, k_pos):
        distance = jnp.abs(q_pos[:, None, :, None] - k_pos[:, None, None, :]).astype(jnp.float32)
        bias = 300.0 - distance / 2  # [B|1, 1, T, S]
        return jnp.broadcast_to(bias, (bias.shape[0], self.bound_dims.num_heads, *bias.shape[2:]))


def test_a_bias_cudnn_rounds_away_fails_the_cudnn_check():
    if not checks._nvidia_gpu():
        pytest.skip(
            f"cudnn needs an NVIDIA GPU (cuDNN's fused attention kernel); {CUDNN_ELSEWHERE}"
        )
    with pytest.raises(AssertionError, match=r"'bias-too-large-for-cudnn'.*path 'cudnn' differs"):
        testing.check_cudnn(BiasTooLargeForCudnn())


@dataclasses.dataclass(frozen=True)
class ReadsTheWindowLength(Encoding):
    """An input term scaled by the window's last position: the padding of a source moves it, so
    a padded source no longer gives the unpadded outputs."""

    name = "reads-the-window-length"
    paper = "a test"
    relative = False
    param_scope = "shared"

    def embed(self, params, positions):
        last = positions.max(axis=-1, keepdims=True).astype(jnp.float32)  # [B|1, 1]
        # Not constant across channels, which a norm would remove.
        pattern = jnp.sin(jnp.arange(self.bound_dims.model_dim, dtype=jnp.float32))
        return jnp.broadcast_to(last[..., None] / 4.0 * pattern, (*positions.shape, len(pattern)))


def test_a_term_that_reads_padding_fails_the_encoder_decoder_check():
    with pytest.raises(AssertionError, match=r"a padded source differs from the unpadded one"):
        testing.check_encoder_decoder(ReadsTheWindowLength())


def test_a_linear_path_with_the_wrong_normaliser_fails_eq19(monkeypatch):
    """Normalising by the rotated features, sum_j (R_i phi(q_i)) . (R_j phi(k_j)), instead of
    eq. (19)'s unrotated ones: still causal, no longer eq. (19)."""
    for name in ("_causal", "_bidirectional"):
        path = getattr(linear_attention, name)
        wrong = lambda fq, fk, rq, rk, *rest, path=path: path(rq, rk, rq, rk, *rest)  # noqa: E731
        monkeypatch.setattr(linear_attention, name, wrong)
    # A RoPE no other test uses: the battery's compiled programs are cached per encoder, so this
    # one is compiled here with the wrong path (and stays cached under a key no one else asks).
    rope = encodings.get("rope", base=777.0)
    with pytest.raises(AssertionError, match=r"fails linear: attention path 'linear' differs fr"):
        testing.check_linear(rope)


# -- a result that is not finite at -O0 is never replaced silently ----------------------------


def _results(*values):
    """A ``compute(jit)`` that returns ``values`` in turn (first at -O0, then recompiled)."""
    it = iter(values)
    return lambda jit: next(it)


def test_a_result_not_finite_at_O0_is_recompiled_with_a_warning():
    with pytest.warns(RuntimeWarning, match=r"the thing is not finite .* LLVM -O0 but is at"):
        assert _harness.finite_or_recompiled(_results((np.nan, 1.0), (2.0, 1.0)), "the thing") == (
            2.0,
            1.0,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # finite at -O0: kept, nothing recompiled, no warning
        assert _harness.finite_or_recompiled(_results(3.0), "the thing") == 3.0
        # Not finite at either level: returned as it is, for the check to fail on.
        assert np.isinf(_harness.finite_or_recompiled(_results(np.nan, np.inf), "the thing"))
