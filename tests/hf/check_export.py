"""Checks with ``transformers`` itself that what ``posenc export-hf`` writes is the same model
(run by hand where torch is installed, like make_golden.py; CI has neither).

1. Round trip: every decoder-only folder of ``tests/hf/golden/`` (written by transformers,
   make_golden.py) imported with ``posenc import-hf`` and written back with ``posenc export-hf``;
   transformers loads the export and its logits are compared with the golden ones (transformers'
   own, on the same ids).
2. The families a run directory does not hold (T5 and Flan-T5, BERT, RoBERTa): loaded with
   ``posenc.hf.load_pretrained``, written with ``posenc.hf.save_pretrained``, loaded by
   transformers, logits compared with the golden ones (and, for BERT and RoBERTa, with the
   original folder's at token type 1, which the golden logits do not cover).
3. posenc's own T5-bias encoder-decoders (built, not trained: T5's parts with posenc's
   ``sqrt(D)`` embedding scale), saved and loaded by transformers, against posenc's logits.
4. posenc-trained models: a tiny RoPE, ALiBi and learned-position model trained a few steps by
   posenc on a generated text folder, exported (as GPT-NeoX, BLOOM and GPT-2), loaded by
   transformers; its logits are compared with posenc's own on random ids.

    python tests/hf/check_export.py          # prints one line per model, exits 1 on a mismatch

The CI tests hold the same facts without transformers: tests/test_hf_rundir.py checks that the
export is the golden folder bit for bit, and that a trained model's export gives its logits
through posenc's import (which tests/hf/test_golden.py ties to transformers).

Measured (torch 2.13.0, transformers 5.24, CPU): relative error 0 for every round trip (the
exported tensors are the golden ones; OPT's unread position rows aside) but Phi-3's, exported as
Llama (3e-7); saved T5 5e-8 (its folded scales divided out again), Flan-T5 0, BERT 6e-7 and
RoBERTa 6e-7 (the token-type row taken out of the position table again), for token type 1 too
(4-5e-7 against the original; 1.0 when the export wrote the token-type table as zeros);
posenc's T5-bias models 3.2e-7 (ReLU) and 6.1e-7 (gated GELU); trained models 2.9e-7 (RoPE as
GPT-NeoX), 3.6e-7 (ALiBi as BLOOM), 2.3e-7 (learned as GPT-2). The output of a run is kept in
tests/hf/check_export.txt.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for the tiny run configs
sys.path.insert(0, HERE)  # tests/hf, for test_export's posenc T5
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository, for posenc

import _train_helpers as helpers  # noqa: E402

from posenc.hf.rundir import export_hf, import_hf  # noqa: E402
from posenc.models.restore import load_model  # noqa: E402

GOLDEN = os.path.join(HERE, "golden")
TOLERANCE = 1e-5
# posenc-trained models: the encoder and the overrides that give a family's options.
TRAINED = {
    "rope": (),
    "alibi": ("model.embed_norm=True", "model.mlp_dim=128"),
    "learned": ("model.mlp_dim=128",),
}


def transformers_logits(folder: str, ids: np.ndarray) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def round_trips(tmp: str) -> list[tuple[str, float]]:
    out = []
    for name in sorted(os.listdir(GOLDEN)):
        if name.endswith("t5") or name in ("bert", "roberta"):  # no run directory: saved()
            continue
        workdir, exported = os.path.join(tmp, name), os.path.join(tmp, f"{name}_hf")
        folder = os.path.join(tmp, f"{name}_in")
        shutil.copytree(os.path.join(GOLDEN, name), folder)
        for file in ("tokenizer.json", "tokenizer_config.json"):  # --no-tokenizer: bytes do not
            if not os.path.exists(os.path.join(folder, file)):  # fit 96 ids
                shutil.copyfile(os.path.join(GOLDEN, "llama", file), os.path.join(folder, file))
        import_hf(folder, workdir)
        export_hf(workdir, exported)
        golden = np.load(os.path.join(GOLDEN, name, "golden.npz"))
        for key in golden.files:
            if key.startswith("ids_"):
                got = transformers_logits(exported, golden[key])
                out.append(
                    (
                        f"round trip {name} L={key[4:]}",
                        relative_error(got, golden[f"logits_{key[4:]}"]),
                    )
                )
    return out


def saved(tmp: str) -> list[tuple[str, float]]:
    from posenc.hf import load_pretrained, save_pretrained

    out = []
    for name in ("t5", "flan_t5", "bert", "roberta"):
        model, spec = load_pretrained(os.path.join(GOLDEN, name))
        exported = os.path.join(tmp, f"{name}_saved")
        save_pretrained(model, spec, exported)
        golden = np.load(os.path.join(GOLDEN, name, "golden.npz"))
        if spec.assembly == "encoder_decoder":
            reference = transformers.T5ForConditionalGeneration.from_pretrained(
                exported, dtype=torch.float32, attn_implementation="eager"
            ).eval()
            for key in golden.files:
                if key.startswith("src_"):
                    length = key[4:]
                    with torch.no_grad():
                        got = reference(
                            input_ids=torch.from_numpy(golden[key].astype(np.int64)),
                            decoder_input_ids=torch.from_numpy(
                                golden[f"tgt_{length}"].astype(np.int64)
                            ),
                        ).logits.numpy()
                    error = relative_error(got, golden[f"logits_{length}"])
                    out.append((f"saved {name} L={length}", error))
            continue
        reference = transformers.AutoModelForMaskedLM.from_pretrained(
            exported, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        original = transformers.AutoModelForMaskedLM.from_pretrained(
            os.path.join(GOLDEN, name), dtype=torch.float32, attn_implementation="eager"
        ).eval()
        for key in golden.files:
            if key.startswith("ids_"):
                ids = torch.from_numpy(golden[key].astype(np.int64))
                with torch.no_grad():
                    got = reference(ids).logits.numpy()
                out.append(
                    (f"saved {name} L={key[4:]}", relative_error(got, golden[f"logits_{key[4:]}"]))
                )
                if original.config.type_vocab_size > 1:  # sentence pairs: token type 1 (issue 36)
                    types = torch.ones_like(ids)
                    with torch.no_grad():
                        got = reference(ids, token_type_ids=types).logits.numpy()
                        want = original(ids, token_type_ids=types).logits.numpy()
                    out.append((f"saved {name} L={key[4:]} type 1", relative_error(got, want)))
    return out


def posenc_t5(tmp: str) -> list[tuple[str, float]]:
    """posenc-built T5-bias encoder-decoders (tests/hf/test_export.py) saved and loaded."""
    import jax.numpy as jnp
    from test_export import posenc_t5 as build

    from posenc.hf import save_pretrained

    out = []
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(0, 64, (2, 12)), rng.integers(0, 64, (2, 9))
    for mlp, tie in (("relu", True), ("geglu", False)):
        model, spec = build(mlp, tie)
        exported = os.path.join(tmp, f"posenc_t5_{mlp}")
        save_pretrained(model, spec, exported)
        want = np.asarray(model(jnp.asarray(src), jnp.asarray(tgt)))
        reference = transformers.T5ForConditionalGeneration.from_pretrained(
            exported, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        with torch.no_grad():
            got = reference(
                input_ids=torch.from_numpy(src), decoder_input_ids=torch.from_numpy(tgt)
            ).logits.numpy()
        out.append((f"posenc t5 ({mlp}) as t5", relative_error(got, want)))
    return out


def trained(tmp: str) -> list[tuple[str, float]]:
    from posenc.runs.train import train

    texts = os.path.join(tmp, "texts")
    os.makedirs(texts)
    rng = np.random.default_rng(0)
    words = "def add return the quick brown fox jumps over lazy dog".split()
    for i in range(9):
        with open(os.path.join(texts, f"doc{i}.txt"), "w") as f:
            f.write("\n".join(" ".join(rng.choice(words, 10)) for _ in range(30)))
    ids = rng.integers(0, 257, size=(2, 40))
    out = []
    for encoding, overrides in TRAINED.items():
        workdir, exported = os.path.join(tmp, encoding), os.path.join(tmp, f"{encoding}_hf")
        config = helpers.tiny_config(
            os.path.join(tmp, "data"),
            f"data.source=textdir:{texts}",
            f"encoding.name={encoding}",
            "train.steps=3",
            "eval.lengths=16",
            *overrides,
        )
        train(config, workdir)
        family = export_hf(workdir, exported)["family"]
        want = np.asarray(helpers.jit_forward(load_model(workdir))(ids))
        got = transformers_logits(exported, ids)
        out.append((f"trained {encoding} as {family}", relative_error(got, want)))
    return out


def main() -> int:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        results = round_trips(tmp) + saved(tmp) + posenc_t5(tmp) + trained(tmp)
    failed = 0
    for what, error in results:
        ok = error < TOLERANCE
        failed += not ok
        print(f"{'ok ' if ok else 'BAD'} {what}: relative error {error:.2e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
