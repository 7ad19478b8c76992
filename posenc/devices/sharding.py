"""Logical axis names -> mesh axes: the one table of sharding rules, and the device mesh.

The model's parts name the axes of every parameter they make (metadata ``axes``:
:mod:`posenc.layers.params`); only this module knows the mesh. The mesh has four named axes,
their sizes from the config's ``mesh`` section (``-1``: the devices the others leave):

==========  =========================================================================
``data``    data parallelism: batch rows; parameters replicated along it
``fsdp``    fully sharded data parallelism (ZeRO-3): batch rows *and* the ``embed`` axis of
            every parameter, its gradient and its optimizer moments; XLA gathers each
            layer's weights where they are used
``context`` the sequence axis of long evaluation windows (context parallelism)
``tensor``  tensor parallelism (Megatron): attention heads, MLP hidden units and the vocabulary
==========  =========================================================================

:data:`RULES` maps logical names to mesh axes, as MaxText's ``logical_axis_rules`` and
Levanter's axis mappings do. A mesh axis of size 1 is dropped from every spec, so the default
mesh (every device on ``data``) places everything exactly as plain data parallelism does:
parameters replicated, batches split by rows. A parameter axis whose size the mesh axes do not
divide (a vocabulary of 257 over 4 tensor shards) stays whole on that axis; :func:`spec` says
what each parameter gets.

The positional encoders' parameters (:class:`~posenc.layers.params.EncoderParam`) carry the
names their encoder declares (``Encoding.param_axes``: Transformer-XL's ``u``, ``v``, ``W_kR``,
DeBERTa's ``P``, ``W_qr``, ``W_kr``, T5's table by heads, FoX's gates, PoPE's phases) and shard
like the projections; the rest (Shaw's and CoPE's small tables, FIRE's and the dynamic bias's
MLPs, KERPLE's scalars) and any scalar are replicated. There is no stacked ``layers`` axis:
each block holds its own arrays, so a per-layer parameter lives with its layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx
from flax.core import spmd as flax_spmd
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# Mesh axes, outermost first: the innermost (tensor) gets neighbouring devices, the fastest links.
MESH_AXES = ("data", "fsdp", "context", "tensor")
# The default ``mesh`` section: every device on ``data``.
DEFAULT_MESH = {"data": -1, "fsdp": 1, "context": 1, "tensor": 1}
# Metadata key of a parameter's logical axis names (posenc.layers.params.AXES).
AXES = "axes"

# Logical axis -> mesh axes (a name, a tuple of names, or None: never sharded).
RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),  # batch rows
    ("length", "context"),  # the sequence axis of a window
    ("embed", "fsdp"),  # the residual width D: every matrix has one, FSDP shards it
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("head_dim", None),
    ("layers", None),
)


def mesh_shape(section: Mapping[str, Any] | None, num_devices: int) -> dict[str, int]:
    """The size of each mesh axis for ``num_devices`` devices.

    Args:
      section: the config's ``mesh`` section (``data``, ``fsdp``, ``context``, ``tensor``;
        one of them may be -1, the devices the others leave); None: :data:`DEFAULT_MESH`.
      num_devices: the devices of every process.

    Returns:
      ``{axis: size}`` in :data:`MESH_AXES` order, the sizes multiplying to ``num_devices``.

    Raises:
      ValueError: one line naming the fields and the device count when they do not fit.
    """
    given = {**DEFAULT_MESH, **dict(section or {})}
    unknown = sorted(set(given) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"mesh has no field {unknown[0]!r}; its fields are {list(MESH_AXES)}")
    for axis in MESH_AXES:
        value = given[axis]
        if not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
            raise ValueError(f"mesh.{axis} must be a positive integer or -1, got {value!r}")
    rest = [a for a in MESH_AXES if given[a] == -1]
    if len(rest) > 1:
        raise ValueError(
            f"only one mesh field may be -1, got {', '.join(f'mesh.{a}' for a in rest)}"
        )
    fixed = math.prod(given[a] for a in MESH_AXES if given[a] != -1)
    named = " x ".join(f"mesh.{a}={given[a]}" for a in MESH_AXES if given[a] not in (1, -1))
    if rest and num_devices % fixed == 0:
        given[rest[0]] = num_devices // fixed
    elif rest or fixed != num_devices:
        need = "divide" if rest else "equal"
        raise ValueError(
            f"{named or 'mesh'} = {fixed} devices does not {need} the {num_devices} devices; "
            f"choose mesh sizes whose product {need}s {num_devices} (-1 takes the rest)"
        )
    return {a: given[a] for a in MESH_AXES}


def make_mesh(
    config: ml_collections.ConfigDict | None = None, devices: Sequence[jax.Device] | None = None
) -> jax.sharding.Mesh:
    """The mesh of ``config.mesh`` over ``devices`` (default: every device of every process).

    Its axes are ``Auto``: XLA propagates the shardings of parameters and batches through the
    model, so no layer needs an explicit sharding on its outputs.
    """
    devices = list(devices) if devices is not None else jax.devices()
    section = None if config is None else config.get("mesh")
    shape = mesh_shape(None if section is None else section.to_dict(), len(devices))
    sizes = tuple(shape[a] for a in MESH_AXES)
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(sizes, MESH_AXES, axis_types=auto, devices=devices)


def _mesh_axes(logical: str | None) -> tuple[str, ...]:
    """The mesh axes a logical axis name maps to under :data:`RULES` (none if unnamed)."""
    if logical is None:
        return ()
    (mapped,) = flax_spmd.from_sharding_rules((logical,), RULES)
    if mapped == logical and logical not in dict(RULES):
        raise ValueError(f"no sharding rule for logical axis {logical!r}; add it to RULES")
    if mapped is None:
        return ()
    return (mapped,) if isinstance(mapped, str) else tuple(mapped)


def spec(axes: Sequence[str | None], shape: Sequence[int] | None, mesh: jax.sharding.Mesh) -> P:
    """The ``PartitionSpec`` of an array whose axes are named ``axes``.

    Mesh axes of size 1 are left out, a mesh axis is used by one array axis at most (the
    first that asks), and an array axis keeps only the mesh axes whose sizes divide it (with
    ``shape`` None every mapped axis is kept).
    """
    used: set[str] = set()
    out = []
    for i, logical in enumerate(axes):
        kept, size = [], 1
        for m in _mesh_axes(logical):
            n = mesh.shape[m]
            if n == 1 or m in used or (shape is not None and shape[i] % (size * n)):
                continue
            kept.append(m)
            size *= n
        used.update(kept)
        out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def named_sharding(
    axes: Sequence[str | None] | None, shape: Sequence[int], mesh: jax.sharding.Mesh
) -> NamedSharding:
    """Where an array of ``shape`` whose axes are named ``axes`` lives on ``mesh`` (replicated
    when ``axes`` is None): the placement training uses, e.g. to load weights into shards with
    ``jax.make_array_from_callback(shape, named_sharding(axes, shape, mesh), read_slice)``."""
    return NamedSharding(mesh, P() if axes is None else spec(axes, shape, mesh))


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _leaf_sharding(leaf: Any, mesh: jax.sharding.Mesh) -> Any:
    if _is_variable(leaf):
        axes = leaf.get_metadata().get(AXES)
        return leaf.replace(named_sharding(axes, leaf.shape, mesh))
    return NamedSharding(mesh, P())


def tree_shardings(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """A ``NamedSharding`` for every array of ``tree`` (parameters, their gradients, optimizer
    state: any tree holding ``nnx.Variable`` s, whose ``axes`` metadata decide; other arrays are
    replicated), in ``tree``'s structure, as ``jax.jit``'s ``out_shardings`` take it."""
    return jax.tree.map(lambda x: _leaf_sharding(x, mesh), tree, is_leaf=_is_variable)


# Logical axes of the residual stream ``[B, T, D]``: rows over data x fsdp, tokens over context,
# the width whole (FSDP gathers weights, never activations; tensor parallelism splits inside
# the sublayers only).
ACTIVATION = ("batch", "length", None)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """``x`` kept where ``axes`` say on the mesh being traced for (set with
    :func:`tracing_on`), so that XLA's propagation moves weights to the activations and not
    the other way; unchanged without such a mesh or on a data-parallel one (where propagation
    from the batch already does that)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or all(mesh.shape.get(a, 1) == 1 for a in ("fsdp", "context", "tensor")):
        return x
    return jax.lax.with_sharding_constraint(x, spec(axes, x.shape, mesh))


