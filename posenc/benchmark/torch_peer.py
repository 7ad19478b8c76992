"""The device check's PyTorch peer: the same network shape in x-transformers, on the same GPU.

``x_transformers.TransformerWrapper`` over a ``Decoder`` of ``layers`` blocks, width ``dim``,
``heads`` heads and a ``4 x dim`` GELU MLP, tied embeddings, byte vocabulary, with the encoders
x-transformers has with its flash path (:data:`ENCODERS`: NoPE, RoPE, ALiBi, a learned absolute
table; it refuses T5's bias with ``attn_flash``),
``attn_flash=True`` (PyTorch's ``scaled_dot_product_attention``, which dispatches to its
FlashAttention kernel where no bias is given), bf16 autocast on a GPU, ``torch.compile`` of the
training step's model, fused AdamW. Timed like :func:`posenc.benchmark.measure.measure_train`:
compile (the first step), ``warmup`` untimed steps, then ``steps`` steps up to
``torch.cuda.synchronize``; tokens are random (throughput does not depend on them). Evaluation:
one window of each length, forward only under ``torch.inference_mode`` (not compiled: every
length would recompile), median of ``repeats``; memory is ``torch.cuda.max_memory_allocated``
since the measurement began.

Run in its own process (``python -m posenc.benchmark.torch_peer SPEC_JSON``), so that PyTorch and
JAX never hold the GPU together: each finished measurement is printed as one JSON line, which
the device check saves as it arrives. torch and x-transformers are imported only here.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder heads sys.path, where posenc's profile.py would shadow the
# standard library's (which torch imports).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

NAME = "x-transformers"

# posenc encoder -> x-transformers keyword arguments (Decoder's, and TransformerWrapper's
# use_abs_pos_emb: x-transformers adds a learned absolute table unless told not to).
ENCODERS: dict[str, dict[str, Any]] = {
    "nope": {"use_abs_pos_emb": False},
    "rope": {"rotary_pos_emb": True},
    "alibi": {"alibi_pos_bias": True, "use_abs_pos_emb": False},
    "learned": {},
}


def build(encoder: str, spec: dict[str, Any]):
    """The x-transformers model of ``encoder`` at ``spec``'s shape (on the CPU)."""
    from x_transformers import Decoder, TransformerWrapper

    kwargs = dict(ENCODERS[encoder])
    use_abs = kwargs.pop("use_abs_pos_emb", True)
    return TransformerWrapper(
        num_tokens=spec["vocab"],
        max_seq_len=max([spec["seq_len"], *spec.get("eval_lengths", ())]),
        use_abs_pos_emb=use_abs,
        tie_embedding=True,
        attn_layers=Decoder(
            dim=spec["dim"],
            depth=spec["layers"],
            heads=spec["heads"],
            ff_mult=spec["mlp_dim"] // spec["dim"],
            attn_flash=True,
            **kwargs,
        ),
    )


def matmul_params(model) -> int:
    """Parameters of the model's matmuls: every weight of two or more dimensions but the
    positional tables (x-transformers' ``pos_emb`` and relative-position modules)."""
    skip = ("pos_emb", "rel_pos", "rotary")
    return sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.dim() >= 2 and not any(s in name for s in skip)
    )


def _sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_train(encoder: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One encoder's training row: compile, then timed steps (see the module docstring)."""
    import torch

    device = spec["device"]
    torch.manual_seed(0)
    model = build(encoder, spec).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    dtype = torch.bfloat16 if spec["dtype"] == "bfloat16" else torch.float32
    compiled = torch.compile(model) if spec["compile"] else model
    b, t, v = spec["batch"], spec["seq_len"], spec["vocab"]
    tokens = torch.randint(0, v, (b, t + 1), device=device)

    def step():
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            logits = compiled(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, v), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    step()
    _sync(torch, device)
    compile_s = time.perf_counter() - start
    for _ in range(spec["warmup"]):
        step()
    _sync(torch, device)
    start = time.perf_counter()
    for _ in range(spec["steps"]):
        loss = step()
    _sync(torch, device)
    seconds = time.perf_counter() - start
    n = matmul_params(model)
    attn_dim = spec["dim"]
    flops = 6.0 * n + 12.0 * spec["layers"] * t * attn_dim
    tokens_per_s = spec["steps"] * b * t / seconds
    return {
        "encoder": encoder,
        "peer": NAME,
        "path": "sdpa (flash)" if "bias" not in json.dumps(ENCODERS[encoder]) else "sdpa + bias",
        "compile_s": compile_s,
        "steps": spec["steps"],
        "tokens_per_step": b * t,
        "seconds": seconds,
        "step_time_s": seconds / spec["steps"],
        "tokens_per_s": tokens_per_s,
        "matmul_params": n,
        "flops_per_token": flops,
        "model_tflops_per_s": flops * tokens_per_s / 1e12,
        "loss": float(loss.detach()),
        "memory_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
    }


def measure_eval(encoder: str, spec: dict[str, Any], length: int) -> dict[str, Any]:
    """Scoring one window of ``length`` tokens (forward only), median of ``spec["repeats"]``."""
    import torch

    device = spec["device"]
    model = build(encoder, spec).to(device).eval()
    dtype = torch.bfloat16 if spec["dtype"] == "bfloat16" else torch.float32
    tokens = torch.randint(0, spec["vocab"], (1, length), device=device)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def run():
        with (
            torch.inference_mode(),
            torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32),
        ):
            out = model(tokens)
        _sync(torch, device)
        return out

    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    times = []
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {
        "encoder": encoder,
        "peer": NAME,
        "length": length,
        "first_s": first,
        "seconds": seconds,
        "tokens_per_s": length / seconds,
        "memory_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
    }


def main(argv: list[str] | None = None) -> None:
    """The child's side: ``SPEC_JSON`` (shape, encoders, steps, lengths, ``deadline`` as
    ``time.time()``); prints one JSON line per measurement, an ``error`` row where one fails,
    and a ``skipped`` row for each measurement past the deadline."""
    spec = json.loads((argv or sys.argv[1:])[0])
    from importlib import metadata

    import torch

    versions = {"torch": torch.__version__, "x_transformers": metadata.version("x-transformers")}
    print(json.dumps({"versions": versions}), flush=True)
    todo = [("train", e, None) for e in spec["encoders"]]
    todo += [("eval", e, n) for n in spec["eval_lengths"] for e in spec["eval_encoders"]]
    for what, encoder, length in todo:
        row: dict[str, Any] = {"section": what, "encoder": encoder}
        if length:
            row["length"] = length
        if time.time() > spec["deadline"]:
            row["skipped"] = "time guard"
        else:
            try:
                row.update(
                    measure_train(encoder, spec)
                    if what == "train"
                    else measure_eval(encoder, spec, length)
                )
            except Exception as e:  # noqa: BLE001 - one line in the table
                row["error"] = (f"{type(e).__name__}: {e}".splitlines() or ["?"])[0][:300]
            if spec["device"] == "cuda":
                torch.cuda.empty_cache()
        print(json.dumps({"section": what, **row}), flush=True)


if __name__ == "__main__":
    main()
