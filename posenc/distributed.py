"""Several processes (hosts): ``jax.distributed`` initialisation from the config or environment.

Each process then feeds only its own rows of every global batch (see
:class:`posenc.data.TrainWindows`), the mesh (:func:`make_mesh`) spans the devices of all
processes, and only process 0 writes metrics, ``eval.json`` and reports; orbax coordinates
checkpoint writes.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections

_ENV = {
    "coordinator_address": "POSENC_COORDINATOR_ADDRESS",
    "num_processes": "POSENC_NUM_PROCESSES",
    "process_id": "POSENC_PROCESS_ID",
}


def make_mesh() -> jax.sharding.Mesh:
    """A one-axis mesh named ``data`` over every device of every process.

    The axis is ``Auto``: XLA propagates the batch sharding through the model (parameters stay
    replicated), rather than requiring explicit output shardings on every gather.
    """
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def abstract_on(tree: Any, sharding: jax.sharding.Sharding) -> Any:
    """``tree``'s arrays (or shape structs) as ``jax.ShapeDtypeStruct`` placed with ``sharding``:
    the target a checkpoint is restored into."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def is_initialized() -> bool:
    """Whether ``jax.distributed`` is running in this process."""
    return jax.distributed.is_initialized()


def maybe_initialize(config: ml_collections.ConfigDict) -> None:
    """Calls ``jax.distributed.initialize`` once when ``distributed.initialize`` is set.

    Each of the coordinator address, the process count and this process's id comes from the
    config (``distributed.*``), else from ``POSENC_COORDINATOR_ADDRESS``,
    ``POSENC_NUM_PROCESSES``, ``POSENC_PROCESS_ID``, else from JAX's cluster auto-detection
    (SLURM, Open MPI, Cloud TPU, ...).
    """
    d = config.get("distributed")
    if d is None or not d.initialize or is_initialized():
        return
    kwargs = {}
    for field, env in _ENV.items():
        value = d.get(field)
        if value is None and os.environ.get(env):
            value = os.environ[env]
            value = value if field == "coordinator_address" else int(value)
        if value is not None:
            kwargs[field] = value
    jax.distributed.initialize(**kwargs)
