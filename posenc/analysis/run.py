"""``posenc analyze``: attention by distance and attention entropy of a trained run.

For each window length the run's evaluation split is cut into non-overlapping windows, as the
evaluation cuts it (:func:`posenc.data.eval_windows`; the first ``max(1, tokens // L)`` of them),
and every self-attention layer's probabilities are reduced on the device
(:mod:`posenc.analysis.stats`). A length gets, per layer and head:

- the mean attention weight and the mean logit (what the softmax reads: scaled, with the
  encoder's biases) over the (query, key) pairs at each distance ``d = i - j``, in buckets a
  quarter of an octave wide (``0``, ``1``, ..., ``7``, ``8-9``, ``10-11``, ``12-13``,
  ``14-15``, ``16-19``, ...) for the CSV and the plot, and octaves (``0``, ``1``, ``2-3``,
  ``4-7``, ...) for the markdown table; and what uniform attention over the visible keys would
  give;
- with a pattern of layer kinds (:mod:`posenc.layers.pattern`: a window, an encoder or options
  per kind), the same statistics per kind over its layers (``by_kind``), each layer's over its
  own visible pairs;
- the mean entropy of the attention rows (nats), the mean ``log n`` of their visible keys ``n``,
  and the mean of ``entropy / log n`` over the rows that see two keys or more: 1 is uniform
  attention, the "dilution" that explains many extrapolation failures (attention spread over
  more keys than in training) shows as this ratio rising with the length; also the entropy by
  query position, in the same buckets.

The windows are the evaluation's (positions randomized as it draws them for a run trained so,
masked-LM windows corrupted as it corrupts them); bidirectional runs get signed distances.
Runs that have no softmax attention weights of a decoder-only model to read are refused:
linear attention, encoder-decoders, algorithmic tasks (examples, not a stream), and evaluation
with Transformer-XL memory (``--config.eval.mem_len=0`` analyses the windows without it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from posenc import data as data_lib
from posenc import kinds
from posenc.analysis.buckets import FINE, bucket_sums, distance_buckets
from posenc.analysis.output import write_analysis
from posenc.analysis.stats import AttentionSums, model_attention_sums
from posenc.attention import linear as linear_attention
from posenc.devices import fits
from posenc.kinds.stream import Positions
from posenc.models.lm import Transformer
from posenc.models.restore import restore_model
from posenc.runs.config import (
    apply_overrides,
    check_eval_lengths,
    eval_lengths,
    eval_mem_len,
    eval_positions,
    evaluation_changes,
    open_source,
    validate,
)
from posenc.runs.evaluate import device_description
from posenc.workdir import RunDir, analysis_names

# Tokens analysed per length by default: max(1, DEFAULT_TOKENS // L) windows.
DEFAULT_TOKENS = 16_384
# Windows per batch: max(1, BATCH_TOKENS // L); memory per query block grows as B x S x block.
BATCH_TOKENS = 8_192
DEFAULT_BLOCK = 128
# The changes that name an analysis's files: those that change the attention weights.
_NAMING_FIELDS = ("encoding.", "eval.split", "eval.positions", "eval.mem_len")


def check_analyzable(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Raises a one-line ``ValueError`` for a run ``posenc analyze`` cannot read (module
    docstring), naming the field: what the run's kind refuses
    (:meth:`posenc.kinds.RunKind.analysis_refusal`), linear attention, evaluation with memory."""
    reasons = [kinds.kind_of(config).analysis_refusal(config)]
    if config.model.attention_impl in linear_attention.PATHS:
        reasons.append(
            f"uses linear attention (model.attention_impl={config.model.attention_impl!r}), "
            "which forms no softmax attention weights; analyze softmax-attention runs"
        )
    if eval_mem_len(config):
        reasons.append(
            f"is evaluated with Transformer-XL memory (eval.mem_len={eval_mem_len(config)}), "
            "which analyze does not carry; pass --config.eval.mem_len=0 to analyse the windows "
            "without it"
        )
    reasons = [reason for reason in reasons if reason]
    if reasons:
        raise ValueError(f"{workdir} {reasons[0]}")


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.maximum(den, 1e-300), np.nan)


