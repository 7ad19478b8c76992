"""Published per-layer architectures as run configs: each preset is ``configs/base.py``'s config
with the layer pattern (``config.layers``), the model's encoder and the attention options of a
published model filled in, and nothing else of that model (its width, depth, MLP, norms,
vocabulary and mixture of experts stay posenc's). Each preset cites where its numbers come from.

Select with ``--config configs/architectures.py:NAME[,VARIANT]``: NAME one of :data:`PRESETS`
(``irope``, ``rnope_swa``, ``swan``, ``gemma2``, ``gemma3``, ``smollm3``, ``gpt_oss``, ``olmo3``),
VARIANT ``base`` (default) or ``tiny``, as in ``configs/base.py``.

- ``base``: the published numbers as they are. posenc refuses a window larger than the training
  length (it would mask nothing the model trains on), so where a preset's largest window or chunk
  exceeds ``configs/base.py``'s 512 tokens, ``train.seq_len`` is raised to it and
  ``train.batch_size`` lowered to keep 32,768 tokens a step (iRoPE: 8192 x 4; RNoPE-SWA, Gemma 2,
  OLMo 3: 4096 x 8; Gemma 3: 1024 x 32).
- ``tiny``: ``configs/base.py:tiny`` (train.seq_len = 64). Every length a preset names (window,
  chunk, Llama 4's temperature floor, YaRN's original length) is divided by 128 = 8192 / 64, so the
  longest published one, Llama 4's 8192-token chunk, becomes the tiny training length and the
  presets keep their windows' ratios to one another (Gemma 2's 4096 -> 32, Gemma 3's 1024 -> 8,
  SWAN's 512 -> 4); a window is at least 4 tokens, which only gpt-oss's 128 (-> 1) needs.
  ``model.num_layers`` is raised from 2 to the pattern's length (4, or 6 for Gemma 3).

In both, a pattern repeats from the first layer and is cut short at the top where it does not
divide the layers (``base``'s 6 layers hold a 4-kind pattern once and its first two kinds again).

The RoPE layers of a preset that all rotate alike name no encoder of their own and use the
model's (``config.encoding``), so ``--config.encoding.name=alibi`` puts another encoder in their
place and ``posenc eval`` scaling of ``encoding.hparams`` reaches them; layers that differ (NoPE,
another base, YaRN on some layers only) name theirs.

Example::

    posenc train --config configs/architectures.py:gemma3,tiny --workdir runs/gemma3
    posenc eval --workdir runs/gemma3 --lengths 64,256,1024

What a preset cannot transcribe (evaluation-time scalings posenc does not implement, parts outside
attention) is said in its comments and in docs/architectures.md.
"""

import os
from collections.abc import Callable
from typing import Any

from posenc.runs.config import load_module

_BASE = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "base.py"))
VARIANTS = ("base", "tiny")
# tiny: published lengths divided by this (8192, Llama 4's chunk, over tiny's train.seq_len 64) ...
TINY_DIVISOR = 128
# ... with windows of at least this many tokens.
TINY_MIN_WINDOW = 4
# base: tokens a training step reads (configs/base.py: 64 windows of 512), kept when a preset's
# window raises train.seq_len.
TOKENS_PER_STEP = 64 * 512

Length = Callable[[int], int]


def _irope(n: Length) -> dict[str, Any]:
    """iRoPE, Llama 4 (Meta, "The Llama 4 herd", 2025; transformers' ``Llama4TextConfig``:
    ``no_rope_layer_interval=4``, ``attention_chunk_size=8192``, ``use_qk_norm=True``,
    ``attn_temperature_tuning``, ``floor_scale=8192``, ``attn_scale=0.1``, ``rope_theta=5e5``)."""
    return dict(
        # Llama 4 rotates interleaved pairs (its rotary embedding multiplies complex numbers made
        # of channels 2i, 2i+1), base 500000. Scout's checkpoint also sets llama3 scaling (factor
        # 16 over 8192, both frequency factors 1) for its long-context extension: not part of the
        # pattern, left out.
        encoding=dict(name="rope", hparams=dict(base=500_000.0, layout="interleaved")),
        # Layer i has RoPE unless (i + 1) % 4 == 0: three RoPE layers, then one NoPE layer.
        pattern=("local", "local", "local", "global"),
        kinds={
            # RoPE layers: chunked attention (a query sees its own 8192-token chunk) and the
            # parameter-free L2 norm of queries and keys after the rotation (Llama4TextL2Norm).
            "local": dict(
                window=f"chunked:{n(8192)}", qk_norm="l2", qk_norm_placement="after_rotate"
            ),
            # NoPE layers: full attention, queries scaled by the attention temperature
            # log(floor((pos + 1) / 8192) + 1) * 0.1 + 1.
            "global": dict(encoding="nope", temperature_floor=n(8192), temperature_scale=0.1),
        },
        model={},
    )


