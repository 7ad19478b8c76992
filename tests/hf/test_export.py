"""posenc.hf.save_pretrained on the families a run directory does not hold (T5's encoder-decoder,
BERT's and RoBERTa's masked LMs): the folder written is the one transformers wrote
(tests/hf/golden, make_golden.py), so transformers' logits of it are the golden ones
(tests/hf/check_export.py loads it with transformers where torch is installed).

T5's import folds scales into its weights (``sqrt(Dh)`` into the queries, ``D^-1/2`` into the
final decoder norm of v1.0), so its export divides them out again: equal to float32 rounding.
BERT's token-type row 0 lives in posenc's position table; the import keeps the original
token-type table (``spec.extra``), so the export writes it back bit for bit and takes row 0 out
of the positions again (equal to float32 rounding).

posenc's own T5-bias encoder-decoder (T5's parts with posenc's ``sqrt(D)`` embedding scale) is
saved as T5 and gives its own logits back (slow; check_export.py: transformers' too).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from posenc.hf import load_pretrained, read_spec, save_pretrained

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
# BERT's position and token-type tensors, compared as their sum.
_EMBEDDINGS = ("embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight")


def assert_same_model_folder(out: str, golden: str) -> None:
    """``out`` holds ``golden``'s T5, BERT or RoBERTa model: a config posenc reads as the same
    model, and the same tensors up to float32 rounding (BERT's token-type table bit for bit)."""
    family, spec, _ = read_spec(golden)
    got_family, got_spec, _ = read_spec(out)
    assert got_family.name == family.name
    assert (got_spec.model, got_spec.encoding, got_spec.hparams, got_spec.train_len) == (
        spec.model,
        spec.encoding,
        spec.hparams,
        spec.train_len,
    )
    want, got = (
        load_file(os.path.join(golden, "model.safetensors")),
        load_file(os.path.join(out, "model.safetensors")),
    )
    # T5's separate lm_head in the golden v1.0 file is the tied table (transformers saves both).
    assert set(got) <= set(want) and set(want) - set(got) <= {"lm_head.weight"}
    offset = spec.extra.get("offset", 0)
    for key, array in want.items():
        if key not in got:
            continue
        if key.endswith(_EMBEDDINGS[0]):  # rows before RoBERTa's offset are never read
            np.testing.assert_allclose(got[key][offset:], array[offset:], rtol=1e-6, atol=1e-7)
            continue
        np.testing.assert_allclose(got[key], array, rtol=1e-6, atol=1e-7, err_msg=key)
    if family.name == "bert":  # the token-type table itself, bit for bit (issue 36)
        types = next(k for k in want if k.endswith(_EMBEDDINGS[1]))
        np.testing.assert_array_equal(got[types], want[types])


def test_bert_export_keeps_token_type_1(tmp_path):
    """issue 36: the export wrote the token-type table as zeros (its row 0 folded into the
    positions), so an exported sentence-pair BERT added nothing for token type 1. What BERT adds
    at position t for token type s, ``position[t] + token_type[s]``, is the original's for both
    types, computed here from the tensors."""
    golden = os.path.join(GOLDEN, "bert")
    model, spec = load_pretrained(golden)
    out = str(tmp_path / "out")
    save_pretrained(model, spec, out)
    want, got = (
        load_file(os.path.join(golden, "model.safetensors")),
        load_file(os.path.join(out, "model.safetensors")),
    )
    pos, types = (next(k for k in want if k.endswith(e)) for e in _EMBEDDINGS)
    assert np.abs(want[types][1] - want[types][0]).max() > 0.1  # the rows differ
    for s in (0, 1):
        np.testing.assert_allclose(
            got[pos] + got[types][s], want[pos] + want[types][s], rtol=1e-6, atol=1e-6
        )


@pytest.mark.parametrize("name", ["t5", "bert", pytest.param("roberta", marks=pytest.mark.slow)])
def test_save_pretrained_writes_transformers_folder_back(tmp_path, name):
    golden = os.path.join(GOLDEN, name)
    model, spec = load_pretrained(golden)
    out = str(tmp_path / "out")
    assert save_pretrained(model, spec, out) == read_spec(golden)[0].name
    assert_same_model_folder(out, golden)


def posenc_t5(mlp: str, tie: bool):
    """An encoder-decoder posenc builds with T5's bias and T5's parts (RMSNorm, no biases), and
    posenc's own sqrt(D) embedding scale: ``(model, spec)``."""
    from flax import nnx

    from posenc import encodings
    from posenc.hf import Spec
    from posenc.layers.config import ModelConfig
    from posenc.models.encdec import EncoderDecoder

    config = ModelConfig(
        vocab_size=64,
        num_layers=2,
        model_dim=32,
        num_heads=4,
        mlp_dim=48,
        norm="rmsnorm",
        dtype="float32",
        mlp=mlp,
        mlp_bias=False,
        tie_embeddings=tie,
    )
    encoding = encodings.get("t5", num_buckets=8, max_distance=20)
    model = EncoderDecoder(config, encoding, rngs=nnx.Rngs(0))
    return model, Spec(config, "encoder_decoder", "t5", encoding.hparams(), 64)


@pytest.mark.slow  # about 10 s: two compilations of an encoder-decoder
@pytest.mark.parametrize("mlp,tie", [("relu", True), ("geglu", False)])
def test_posenc_t5_model_saved_gives_its_logits(tmp_path, mlp, tie):
    """A T5-bias model of posenc's (embeddings scaled by sqrt(D), which T5 does not do: the
    export writes the scaled table and the unscaled head) comes back with its own logits."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    model, spec = posenc_t5(mlp, tie)
    assert save_pretrained(model, spec, str(tmp_path / "out")) == "t5"
    loaded, _ = load_pretrained(str(tmp_path / "out"))
    rng = np.random.default_rng(0)
    src, tgt = jnp.asarray(rng.integers(0, 64, (2, 12))), jnp.asarray(rng.integers(0, 64, (2, 9)))

    def logits(m):
        graphdef, state = nnx.split(m)
        return np.asarray(jax.jit(lambda s: nnx.merge(graphdef, s)(src, tgt))(state))

    want = logits(model)
    np.testing.assert_allclose(logits(loaded), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
