"""Translation: an encoder-decoder on parallel text, beam search, BLEU (Vaswani et al. 2017,
Shaw et al. 2018, RoFormer's WMT14 table), and train short / test long by source length.

Variants (``--config configs/translation.py:VARIANT``):

- ``tiny`` (default for CPU): 2 + 2 layers, width 64, byte vocabulary, the embedded
  English-German corpus (``parallel:default``), 1500 steps of about 2048 tokens; a few minutes
  on a 2-core CPU.
- ``base``: the papers' base model (6 + 6 layers, width 512, 8 heads, feed-forward 2048,
  dropout 0.1, label smoothing 0.1, a shared 32k SentencePiece vocabulary, beam 4 with
  alpha 0.6); point ``data.source`` at a prepared WMT14 builder, e.g.
  ``tfds:wmt14_translate/de-en`` with ``data.src_lang=en --config.data.tgt_lang=de``.
  Vaswani et al. train 100k steps of about 25k source and 25k target tokens on 8 P100s;
  posenc counts ``train.tokens_per_batch`` as padded rows x the longer side.
- ``big``: width 1024, 16 heads, feed-forward 4096, dropout 0.3 (Vaswani et al.; Shaw et al.
  use 0.1 and clip at k = 8), 300k steps.

Shaw et al. print a feed-forward width of 1024 for their base model (tensor2tensor's
``transformer_base`` is 2048); ``--config.model.mlp_dim=1024`` reproduces the table as printed.

Example::

    posenc train --config configs/translation.py:tiny --config.encoding.name=shaw --workdir runs/mt
    posenc eval --workdir runs/mt                 # BLEU, chrF, per source-length bucket
    posenc translate --workdir runs/mt --input sources.txt --beam 4 --alpha 0.6
"""

import os

import ml_collections

from posenc.runs.config import load_config

_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "base.py")


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    config = load_config(f"{_BASE}:base")
    config.unlock()
    # The encoder-decoder (posenc/models/encdec.py) instead of the decoder-only LM.
    config.model.assembly = "encoder_decoder"
    # Encoder blocks; None: as many as the decoder's (model.num_layers).
    config.model.num_encoder_layers = ml_collections.config_dict.placeholder(int)
    # Source and target share one token table (a joint vocabulary, as Vaswani et al.).
    config.model.share_embeddings = True
    # Token ids: the vocabulary's size (259 for bytes; data.vocab_size for SentencePiece).
    config.model.vocab_size = 259
    config.model.update(num_layers=6, model_dim=512, num_heads=8, mlp_dim=2048, dropout=0.1)
    # The papers' Transformer is sinusoidal; every registered encoder serves both stacks.
    config.encoding.name = "sinusoidal"

    # A parallel source: "parallel:default" (the embedded English-German corpus),
    # "parallel:<dir>" (train.SRC / train.TGT, valid.*, test.* line-aligned files), or a
    # prepared TFDS translation builder ("tfds:wmt14_translate/de-en").
    config.data.source = "parallel:default"
    # Source and target languages (file suffixes, TFDS feature names); None: the source's default.
    config.data.src_lang = ml_collections.config_dict.placeholder(str)
    config.data.tgt_lang = ml_collections.config_dict.placeholder(str)
    # "bytes" (UTF-8 bytes + EOS, BOS, PAD: 259 ids) or "sentencepiece" (trained once on the
    # training pairs, source and target together, cached under the data directory).
    config.data.vocab = "bytes"
    # SentencePiece vocabulary size and model type ("unigram" or "bpe").
    config.data.vocab_size = 32_000
    config.data.spm_model_type = "unigram"
    # Train short: keep only training pairs whose source has at most this many tokens; None
    # keeps all. Evaluation reports BLEU per source length: within it, up to 2x, 4x, ...
    config.data.max_src_len = ml_collections.config_dict.placeholder(int)
    # Keep only training pairs whose target has at most this many tokens; None keeps all.
    config.data.max_tgt_len = ml_collections.config_dict.placeholder(int)
    # Padded source lengths of the training buckets grow by this factor: each bucket is one
    # compiled shape. 1.1: about 35 shapes and 7-11 % padding on the embedded corpus; 1.2: half
    # the shapes (half the compilation time, which dominates a tiny run on a CPU) at 11-15 %.
    config.data.bucket_step = 1.1

    config.optim.update(learning_rate=7e-4, warmup_steps=4000, b2=0.98, weight_decay=0.0)
    # Padded tokens per training batch, rows x max(source, target length) (fairseq's
    # --max-tokens); pairs are bucketed by length so each batch has one of a few shapes.
    config.train.tokens_per_batch = 25_000
    # Label smoothing of the training loss (Vaswani et al.: 0.1); evaluation reports the plain
    # cross entropy.
    config.train.label_smoothing = 0.1
    config.train.steps = 100_000
    config.train.checkpoint_every = 5000

    # Decoding: beam size (1: greedy) and GNMT's length penalty exponent (Vaswani et al. and
    # Shaw et al.: 4 and 0.6).
    config.eval.beam_size = 4
    config.eval.alpha = 0.6
    # Outputs stop at the source length + this many tokens (Vaswani et al.: 50).
    config.eval.max_len_offset = 50
    # Padded tokens per evaluation batch.
    config.eval.tokens_per_batch = 8192
    # Padded source lengths of evaluation and decoding batches grow by this factor (each is one
    # compiled shape of the beam search and of the scoring step; decoding results do not depend
    # on it, since padding is masked exactly). A coarser step compiles fewer shapes.
    config.eval.bucket_step = 1.1
    # Score at most this many sentences of the split (0: all).
    config.eval.max_sentences = 0

    if variant == "tiny":
        config.model.update(
            num_layers=2, model_dim=64, num_heads=4, mlp_dim=256, dropout=0.0, dtype="float32"
        )
        config.optim.update(learning_rate=3e-3, warmup_steps=100)
        config.train.update(tokens_per_batch=2048, steps=1500, log_every=50, checkpoint_every=500)
        config.eval.update(tokens_per_batch=4096, max_sentences=200)
    elif variant == "base":
        config.data.vocab = "sentencepiece"
        config.model.vocab_size = config.data.vocab_size
    elif variant == "big":
        config.data.vocab = "sentencepiece"
        config.model.vocab_size = config.data.vocab_size
        config.model.update(model_dim=1024, num_heads=16, mlp_dim=4096, dropout=0.3)
        config.train.steps = 300_000
    else:
        raise ValueError(
            f"configs/translation.py has variants 'tiny', 'base' and 'big', got {variant!r}"
        )
    return config