def _rnope_swa(n: Length) -> dict[str, Any]:
    """RNoPE-SWA (Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid Attention
    Strategy"), as Cohere's Command R7B ships it (model card; transformers' ``Cohere2Config``:
    ``sliding_window=4096``, ``sliding_window_pattern=4``; the checkpoint's config.json:
    ``rope_theta=50000``, ``position_embedding_type="rope_gptj"``)."""
    return dict(
        # "rope_gptj": interleaved pairs; base 50000.
        encoding=dict(name="rope", hparams=dict(base=50_000.0, layout="interleaved")),
        # Three sliding-window RoPE layers, then one global layer without positions.
        pattern=("local", "local", "local", "global"),
        kinds={"local": dict(window=f"sliding:{n(4096)}"), "global": dict(encoding="nope")},
        model={},
    )


def _swan(n: Length) -> dict[str, Any]:
    """SWAN-GPT (Puvvada et al. 2025, "SWAN-GPT: An Efficient and Scalable Approach for
    Long-Context Language Modeling", Sec. 2 and App. A): a global NoPE layer, then three
    sliding-window RoPE layers (window 512), repeated (their "global_start", 1:3)."""
    return dict(
        # The paper states no RoPE base: posenc's default 10000.
        encoding=dict(name="rope", hparams=dict()),
        pattern=("global", "local", "local", "local"),
        kinds={"global": dict(encoding="nope"), "local": dict(window=f"sliding:{n(512)}")},
        # Its log(a + n) scaling of the NoPE layers' logits is fitted per model and applied at
        # inference only (Sec. 2.2); posenc has no such evaluation option: not transcribed.
        model={},
    )


def _gemma2(n: Length) -> dict[str, Any]:
    """Gemma 2 (Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size";
    transformers' ``Gemma2Config``: layer i sliding when i is even, ``sliding_window=4096``,
    ``attn_logit_softcapping=50``, ``query_pre_attn_scalar=256``, ``rope_theta=10000``)."""
    return dict(
        encoding=dict(name="rope", hparams=dict(base=10_000.0)),
        pattern=("local", "global"),
        kinds={"local": dict(window=f"sliding:{n(4096)}"), "global": dict()},
        model=dict(
            # Every layer: 50 * tanh(z / 50) on the scaled logits.
            softcap=50.0,
            # Logits scaled by query_pre_attn_scalar ** -0.5 = 256 ** -0.5 (2B, 9B; there 256 is
            # the head size, so the usual scale; on posenc's smaller heads, a colder softmax).
            logit_scale=256**-0.5,
            # final_logit_softcapping=30 caps the output logits, not attention: not transcribed
            # (model.output_softcap holds it; the presets transcribe attention).
        ),
    )


def _gemma3(n: Length) -> dict[str, Any]:
    """Gemma 3 (Gemma Team 2025, "Gemma 3 Technical Report", Sec. 2; transformers'
    ``Gemma3TextConfig``: ``sliding_window_pattern=6``, ``rope_local_base_freq=10000``,
    ``rope_theta=1e6``, ``query_pre_attn_scalar=256``; the 4B-27B checkpoints'
    ``sliding_window=1024``)."""
    return dict(
        # The local layers' RoPE (base 10k) is the model's; the global layers name their own.
        encoding=dict(name="rope", hparams=dict(base=10_000.0)),
        # Five local layers (i + 1 not a multiple of 6), then one global.
        pattern=("local",) * 5 + ("global",),
        kinds={
            "local": dict(window=f"sliding:{n(1024)}"),
            # Base 1M on global layers. The 4B-27B checkpoints add linear scaling (factor 8) on
            # them for the 128K extension at the end of pre-training: left out.
            "global": dict(encoding="rope", hparams=dict(base=1_000_000.0)),
        },
        model=dict(
            # RMSNorm of queries and keys (learned scale per channel) before the rotation; Gemma
            # 2's soft-capping is gone.
            qk_norm="rms",
            qk_norm_placement="before_rotate",
            logit_scale=256**-0.5,  # query_pre_attn_scalar, as Gemma 2
        ),
    )


def _smollm3(n: Length) -> dict[str, Any]:
    """SmolLM3 (Hugging Face 2025, "SmolLM3: smol, multilingual, long-context reasoner";
    transformers' ``SmolLM3Config``: ``no_rope_layer_interval=4``; SmolLM3-3B's config.json:
    ``rope_theta=5e6``, full attention everywhere)."""
    del n  # no lengths
    return dict(
        encoding=dict(name="rope", hparams=dict(base=5_000_000.0)),
        # no_rope_layers = [1, 1, 1, 0, ...]: every fourth layer without positions.
        pattern=("rope", "rope", "rope", "nope"),
        kinds={"rope": dict(), "nope": dict(encoding="nope")},
        model={},
    )


