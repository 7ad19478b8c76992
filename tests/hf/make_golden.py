"""Makes the golden Hugging Face checkpoints and logits under ``tests/hf/golden/`` (run by hand).

The reference is ``transformers`` itself: for every family posenc imports (and every RoPE
scaling type of the Llama family) this script builds a tiny randomly initialised model with
``transformers``' PyTorch code, saves it as a Hugging Face folder (``config.json``,
``model.safetensors``; the first folder of each decoder-only family, llama, gpt_neox, gpt2, bloom
and opt, also gets a small ``tokenizer.json`` for the import and extrapolation tests), stores its
float32 logits on random ids in ``golden.npz`` beside it, at a length within the model's
``max_position_embeddings`` and one beyond it (the learned tables of GPT-2, OPT, BERT and RoBERTa
have no row beyond it, so both of their lengths are within); for a few decoder-only folders
also transformers' greedy continuation through its key/value cache (``greedy.npz``), and for
BERT its hidden states on padded sentence pairs (``states.npz``). The tests
(``tests/hf/``) import these folders with posenc and compare; they need neither torch nor
transformers.

    pip install torch==2.13.0 transformers   # not posenc's test extras: CI uses the files
    python tests/hf/make_golden.py            # rewrites tests/hf/golden/
    python tests/hf/make_golden.py opt greedy # only these (a rewritten folder loses greedy.npz
                                              # and states.npz until greedy, bert_states run)

The decoder-only and masked-LM folders are the rows of :data:`FOLDERS` (a model class, config
fields, seed and lengths each), written by one function, :func:`language_model`; T5's
encoder-decoders, the greedy continuations and BERT's states have functions of their own.

Weights are redrawn at a scale that makes every part matter (norm scales around 1, biases and
T5's bucket table of order 0.1-1), so a mapping mistake moves the logits by far more than
float32 rounding. Files stay small (vocabulary 64-96, width 32-48, two to four layers).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import sys
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden")
VOCAB = 96
# Short and long lengths: within max_position_embeddings (32) and beyond it.
LENGTHS = (24, 48)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Redraws every parameter: matrices ~ N(0, 1/fan_in), norm weights 1 + N(0, 0.2^2),
    biases N(0, 0.1^2), T5's bucket tables N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "relative_attention_bias" in name:
                p.copy_(noise)
            elif p.ndim >= 2:
                p.copy_(noise / np.sqrt(p.shape[-1]))
            elif "norm" in name.lower() or "ln" in name:
                p.copy_(1.0 + 0.2 * noise if name.endswith("weight") else 0.1 * noise)
            else:
                p.copy_(0.1 * noise)


def _ids(length: int, batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, length), dtype=np.int64)


def _save(model, folder: str) -> None:
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    model.save_pretrained(folder)


def _reload(cls, folder: str):
    """The saved folder loaded back by transformers: the logits are those of the files."""
    return cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def language_model(
    name: str, config, cls, seed: int, lengths=LENGTHS, batch: int = 2, avoid: int | None = None
) -> None:
    """A decoder-only or masked LM: folder + golden.npz with ``ids_<L>`` and ``logits_<L>``
    (ids never ``avoid``: RoBERTa gives its padding id no position)."""
    torch.manual_seed(seed)
    model = cls(config).eval()
    _perturb(model, seed)
    folder = os.path.join(GOLDEN, name)
    _save(model, folder)
    model = _reload(cls, folder)
    out = {}
    for i, length in enumerate(lengths):
        ids = _ids(length, batch, seed + i)
        if avoid is not None:
            ids[ids == avoid] = avoid + 2
        with torch.no_grad():
            logits = model(torch.from_numpy(ids)).logits.float().numpy()
        out[f"ids_{length}"] = ids.astype(np.int32)
        out[f"logits_{length}"] = logits
    body = getattr(model, "model", None) or getattr(model, "gpt_neox", None)
    rotary = getattr(body, "rotary_emb", None)
    # The frequencies transformers computes, for the RoPE formula tests (one RoPE per model;
    # Gemma 3's and OLMo 3's have one per layer type).
    if rotary is not None and hasattr(rotary, "original_inv_freq"):
        out["inv_freq"] = rotary.original_inv_freq.float().numpy()
        out["attention_scaling"] = np.float32(rotary.attention_scaling)
    np.savez_compressed(os.path.join(folder, "golden.npz"), **out)
    print(f"{name}: {sorted(out)}")


def _tokenizer(folder: str) -> None:
    """A byte-level BPE of VOCAB ids trained on a few sentences, as ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=[],
        show_progress=False,
    )
    text = ["def add(a, b):\n    return a + b\n", "the quick brown fox jumps over the lazy dog"] * 8
    tok.train_from_iterator(text, trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f)


