"""Several processes (hosts): ``jax.distributed`` initialisation from the config or environment.

Each process then feeds only its own rows of every global batch (see
:class:`posenc.data.TrainWindows`), the mesh (:func:`make_mesh`, its axes named by the config's
``mesh`` section) spans the devices of all processes, and only process 0 writes metrics,
``eval.json`` and reports; orbax coordinates checkpoint writes (each process its shards).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections

from posenc.devices import sharding

_ENV = {
    "coordinator_address": "POSENC_COORDINATOR_ADDRESS",
    "num_processes": "POSENC_NUM_PROCESSES",
    "process_id": "POSENC_PROCESS_ID",
}


def make_mesh(config: ml_collections.ConfigDict | None = None) -> jax.sharding.Mesh:
    """The mesh of ``config.mesh`` (default: one ``data`` axis in effect) over every device of
    every process; :func:`posenc.devices.sharding.make_mesh`."""
    return sharding.make_mesh(config)


def abstract_on(tree: Any, shardings: Any) -> Any:
    """``tree``'s arrays (or shape structs) as ``jax.ShapeDtypeStruct`` placed with
    ``shardings`` (one sharding for all, or a tree of them in ``tree``'s structure): the target
    a checkpoint is restored into."""
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree
        )
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


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