def tracing_on(mesh: jax.sharding.Mesh) -> Any:
    """A context in which :func:`constrain` applies ``mesh``'s shardings (enter it inside the
    jitted function, around the model's call)."""
    return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def batch_spec(mesh: jax.sharding.Mesh, *, length: bool = False) -> P:
    """The spec of a ``[B, T, ...]`` batch: rows over ``data`` x ``fsdp`` (``data`` alone
    when ``fsdp`` is 1, as plain data parallelism has it), and with ``length`` the window over
    ``context``."""
    rows = tuple(a for a in _mesh_axes("batch") if a == "data" or mesh.shape[a] > 1)
    parts: list[Any] = [rows[0] if len(rows) == 1 else rows]
    if length and mesh.shape["context"] > 1:
        parts.append("context")
    return P(*parts)


def splits_parameters(mesh: jax.sharding.Mesh) -> bool:
    """Whether ``mesh`` shards parameters (``fsdp`` or ``tensor`` above 1), rather than
    replicating them as data parallelism does."""
    return any(mesh.shape[a] > 1 for a in ("fsdp", "tensor"))


def batch_shards(mesh: jax.sharding.Mesh) -> int:
    """How many ways a batch's rows are split (``data`` x ``fsdp``)."""
    return int(np.prod([mesh.shape[a] for a in _mesh_axes("batch")]))


def shard_bytes(tree: Any) -> int:
    """Bytes of ``tree``'s arrays held by one device (the first addressable one), from the
    arrays' own shards: what sharding saves is measured, not computed from the rules."""
    device = None
    total = 0
    for leaf in jax.tree.leaves(tree):
        shards = leaf.addressable_shards
        device = device or shards[0].device
        total += sum(s.data.nbytes for s in shards if s.device == device)
    return total