@dataclasses.dataclass(frozen=True)
class Folder:
    """One golden folder of a decoder-only or masked LM (:func:`language_model`).

    Attributes:
      name: the folder under ``golden/``.
      model: transformers' model class (its ``config_class`` takes ``fields``).
      fields: the config's fields.
      seed: the weights' seed (the ids' seeds follow it).
      lengths: the lengths of the golden logits.
      avoid: an id the random ids never take.
    """

    name: str
    model: type
    fields: dict[str, Any]
    seed: int
    lengths: tuple[int, int] = LENGTHS
    avoid: int | None = None


def _folders(
    model: type, common: dict[str, Any], cases: dict[str, dict[str, Any]], seed: int, **options: Any
) -> list[Folder]:
    """Folders of one model class: each case's fields over ``common``, seeds from ``seed`` on."""
    return [
        Folder(name, model, {**common, **fields}, seed + i, **options)
        for i, (name, fields) in enumerate(cases.items())
    ]


# The sizes the families with transformers' standard field names share.
TINY = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2)
LLAMA = dict(
    TINY,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    rms_norm_eps=1e-5,
)
LLAMA_CASES = {
    "llama": dict(tie_word_embeddings=True),
    "llama_linear": dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "llama_dynamic": dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "llama_yarn": dict(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    ),
    "llama_llama3": dict(
        head_dim=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_theta=500.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "llama_longrope": dict(
        max_position_embeddings=64,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0, 1.1, 1.3, 1.7],
            "long_factor": [1.0, 1.5, 3.0, 6.0],
            "original_max_position_embeddings": 32,
        },
    ),
}
GPT_NEOX = dict(
    TINY, intermediate_size=64, num_attention_heads=2, max_position_embeddings=32, rope_scaling=None
)
BERT = dict(TINY, num_attention_heads=4, intermediate_size=64, type_vocab_size=2)
OPT = dict(
    TINY, word_embed_proj_dim=32, ffn_dim=64, num_attention_heads=4, max_position_embeddings=32
)
PHI3 = dict(
    TINY,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# Gemma 2 / 3: grouped heads wider than hidden_size / heads, a window of 8 tokens.
GEMMA = dict(
    TINY,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=32,
    sliding_window=8,
    rms_norm_eps=1e-6,
)
# OLMo 2 / 3: grouped heads (QK-norm over the whole projection: the keys' over 2 heads).
OLMO = dict(
    TINY,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    rms_norm_eps=1e-5,
)
T5 = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=8,
    d_ff=48,
    num_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
)

