"""A Hugging Face config's rotary embedding (``rope_theta``, ``partial_rotary_factor`` and
``rope_scaling`` / ``rope_parameters``) as posenc's ``rope`` encoder hyperparameters, and back.

Both spellings are read: transformers 4's ``rope_theta`` and ``rope_scaling`` beside the other
fields (as Hub configs have them; GPT-NeoX's ``rotary_emb_base`` and ``rotary_pct``), and
transformers 5's ``rope_parameters`` dict. Every scaling type maps onto a scaling of posenc's
RoPE, so ``posenc eval``'s scaling overrides apply to imported models as to trained ones:

==============  ===========================================================================
rope_type       posenc ``encoding.hparams``
==============  ===========================================================================
default         ``scaling=None``
linear          ``scaling="linear", factor``
dynamic         ``scaling="dynamic", factor, original_max_len=max_position_embeddings``
yarn            ``scaling="yarn", factor, original_max_len, beta_fast, beta_slow,
                attention_factor`` (``mscale``/``mscale_all_dim`` folded into it)
llama3          ``scaling="llama3", factor, original_max_len, low_freq_factor, high_freq_factor``
longrope        ``scaling="longrope", short_factor, long_factor, original_max_len, factor,
                attention_factor``
==============  ===========================================================================

When a config holds both, a non-empty ``rope_scaling`` replaces ``rope_parameters`` whole, as in
transformers 5 (its base too: the base is then ``rope_scaling``'s, else the field beside it, else
10000); ``tests/hf/rope_golden.json`` records transformers' own reading of such configs. A type,
factor or key transformers rejects or warns about is refused in one line.

Export writes the transformers 4 spelling, which transformers 4 and 5 both read; posenc's
static ``ntk`` has no rope_type and is written as the ``rope_theta`` it amounts to.
"""

from __future__ import annotations

import math
from typing import Any

from posenc.encodings.rope import rotary_dims
from posenc.hf.fields import HFConfig

# The keys each rope_type must carry (transformers' _validate_<type>_rope_parameters: a config
# without them is a KeyError there; only LongRoPE derives its factor from the lengths).
_REQUIRED = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor"},
    "longrope": {"short_factor", "long_factor"},
}
# The keys each rope_type may carry besides rope_type/type, rope_theta, partial_rotary_factor.
_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor", "original_max_position_embeddings"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "longrope": {
        "short_factor",
        "long_factor",
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
    },
}


