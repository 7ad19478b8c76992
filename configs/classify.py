"""Sequence classification and regression: a bidirectional model fine-tuned on labelled text
(BERT's recipe; RoFormer's GLUE table and its long-document table), trained at one length and
evaluated per length bucket.

Variants (``--config configs/classify.py:VARIANT``):

- ``tiny`` (default): 2 layers, width 64, the embedded text-order task (``labelled:default``:
  is a standard-library snippet as written or reversed; 50 % without position
  information), train length 64, 400 steps of 32 examples; about two minutes on a 2-core CPU,
  evaluated at 64, 128 and 256 tokens.
- ``mlm_tiny``: the masked-LM pre-training run whose model ``tiny`` fine-tunes (same shapes, the
  ``pystdlib`` corpus, 600 steps).
- ``base``: BERT-base's shape (12 layers, width 768, 12 heads, feed-forward 3072), train length
  128, batch 32, learning rate 2e-5 with 10 % warmup, dropout 0.1 (Devlin et al. 2019, Sec. 4.1;
  RoFormer fine-tunes the same way); point ``data.source`` at a prepared GLUE task, e.g.
  ``tfds:glue/mrpc``, and ``--init-from`` at a masked-LM run of the same shape (``mlm_base``,
  or an imported BERT). Set ``train.steps`` to about 3 epochs of the task.
- ``mlm_base``: BERT-base-shaped masked-LM pre-training on ``data.source``.

Classes: ``model.num_labels`` is the number of classes of the training split (2 for MRPC,
SST-2, QNLI, QQP; 3 for MNLI), 1 for a regression (STS-B). ``--init-from`` needs the masked-LM
run's model fields (shapes, encoder) to equal the classifier's, or
``--config.train.inherit_model=True`` to take them (with its tokenizer) from that run: the way
to fine-tune an imported BERT or RoBERTa (``posenc import-hf``), whose rows are then framed by
its own tokenizer (``[CLS] a [SEP] b [SEP]``; RoBERTa's ``<s> a </s></s> b </s>``) and whose
segment embedding and pooler start from its token-type table and pooler.

Example::

    posenc train --config configs/classify.py:mlm_tiny --workdir runs/mlm
    posenc train --config configs/classify.py:tiny --workdir runs/cls --init-from runs/mlm
    posenc eval --workdir runs/cls        # accuracy per length bucket: <=1x, 1x-2x, 2x-4x
    posenc train --config configs/classify.py:base --config.data.source=tfds:glue/mrpc \\
        --workdir runs/mrpc --init-from runs/bert
    posenc import-hf /models/bert-base-uncased --workdir runs/bert-hf
    posenc train --config configs/classify.py:base --config.data.source=tfds:glue/mrpc \\
        --workdir runs/mrpc-hf --init-from runs/bert-hf --config.train.inherit_model=True
"""

import os

import ml_collections

from posenc.runs.config import load_config

_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "base.py")


def _bidirectional(config: ml_collections.ConfigDict) -> None:
    """What the masked-LM run and the classifier share: a bidirectional model whose vocabulary
    has the mask token (257) and [CLS] (258) after the bytes and the separator (256)."""
    config.model.causal = False
    config.model.vocab_size = 259


def _classifier(config: ml_collections.ConfigDict) -> None:
    # The sequence classifier (posenc/models/classifier.py) instead of the LM.
    config.model.assembly = "classifier"
    # Classes of the training split; 1: a regression (squared error), as STS-B.
    config.model.num_labels = 2
    # Pooling of the final states: "first" (BERT's [CLS]) or "mean" (over the real tokens).
    config.model.pool = "first"
    # Segment (token type) ids: 2 for sentence pairs as BERT; 0: no segment embedding.
    config.model.num_segments = 2
    # BERT's pooler (dense + tanh) between the pooled state and the output layer.
    config.model.pooler = True
    # What is trained: the classes (or the regression) of labelled examples.
    config.train.objective = "classification"
    # True: the model's shape and options, the encoder and data.tokenizer are those of the run
    # train.init_from names (an imported BERT or RoBERTa: --init-from W
    # --config.train.inherit_model=True); the head's fields and dropout stay this config's.
    config.train.inherit_model = False
    # "labelled:default" (the embedded text-order task), "tsv:<dir>" (train.tsv, validation.tsv,
    # optionally test.tsv; header text[, text_b], label) or a prepared "tfds:glue/<task>".
    config.data.source = "labelled:default"
    # Length buckets of the evaluation, in tokens: eval.multiples x train.seq_len.
    config.eval.lengths = ()
    config.eval.multiples = (1, 2, 4)


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    config = load_config(f"{_BASE}:base")
    config.unlock()
    _bidirectional(config)
    if variant in ("tiny", "base"):
        _classifier(config)
    else:
        config.train.objective = "masked_lm"
    if variant in ("tiny", "mlm_tiny"):
        config.model.update(num_layers=2, model_dim=64, num_heads=4, mlp_dim=256, dtype="float32")
    if variant == "tiny":
        config.optim.update(learning_rate=1e-3, warmup_steps=40, weight_decay=0.01)
        config.train.update(seq_len=64, batch_size=32, steps=400, log_every=50)
        config.train.checkpoint_every = 200
        config.eval.batch_tokens = 16_384
    elif variant == "mlm_tiny":
        config.optim.update(learning_rate=3e-3, warmup_steps=60)
        config.train.update(seq_len=64, batch_size=16, steps=600, log_every=50)
        config.train.checkpoint_every = 200
        config.eval.update(multiples=(1, 2), batch_tokens=16_384, max_tokens=65_536)
    elif variant in ("base", "mlm_base"):
        config.model.update(num_layers=12, model_dim=768, num_heads=12, mlp_dim=3072, dropout=0.1)
        if variant == "base":
            config.optim.update(learning_rate=2e-5, warmup_steps=300, weight_decay=0.01)
            config.optim.final_lr_ratio = 0.0
            config.train.update(seq_len=128, batch_size=32, steps=3000, checkpoint_every=1000)
    else:
        raise ValueError(
            "configs/classify.py has variants 'tiny', 'mlm_tiny', 'base' and 'mlm_base', got "
            f"{variant!r}"
        )
    return config
