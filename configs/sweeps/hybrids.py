"""Hybrid layer patterns against one-encoder models (issue 31): iRoPE, RNoPE-SWA, Gemma 3's
local/global layers, SmolLM3's NoPE layers and sliding-window RoPE alone, beside RoPE, NoPE and
ALiBi, trained at L and evaluated on non-overlapping windows of 1, 2, 4, 8 and 16 x L (ALiBi
Table 2's protocol, ``alibi_table2.py``).

Each hybrid is written out as ``layers.pattern`` and ``layers.kinds`` (posenc/layers/pattern.py),
at this scale: a window or chunk of W tokens in a published model becomes one of L / 2 or L / 4
here, and a pattern longer than the model (Gemma 3's five local layers per global one) keeps
three local layers per global one. The published settings transcribed:

- ``irope`` (Meta, Llama 4, 2025; transformers' ``Llama4TextConfig``: ``no_rope_layers``,
  ``attention_chunk_size=8192``, ``use_qk_norm``, ``attn_temperature_tuning``,
  ``floor_scale=8192``, ``attn_scale=0.1``): three RoPE layers with chunked attention (chunks of
  8192) and QK L2-norm after the rotation, then one NoPE layer with global attention and the
  query temperature ``log(floor((pos + 1) / 8192) + 1) * 0.1 + 1``. Here: chunks of L / 2, the
  temperature's floor at the chunk size (Llama 4's 8192 is its chunk size too).
- ``rnope_swa`` (Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid Attention
  Strategy", arXiv 2501.18795; Cohere Command R7B / A, transformers' ``Cohere2Config``:
  ``sliding_window=4096``, ``sliding_window_pattern=4``): three sliding-window RoPE layers
  (window 4096), then one full-attention NoPE layer. Here: window L / 2.
- ``gemma3`` (Gemma Team 2025, "Gemma 3 Technical Report", arXiv 2503.19786): local layers with a
  sliding window of 1024 and RoPE base 10k, global layers with RoPE base 1M, QK-norm (RMS, before
  the rotation); five local per global. Here: three local per global (four layers), window L / 4.
- ``smollm3`` (Hugging Face 2025, "SmolLM3: smol, multilingual, long-context reasoner"; its
  config's ``no_rope_layer_interval=4``): RoPE in every layer but every fourth, which has NoPE;
  full attention everywhere.
- ``swa_rope`` (Mistral 7B, Jiang et al. 2023, arXiv 2310.06825: a sliding window of 4096 in
  every layer): RoPE with a sliding window in every layer. Here: window L / 2.
- ``rope``, ``nope``, ``alibi``: one encoder, full attention, every layer.

SWAN-GPT (Puvvada et al. 2025, arXiv 2504.08719) interleaves NoPE and sliding-window RoPE layers
as RNoPE-SWA does; its dynamic log scaling of attention at inference is not a field posenc has,
so it has no column of its own (``rnope_swa`` is its pattern).

Variants (``--config configs/sweeps/hybrids.py:VARIANT``):

- ``tiny``: a 2-core CPU. 4 layers, width 64, 4 heads, float32, L = 64, 1000 steps of 16 x 64
  bytes on ``pystdlib``; 32k validation tokens per length.
- ``gpu``: one GPU. 8 layers, width 512, 8 heads, bf16, L = 512, 2000 steps of 32 x 512 bytes;
  evaluated up to 16 x 512 = 8192, 128k tokens per length (not measured).

Passkey retrieval of the same architectures (trained on ``synthetic:passkey``, scored at 1-16 x
its training length) is ``configs/sweeps/hybrids_passkey.py``, ``experiments/hybrids.py``'s
second half.

Run::

    python experiments/hybrids.py --variant tiny
"""

import os

import ml_collections

from posenc.runs.config import load_module

_HERE = os.path.dirname(os.path.abspath(__file__))
_TABLE2 = load_module(os.path.join(_HERE, "alibi_table2.py"))

VARIANTS = ("tiny", "gpu")
MULTIPLES = (1, 2, 4, 8, 16)
# Column order: the one-encoder models, then the hybrids.
ARCHITECTURES = ("rope", "nope", "alibi", "swa_rope", "rnope_swa", "irope", "gemma3", "smollm3")


def _rope(base: float | None = None) -> dict:
    kind = {"encoding": "rope"}
    if base is not None:
        kind["hparams"] = {"base": base}
    return kind


def architecture(name: str, seq_len: int) -> dict:
    """The overrides of architecture ``name`` for a model trained at ``seq_len`` (module
    docstring): ``encoding.name`` and, for a hybrid, ``layers.pattern`` and ``layers.kinds``."""
    half, quarter = seq_len // 2, seq_len // 4
    local3 = ("local", "local", "local", "global")
    if name in ("rope", "nope", "alibi"):
        return {"encoding.name": name}
    if name == "swa_rope":
        return {"encoding.name": "rope", "model.window": f"sliding:{half}"}
    if name == "rnope_swa":
        kinds = {"local": {**_rope(), "window": f"sliding:{half}"}, "global": {"encoding": "nope"}}
    elif name == "irope":
        kinds = {
            "local": {
                **_rope(),
                "window": f"chunked:{half}",
                "qk_norm": "l2",
                "qk_norm_placement": "after_rotate",
            },
            "global": {"encoding": "nope", "temperature_floor": half, "temperature_scale": 0.1},
        }
    elif name == "gemma3":
        kinds = {
            "local": {**_rope(10_000.0), "window": f"sliding:{quarter}", "qk_norm": "rms"},
            "global": {**_rope(1_000_000.0), "qk_norm": "rms"},
        }
    elif name == "smollm3":
        kinds = {"local": _rope(), "global": {"encoding": "nope"}}
    else:
        raise ValueError(f"hybrids: unknown architecture {name!r}; one of {ARCHITECTURES}")
    return {"encoding.name": "rope", "layers.pattern": local3, "layers.kinds": kinds}


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"hybrids has variants {VARIANTS}, got {variant!r}")
    config = _TABLE2.get_config(variant)
    config.eval.multiples = MULTIPLES
    if variant == "tiny":
        config.model.num_layers = 4
        config.train.update(steps=1000, log_every=100)
        config.eval.max_tokens = 32_768
    else:
        config.model.num_layers = 8
        config.train.steps = 2000
    return config


def get_sweep(variant: str = "tiny") -> list[dict]:
    seq_len = get_config(variant).train.seq_len
    return [{**architecture(name, seq_len), "seed": 0} for name in ARCHITECTURES]
