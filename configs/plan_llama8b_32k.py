"""A Llama-3-8B-shaped model fine-tuned with YaRN at 32k tokens on 8 x 80 GB: the shape of the
context-extension runs (YaRN, Peng et al. 2023, Sec. 4; Llama 3's 8k -> 32k), for ``posenc
plan`` (a config to plan, not a run to start: it names no data of that scale).

Llama-3-8B's architecture (32 layers, width 4096, 32 query and 8 key/value heads, SwiGLU of
14336, RMSNorm, vocabulary 128256, untied head, RoPE base 500000) with YaRN x4 over its 8192
training tokens; bfloat16 matmuls, float32 parameters and Adam moments (posenc's). On 8 devices:
2-way FSDP x 4-way tensor parallelism (heads, MLP and vocabulary split 4 ways; the rest of every
parameter 2 ways), one 32k window per FSDP shard, each block rematerialised (``model.remat``),
attention in query tiles (``blocked``: linear in the window, also under a gradient).

Run (about 11 minutes of compiling on a 2-core CPU; nothing allocates)::

    posenc plan --config configs/plan_llama8b_32k.py --devices 8 --device-memory 80GB
"""

import os

import ml_collections

from posenc.runs.config import load_config

_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "base.py")


def llama3(config: ml_collections.ConfigDict, **shape: int) -> ml_collections.ConfigDict:
    """``config`` with Llama 3's architecture options (as ``posenc import-hf`` sets them for a
    Llama 3 checkpoint) and the given shape (``num_layers``, ``model_dim``, ...)."""
    config.model.update(
        vocab_size=128_256,
        num_kv_heads=8,
        mlp="swiglu",
        mlp_bias=False,
        norm="rmsnorm",
        norm_eps=1e-5,
        scale_embeddings=False,
        dtype="bfloat16",
        **shape,
    )
    config.encoding.name = "rope"
    config.encoding.hparams = ml_collections.ConfigDict({"base": 500_000.0})
    return config


def get_config(variant: str = "base") -> ml_collections.ConfigDict:
    if variant != "base":
        raise ValueError(f"configs/plan_llama8b_32k.py has the variant 'base', got {variant!r}")
    config = llama3(
        load_config(f"{_BASE}:base"),
        num_layers=32,
        model_dim=4096,
        num_heads=32,
        mlp_dim=14_336,
    )
    config.model.update(tie_embeddings=False, remat="full", attention_impl="blocked")
    config.model.attention_block_size = 1024
    # YaRN x4: 8192 trained tokens -> 32768.
    config.encoding.hparams.update(scaling="yarn", factor=4.0, original_max_len=8192)
    config.train.update(seq_len=32_768, batch_size=2)
    config.eval.update(lengths=(32_768,), batch_tokens=65_536)
    config.mesh.update(data=1, fsdp=2, tensor=4)
    return config