def read_rope(
    hf: HFConfig,
    head_dim: int,
    max_len: int,
    *,
    theta_key: str = "rope_theta",
    fraction_key: str = "partial_rotary_factor",
    fraction_default: float = 1.0,
    params: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], int]:
    """posenc ``rope`` hyperparameters and the training length of a config's rotary embedding.

    Args:
      hf: the config being read.
      head_dim: the attention head width.
      max_len: the config's ``max_position_embeddings``.
      theta_key, fraction_key, fraction_default: the family's legacy names and default for the
        base and the rotated fraction (GPT-NeoX: ``rotary_emb_base``, ``rotary_pct``, 0.25).
      params: the rope parameters to read (one layer type's entry of a ``rope_parameters``
        nested by layer type, :func:`posenc.hf.layer_types.read_rope_by_type`); None: the
        config's own (``rope_scaling`` or ``rope_parameters``).

    Returns:
      ``(hparams, train_len)``: ``train_len`` is the scaling's
      ``original_max_position_embeddings`` when it has one, else ``max_len``.
    """
    params = _effective(hf) if params is None else dict(params)
    kind = params.pop("rope_type") if "rope_type" in params else params.get("type", "default")
    params.pop("type", None)
    # rope_parameters' own base and fraction come first, then the fields beside it, then the
    # family's defaults (transformers' convert_rope_params_to_dict: setdefault).
    base = params.pop("rope_theta", None)
    base = hf.take(theta_key, 10000.0) if base is None else base
    fraction = params.pop("partial_rotary_factor", None)
    fraction = hf.take(fraction_key, fraction_default) if fraction is None else fraction
    hf.ignore(theta_key, fraction_key)  # a copy of what rope_parameters says, when it is there
    if not isinstance(kind, str) or kind not in _KEYS:
        raise ValueError(
            f"{hf.source}: rope_scaling type {kind!r} is not supported by posenc's import "
            f"(supported: {', '.join(_KEYS)})"
        )
    unknown = sorted(set(params) - _KEYS[kind])
    if unknown:
        raise ValueError(
            f"{hf.source}: rope_scaling key {unknown[0]!r} of type {kind!r} is not supported by "
            f"posenc's import (it reads {sorted(_KEYS[kind]) or 'no other keys'})"
        )
    missing = sorted(_REQUIRED[kind] - set(k for k, v in params.items() if v is not None))
    if missing:
        raise ValueError(
            f"{hf.source}: rope_scaling of type {kind!r} has no {missing[0]!r} (transformers "
            f"requires {sorted(_REQUIRED[kind])}); add it to config.json"
        )
    for key in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow"):
        _check_number(hf, kind, key, params.get(key), at_least=1.0 if key == "factor" else 0.0)
    _check_number(hf, kind, "rope_theta", base, at_least=0.0)
    _check_number(hf, kind, "partial_rotary_factor", fraction, at_least=0.0)
    rotated = int(head_dim * fraction)
    if rotated != rotary_dims(head_dim, fraction) or rotated < 2:
        raise ValueError(
            f"{hf.source}: a partial rotary factor of {fraction} rotates {rotated} channels of "
            f"{head_dim}; posenc's RoPE rotates an even number of channels (at least 2)"
        )
    hparams: dict[str, Any] = {"base": float(base), "layout": "half"}
    if fraction != 1.0:
        hparams["fraction"] = float(fraction)
    # Phi-3 states it beside the other fields too; the two must agree when both are given.
    stated = hf.take("original_max_position_embeddings", None)
    original = params.get("original_max_position_embeddings")
    if original is not None and stated is not None and original != stated:
        raise ValueError(
            f"{hf.source}: original_max_position_embeddings is {stated!r} beside the other "
            f"fields and {original!r} in the rope scaling; make them agree"
        )
    original = original if original is not None else stated if stated is not None else max_len
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ValueError(
            f"{hf.source}: original_max_position_embeddings={original!r} must be a positive "
            "integer (the length the model was trained at)"
        )
    if kind == "default":
        return hparams, max_len
    hparams["scaling"] = kind
    if kind == "linear":
        hparams["factor"] = float(params["factor"])
        return hparams, max_len
    if kind == "dynamic":  # transformers scales from max_position_embeddings
        hparams.update(factor=float(params["factor"]), original_max_len=int(max_len))
        return hparams, max_len
    hparams["original_max_len"] = int(original)
    factor = params.get("factor") or max_len / original  # longrope only: factor is optional
    hparams["factor"] = float(factor)
    if kind == "yarn":
        if params.get("truncate", True) is not True:
            raise ValueError(
                f"{hf.source}: rope_scaling truncate=false (YaRN without rounding the ramp's "
                "boundaries) is not supported by posenc's RoPE"
            )
        hparams["beta_fast"] = float(params.get("beta_fast") or 32.0)
        hparams["beta_slow"] = float(params.get("beta_slow") or 1.0)
        hparams["attention_factor"] = _yarn_attention(params, factor)
    elif kind == "llama3":
        hparams["low_freq_factor"] = float(params["low_freq_factor"])
        hparams["high_freq_factor"] = float(params["high_freq_factor"])
    else:  # longrope
        for key in ("short_factor", "long_factor"):
            values = params[key]
            if not isinstance(values, list) or not all(_is_number(x) for x in values):
                raise ValueError(
                    f"{hf.source}: rope_scaling {key}={values!r} must be a list of numbers"
                )
            hparams[key] = tuple(float(x) for x in values)
        if params.get("attention_factor") is not None:
            hparams["attention_factor"] = float(params["attention_factor"])
    return hparams, int(original)


