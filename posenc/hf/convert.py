"""Hugging Face tensors into a posenc model and back, one tensor at a time.

:func:`build` makes the model a :class:`~posenc.hf.family.Spec` describes without drawing any
parameter (``nnx.eval_shape``); :func:`fill` streams the checkpoint's tensors into it through the
family's rules: each tensor is read, its shape asserted against the config, converted, cast to the
parameter dtype and placed on the device before the next is read, so the host never holds more
than one tensor beside the model. Given a mesh, each parameter goes straight into its shards
(:func:`posenc.devices.sharding.named_sharding` of its axis names: the placement training uses),
each device receiving only its slice, so no device ever holds a whole copy of a sharded parameter.
Every parameter must be filled exactly once and every tensor used (or one the family knows
transformers ignores), else a one-line error names it.
:func:`hf_tensors` runs the rules backwards for export.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc import encodings
from posenc.devices import sharding as sharding_lib
from posenc.hf.family import Family, Path, Rule, Spec
from posenc.hf.tensors import TensorReader
from posenc.models.build import kinds_of
from posenc.models.encdec import EncoderDecoder
from posenc.models.lm import Transformer

_ASSEMBLIES = {"lm": Transformer, "encoder_decoder": EncoderDecoder}


def build(spec: Spec, dtype: str | None = None) -> tuple[Any, Any, Any]:
    """The abstract model of ``spec`` (compute dtype ``dtype``, default the spec's), split as
    ``(graphdef, params, rest)``."""
    config = spec.model if dtype is None else dataclasses.replace(spec.model, dtype=dtype)
    encoding = encodings.get(spec.encoding, **spec.hparams)
    cls = _ASSEMBLIES[spec.assembly]
    layers = kinds_of(spec.pattern, spec.kinds, config, spec.assembly)
    kwargs = {"layers": layers} if layers else {}
    abstract = nnx.eval_shape(lambda: cls(config, encoding, rngs=nnx.Rngs(0), **kwargs))
    return nnx.split(abstract, nnx.Param, ...)


def _name(path: Path) -> str:
    return ".".join(str(p) for p in path)


def fill(
    family: Family,
    spec: Spec,
    reader: TensorReader,
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    sharding: jax.sharding.Sharding | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> Transformer | EncoderDecoder:
    """The model of ``spec`` with the checkpoint's parameters (module docstring).

    Args:
      family: the family that read ``spec``.
      spec: the model.
      reader: the checkpoint's tensors.
      dtype: compute dtype (default the spec's).
      param_dtype: the parameters' dtype; None keeps posenc's float32.
      sharding: where each parameter is placed as it is read (e.g. a mesh's replicated
        ``NamedSharding``); None: the default device.
      mesh: place each parameter in its shards on this mesh, as the sharding rules say for its
        axis names (instead of ``sharding``).

    Raises:
      ValueError: a tensor is missing, has another shape than the config says, or is not used.
    """
    if sharding is not None and mesh is not None:
        raise ValueError("give fill() a sharding for every parameter or a mesh, not both")
    graphdef, params, rest = build(spec, dtype)
    slots = dict(nnx.to_flat_state(params))
    filled: dict[Path, Any] = {}
    target = jnp.dtype(param_dtype or "float32")
    rules = family.rules(spec)
    names = reader.names()
    for rule in rules:
        arrays = [
            _read(reader, family, name, shape)
            for name, shape in ((rule.hf, rule.shape), *rule.also)
        ]
        for path, value in zip(rule.paths, rule.load(*arrays), strict=True):
            slot = slots.get(path)
            if slot is None or path in filled:
                raise RuntimeError(f"{family.name} maps {rule.hf!r} onto {_name(path)}, twice")
            if tuple(value.shape) != tuple(slot.shape):
                raise RuntimeError(f"{rule.hf!r} -> {_name(path)}: {value.shape} != {slot.shape}")
            filled[path] = slot.replace(
                _place(np.asarray(value).astype(target), slot, sharding, mesh)
            )
        del arrays
    read = {r.hf for r in rules} | {name for r in rules for name, _ in r.also}
    unused = sorted(n for n in names - read if not n.endswith(family.ignored_suffixes))
    if unused:
        raise ValueError(
            f"{reader.folder}: the checkpoint has tensors the config does not describe "
            f"({family.name}), e.g. {unused[:3]}; is config.json the one of these weights?"
        )
    missing = sorted(_name(p) for p in slots if p not in filled)
    if missing:
        raise RuntimeError(f"{family.name}'s rules leave posenc parameters unset: {missing[:3]}")
    state = nnx.from_flat_state([(p, filled[p]) for p in slots])
    return nnx.merge(graphdef, state, rest)


def _place(
    value: np.ndarray,
    slot: nnx.Variable,
    sharding: jax.sharding.Sharding | None,
    mesh: jax.sharding.Mesh | None,
) -> jax.Array:
    """``value`` (on the host) as the parameter ``slot``'s device array: in its shards on
    ``mesh`` (each device is sent its own slice: no device holds the whole of a sharded
    parameter, and every process fills only its devices), else at ``sharding``."""
    if mesh is None:
        return jax.device_put(value, sharding)
    placement = sharding_lib.named_sharding(
        slot.get_metadata().get(sharding_lib.AXES), value.shape, mesh
    )
    return jax.make_array_from_callback(value.shape, placement, lambda index: value[index])


# The dtypes of a checkpoint's tensors that hold the weights themselves; any other (int8, uint8,
# float8 with its scales in other tensors) is a quantized encoding of them.
_FLOATS = ("float32", "bfloat16", "float16", "float64")


def _read(reader: TensorReader, family: Family, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Tensor ``name`` as float32, refused in one line when missing or of another shape."""
    if name not in reader.names():
        raise ValueError(
            f"{reader.folder}: the checkpoint has no tensor {name!r}, which the config "
            f"({family.name}) needs"
        )
    array = reader.read(name)
    if array.dtype.name not in _FLOATS:
        raise ValueError(
            f"{reader.folder}: tensor {name!r} is {array.dtype}, not float32, bfloat16 or "
            "float16: a quantized checkpoint, which posenc does not import (dequantize it first)"
        )
    if tuple(array.shape) != shape:
        raise ValueError(
            f"{reader.folder}: tensor {name!r} has shape {tuple(array.shape)}, the config "
            f"({family.name}) says {shape}"
        )
    return array.astype(np.float32)


def hf_tensors(
    family: Family, spec: Spec, params: Any, dtype: str = "float32"
) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, array)`` of every Hugging Face tensor of a posenc model's parameters, in
    ``dtype`` (export).

    Args:
      family: the family to write.
      spec: the model (``family.fits(spec)`` is empty).
      params: the model's ``nnx.Param`` state.
      dtype: the dtype written (``"float32"``, ``"bfloat16"``, ``"float16"``).
    """
    flat = dict(nnx.to_flat_state(params))
    rules: list[Rule] = family.export_rules(spec)
    used = {p for r in rules for p in r.paths}
    left = sorted(_name(p) for p in flat if p not in used)
    if left:
        raise RuntimeError(f"{family.name} writes no tensor for posenc parameters {left[:3]}")
    for rule in rules:
        array = rule.save(*(np.asarray(flat[p].get_value(), np.float32) for p in rule.paths))
        if tuple(array.shape) != rule.shape:
            raise RuntimeError(f"{rule.hf}: wrote {array.shape}, the config says {rule.shape}")
        yield rule.hf, array.astype(jnp.dtype(dtype))