def _floats(x: np.ndarray, digits: int = 6) -> Any:
    """A nested list of floats rounded to ``digits`` significant digits; NaN becomes None."""
    x = np.asarray(x, np.float64)
    if x.ndim:
        return [_floats(row, digits) for row in x]
    return None if not math.isfinite(x) else float(f"{float(x):.{digits}g}")


def _uniform(keys: np.ndarray, pairs: np.ndarray, length: int, causal: bool) -> np.ndarray:
    """What uniform attention over each row's visible keys puts at each distance (summed over
    the rows of one window): ``keys [T]`` visible keys per row, ``pairs [n_d]`` pairs per
    distance over the windows (for the bidirectional full window); NaN where unknown."""
    if causal and np.array_equal(keys, np.arange(1, length + 1)):
        # Row i spreads 1/(i + 1) over its keys: distance d gets sum_{i >= d} 1/(i + 1).
        return np.cumsum((1.0 / keys)[::-1])[::-1]
    if causal:  # a window: row i sees distances 0 .. keys_i - 1, 1/keys_i each
        steps = np.zeros(length + 1)
        steps[0] = np.sum(1.0 / keys)
        np.add.at(steps, keys.astype(np.int64), -1.0 / keys)
        return np.cumsum(steps)[:length]
    if np.all(keys == length):
        return pairs / length
    return np.full(pairs.shape, np.nan)  # a bidirectional window: not derived from keys alone


def _layer_summary(sums: AttentionSums, layers: Sequence[int], length: int, causal: bool):
    """The pair-weighted statistics of ``layers`` (one layer, or the layers of one kind, which
    share their mask): weight and logit by fine bucket ``[H, n_b]``, pairs and uniform
    ``[n_b]``, mean entropy and ``entropy / log n`` per head ``[H]``, mean ``log n``."""
    low = 0 if causal else -(length - 1)
    fine = distance_buckets(low, length - 1, FINE)
    first = layers[0]
    windows = float(sums.windows[first])
    pairs = bucket_sums(sums.pairs[first], fine, low)  # [n_b]
    keys = sums.keys[first]  # [T]
    uniform = _uniform(keys, sums.pairs[first], length, causal) * windows
    weight = sum(bucket_sums(sums.weight[i], fine, low) for i in layers)  # [H, n_b]
    logit = sum(bucket_sums(sums.logit[i], fine, low) for i in layers)
    entropy = np.stack([sums.entropy[i] for i in layers]) / windows  # [n, H, T]
    several = keys > 1
    log_keys = np.log(keys)
    return {
        "pairs": pairs,
        "uniform": _ratio(bucket_sums(uniform, fine, low), pairs),
        "weight": _ratio(weight, pairs * len(layers)),
        "logit": _ratio(logit, pairs * len(layers)),
        "entropy": entropy.mean(-1).mean(0),
        "log_keys": float(log_keys.mean()),
        "normalized_entropy": (entropy[..., several] / log_keys[several]).mean(-1).mean(0),
    }


def summarize(
    sums: AttentionSums, length: int, causal: bool, kinds: Sequence[str] | None = None
) -> dict[str, Any]:
    """One length's record from the float64 sums over its windows (layer axis first).

    Per layer: the weight and logit by distance, the entropy and ``entropy / log n``, each over
    the layer's own visible pairs. ``pairs``, ``uniform`` and ``log_keys`` are the first layer's
    (every layer's, unless layers differ in their window). ``kinds``: each layer's kind in a
    pattern (:mod:`posenc.layers.pattern`); with them the record gets ``by_kind``, each kind's
    statistics over its layers (:func:`_layer_summary`, weights averaged over the kind's
    layers)."""
    low = 0 if causal else -(length - 1)
    num_layers = sums.weight.shape[0]
    per_layer = [_layer_summary(sums, [i], length, causal) for i in range(num_layers)]
    first = per_layer[0]
    windows = float(sums.windows[0])
    positions = distance_buckets(0, length - 1, FINE)
    entropy = sums.entropy / windows  # [layers, H, T], mean over windows per row
    record = {
        "length": int(length),
        "windows": int(round(windows)),
        "tokens": int(round(windows)) * int(length),
        "causal": bool(causal),
        "buckets": distance_buckets(low, length - 1, FINE).tolist(),
        "pairs": _floats(first["pairs"], 12),
        "uniform": _floats(first["uniform"]),
        "weight": _floats([layer["weight"] for layer in per_layer]),
        "logit": _floats([layer["logit"] for layer in per_layer]),
        "entropy": _floats(entropy.mean(-1)),
        "log_keys": first["log_keys"],
        "normalized_entropy": _floats([layer["normalized_entropy"] for layer in per_layer]),
        "position_buckets": positions.tolist(),
        "entropy_by_position": _floats(
            bucket_sums(entropy, positions, 0) / bucket_sums(np.ones(length), positions, 0)
        ),
    }
    if kinds:
        by_kind = {}
        for name in dict.fromkeys(kinds):
            layers = [i for i, k in enumerate(kinds) if k == name]
            kind = _layer_summary(sums, layers, length, causal)
            by_kind[name] = {"layers": layers, "pairs": _floats(kind.pop("pairs"), 12)}
            by_kind[name]["log_keys"] = kind.pop("log_keys")
            by_kind[name].update({key: _floats(value) for key, value in kind.items()})
        record["by_kind"] = by_kind
    return record


