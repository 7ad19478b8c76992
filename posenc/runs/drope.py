"""DroPE: continue a trained run with its positional encoder dropped (``train.drop_positions``).

Gelberg, Eguchi, Akiba and Cetin, *Extending the Context of Pretrained LLMs by Dropping Their
Positional Embeddings* (ICLR 2026; arXiv:2512.12167; code: github.com/SakanaAI/DroPE). A model
pretrained with RoPE has every rotation removed (NoPE) and is trained on for a short
*recalibration* at its original length and on its own data; it is then evaluated past that
length with no long-context training. The recipe is not an encoder but a way to start a run:
``posenc train --init-from RUN --drop-positions`` (:func:`drop_positions` on the config).

What :func:`drop_positions` changes, and what :func:`check` holds a run to:

- the run's encoder (``config.encoding``) and every layer kind's own encoder
  (``layers.kinds.<kind>.encoding``) become ``nope``, their hyperparameters cleared;
- ``train.init_from`` must name the run whose parameters it continues from, and the source's
  encoder parameters (:class:`~posenc.layers.params.EncoderParam`: FIRE's MLP, T5's table, a
  learned absolute table, ...) are left behind; RoPE has none, so DroPE from RoPE starts from
  every parameter of the source;
- any other change of shape is refused as without the flag (parameters the source lacks, a
  wider model, QK-norm scales: DroPE's ``qk_norm_nope`` variant is not this recipe);
- ``init.json`` records the source's encoder and the parameters left behind, and
  ``posenc report`` labels the run ``nope (DroPE from rope)``.

Without the flag, ``--init-from`` keeps its rule (the parameters must fit, encoder or not: RoPE's
weights may train on under ALiBi); a source whose encoder parameters are all that does not fit
a NoPE run is refused with a pointer to ``--drop-positions``.

The recalibration's budget, learning rate and length are the run's config (``train.steps``,
``optim.*``, ``train.seq_len``); ``experiments/drope.py`` sets them as the paper does.
"""

from __future__ import annotations

from typing import Any

import ml_collections

__all__ = ["NOPE", "check", "drop_positions", "dropped_from", "source_encoders"]

# The encoder a DroPE run continues with.
NOPE = "nope"
# The flag and field that allow the encoder change, as messages name them.
FLAG = "--drop-positions (train.drop_positions=True)"


def drop_positions(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` (a copy) continuing with no positional encoder: ``train.drop_positions=True``,
    ``encoding`` NoPE and every layer kind's own encoder NoPE, hyperparameters cleared.

    ``train.init_from`` (the run whose positions are dropped) is left as it is; :func:`check`
    refuses a DroPE config without one.
    """
    fields = config.to_dict()
    fields["train"]["drop_positions"] = True
    fields["encoding"] = {"name": NOPE, "hparams": {}}
    for kind in (fields.get("layers") or {}).get("kinds", {}).values():
        if kind.get("encoding") is not None:
            kind["encoding"] = NOPE
            kind["hparams"] = {}
    out = ml_collections.ConfigDict(fields, type_safe=True)
    out.lock()
    return out


def check(config: ml_collections.ConfigDict) -> None:
    """One-line refusals of a DroPE config (``train.drop_positions=True``) that does not say
    what DroPE does: no ``train.init_from``, or an encoder other than NoPE."""
    t = config.train
    if not t.get("drop_positions"):
        return
    if not t.get("init_from"):
        raise ValueError(
            "train.drop_positions=True continues another run with its positional encoder "
            "dropped; name that run with --init-from RUN (train.init_from)"
        )
    named = {"encoding.name": config.encoding.name}
    for name, kind in _kinds(config).items():
        if kind.get("encoding") is not None:
            named[f"layers.kinds.{name}.encoding"] = kind["encoding"]
    other = {field: value for field, value in named.items() if value != NOPE}
    if other:
        field, value = next(iter(other.items()))
        raise ValueError(
            f"train.drop_positions=True continues with encoding {NOPE!r}, got {field}={value!r}; "
            "--drop-positions sets every encoder to nope (drop the other encoder override), or "
            "leave the flag out to fine-tune with an encoder whose parameters fit"
        )
    if config.encoding.get("hparams"):
        raise ValueError(
            "train.drop_positions=True continues with encoding 'nope', which takes no "
            f"encoding.hparams (got {sorted(config.encoding.hparams.keys())})"
        )


def source_encoders(config: ml_collections.ConfigDict) -> list[str]:
    """The positional encoders of a run's config, the run's first, then each layer kind's own
    (``["rope"]``; ``["rope", "nope"]`` for a pattern with NoPE layers), without repeats."""
    names = [config.encoding.name]
    names += [k["encoding"] for k in _kinds(config).values() if k.get("encoding") is not None]
    return list(dict.fromkeys(names))


def dropped_from(record: dict[str, Any] | None) -> str | None:
    """The source encoders a run's ``init.json`` says were dropped (``"rope"``, or
    ``"rope+nope"`` for several), None for a run that was not DroPE-continued."""
    dropped = (record or {}).get("drop_positions")
    if not dropped:
        return None
    return "+".join(dropped["encoders"])


def _kinds(config: ml_collections.ConfigDict) -> dict[str, Any]:
    layers = config.get("layers")
    kinds = layers.get("kinds") if layers is not None else None
    return {name: kind.to_dict() for name, kind in kinds.items()} if kinds else {}