# The decoder-only and masked-LM folders, by family (a command-line name).
FOLDERS: dict[str, list[Folder]] = {
    "llama": [
        *_folders(transformers.LlamaForCausalLM, LLAMA, LLAMA_CASES, seed=10),
        *_folders(
            transformers.Qwen2ForCausalLM,
            LLAMA,
            {"qwen2": dict(rope_theta=1e6, tie_word_embeddings=False)},
            seed=30,
        ),
        *_folders(
            transformers.MistralForCausalLM,
            LLAMA,
            {"mistral": dict(head_dim=16, sliding_window=None)},
            seed=31,
        ),
    ],
    "gpt_neox": _folders(
        transformers.GPTNeoXForCausalLM,
        GPT_NEOX,
        {
            "gpt_neox": dict(rotary_pct=0.25, use_parallel_residual=True),
            "gpt_neox_sequential": dict(rotary_pct=0.5, use_parallel_residual=False),
            "gpt_neox_linear": dict(
                rotary_pct=0.25, rope_scaling={"rope_type": "linear", "factor": 2.0}
            ),
        },
        seed=40,
    ),
    "gpt2": _folders(
        transformers.GPT2LMHeadModel,
        dict(
            vocab_size=VOCAB,
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
        ),
        {"gpt2": {}},
        seed=50,
        lengths=(24, 64),
    ),
    # 6 heads: not a power of two, so the slopes take BLOOM's rule for the extra heads.
    "bloom": _folders(
        transformers.BloomForCausalLM,
        dict(vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=6, bos_token_id=0, eos_token_id=0),
        {"bloom": {}},
        seed=60,
    ),
    # BERT and RoBERTa masked LMs (bidirectional; RoBERTa's positions start after its padding
    # id, so its ids avoid that id: transformers would give a padding token no position).
    "bert": [
        *_folders(
            transformers.BertForMaskedLM,
            BERT,
            {"bert": dict(max_position_embeddings=32)},
            seed=100,
            lengths=(24, 32),
        ),
        *_folders(
            transformers.RobertaForMaskedLM,
            BERT,
            {"roberta": dict(max_position_embeddings=34, pad_token_id=1)},
            seed=101,
            lengths=(24, 32),
            avoid=1,
        ),
    ],
    # OPT, pre-norm (most sizes) and post-norm (``do_layer_norm_before=false``, OPT-350m).
    "opt": _folders(
        transformers.OPTForCausalLM,
        OPT,
        {"opt": dict(do_layer_norm_before=True), "opt_post": dict(do_layer_norm_before=False)},
        seed=120,
        lengths=(24, 32),
    ),
    # Phi-3: fused qkv and gate/up rows; plain RoPE and LongRoPE (the 128k models).
    "phi3": _folders(
        transformers.Phi3ForCausalLM,
        PHI3,
        {
            "phi3": dict(max_position_embeddings=32, original_max_position_embeddings=32),
            "phi3_longrope": dict(
                max_position_embeddings=64,
                original_max_position_embeddings=32,
                rope_scaling={
                    "rope_type": "longrope",
                    "short_factor": [1.0, 1.2, 1.5, 2.0],
                    "long_factor": [1.0, 2.0, 4.0, 8.0],
                },
            ),
        },
        seed=130,
        lengths=(24, 80),
    ),
    # -- issue 32, today's families: Mistral's window, Qwen3, SmolLM3, Cohere2 ----------------
    # Windows of 8 keys: both lengths and the greedy continuation (42 tokens) reach far past them
    # and past max_position_embeddings (32).
    "mistral": _folders(
        transformers.MistralForCausalLM, LLAMA, {"mistral_window": dict(sliding_window=8)}, seed=140
    ),
    # Qwen3: QK-norm (head_dim 16, not D / H), biases on all four attention projections; and
    # sliding windows on the layers from max_window_layers on (layer 0 full, layers 1-2 sliding).
    "qwen3": _folders(
        transformers.Qwen3ForCausalLM,
        LLAMA,
        {
            "qwen3": dict(
                head_dim=16, attention_bias=True, rope_theta=1e6, tie_word_embeddings=True
            ),
            "qwen3_window": dict(
                num_hidden_layers=3, use_sliding_window=True, sliding_window=8, max_window_layers=1
            ),
        },
        seed=150,
    ),
    # SmolLM3: every 4th layer without RoPE (its default), and every 2nd without RoPE and with
    # a sliding window (use_sliding_window's default placement).
    "smollm3": _folders(
        transformers.SmolLM3ForCausalLM,
        dict(LLAMA, num_hidden_layers=4, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        {
            "smollm3": {},
            "smollm3_window": dict(
                no_rope_layer_interval=2, use_sliding_window=True, sliding_window=8
            ),
        },
        seed=160,
    ),
    # Cohere2 (Command R7B's design): three sliding RoPE layers, then one full NoPE layer.
    "cohere2": _folders(
        transformers.Cohere2ForCausalLM,
        dict(
            TINY,
            num_hidden_layers=4,
            intermediate_size=48,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            sliding_window=8,
            logit_scale=0.25,
            layer_norm_eps=1e-5,
            rope_theta=500.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        {"cohere2": {}},
        seed=170,
    ),
    # -- Gemma 2 and 3, OLMo 2 and 3 (issue 32): windows of 8 tokens and max_position_embeddings
    # 32, so the golden lengths 24 and 48 are past both.
    "gemma2": _folders(
        transformers.Gemma2ForCausalLM,
        GEMMA,
        {
            # Layers local, global, local (the pattern cut short); soft caps that bite; a query
            # scale that is not the head width's.
            "gemma2": dict(
                num_hidden_layers=3,
                query_pre_attn_scalar=24,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
                rope_theta=1000.0,
            )
        },
        seed=140,
    ),
    "gemma3": _folders(
        transformers.Gemma3ForCausalLM,
        GEMMA,
        {
            # Local, local, global, local; the local RoPE base 100, the global 10000 scaled
            # linearly (as the 4B-27B models); no soft caps.
            "gemma3": dict(
                num_hidden_layers=4,
                sliding_window_pattern=3,
                query_pre_attn_scalar=16,
                rope_theta=10000.0,
                rope_local_base_freq=100.0,
                rope_scaling={"rope_type": "linear", "factor": 2.0},
            )
        },
        seed=145,
    ),
    "olmo2": _folders(
        transformers.Olmo2ForCausalLM, OLMO, {"olmo2": dict(rope_theta=500.0)}, seed=150
    ),
    "olmo3": _folders(
        transformers.Olmo3ForCausalLM,
        OLMO,
        {
            # Three local layers then a global one (the default layer_types); YaRN on the global
            # layer alone, trained at 16.
            "olmo3": dict(
                num_hidden_layers=4,
                sliding_window=8,
                rope_theta=1000.0,
                rope_scaling={
                    "rope_type": "yarn",
                    "factor": 2.0,
                    "original_max_position_embeddings": 16,
                },
            )
        },
        seed=155,
    ),
}
# The folders that also get a tokenizer.json (the import and extrapolation tests'): the first of
# each decoder-only family but Phi-3, and the families with layers of several kinds.
TOKENIZERS = ("llama", "gpt_neox", "gpt2", "bloom", "opt", "gemma3", "olmo3", "cohere2", "smollm3")


def language_models(family: str) -> None:
    """The folders of ``FOLDERS[family]``, with a tokenizer where :data:`TOKENIZERS` says."""
    for f in FOLDERS[family]:
        config = f.model.config_class(**f.fields)
        language_model(f.name, config, f.model, f.seed, f.lengths, avoid=f.avoid)
        if f.name in TOKENIZERS:
            _tokenizer(os.path.join(GOLDEN, f.name))


def t5() -> None:
    """T5 v1.0 (ReLU, tied, decoder output scaled by d^-0.5) and Flan-T5-like (gated GELU, a
    separate ``lm_head``, as Flan-T5's files hold it)."""
    for seed, (name, extra) in enumerate(
        {
            "t5": dict(feed_forward_proj="relu"),
            "flan_t5": dict(feed_forward_proj="gated-gelu", num_decoder_layers=1),
        }.items()
    ):
        config = transformers.T5Config(**T5, **extra)
        torch.manual_seed(70 + seed)
        model = transformers.T5ForConditionalGeneration(config).eval()
        _perturb(model, 70 + seed)
        folder = os.path.join(GOLDEN, name)
        _save(model, folder)
        if name == "flan_t5":  # untied: a head of its own, as Flan-T5's checkpoints
            _untie_t5(folder, seed)
        model = _reload(transformers.T5ForConditionalGeneration, folder)
        out = {}
        for i, (src_len, tgt_len) in enumerate(((12, 10), (40, 30))):
            src, tgt = _ids(src_len, 2, 80 + i), _ids(tgt_len, 2, 90 + i)
            with torch.no_grad():
                logits = model(
                    input_ids=torch.from_numpy(src), decoder_input_ids=torch.from_numpy(tgt)
                ).logits
            out[f"src_{src_len}"] = src.astype(np.int32)
            out[f"tgt_{src_len}"] = tgt.astype(np.int32)
            out[f"logits_{src_len}"] = logits.float().numpy()
        np.savez_compressed(os.path.join(folder, "golden.npz"), **out)
        print(f"{name}: {sorted(out)}")


def _untie_t5(folder: str, seed: int) -> None:
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    gen = torch.Generator().manual_seed(seed)
    shape = tensors["shared.weight"].shape
    tensors["lm_head.weight"] = torch.randn(shape, generator=gen) / np.sqrt(shape[-1])
    save_file(tensors, path, metadata={"format": "pt"})
    config_path = os.path.join(folder, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["tie_word_embeddings"] = False  # as Flan-T5's config.json says it
    config.pop("scale_decoder_outputs", None)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


def bert_states() -> None:
    """transformers' final hidden states of the golden BERT (``BertModel``, no head) on sentence
    pairs: random ids with token types 0 then 1 and a padded second row (``attention_mask``),
    into ``bert/states.npz`` (``ids``, ``types``, ``mask``, ``states``): what a classifier
    fine-tuned from the import reads before its first step. The folder is not rewritten."""
    folder = os.path.join(GOLDEN, "bert")
    model = _reload(transformers.BertModel, folder)
    ids = _ids(20, 2, seed=300)
    types = np.zeros_like(ids)
    types[:, 9:] = 1
    mask = np.ones_like(ids)
    mask[1, 15:] = 0
    with torch.no_grad():
        states = model(
            input_ids=torch.from_numpy(ids),
            token_type_ids=torch.from_numpy(types),
            attention_mask=torch.from_numpy(mask),
        ).last_hidden_state
    np.savez_compressed(
        os.path.join(folder, "states.npz"),
        ids=ids.astype(np.int32),
        types=types.astype(np.int32),
        mask=mask.astype(bool),
        states=states.float().numpy(),
    )
    print("bert: states.npz")


# Decoder-only folders whose greedy continuation transformers records (greedy.npz), 42 tokens:
# past max_position_embeddings (32) for RoPE with GQA, YaRN's scaled RoPE, partial rotary with
# a parallel residual and ALiBi; within GPT-2's 64 learned rows (OPT's table ends at 32).
GREEDY = (
    "llama",
    "llama_yarn",
    "gpt_neox",
    "gpt2",
    "bloom",
    # Past their 8-token windows too (posenc decodes those layers through a window-sized cache).
    "gemma2",
    "gemma3",
    "olmo2",
    "olmo3",
)
# issue 32: through window-sized caches (Mistral's, Qwen3's, SmolLM3's, Cohere2's local layers)
# and QK-norm.
GREEDY += ("mistral_window", "qwen3", "qwen3_window", "smollm3_window", "cohere2")
PROMPT, NEW = 12, 30


def greedy() -> None:
    """transformers' own greedy decoding through its key/value cache (a prefill over the prompt,
    then one token per step with ``past_key_values``), into ``greedy.npz`` beside each folder of
    :data:`GREEDY`: ``prompts [2, PROMPT]``, ``tokens [2, NEW]`` and the ``logits [2, NEW, V]``
    each token was chosen from. The folders themselves are not rewritten."""
    for name in GREEDY:
        folder = os.path.join(GOLDEN, name)
        model = _reload(transformers.AutoModelForCausalLM, folder)
        prompts = _ids(PROMPT, 2, seed=200)
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(prompts), use_cache=True)
            tokens, logits = [], []
            for _ in range(NEW):
                last = out.logits[:, -1].float()
                logits.append(last.numpy())
                tokens.append(last.argmax(-1))
                cache = out.past_key_values
                out = model(input_ids=tokens[-1][:, None], past_key_values=cache, use_cache=True)
        np.savez_compressed(
            os.path.join(folder, "greedy.npz"),
            prompts=prompts.astype(np.int32),
            tokens=torch.stack(tokens, 1).numpy().astype(np.int32),
            logits=np.stack(logits, 1),
        )
        print(f"{name}: greedy.npz")


FAMILIES = {
    **{family: functools.partial(language_models, family) for family in FOLDERS},
    "t5": t5,
    "greedy": greedy,  # after the decoder-only families: it reads their folders
    "bert_states": bert_states,  # after bert
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    for family in sys.argv[1:] or FAMILIES:
        FAMILIES[family]()