def _effective(hf: HFConfig) -> dict[str, Any]:
    """The rope scaling transformers 5 uses: ``rope_scaling`` when it is non-empty (it
    replaces ``rope_parameters`` whole, base included: ``convert_rope_params_to_dict``'s
    ``rope_scaling or rope_parameters``), else ``rope_parameters``; tests/hf/rope_golden.json
    records transformers' own reading of each case. A copy, refused unless an object."""
    new, old = hf.take("rope_parameters", None), hf.take("rope_scaling", None)
    for key, value in (("rope_scaling", old), ("rope_parameters", new)):
        if value is not None and not isinstance(value, dict):
            raise ValueError(
                f"{hf.source}: config.json {key} must be an object (rope_type, factor, ...), "
                f"got {type(value).__name__} {value!r}"
            )
    return dict(old or new or {})


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_number(hf: HFConfig, kind: str, key: str, value: Any, at_least: float) -> None:
    """Refuses a rope field that is not a finite number (``"2"``, ``true``) or is below
    ``at_least`` (a factor under 1, a negative base); None is left to the caller's default."""
    if value is None:
        return
    if not _is_number(value) or value < at_least or (at_least == 0.0 and value == 0):
        bound = f">= {at_least:g}" if at_least else "> 0"
        raise ValueError(
            f"{hf.source}: rope {key}={value!r} (type {kind!r}) must be a number {bound}"
        )


def _yarn_attention(params: dict[str, Any], factor: float) -> float:
    """transformers' YaRN attention factor: given, or ``mscale(s, m) / mscale(s, m_all)``."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if m and m_all:
        return mscale(factor, m) / mscale(factor, m_all)
    return mscale(factor)


def write_rope(
    hparams: dict[str, Any],
    head_dim: int,
    *,
    theta_key: str = "rope_theta",
    fraction_key: str | None = "partial_rotary_factor",
) -> tuple[dict[str, Any], int | None]:
    """The config fields of posenc ``rope`` hyperparameters (transformers 4's spelling) and the
    ``max_position_embeddings`` a dynamic scaling needs (None: the caller chooses)."""
    h = dict(hparams)
    scaling = h.get("scaling")
    base = float(h.get("base", 10000.0))
    out: dict[str, Any] = {}
    fraction = h.get("fraction", 1.0)
    if fraction_key is not None:
        out[fraction_key] = fraction
    d = rotary_dims(head_dim, fraction)
    if scaling == "ntk":  # static NTK is a base
        base = base * h.get("factor", 1.0) ** (d / (d - 2))
        scaling = None
    out[theta_key] = base
    if scaling is None:
        return out, None
    rope: dict[str, Any] = {"rope_type": scaling, "factor": float(h.get("factor", 1.0))}
    max_len = None
    if scaling == "dynamic":
        max_len = h["original_max_len"]
    elif scaling != "linear":
        rope["original_max_position_embeddings"] = h["original_max_len"]
    if scaling == "yarn":
        rope.update(beta_fast=h.get("beta_fast", 32.0), beta_slow=h.get("beta_slow", 1.0))
        if h.get("attention_factor") is not None:
            rope["attention_factor"] = h["attention_factor"]
    elif scaling == "llama3":
        rope.update(
            low_freq_factor=h.get("low_freq_factor", 1.0),
            high_freq_factor=h.get("high_freq_factor", 4.0),
        )
    elif scaling == "longrope":
        rope.update(short_factor=list(h["short_factor"]), long_factor=list(h["long_factor"]))
        if h.get("attention_factor") is not None:
            rope["attention_factor"] = h["attention_factor"]
    out["rope_scaling"] = rope
    return out, max_len
