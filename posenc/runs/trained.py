"""A trained run from Python: :func:`load_run` is the one public entry point ("load this run").

    import posenc

    run = posenc.load_run("runs/rope")              # the newest intact checkpoint's parameters
    tokens = run.encode("def add(a, b):\n")         # int32 [T], one token per byte
    logits = run.logits(tokens)                     # float32 [T, V]
    losses = run.token_losses(tokens)               # float32 [T - 1], nats
    yarn = posenc.load_run("runs/rope", overrides={"encoding.hparams.scaling": "yarn", ...})
    yarn.evaluate(lengths=[64, 512])                # eval-<changes>.json, as `posenc eval` writes

A :class:`TrainedRun` holds the run's config (with the overrides applied), the changes they make
to it, the model with the checkpoint's parameters, and the step it was saved at. Overrides may
change only what `posenc eval` may (:func:`posenc.runs.config.evaluation_changes`: the ``eval``
section, the attention path, the encoder's ``eval_safe_hparams`` such as RoPE's scaling);
anything that would change what was trained is refused with the field named. Nothing is
written except by :meth:`TrainedRun.evaluate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from posenc import kinds
from posenc.data.hf_tokenizer import make_tokenizer
from posenc.models.build import assembly
from posenc.models.lm import Transformer
from posenc.models.restore import restore_model
from posenc.runs.config import (
    apply_overrides,
    evaluation_changes,
    open_source,
    set_field,
    validate,
)
from posenc.runs.evaluate import evaluate_workdir
from posenc.workdir import RunDir

__all__ = ["TrainedRun", "load_run"]


class TrainedRun:
    """A trained run, loaded (see the module docstring).

    Attributes:
      workdir: the run's work directory.
      config: the config the model is built with: the run's, with the overrides applied.
      changes: ``{dotted field: value}`` the overrides change (empty: the run's own settings).
      model: the model with the checkpoint's parameters: the decoder-only (or masked-LM)
        :class:`posenc.models.lm.Transformer`, a translation run's
        :class:`~posenc.models.encdec.EncoderDecoder` (``model(source, target)``) or a
        classification run's :class:`~posenc.models.classifier.Classifier`
        (``model(tokens, segments, mask)``).
      step: the checkpoint's step.
      finished: whether training had finished at that step.
      tokenizer: the run's tokenizer (``data.tokenizer``; bytes: ids 0..255, 256 separates
        documents; a pretrained model's own after ``posenc import-hf``).
    """

    def __init__(
        self,
        workdir: str,
        config: ml_collections.ConfigDict,
        changes: dict[str, Any],
        model: Any,
        step: int,
    ):
        self.workdir = workdir
        self.config = config
        self.changes = changes
        self.model = model
        self.step = step
        self.finished = step == config.train.steps
        self.tokenizer = make_tokenizer(config.data.get("tokenizer", "bytes"))
        graphdef, self._state = nnx.split(model)
        self._forward = jax.jit(lambda state, t, p: nnx.merge(graphdef, state)(t, p))
        self._losses = jax.jit(lambda state, t, p: _window_losses(nnx.merge(graphdef, state), t, p))

    def __repr__(self) -> str:
        changed = f", changes={self.changes}" if self.changes else ""
        name = self.config.encoding.name
        return f"TrainedRun({self.workdir!r}, {name}, step {self.step}{changed})"

    def encode(self, text: str) -> np.ndarray:
        """``text`` as int32 token ids ``[T]``."""
        return self.tokenizer.encode(text).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Token ids ``[T]`` as text (document separators shown as ``<|sep|>``)."""
        return self.tokenizer.decode(np.asarray(ids))

    def split_tokens(self, split: str = "validation") -> np.ndarray:
        """The token stream of a split of the run's data (``[N]``, memory-mapped)."""
        return open_source(self.config).split_stream(split)

    def logits(self, tokens: Any, positions: Any = None) -> np.ndarray:
        """The model's logits over one window (no memory).

        Args:
          tokens: ``[T]`` or ``[B, T]`` integer token ids.
          positions: ``[T]`` or ``[B, T]`` integer positions; default ``0 .. T - 1`` (a run
            trained with randomized positions may want its own).

        Returns:
          float32 ``[T, V]`` (or ``[B, T, V]``): causal runs predict the next token at every
          position, masked-LM runs each position's own token.
        """
        if not isinstance(self.model, Transformer):
            kind = type(self.model).__name__
            raise ValueError(
                f"{self.workdir} holds a {kind} (model.assembly={assembly(self.config)!r}), "
                "whose inputs are not one token window; call run.model directly"
            )
        tokens = np.asarray(tokens)
        batch = tokens if tokens.ndim == 2 else tokens[None]
        if positions is not None:
            positions = jnp.asarray(positions, jnp.int32)
        out = np.asarray(self._forward(self._state, jnp.asarray(batch, jnp.int32), positions))
        return out if tokens.ndim == 2 else out[0]

    def token_losses(self, tokens: Any, positions: Any = None) -> np.ndarray:
        """Per-token loss in nats over one window of a causal run: entry ``t`` is the loss of
        token ``t + 1`` given tokens ``0 .. t`` (``[T]`` -> ``[T - 1]``, or ``[B, T]`` ->
        ``[B, T - 1]``), as the evaluation scores a window's targets.

        Raises:
          ValueError: a masked-LM run (its loss is over masked tokens: use :meth:`evaluate`).
        """
        kind = kinds.kind_of(self.config)
        if not kind.predicts_next:
            raise ValueError(
                f"{self.workdir} is a {kind.objective} run: next-token losses are not "
                "its loss; use run.evaluate() (masked tokens, as it was trained) or run.logits()"
            )
        if not isinstance(self.model, Transformer):
            self.logits(tokens, positions)  # the one-line refusal of a model of another shape
        tokens = np.asarray(tokens)
        batch = jnp.asarray(tokens if tokens.ndim == 2 else tokens[None], jnp.int32)
        if positions is not None:
            positions = jnp.asarray(positions, jnp.int32)
        out = np.asarray(self._losses(self._state, batch, positions))
        return out if tokens.ndim == 2 else out[0]

    def evaluate(self, lengths: Sequence[int] | None = None, progress: bool = False) -> dict:
        """Evaluates this model as ``posenc eval`` does (every window of the split, exact sums)
        under this run's changes and ``lengths`` (default the config's), writing the report
        beside the run (``eval.json`` for its own settings, else ``eval-<changes>.json``), where
        ``posenc report`` finds it. Returns the report."""
        config = self.config
        if lengths is not None:
            config = apply_overrides(config, [f"eval.lengths={tuple(int(n) for n in lengths)!r}"])
        return evaluate_workdir(
            self.workdir, overrides=config, progress=progress, model=self.model, step=self.step
        )


def load_run(workdir: str, overrides: Mapping[str, Any] | Sequence[str] = ()) -> TrainedRun:
    """Loads a trained run: its config and the parameters of its newest intact checkpoint.

    Args:
      workdir: a work directory written by ``posenc train`` (or a sweep point).
      overrides: evaluation-time changes, ``{"encoding.hparams.scaling": "yarn", ...}`` or
        ``["encoding.hparams.scaling=yarn", ...]`` as on the command line.

    Returns:
      The :class:`TrainedRun`.

    Raises:
      posenc.workdir.WorkdirError: not a work directory, or no intact checkpoint.
      ValueError: an override that would change what was trained, or an invalid value.
    """
    run = RunDir(workdir)
    trained = run.read_config()
    if isinstance(overrides, Mapping):
        config = apply_overrides(trained, [])  # a copy
        for key, value in overrides.items():
            set_field(config, key, value)
    else:
        config = apply_overrides(trained, overrides)
    changes = evaluation_changes(trained, config)
    validate(config)
    model, step = restore_model(run, config)
    return TrainedRun(workdir, config, changes, model, step)


def _window_losses(model: Transformer, tokens: jax.Array, positions: jax.Array | None) -> jax.Array:
    """``[B, T - 1]`` next-token losses over windows ``[B, T]``, the logits formed a chunk at a
    time (``model.loss_chunk``)."""
    hidden = model.hidden_states(tokens, positions)[:, :-1]  # the last position predicts nothing
    return model.token_losses(hidden, tokens[:, 1:]).loss
