"""Exact scoring of a token stream in windows: what causal and masked LM runs evaluate.

For each length ``L`` the evaluation split is cut into windows (:func:`posenc.data.eval_windows`):
non-overlapping by default, as in the ALiBi paper's tables (every token scored once, each with
the context since its window started), or sliding (context ``L``, stride ``S``, only the last
``S`` tokens of a window scored). The model scores fixed-shape batches (one compilation per
length); per-position loss sums and counts come back to the host and are added in float64, so
the reported mean is the exact mean over the scored tokens.

Windows get the positions ``0 .. L - 1``, or, for a run trained with randomized positions (Ruoss
et al. 2023), by default a sorted random subset of ``[0, train.max_position)`` per batch, as the
paper evaluates (``eval.positions`` chooses; the report records which).

Reported per length: tokens scored, mean loss (nats), perplexity (``inf`` where ``exp`` of the
loss overflows), bits per byte, loss by position inside the window, windows, the split's tokens
left unscored (``unscored_tokens``: the tail too short for another window, plus
``unscored_by_max_tokens``, those past the ``eval.max_tokens`` cap) and seconds.

With Transformer-XL memory (``eval.mem_len``, default ``model.mem_len``, > 0; Dai et al. 2019,
Sec. 3.2) the split is cut into ``B`` parallel parts (``B`` = the batch's windows, but at most
half the windows scored, so that each part holds two or more), each read as
consecutive windows of ``L`` scored one after another with the memory carried
(:func:`posenc.data.memory_segments`): length ``L`` then means *segments of L tokens, each scored
with the per-layer states of the up to ``mem_len`` tokens before it* (the first window of each
part has none; through the layers the memory reaches further back, as in the paper). Every
target of every window is scored once; the report adds ``mem_len`` and ``rows`` and counts the
windows over all rows.

A masked-LM run (``train.objective = "masked_lm"``) is scored on the same windows as a masked LM:
each window is corrupted by BERT's rule (:mod:`posenc.data.masking`), drawn from the seed, the
length and the window's place in the stream, and the loss is over the chosen tokens of the
scored positions, against the window itself. Reported per length: masked tokens scored, their
mean loss and ``exp`` of it, accuracy (share of them predicted by the arg max), loss by position,
windows, the tokens in the scored positions, tokens left unscored and seconds; no bits per byte
(a masked loss is not a code length).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from posenc import data as data_lib
from posenc.decoding.lm import layer_encodings
from posenc.devices import budget as budget_lib
from posenc.devices import fits, sharding
from posenc.devices.distributed import abstract_on, make_mesh
from posenc.kinds.common import check_eval_lengths, eval_positions
from posenc.models import memory as memory_lib
from posenc.models.lm import Transformer
from posenc.workdir.metrics import perplexity


class BudgetWarning(UserWarning):
    """One window a device needs more than the evaluation's memory budget."""