class Analyzer:
    """Reduces batches of windows of a model with one compiled program per window length."""

    def __init__(self, model: Transformer, block_size: int = DEFAULT_BLOCK):
        graphdef, self.state = nnx.split(model)
        self.block_size = block_size

        def sums(state, tokens, positions, weights):
            model = nnx.merge(graphdef, state)
            return model_attention_sums(model, tokens, positions, weights, block_size)

        self._sums = fits.CheckedJit(sums, self._describe)

    def _describe(self, state, tokens, *rest) -> tuple[str, str]:
        rows, length = tokens.shape
        what = f"analysing attention at length {length} ({rows} window{'s' * (rows > 1)} a batch)"
        return what, f"lower --block-size (now {self.block_size}) or leave {length} out"

    def __call__(self, tokens, positions, weights) -> AttentionSums:
        """Float64 host sums of one batch (``tokens [B, L]``, ``positions [B, L]`` or None,
        ``weights [B]``)."""
        out = self._sums(self.state, jnp.asarray(tokens), positions, jnp.asarray(weights))
        return jax.tree.map(lambda x: np.asarray(x, np.float64), jax.device_get(out))


def layer_kinds(model: Transformer) -> list[str] | None:
    """Each layer's kind in the model's pattern (:mod:`posenc.layers.pattern`), None without
    one."""
    kinds = [block.kind for block in model.blocks]
    return None if all(kind is None for kind in kinds) else kinds


