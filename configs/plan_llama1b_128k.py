"""A Llama-3.2-1B-shaped model evaluated on 128k-token windows over 8 devices, each window split
over them by context parallelism: for ``posenc plan --only eval`` (a config to plan: it names
no data of that scale).

Llama-3.2-1B's architecture (16 layers, width 2048, 32 query and 8 key/value heads of 64, SwiGLU
of 8192, RMSNorm, vocabulary 128256, tied head, RoPE base 500000 with Llama 3's frequency
bands x32 over 8192 tokens); bfloat16 matmuls, float32 parameters. On 8 devices
``mesh.context=8``: one 131072-token window, 16384 tokens per device, attention in query tiles
of 1024 (``blocked``), the keys and values each tile needs gathered by XLA.

Run (about 4 minutes of compiling on a 2-core CPU; nothing allocates)::

    posenc plan --config configs/plan_llama1b_128k.py --only eval --devices 8 --device-memory 80GB
"""

import os

from posenc.runs.config import load_config, load_module

_HERE = os.path.dirname(os.path.abspath(__file__))
_LLAMA = load_module(os.path.join(_HERE, "plan_llama8b_32k.py"))


def get_config(variant: str = "base"):
    if variant != "base":
        raise ValueError(f"configs/plan_llama1b_128k.py has the variant 'base', got {variant!r}")
    config = _LLAMA.llama3(
        load_config(os.path.join(_HERE, "base.py") + ":base"),
        num_layers=16,
        model_dim=2048,
        num_heads=32,
        mlp_dim=8192,
    )
    config.model.update(tie_embeddings=True, attention_impl="blocked", attention_block_size=1024)
    # Llama 3.2's RoPE: Llama 3's frequency bands, x32 over 8192 tokens.
    config.encoding.hparams.update(scaling="llama3", factor=32.0, original_max_len=8192)
    config.train.seq_len = 8192
    config.eval.update(lengths=(131_072,), batch_tokens=131_072)
    config.mesh.update(data=1, context=8)
    return config
