"""A trained run's model, read back from its newest intact checkpoint (parameters only: no
optimizer state is built), placed on a mesh as training places them.

Every kind's evaluation, ``posenc translate``, the attention analysis and the Hugging Face
export read a run's model through these two functions.
"""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from posenc.devices import sharding
from posenc.devices.distributed import abstract_on, make_mesh
from posenc.models.build import build
from posenc.workdir import RunDir


def restore_model(
    run: RunDir, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None
) -> tuple[nnx.Module, int]:
    """The model of a trained run, from the parameters of its newest intact checkpoint (no
    optimizer state is read), placed on ``mesh`` as training places them (default: replicated
    on this process's devices, whatever mesh the run trained on); and the checkpoint's step."""
    mesh = mesh or make_mesh()
    graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: build(config)), nnx.Param, ...)
    step, params = run.restore_params(abstract_on(params, sharding.tree_shardings(params, mesh)))
    return nnx.merge(graphdef, params, rest), step


def load_model(workdir: str, config: ml_collections.ConfigDict | None = None) -> nnx.Module:
    """The model of a trained work directory, from its newest intact checkpoint."""
    run = RunDir(workdir)
    return restore_model(run, config or run.read_config())[0]
