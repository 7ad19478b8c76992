"""The memory an evaluation may use, and the batches it can afford: windows per batch sized from
a budget that knows the model, not from a fixed token count.

An evaluation batch of ``rows`` windows of ``L`` tokens holds the parameters, each row's
activations inside one block (its residual stream, the attention's queries, keys, values and
score tiles, the MLP's hidden units) and one chunk of logits (``model.loss_chunk`` tokens of the
vocabulary: :func:`posenc.models.losses.chunked_token_losses`). :func:`estimate` adds these up;
:func:`eval_rows` takes the most rows whose estimate fits the budget (at most
:data:`MAX_BATCH_TOKENS` tokens, the fixed count evaluation batches held before, beyond which a
batch evaluates no faster). The compiled program's own figure (XLA's buffer assignment,
:func:`posenc.devices.fits.required_bytes`) then has the last word: where it exceeds the budget,
the evaluation takes fewer rows (:meth:`posenc.kinds.stream.Scorer.rows`).

The budget (``eval.memory_budget``): a size such as ``"8GB"``, or by default half of one
device's memory (:func:`posenc.devices.fits.device_memory`: an accelerator's allocator limit; on
a CPU the host's physical memory, or what the host has available now plus the parameters
already loaded, if that is less).
"""

from __future__ import annotations

import os
import re

from posenc.layers.config import ModelConfig

# Tokens an evaluation batch holds at most (the fixed eval.batch_tokens before budgets).
MAX_BATCH_TOKENS = 65_536
# Work a batch needs to pay for what each batch costs besides its arithmetic (dispatch, the
# host's windows, the device-to-host sums): a batch takes windows until its forward pass is
# about this many FLOPs (2 x parameters x tokens), and no more. A 135M-parameter model's
# 2048-token window is 0.55e12 (one window a batch); a 0.1M-parameter model's 64-token window
# 1.3e7 (the token cap decides).
BATCH_FLOPS = 10**12
# The share of a device's memory an evaluation takes when eval.memory_budget is not given.
DEFAULT_SHARE = 0.5

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_bytes(text: str, field: str = "--device-memory") -> int:
    """``"80GB"`` (10^9), ``"80GiB"`` (2^30), ``"512MB"``, ``"1e9"`` -> bytes.

    Raises:
      ValueError: one line naming ``field``, the value and the accepted forms.
    """
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B|B)?\s*", str(text), flags=re.IGNORECASE)
    try:
        value = float(match.group(1)) if match else -1.0
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(
            f"{field} must be a size such as 80GB (10^9 bytes) or 80GiB (2^30), got {text!r}"
        )
    return int(value * _UNITS[(match.group(2) or "").upper()])


def available_host_memory() -> int | None:
    """Bytes the host can still give a process (``MemAvailable`` of ``/proc/meminfo``: free
    memory plus the page cache it may reclaim), or None where that is not known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget(setting: int | str | None, params: int = 0) -> int | None:
    """The bytes an evaluation may hold at once (parameters included).

    Args:
      setting: ``eval.memory_budget``: bytes, a size (:func:`parse_bytes`), or None for
        :data:`DEFAULT_SHARE` of one device's memory; on a CPU, of the host's physical memory
        or, if less, of what is available now plus ``params`` (the parameters, loaded already).
      params: bytes of the parameters one device holds.

    Returns:
      Bytes, or None when ``setting`` is None and the device's memory is not known.
    """
    if isinstance(setting, int) and not isinstance(setting, bool) and setting > 0:
        return setting
    if setting is not None:
        return parse_bytes(setting, "eval.memory_budget")
    import jax

    from posenc.devices import fits

    memory = fits.device_memory()
    if memory is not None and jax.local_devices()[0].platform == "cpu":
        available = available_host_memory()
        if available is not None:
            memory = min(memory, available + params)
    return None if memory is None else int(DEFAULT_SHARE * memory)


def row_bytes(config: ModelConfig, length: int) -> int:
    """Estimated bytes one window of ``length`` tokens adds to an evaluation batch: what one
    block holds at once while it runs (a forward pass frees each block's activations before
    the next), the residual stream of the window in float32 kept across blocks, and the
    hidden states the loss reads.

    A block's largest moment is the attention or the MLP: the normed input, queries, keys and
    values (float32 and compute dtype), and the score tiles (``blocked``: ``H x block x L``
    float32 logits and probabilities; ``einsum``: ``H x L x L``); or the MLP's two hidden
    projections and their product. Counted generously (float32 throughout): the compiled
    program's figure corrects the estimate downward, never the reverse.
    """
    d, h = config.model_dim, config.num_heads
    hd = config.dims.head_dim
    qkv = (h + 2 * config.kv_heads) * hd
    block = config.attention_block_size
    tile = length if config.attention_impl == "einsum" else min(length, block)
    attention = 3 * d + 2 * qkv + 2 * h * tile
    mlp = 2 * d + 3 * config.mlp_dim
    per_token = 4 * (3 * d + max(attention, mlp))
    return length * per_token


def fixed_bytes(config: ModelConfig, params: int, rows: int, length: int) -> int:
    """Bytes an evaluation batch holds whatever its rows: the parameters and one chunk of
    logits (``model.loss_chunk`` tokens, or the batch's if that is fewer; float32 logits, their
    exponentials and the log-softmax: three of them)."""
    chunk = config.loss_chunk_tokens or rows * length
    return params + 3 * 4 * min(chunk, rows * length) * config.vocab_size


def estimate(config: ModelConfig, params: int, rows: int, length: int) -> int:
    """Estimated bytes of an evaluation batch of ``rows`` windows of ``length`` tokens."""
    return fixed_bytes(config, params, rows, length) + rows * row_bytes(config, length)


def eval_rows(
    config: ModelConfig,
    params: int,
    length: int,
    budget: int | None,
    devices: int = 1,
    param_count: int | None = None,
    windows: int | None = None,
) -> int:
    """Windows per evaluation batch: the most whose :func:`estimate` per device fits
    ``budget`` (at least one per device), at most :data:`MAX_BATCH_TOKENS` tokens and, given
    ``param_count``, no more than :data:`BATCH_FLOPS` of work needs, nor than ``windows``
    (the windows to score); a multiple of ``devices`` (the ways a batch's rows are split).

    Args:
      config: the model's shape.
      params: bytes of parameters one device holds.
      length: the window length.
      budget: bytes one device may hold (None: the caps alone).
      devices: the ways a batch's rows are split.
      param_count: the model's parameters (None: no work cap).
      windows: the windows to score (None: no cap).
    """
    most = max(1, MAX_BATCH_TOKENS // length)
    if param_count:
        most = min(most, max(1, BATCH_FLOPS // (2 * param_count * length)))
    if windows is not None:
        most = min(most, max(1, windows))
    per_device = -(-most // devices)
    if budget is not None and estimate(config, params, per_device, length) > budget:
        lo, hi = 1, per_device  # the estimate grows with the rows: the most that fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if estimate(config, params, mid, length) <= budget:
                lo = mid
            else:
                hi = mid - 1
        per_device = lo
    return per_device * devices
