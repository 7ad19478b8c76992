"""Pretrained Hugging Face models in and out of posenc.

    model, spec = posenc.hf.load_pretrained("/models/pythia-160m", dtype="float32")
    logits = model(tokens)                       # [B, T, V] float32

``posenc import-hf <folder> --workdir W`` writes a run directory every posenc tool accepts;
``posenc export-hf --workdir W --out DIR`` writes a folder transformers loads as the same model;
``posenc.hf.save_pretrained(model, spec, out)`` does the same for a model in hand (any family).

One module per family (:mod:`posenc.hf.llama`, :mod:`posenc.hf.gpt_neox`, ...) maps a
``config.json`` and its weight names onto posenc's model options, registered encoders and
parameters (:mod:`posenc.hf.family`); adding a family is adding one module.
"""

from posenc.hf.family import Family, Rule, Spec, families, for_model_type, model_types, register
from posenc.hf.load import load_pretrained, read_spec
from posenc.hf.rundir import save_pretrained

__all__ = [
    "Family",
    "Rule",
    "Spec",
    "families",
    "for_model_type",
    "load_pretrained",
    "model_types",
    "read_spec",
    "register",
    "save_pretrained",
]