def _gpt_oss(n: Length) -> dict[str, Any]:
    """gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"; transformers'
    ``GptOssConfig``: layer i sliding when i is even, ``sliding_window=128``, sinks in every
    layer, YaRN ``factor=32``, ``original_max_position_embeddings=4096``, ``beta_fast=32``,
    ``beta_slow=1``; the checkpoints' ``rope_theta=150000``)."""
    return dict(
        # YaRN on every layer. gpt-oss sets truncate=False (the ramp's boundary pair indices
        # left fractional); posenc's YaRN rounds them as the YaRN authors' code does.
        encoding=dict(
            name="rope",
            hparams=dict(
                base=150_000.0,
                scaling="yarn",
                factor=32.0,
                original_max_len=n(4096),
                beta_fast=32.0,
                beta_slow=1.0,
            ),
        ),
        # Banded 128-token layers alternating with dense ones, the banded first.
        pattern=("local", "global"),
        kinds={"local": dict(window=f"banded:{n(128)}"), "global": dict()},
        # A learned sink logit per head in every layer's softmax denominator.
        model=dict(sinks=True),
    )


def _olmo3(n: Length) -> dict[str, Any]:
    """OLMo 3 (Ai2 2025, "Olmo 3"; transformers' ``Olmo3Config``: layer i sliding unless
    (i + 1) % 4 == 0, ``sliding_window=4096``, ``rope_theta=5e5``, ``rope_scaling`` applied to
    the full-attention layers only; Olmo-3-7B's config.json: YaRN ``factor=8``,
    ``original_max_position_embeddings=8192``, ``attention_factor=0.1 ln 8 + 1``)."""
    return dict(
        # The sliding layers' plain RoPE is the model's.
        encoding=dict(name="rope", hparams=dict(base=500_000.0)),
        pattern=("local", "local", "local", "global"),
        kinds={
            "local": dict(window=f"sliding:{n(4096)}"),
            # YaRN on the full layers only (its attention factor is YaRN's default, 0.1 ln 8 + 1).
            "global": dict(
                encoding="rope",
                hparams=dict(
                    base=500_000.0,
                    scaling="yarn",
                    factor=8.0,
                    original_max_len=n(8192),
                    beta_fast=32.0,
                    beta_slow=1.0,
                ),
            ),
        },
        # RMSNorm of the whole query and key projections (all heads of a token together, with a
        # learned scale per channel) before the rotation, in every layer.
        model=dict(qk_norm="rms_all_heads", qk_norm_placement="before_rotate"),
    )


# Name -> the preset's parts as a function of the variant's length map.
PRESETS: dict[str, Callable[[Length], dict[str, Any]]] = {
    "irope": _irope,
    "rnope_swa": _rnope_swa,
    "swan": _swan,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "smollm3": _smollm3,
    "gpt_oss": _gpt_oss,
    "olmo3": _olmo3,
}


def _parse(arg: str) -> tuple[str, str]:
    parts = [p for p in arg.split(",") if p]
    names = [p for p in parts if p in PRESETS]
    variants = [p for p in parts if p in VARIANTS]
    unknown = [p for p in parts if p not in PRESETS and p not in VARIANTS]
    if unknown or len(names) != 1 or len(variants) > 1:
        raise ValueError(
            f"configs/architectures.py takes NAME[,VARIANT] with NAME one of {list(PRESETS)} and "
            f"VARIANT one of {list(VARIANTS)}, got {arg!r}"
        )
    return names[0], (variants[0] if variants else "base")


def _length(variant: str) -> Length:
    if variant == "base":
        return lambda size: size
    return lambda size: max(TINY_MIN_WINDOW, size // TINY_DIVISOR)


def get_config(arg: str = ""):
    name, variant = _parse(arg)
    config = _BASE.get_config(variant)
    preset = PRESETS[name](_length(variant))
    config.encoding.name = preset["encoding"]["name"]
    config.encoding.hparams.update(preset["encoding"]["hparams"])
    config.model.update(preset["model"])
    config.layers.pattern = preset["pattern"]
    for kind, fields in preset["kinds"].items():
        config.layers.kinds[kind] = dict(fields)
    # At least one whole pattern (tiny's 2 layers are too few); a pattern that does not divide
    # the layers is cut short at the top (base's 6 layers of a 4-kind pattern: 4 + 2).
    config.model.num_layers = max(config.model.num_layers, len(preset["pattern"]))
    # A window or chunk longer than the training length would mask nothing in training.
    longest = max((_size(f.get("window", "full")) for f in preset["kinds"].values()), default=0)
    if longest > config.train.seq_len:
        config.train.seq_len = longest
        config.train.batch_size = max(1, TOKENS_PER_STEP // longest)
    return config


def _size(window: str) -> int:
    return 0 if window == "full" else int(window.partition(":")[2])