def _max_windows(length: int, stride: int, max_tokens: int) -> int | None:
    """Windows that score at most ``max_tokens`` (the first scores ``length``, later ``stride``)."""
    if not max_tokens:
        return None
    return max(1, 1 + (max_tokens - length) // stride) if max_tokens >= length else 1


@dataclasses.dataclass(frozen=True)
class Positions:
    """Randomized evaluation positions (Ruoss et al. 2023): per batch, a sorted random subset of
    ``[0, max_position)``, drawn from ``(seed, window length, batch number)``."""

    seed: int
    max_position: int

    def draw(self, number: int, rows: int, length: int) -> np.ndarray:
        """``[rows, length]`` int32 positions of batch ``number``."""
        index = (length, number)  # each window length draws its own sequence
        return data_lib.batch_positions(self.seed, index, rows, length, self.max_position, "eval")


class Scorer:
    """Scores batches of windows with one compiled function per window length.

    With ``masked_lm`` (a :class:`posenc.data.MaskedLM`), windows are corrupted and scored as a
    masked LM, and correct predictions are counted too.
    """

    def __init__(
        self,
        model: Transformer,
        mesh: jax.sharding.Mesh | None = None,
        masked_lm: data_lib.MaskedLM | None = None,
    ):
        self.mesh = mesh or make_mesh()
        self.masked_lm = masked_lm
        self.graphdef, self.state = nnx.split(model)
        self.config = model.config
        self.attention = (model.config.attention_impl, model.config.attention_block_size)
        self.batch_sharding = NamedSharding(self.mesh, sharding.batch_spec(self.mesh))
        # Parameters where training keeps them (posenc.devices.sharding's rules; replicated on the
        # default mesh). A model of shapes only (nnx.eval_shape) is planned, not run.
        shardings = sharding.tree_shardings(self.state, self.mesh)
        if all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(self.state)):
            self.state = abstract_on(self.state, shardings)
        else:
            self.state = jax.device_put(self.state, shardings)
        # Compiled once per length, refused in one line if it cannot fit (posenc.devices.fits).
        self._score = fits.CheckedJit(self._score_batch, self._describe)
        self._score_memory = fits.CheckedJit(
            self._score_with_memory, self._describe, static_argnums=(3,)
        )

    def _describe(self, state, batch, *memory) -> tuple[str, str]:
        """What a batch's scoring computes and what to change if it does not fit."""
        rows, length = batch["inputs"].shape
        what = f"evaluating length {length} in batches of {rows} window{'s' * (rows > 1)}"
        changes = [fits.attention_change(*self.attention), f"leave {length} out of eval.lengths"]
        config = self.config
        chunk = config.loss_chunk_tokens
        if (chunk == 0 or chunk > rows * length // 4) and config.vocab_size > 4096:
            change = (
                f"lower model.loss_chunk (now {chunk} tokens of logits at once)"
                if chunk
                else "unset model.loss_chunk (now 0: every logit at once; unset: 128 MiB of them)"
            )
            changes.insert(0, change)
        if rows > sharding.batch_shards(self.mesh):
            changes.insert(
                0,
                "leave eval.batch_tokens unset (windows per batch sized from "
                "eval.memory_budget) or lower it",
            )
        return what, ", ".join(changes[:-1]) + " or " + changes[-1]

    @property
    def param_count(self) -> int:
        """The model's parameters (numbers, over all devices)."""
        return sum(math.prod(x.shape) for x in jax.tree.leaves(self.state))

    @property
    def param_bytes(self) -> int:
        """Bytes of the parameters (the whole model state) one device holds."""
        return sum(
            math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
            for x in jax.tree.leaves(self.state)
        )

    def abstract_batch(
        self, rows: int, length: int, positions: bool = False
    ) -> dict[str, jax.ShapeDtypeStruct]:
        """The shapes, dtypes and shardings of a batch of ``rows`` windows of ``length`` tokens
        as :meth:`score` places it (``positions``: randomized positions too)."""
        fields = {"inputs": jnp.int32, "targets": jnp.int32, "mask": jnp.float32}
        if positions:
            fields["positions"] = jnp.int32
        shape = (rows, length)
        return {
            k: jax.ShapeDtypeStruct(shape, t, sharding=self._window_sharding(shape))
            for k, t in fields.items()
        }

    def rows(
        self,
        length: int,
        batch_tokens: int | None = None,
        memory_budget: int | None = None,
        positions: bool = False,
        windows: int | None = None,
    ) -> int:
        """Windows per batch at ``length``, a multiple of the ways a batch's rows are split.

        With ``batch_tokens`` (``eval.batch_tokens``): ``max(1, batch_tokens // length)``.
        Without: the most rows whose estimated memory fits ``memory_budget`` bytes per device
        and that the work of a batch needs (:func:`posenc.devices.budget.eval_rows`; None: no
        budget, the caps alone), then,
        while the compiled program (XLA's buffer assignment) needs more than the budget, fewer
        (the program for the rows chosen is compiled once, and the batches run it).
        ``positions``: the batches carry randomized positions; ``windows``: the windows to
        score, past which a sized batch takes no rows (only padding).
        """
        devices = sharding.batch_shards(self.mesh)
        if batch_tokens is not None:
            rows = max(1, batch_tokens // length)
            return -(-rows // devices) * devices  # a multiple of the device count
        rows = budget_lib.eval_rows(
            self.config, self.param_bytes, length, memory_budget, devices, self.param_count, windows
        )
        if memory_budget is None:
            return rows
        while True:
            batch = self.abstract_batch(rows, length, positions)
            need = fits.required_bytes(self._score.compile(self.state, batch, checked=False))
            if need is None or need <= memory_budget:
                return rows
            if rows == devices:
                break
            # Rows in proportion to the room over the parameters, and at least one fewer.
            room = max(0, memory_budget - self.param_bytes) / max(1, need - self.param_bytes)
            fewer = int(rows * room) // devices * devices
            rows = max(devices, min(rows - devices, fewer))
        # One window a device is over the budget: it runs if the device has the memory (the
        # check before the first batch refuses it otherwise), and says so.
        what, change = self._describe(self.state, batch)
        warnings.warn(
            f"{what} needs about {fits.gib(need)}, more than the evaluation's memory budget "
            f"({fits.gib(memory_budget)}, eval.memory_budget); to stay within it, {change}",
            BudgetWarning,
            stacklevel=2,
        )
        return rows

    def _score_batch(self, state, batch):
        model = nnx.merge(self.graphdef, state)
        with sharding.tracing_on(self.mesh):
            hidden = model.hidden_states(batch["inputs"], batch.get("positions"))
            # The logits a chunk at a time (model.loss_chunk), never all [B, L, V] of them.
            scored = model.token_losses(
                hidden, batch["targets"], correct=self.masked_lm is not None
            )
        mask = batch["mask"]
        losses = scored.loss  # [B, L]
        if self.masked_lm is None:
            return (losses * mask).sum(axis=0), mask.sum(axis=0)  # [L], [L]
        correct = scored.correct * mask  # [B, L]
        return (losses * mask).sum(axis=0), mask.sum(axis=0), correct.sum(axis=0)

    def _score_with_memory(self, state, batch, memory, mem_len):
        model = nnx.merge(self.graphdef, state)
        with sharding.tracing_on(self.mesh):
            hidden, memory = memory_lib.hidden_states(
                model, batch["inputs"], memory, mem_len=mem_len
            )
            losses = model.token_losses(hidden, batch["targets"]).loss  # [B, L]
        mask = batch["mask"]
        return (losses * mask).sum(axis=0), mask.sum(axis=0), memory

    def score_with_memory(
        self, segments: data_lib.MemorySegments, batch_size: int, mem_len: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-position ``(loss_sum, count)``, float64 ``[L]``, over the windows of ``segments``
        scored row by row in order with ``mem_len`` tokens of memory carried."""
        model = nnx.merge(self.graphdef, self.state)
        memory = memory_lib.empty_memory(model, batch_size)
        sums = [np.zeros(segments.length, np.float64) for _ in range(2)]
        for local in segments.iter_batches(batch_size, jax.process_index(), jax.process_count()):
            batch = {
                k: jax.make_array_from_process_local_data(self.batch_sharding, v)
                for k, v in local.items()
            }
            loss_sum, count, memory = self._score_memory(self.state, batch, memory, mem_len)
            for total, part in zip(sums, jax.device_get((loss_sum, count)), strict=True):
                total += part
        return tuple(sums)

    def compiled(self, rows: int, length: int) -> jax.stages.Compiled:
        """The scoring of ``rows`` windows of ``length`` tokens compiled as an evaluation
        compiles it, unchecked (``posenc plan`` reads its memory; cached for :meth:`score`)."""
        return self._score.compile(self.state, self.abstract_batch(rows, length), checked=False)

    def lower(self, rows: int, length: int) -> jax.stages.Lowered:
        """The scoring of ``rows`` windows of ``length`` tokens, lowered for the mesh without
        running it (``posenc plan``)."""
        return self._score.lower(self.state, self.abstract_batch(rows, length))

    def _window_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        """Where a batch field ``[rows, L, ...]`` goes: rows over ``data`` x ``fsdp`` and, when
        ``mesh.context`` divides ``L``, each window split over ``context`` (XLA gathers the
        keys and values each query block needs: context-parallel evaluation)."""
        context = self.mesh.shape["context"]
        if len(shape) < 2 or context == 1 or shape[1] % context:
            return self.batch_sharding
        return NamedSharding(self.mesh, sharding.batch_spec(self.mesh, length=True))

    def score(
        self,
        windows: data_lib.EvalWindows,
        batch_size: int,
        positions: Positions | None = None,
    ) -> tuple[np.ndarray, ...]:
        """Per-position ``(loss_sum, count)`` over all windows, float64 ``[L]`` each; with
        masked LM ``(loss_sum, count, correct)`` over the chosen tokens.

        Args:
          windows: the evaluation windows of one length.
          batch_size: windows per batch (a multiple of the device count).
          positions: randomized positions (one draw per batch, a function of the seed, the
            window length and the batch number); None: ``0 .. L - 1``.
        """
        sums = None
        batches = windows.iter_batches(
            batch_size,
            jax.process_index(),
            jax.process_count(),
            with_starts=self.masked_lm is not None,
        )
        for number, local in enumerate(batches):
            if self.masked_lm is not None:
                local = self.masked_lm.eval_batch(local, windows.length)
            if positions is not None:
                rows = local["inputs"].shape[0]
                local = {**local, "positions": positions.draw(number, rows, windows.length)}
            batch = {
                k: jax.make_array_from_process_local_data(self._window_sharding(v.shape), v)
                for k, v in local.items()
            }
            scored = jax.device_get(self._score(self.state, batch))
            if sums is None:
                sums = [np.zeros(windows.length, np.float64) for _ in scored]
            for total, part in zip(sums, scored, strict=True):
                total += part
        return tuple(sums)


def evaluate(
    model: Transformer,
    stream: np.ndarray,
    lengths: Sequence[int],
    *,
    mode: str = "nonoverlapping",
    stride: int | None = None,
    batch_tokens: int | None = None,
    memory_budget: int | str | None = None,
    max_tokens: int = 0,
    split: str = "validation",
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = False,
    positions: Positions | None = None,
    masked_lm: data_lib.MaskedLM | None = None,
    mem_len: int = 0,
    byte_level: bool = True,
) -> list[dict[str, Any]]:
    """Evaluates ``model`` on ``stream`` at each window length.

    Args:
      model: a trained model.
      stream: the token stream of the evaluation split.
      lengths: window lengths ``L``.
      mode: ``"nonoverlapping"`` or ``"sliding"``.
      stride: sliding mode's stride ``S <= L`` (tokens scored per window).
      batch_tokens: windows per batch = ``max(1, batch_tokens // L)`` rounded up to a multiple
        of the device count (padding windows are masked); None: sized from ``memory_budget``
        (:meth:`Scorer.rows`).
      memory_budget: what one device's evaluation batch may hold (parameters included) when
        ``batch_tokens`` is None: bytes, a size such as ``"8GB"`` (``eval.memory_budget``) or
        None for half the device's memory (:func:`posenc.devices.budget.memory_budget`).
      max_tokens: score at most this many tokens per length (0: all); reported honestly.
      split: name of the split, for messages.
      mesh: device mesh (:func:`posenc.devices.sharding.make_mesh`); default all devices along
        ``data``. Parameters are placed by :mod:`posenc.devices.sharding`'s rules, batch rows split
        over ``data`` x ``fsdp`` and, where ``context`` divides a length, each window over
        ``context``.
      progress: print one line per length.
      positions: randomized window positions (:class:`Positions`); None: ``0 .. L - 1``.
      masked_lm: score as a masked LM (see the module docstring); None: causal LM.
      mem_len: > 0: score consecutive windows with this much Transformer-XL memory carried
        (see the module docstring; non-overlapping causal LM only).
      byte_level: the stream holds byte tokens, so bits per byte are the loss in bits; False
        (a pretrained model's tokenizer): ``bits_per_byte`` is None.

    Returns:
      One dict per length (see the module docstring); a length the encoder cannot represent
      (a learned table shorter than ``L``) gets ``{"length": L, "error": message}``.
    """
    check_eval_lengths(len(stream), lengths, split)
    scorer = Scorer(model, mesh, masked_lm)
    devices = sharding.batch_shards(scorer.mesh)  # the ways a batch's rows are split
    if batch_tokens is None:
        memory_budget = budget_lib.memory_budget(memory_budget, scorer.param_bytes)
    results = []
    for length in lengths:
        try:
            # Randomized positions reach max_position - 1 whatever the window length.
            for _, encoding in layer_encodings(model):  # every layer's encoder, not only one
                encoding.check_length(positions.max_position if positions else length)
        except ValueError as e:
            results.append({"length": int(length), "error": str(e)})
            continue
        start = time.perf_counter()  # compiling included, as it always was
        if mem_len:
            if batch_tokens is None:  # with memory, the estimate alone
                batch = budget_lib.eval_rows(
                    scorer.config,
                    scorer.param_bytes,
                    length,
                    memory_budget,
                    devices,
                    scorer.param_count,
                )
            else:
                batch = scorer.rows(length, batch_tokens)
            windows = data_lib.memory_segments(stream, length, batch, max_tokens)
            batch = -(-windows.rows // devices) * devices  # no batch rows without a part
            loss_sum, count = scorer.score_with_memory(windows, batch, mem_len)
            correct = []
        else:
            step = length if mode == "nonoverlapping" else stride
            windows = data_lib.eval_windows(
                stream, length, stride=step, max_windows=_max_windows(length, step, max_tokens)
            )
            batch = scorer.rows(
                length, batch_tokens, memory_budget, positions is not None, windows.num_windows
            )
            loss_sum, count, *correct = scorer.score(windows, batch, positions)
        seconds = time.perf_counter() - start
        tokens = int(count.sum())
        if masked_lm is not None:
            results.append(_masked_result(windows, loss_sum, count, correct[0], seconds))
            if progress and jax.process_index() == 0:
                r = results[-1]
                print(
                    f"  L={length:>6}: masked loss {r['loss']:.4f}  accuracy {r['accuracy']:.4f}  "
                    f"({tokens} masked tokens, {seconds:.1f}s)",
                    flush=True,
                )
            continue
        if tokens != windows.scored_tokens:
            raise AssertionError(f"scored {tokens} tokens, expected {windows.scored_tokens}")
        loss = float(loss_sum.sum() / tokens)
        by_position = np.where(count > 0, loss_sum / np.maximum(count, 1), np.nan)
        result = {
            "length": int(length),
            "tokens": tokens,
            "loss": loss,
            "perplexity": perplexity(loss),
            # Byte-level tokens: one token per byte (a document separator counts as one).
            "bits_per_byte": loss / math.log(2) if byte_level else None,
            "windows": int(_num_windows(windows)),
            **_unscored(windows),
            "seconds": seconds,
            "loss_by_position": [None if np.isnan(x) else round(float(x), 5) for x in by_position],
        }
        if mem_len:
            result.update(mem_len=int(mem_len), rows=int(windows.rows))
        results.append(result)
        if progress and jax.process_index() == 0:
            bpb = f"bpb {result['bits_per_byte']:.4f}  " if byte_level else ""
            print(
                f"  L={length:>6}: loss {loss:.4f}  ppl {result['perplexity']:.3f}  "
                f"{bpb}({tokens} tokens, {seconds:.1f}s)",
                flush=True,
            )
    return results


def _unscored(windows: data_lib.EvalWindows | data_lib.MemorySegments) -> dict[str, int]:
    """The split's tokens a length leaves unscored: all of them, and those because of
    ``eval.max_tokens`` (the rest is the tail too short for another window)."""
    return {
        "unscored_tokens": int(windows.dropped_tokens),
        "unscored_by_max_tokens": int(windows.capped_tokens),
    }


def _num_windows(windows: data_lib.EvalWindows | data_lib.MemorySegments) -> int:
    if isinstance(windows, data_lib.MemorySegments):
        return windows.rows * windows.segments
    return windows.num_windows


def _masked_result(windows, loss_sum, count, correct, seconds) -> dict[str, Any]:
    """One length's masked-LM report from per-position float64 sums."""
    tokens = int(count.sum())
    loss = float(loss_sum.sum() / tokens) if tokens else math.nan
    by_position = np.where(count > 0, loss_sum / np.maximum(count, 1), np.nan)
    return {
        "length": int(windows.length),
        "tokens": tokens,  # the masked (chosen) tokens scored
        "loss": loss,
        "perplexity": perplexity(loss),
        "accuracy": float(correct.sum() / tokens) if tokens else math.nan,
        "correct": int(correct.sum()),
        "windows": int(windows.num_windows),
        "window_tokens": int(windows.scored_tokens),  # tokens in the scored positions
        **_unscored(windows),
        "seconds": seconds,
        "loss_by_position": [None if np.isnan(x) else round(float(x), 5) for x in by_position],
    }


def random_positions(config: ml_collections.ConfigDict) -> Positions | None:
    """The evaluation's randomized positions (``eval.positions``), or None for contiguous
    ones."""
    if eval_positions(config) != "randomized":
        return None
    return Positions(seed=config.seed, max_position=config.train.max_position)
