"""configs/sweeps/roformer_fig3.py: each panel is the figure's two models, seeds only apart."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc.attention import linear as linear_attention
from posenc.models import build
from posenc.runs.config import validate
from posenc.runs.sweep import load_sweep

SWEEP = pathlib.Path(__file__).parents[1] / "configs" / "sweeps" / "roformer_fig3.py"


@pytest.mark.parametrize("variant", ["tiny_mlm", "tiny_linear", "gpu_mlm", "gpu_linear"])
def test_each_panel_is_learned_against_rope_over_three_seeds(variant):
    points, configs = load_sweep(f"{SWEEP}:{variant}")
    assert sorted((p["encoding.name"], p["seed"]) for p in points) == [
        (name, seed) for name in ("learned", "rope") for seed in (0, 1, 2)
    ]
    for config in configs:
        validate(config)
        if config.encoding.name == "learned":  # BERT's table covers the window, no more
            assert config.encoding.hparams.max_len == config.train.seq_len
        if variant.endswith("mlm"):  # Figure 3 left: a bidirectional masked LM
            assert config.model.causal is False and config.train.objective == "masked_lm"
            assert config.model.attention_impl not in linear_attention.PATHS
        else:  # right: a causal LM with FAVOR+ attention
            assert config.model.causal is True and config.train.objective == "causal_lm"
            assert config.model.attention_impl == "linear_performer"

    # Within a panel the configs differ only in the encoder and the seed.
    def rest(config):
        flat = config.to_dict()
        flat.pop("seed")
        flat.pop("encoding")
        return flat

    assert all(rest(c) == rest(configs[0]) for c in configs)


def test_the_models_build_and_mask_as_their_panel_says():
    """Both encoders build on both panels (the linear path accepts learned and RoPE), and the
    built models are the figure's: changing one token moves earlier outputs in the
    bidirectional MLM (left) and never in the causal Performer (right)."""
    for variant in ("tiny_mlm", "tiny_linear"):
        _, configs = load_sweep(f"{SWEEP}:{variant}")
        for config in configs[::3]:  # one per encoder
            graphdef, state = nnx.split(build(config, seed=0))
            t, changed = config.train.seq_len, config.train.seq_len // 2
            rows = np.stack([np.arange(t), np.arange(t)]) % config.model.vocab_size
            rows[1, changed] += 1  # the same window with one token changed
            run = jax.jit(
                lambda state, x, graphdef=graphdef: nnx.merge(graphdef, state)(x),
                compiler_options={"xla_backend_optimization_level": 0},  # compiles ~2x faster
            )
            before, after = np.asarray(run(state, jnp.asarray(rows)))
            assert before.shape == (t, config.model.vocab_size)
            earlier_moved = np.abs(after[:changed] - before[:changed]).max()
            if variant.endswith("mlm"):
                assert earlier_moved > 1e-4, config.encoding.name
            else:
                assert earlier_moved == 0.0, config.encoding.name
            assert np.abs(after[changed:] - before[changed:]).max() > 1e-4


def test_a_bad_variant_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"scale in \('tiny', 'gpu'\) and panel in"):
        load_sweep(f"{SWEEP}:tiny_bogus")
