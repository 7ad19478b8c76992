"""Base configuration: one encoder, trained at one length, evaluated at several.

Variants (select with ``--config configs/base.py:VARIANT``):

- ``base`` (default): 6 layers, width 512, 8 heads, train length 512, batch 64, 20k steps; a
  real run for one GPU (about 20 minutes per encoder on an H100 with RoPE or ALiBi).
- ``tiny``: 2 layers, width 64, train length 64, 300 steps; a CPU smoke run of about a minute.

Example::

    posenc train --config configs/base.py:tiny --config.encoding.name=alibi --workdir runs/alibi
    posenc eval --workdir runs/alibi --lengths 64,256,1024

Every field is commented; ``posenc.runs.config.validate`` checks them before anything compiles.
"""

import ml_collections


def get_config(variant: str = "base") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # Seed of parameter initialisation, training-window sampling and dropout.
    config.seed = 0

    config.model = ml_collections.ConfigDict()
    # Number of token ids; 257 = 256 bytes + the document separator of the byte tokenizer.
    config.model.vocab_size = 257
    # Transformer blocks.
    config.model.num_layers = 6
    # Residual stream width D.
    config.model.model_dim = 512
    # Attention heads; head_dim = model_dim // num_heads unless model.head_dim is set.
    config.model.num_heads = 8
    # Hidden width of each MLP.
    config.model.mlp_dim = 2048
    # Per-head width; None derives it from model_dim // num_heads.
    config.model.head_dim = ml_collections.config_dict.placeholder(int)
    # Dropout on embeddings and residual branches (0 for the short runs posenc targets).
    config.model.dropout = 0.0
    # "layernorm", "rmsnorm" or "layernorm_nobias" (mean removed, scale only: Cohere's).
    config.model.norm = "layernorm"
    # Matmul dtype: "bfloat16" (GPU/TPU), "float32" (exact CPU runs) or "float16".
    config.model.dtype = "bfloat16"
    # Reuse the token embedding as the output projection.
    config.model.tie_embeddings = True
    # Attention path: "auto", "einsum", "blocked", "xla" or "cudnn" (see posenc/attention/core.py),
    # "pallas" (our flash kernel with the bias computed inside; explicit only, unmeasured on GPU);
    # "linear" (elu + 1) or "linear_performer" (FAVOR+) is linear attention, another model.
    config.model.attention_impl = "auto"
    # Queries per block of the "blocked" path; longer windows are evaluated block by block. Also
    # the chunk of the linear paths' causal prefix sums.
    config.model.attention_block_size = 512
    # Mask keys after the query (a decoder, for causal LM); False: bidirectional attention on
    # every path (an encoder, for train.objective="masked_lm"; not for causal-only encoders).
    config.model.causal = True
    # Random features per head of "linear_performer" (FAVOR+'s m): 256, the Performer code's
    # default (about Dh log Dh for Dh = 64); drawn once per layer from a fixed seed.
    config.model.performer_features = 256
    # Transformer-XL segment recurrence (Dai et al. 2019, Sec. 3.2): each layer also attends to
    # the states of the last mem_len tokens before the segment (gradient stopped); training then
    # reads consecutive segments of each batch row, and evaluation carries the memory across
    # windows. 0: no memory (random windows, as before).
    config.model.mem_len = 0
    # Architecture options (posenc.layers.config.ModelConfig), named by mechanism; the defaults
    # are posenc's own model. Pretrained families set them (posenc import-hf), and a model trained
    # with a family's options can be exported as that family (posenc export-hf).
    # Key/value heads (grouped-query attention); None: one per query head.
    config.model.num_kv_heads = ml_collections.config_dict.placeholder(int)
    # Biases on the query/key/value projections, and on the attention output projection.
    config.model.qkv_bias = False
    config.model.out_bias = False
    # MLP kind: "gelu" (tanh), "gelu_exact", "relu", "swiglu" or "geglu"; biases on its weights.
    config.model.mlp = "gelu"
    config.model.mlp_bias = True
    # Where the norms sit: "pre" (x + f(norm(x)), and a final norm), "post" (norm(x + f(x))),
    # "sandwich" (x + norm(f(norm(x))): Gemma 2, 3) or "post_branch" (x + norm(f(x)): OLMo 2, 3);
    # the last two with a final norm too.
    config.model.norm_position = "pre"
    # "sequential" (attention, then the MLP), "parallel" (both on the block's input, each with
    # its own norm: GPT-NeoX) or "parallel_shared_norm" (both on one norm of it: GPT-J, Cohere).
    config.model.residual = "sequential"
    # The norms' epsilon.
    config.model.norm_eps = 1e-6
    # Multiply token embeddings by sqrt(model_dim) (Vaswani et al.).
    config.model.scale_embeddings = True
    # Norms multiply by (1 + scale), the scale starting at 0 (Gemma's RMSNorm; QK-norm too).
    config.model.norm_unit_offset = False
    # Soft cap of the output logits, cap * tanh(logits / cap) (Gemma 2: 30); 0: none.
    config.model.output_softcap = 0.0
    # A norm on the embeddings before the first block (BLOOM; BERT with post-norm).
    config.model.embed_norm = False
    # A masked-LM head (BERT, RoBERTa): None, or an activation ("gelu", "gelu_exact", "relu") of a
    # dense D -> D layer followed by a norm before the output projection; and a bias on the logits.
    config.model.head_transform = ml_collections.config_dict.placeholder(str)
    config.model.output_bias = False
    # Rematerialisation of each block in training's backward pass: "none" (keep every
    # intermediate), "full" (keep each block's input, recompute the block) or "dots" (keep the
    # weight matmuls' outputs, recompute attention). Memory and time only; the numbers stay.
    config.model.remat = "none"
    # Tokens (rows x positions) whose logits the loss forms at once, in training and evaluation
    # (posenc/models/losses.py: a chunk at a time from the last hidden states, recomputed in the
    # backward pass); 0: the whole batch's [B, T, vocab] logits; None: 128 MiB of float32 logits
    # (682 tokens of a 49,152-token vocabulary; byte-level batches unchunked). Memory only.
    config.model.loss_chunk = ml_collections.config_dict.placeholder(int)
    # Attention options of every layer (posenc/attention/options.py); a layer kind of
    # config.layers may override each. The defaults change nothing.
    # Window: "full", "sliding:W" (the last W keys: Mistral, Gemma's local layers), "banded:W"
    # (|i - j| < W on both sides) or "chunked:C" (the query's own chunk of C: Llama 4).
    config.model.window = "full"
    # A learned sink logit per head in the softmax's denominator (gpt-oss).
    config.model.sinks = False
    # QK-norm: "none", "rms" (per head, learned scale per channel: Qwen3, Gemma 3),
    # "rms_all_heads" (over all heads of a token together: OLMo 2, 3) or "l2" (Llama 4's, no
    # scale); "before_rotate" (Qwen3, Gemma 3, OLMo) or "after_rotate" (Llama 4) the rotation.
    config.model.qk_norm = "none"
    config.model.qk_norm_placement = "before_rotate"
    # Logit soft-capping cap * tanh(z / cap) (Gemma 2: 50); 0: none.
    config.model.softcap = 0.0
    # The logits' scale; 0: 1 / sqrt(head_dim) (Gemma 2 sets query_pre_attn_scalar ** -0.5).
    config.model.logit_scale = 0.0
    # Llama 4's query temperature: q * (log(floor((pos + 1) / floor) + 1) * scale + 1); floor 0:
    # none (Llama 4: 8192 and 0.1).
    config.model.temperature_floor = 0
    config.model.temperature_scale = 0.1
    # Scalable-Softmax (Nakanishi 2025): queries times s_h * log(keys seen), s_h learned per head.
    config.model.ssmax = False
    # issue 32 (pretrained families): a factor on the output logits (Cohere's logit_scale); 1: none.
    config.model.output_logit_scale = 1.0

    config.encoding = ml_collections.ConfigDict()
    # Registered encoder name: any of posenc.encodings.names() (alibi, learned, nope, rope, shaw,
    # sinusoidal, t5, xl, and the later ones; plugins too).
    config.encoding.name = "rope"
    # Encoder hyperparameters, passed to posenc.encodings.get(name, **hparams); e.g.
    # --config.encoding.hparams.base=500000 for RoPE. Unknown names are rejected.
    config.encoding.hparams = ml_collections.ConfigDict()

    config.layers = ml_collections.ConfigDict()
    # Per-layer differences (posenc/layers/pattern.py): a repeating pattern of layer kinds, layer
    # i of kind pattern[i % len(pattern)]; empty: every layer with config.encoding and the
    # model's attention options. Presets of published patterns: configs/architectures.py.
    config.layers.pattern = ()
    # Each kind: an "encoding" name with its "hparams" (none: config.encoding's) and any of the
    # attention options above (window, sinks, qk_norm, ...; none: config.model's).
    config.layers.kinds = ml_collections.ConfigDict()

    config.data = ml_collections.ConfigDict()
    # "pystdlib" (embedded default), "textdir:<path>", "tfds:<name>[/<config>]", or an
    # algorithmic task "synthetic:<task>" (posenc/data/synthetic; train.seq_len is then the
    # longest training input and eval.lengths input lengths).
    config.data.source = "pystdlib"
    # Where prepared data sets and caches live; None: $POSENC_DATA_DIR or ~/.cache/posenc/data.
    config.data.data_dir = ml_collections.config_dict.placeholder(str)
    # Feature holding the text in tfds: data sets; None: "text", or the only text feature.
    config.data.text_field = ml_collections.config_dict.placeholder(str)
    # Tokenizer of the text: "bytes" (256 byte ids + a document separator, no vocabulary file)
    # or "hf:<folder>" with a pretrained model's tokenizer.json (posenc import-hf sets it to the
    # imported model's own; model.vocab_size must cover its ids).
    config.data.tokenizer = "bytes"

    config.optim = ml_collections.ConfigDict()
    # Peak learning rate of AdamW.
    config.optim.learning_rate = 1e-3
    # Linear warmup steps from 0 to the peak.
    config.optim.warmup_steps = 1000
    # Cosine decay ends at learning_rate * final_lr_ratio.
    config.optim.final_lr_ratio = 0.1
    # Decoupled weight decay, applied to matrices only (not norms, biases or position tables).
    config.optim.weight_decay = 0.1
    # Adam moments.
    config.optim.b1 = 0.9
    config.optim.b2 = 0.95
    config.optim.eps = 1e-8
    # Clip the global gradient norm to this (0 disables clipping).
    config.optim.grad_clip = 1.0

    config.train = ml_collections.ConfigDict()
    # Training window length in tokens: the "train short" length.
    config.train.seq_len = 512
    # Global batch size in windows (divided over devices and processes).
    config.train.batch_size = 64
    # Optimizer steps (>= 1).
    config.train.steps = 20_000
    # Write a metrics line (JSONL, TensorBoard) and check for non-finite loss every N steps.
    config.train.log_every = 100
    # Save a checkpoint every N steps (and at the end).
    config.train.checkpoint_every = 2000
    # Checkpoints to keep.
    config.train.keep_checkpoints = 2
    # Show a progress bar (step, loss, tokens/s, ETA).
    config.train.progress = True
    # Token positions in a training window: "contiguous" (0 .. seq_len - 1) or "randomized" (a
    # sorted random subset of [0, max_position) per batch; Ruoss et al. 2023).
    config.train.positions = "contiguous"
    # The range randomized positions are drawn from (the paper: 2048); >= every window length.
    config.train.max_position = 2048
    # Start from the parameters of another run's work directory (fresh optimizer), e.g. to
    # fine-tune at a longer length or under RoPE scaling (PI, YaRN); None: fresh initialisation.
    config.train.init_from = ml_collections.config_dict.placeholder(str)
    # DroPE (Gelberg et al. 2026; posenc/runs/drope.py): continue train.init_from's run with its
    # positional encoder dropped (encoding nope; the source's encoder parameters left behind,
    # recorded in init.json). posenc train --drop-positions sets it and the encoders.
    config.train.drop_positions = False
    # "causal_lm" (next token) or "masked_lm" (BERT's: 15 % of tokens chosen, of those 80 %
    # replaced by a mask token, 10 % by a random one, 10 % kept; loss on the chosen ones).
    # Masked LM needs model.causal=False and model.vocab_size >= 258 (the mask token is 257).
    config.train.objective = "causal_lm"
    # Order of the training windows: "random" (each window anywhere in the stream, a function of
    # seed and step), "consecutive" (each batch row reads consecutive segments of its own part
    # of the stream, as Transformer-XL trains) or "auto" (consecutive with model.mem_len > 0,
    # else random). Memory needs consecutive segments.
    config.train.order = "auto"

    config.eval = ml_collections.ConfigDict()
    # Evaluation window lengths in tokens; empty: eval.multiples x train.seq_len.
    config.eval.lengths = ()
    # Multiples of train.seq_len evaluated when eval.lengths is empty.
    config.eval.multiples = (1, 2, 4, 8, 16)
    # Split scored: "validation" or "test".
    config.eval.split = "validation"
    # "nonoverlapping" (every token scored once, as in ALiBi's tables) or "sliding".
    config.eval.mode = "nonoverlapping"
    # Sliding mode: tokens scored per window (the window advances by this much).
    config.eval.stride = ml_collections.config_dict.placeholder(int)
    # Tokens per evaluation batch (windows per batch = max(1, batch_tokens // length)); None:
    # windows per batch sized from eval.memory_budget and the model (docs/evaluation.md).
    config.eval.batch_tokens = ml_collections.config_dict.placeholder(int)
    # What one device's evaluation batch may hold (parameters, a window's activations per row,
    # one logits chunk), e.g. "8GB"; None: half the device's memory (a CPU: half the host's, or
    # of what is available now, if less). Used when eval.batch_tokens is None.
    config.eval.memory_budget = ml_collections.config_dict.placeholder(str)
    # Score at most this many tokens per length (0: the whole split); the count is reported.
    config.eval.max_tokens = 0
    # Positions of evaluation windows: "as_trained" (randomized if train.positions is, as in
    # Ruoss et al.'s evaluation), "contiguous" or "randomized".
    config.eval.positions = "as_trained"
    # Algorithmic tasks (data.source="synthetic:<task>", posenc/kinds/tasks.py): examples generated
    # per evaluation length (eval.lengths are input lengths there) ...
    config.eval.examples = 256
    # ... and whether to score greedy generation (exact match) besides per-token accuracy.
    config.eval.generate = True
    # Transformer-XL memory carried from window to window (the states of the last mem_len tokens
    # per layer; each window then scores its tokens with up to mem_len tokens before it); None:
    # model.mem_len, 0: none. The paper evaluates with a longer memory than it trains with.
    config.eval.mem_len = ml_collections.config_dict.placeholder(int)

    config.distributed = ml_collections.ConfigDict()
    # Call jax.distributed.initialize() before training (several hosts / processes).
    config.distributed.initialize = False
    # Coordinator "host:port"; None reads the environment (cluster auto-detection).
    config.distributed.coordinator_address = ml_collections.config_dict.placeholder(str)
    # Total processes and this process's id; None reads the environment.
    config.distributed.num_processes = ml_collections.config_dict.placeholder(int)
    config.distributed.process_id = ml_collections.config_dict.placeholder(int)

    config.mesh = ml_collections.ConfigDict()
    # Device mesh axes (posenc/devices/sharding.py); their product is the device count, and one of
    # them may be -1 (the devices the others leave). data: batch rows, parameters replicated.
    config.mesh.data = -1
    # fsdp: batch rows too, and every parameter, gradient and Adam moment sharded (ZeRO-3).
    config.mesh.fsdp = 1
    # tensor: attention heads, MLP hidden units and the vocabulary split over devices.
    config.mesh.tensor = 1
    # context: the sequence of long evaluation windows split over devices.
    config.mesh.context = 1

    if variant == "tiny":
        config.model.update(num_layers=2, model_dim=64, num_heads=4, mlp_dim=256, dtype="float32")
        config.optim.update(learning_rate=3e-3, warmup_steps=30)
        config.train.update(seq_len=64, batch_size=16, steps=300, log_every=25)
        config.train.checkpoint_every = 100
        config.eval.update(multiples=(1, 2, 4), batch_tokens=16_384, max_tokens=65_536)
    elif variant != "base":
        raise ValueError(f"configs/base.py has variants 'base' and 'tiny', got {variant!r}")
    return config