def analyze(
    model: Transformer,
    stream: np.ndarray,
    lengths: Sequence[int],
    *,
    tokens: int = DEFAULT_TOKENS,
    block_size: int = DEFAULT_BLOCK,
    positions: Positions | None = None,
    masking: data_lib.MaskedLM | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """The records of ``model``'s attention at each window length (module docstring).

    Args:
      model: a trained decoder-only model.
      stream: the token stream of the split.
      lengths: window lengths.
      tokens: analyse the first ``max(1, tokens // L)`` windows of each length.
      block_size: queries per block.
      positions: randomized window positions (as the evaluation draws them); None:
        ``0 .. L - 1``.
      masking: a masked-LM run's corruption of the windows (as the evaluation applies it).
      progress: print one line per length.

    Returns:
      One record per length (:func:`summarize`); a length the encoder cannot represent gets
      ``{"length": L, "error": message}``.
    """
    analyzer = Analyzer(model, block_size)
    causal = model.config.causal
    kinds = layer_kinds(model)
    records = []
    for length in lengths:
        try:
            model.encoding.check_length(positions.max_position if positions else length)
        except ValueError as e:
            records.append({"length": int(length), "error": str(e)})
            continue
        start = time.perf_counter()
        windows = data_lib.eval_windows(stream, length, max_windows=max(1, tokens // length))
        batch = max(1, min(windows.num_windows, BATCH_TOKENS // length))
        total = None
        for number, local in enumerate(windows.iter_batches(batch, with_starts=True)):
            weights = (local["starts"] >= 0).astype(np.float32)
            if masking is not None:
                local = masking.eval_batch(local, length)
            drawn = None if positions is None else positions.draw(number, batch, length)
            sums = analyzer(local["inputs"], drawn, weights)
            total = sums if total is None else jax.tree.map(np.add, total, sums)
        record = summarize(total, length, causal, kinds)
        record["seconds"] = time.perf_counter() - start
        records.append(record)
        if progress:
            ratio = np.mean(record["normalized_entropy"])
            print(
                f"  L={length:>6}: {record['windows']} windows, entropy / log n {ratio:.3f} "
                f"(mean over layers and heads, {record['seconds']:.1f}s)",
                flush=True,
            )
    return records


def _pattern_fields(model: Transformer) -> dict[str, Any]:
    """``layer_kinds`` (each layer's kind) and ``kinds`` (each kind described: its encoder and
    options) of a model with a pattern of layer kinds; nothing without one."""
    kinds = layer_kinds(model)
    if kinds is None:
        return {}
    described = {kind.name: kind.describe() for kind in model.layers}
    return {"layer_kinds": kinds, "kinds": {name: described[name] for name in dict.fromkeys(kinds)}}


def analyze_workdir(
    workdir: str,
    *,
    lengths: Sequence[int] | None = None,
    tokens: int = DEFAULT_TOKENS,
    block_size: int = DEFAULT_BLOCK,
    overrides: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, Any]:
    """Analyses a trained run's attention and writes its tables and plots beside it.

    Args:
      workdir: a work directory written by ``posenc train``.
      lengths: window lengths; default the run's evaluation lengths.
      tokens: tokens analysed per length (``max(1, tokens // L)`` windows).
      block_size: queries per block (memory grows as ``L x block``).
      overrides: ``field=value`` settings that evaluation may change (the split, RoPE's scaling,
        ``eval.mem_len=0``, ...); anything else is refused.
      progress: print one line per length.

    Returns:
      The record written (``attention.json``, or ``attention-<changes and settings>.json`` under
      changed evaluation settings or other ``lengths`` or ``tokens`` than the defaults), with the
      names of every file written under ``"files"``.

    Raises:
      ValueError: a run analyze cannot read, a setting evaluation may not change, a length the
        split cannot fill, or a non-positive ``tokens`` or ``block_size``.
    """
    for name, value in (("--tokens", tokens), ("--block-size", block_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    run = RunDir(workdir)
    trained = run.read_config()
    config = apply_overrides(trained, overrides)
    changes = evaluation_changes(trained, config)
    validate(config)
    check_analyzable(config, workdir)
    own_lengths = tuple(int(n) for n in eval_lengths(config))
    lengths = tuple(int(n) for n in lengths) if lengths else own_lengths
    # Other lengths or tokens than the defaults name the files apart (posenc.workdir's
    # analysis_names): a later analysis never replaces an earlier one's.
    settings = {
        name: value
        for name, value, default in (
            ("lengths", lengths, own_lengths),
            ("tokens", tokens, DEFAULT_TOKENS),
        )
        if value != default
    }
    split = config.eval.split
    stream = open_source(config).split_stream(split)
    check_eval_lengths(len(stream), lengths, split)
    randomized = eval_positions(config) == "randomized"
    positions = Positions(config.seed, config.train.max_position) if randomized else None
    naming = {k: v for k, v in changes.items() if k.startswith(_NAMING_FIELDS)}
    kind = kinds.kind_of(config)
    with run.lock():
        model, step = restore_model(run, config)
        records = analyze(
            model,
            stream,
            lengths,
            tokens=tokens,
            block_size=block_size,
            positions=positions,
            masking=kind.window_masking(config),
            progress=progress,
        )
        record = {
            "encoding": config.encoding.name,
            "encoding_hparams": config.encoding.hparams.to_dict(),
            "changes": naming,
            "train_seq_len": config.train.seq_len,
            "checkpoint_step": step,
            "finished": step == config.train.steps,
            "seed": config.seed,
            "split": split,
            "positions": eval_positions(config),
            "objective": kind.objective,
            "num_layers": config.model.num_layers,
            "num_heads": model.config.dims.num_heads,
            **_pattern_fields(model),
            "tokens_per_length": tokens,
            "device": device_description(),
            "lengths": records,
            "settings": settings,
            "files": analysis_names(naming, settings),
            "time": time.time(),
        }
        write_analysis(run, record)
    return record
