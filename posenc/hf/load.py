"""A local Hugging Face folder as a posenc model: ``load_pretrained(path)``.

Nothing downloads: a folder that is not on disk is a one-line error saying how to fetch it with
the user's own tools.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import jax

from posenc.data.hf_tokenizer import read_json_object
from posenc.hf import convert
from posenc.hf.family import Family, Spec, for_model_type
from posenc.hf.fields import HFConfig, IgnoredFieldsWarning, ignored_line
from posenc.hf.tensors import CONFIG_FILE, TensorReader
from posenc.models.encdec import EncoderDecoder
from posenc.models.lm import Transformer


def check_folder(path: str) -> None:
    """Raises a one-line ``FileNotFoundError`` unless ``path`` is a folder with a config."""
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{path} is not a folder; posenc never downloads: fetch the model with your own "
            "tools first (e.g. `huggingface-cli download <org>/<model> --local-dir "
            f"{path}`, or git clone of its repository), then pass that folder"
        )
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise FileNotFoundError(
            f"{path} has no {CONFIG_FILE}: pass the folder of a Hugging Face model (config.json, "
            "model.safetensors or its shards and index, tokenizer files)"
        )


def read_config(path: str) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict."""
    check_folder(path)
    return read_json_object(os.path.join(path, CONFIG_FILE), what="a config object")


# The dtypes a model is computed and stored in (the CLI's --dtype and --param-dtype choices).
DTYPES = ("float32", "bfloat16", "float16")


def check_dtypes(dtype: str, param_dtype: str | None) -> None:
    """Refuses (one line) a compute or parameter dtype other than :data:`DTYPES`: an integer
    parameter dtype would round every weight to 0."""
    for name, value in (("dtype", dtype), ("param_dtype", param_dtype)):
        if value is not None and value not in DTYPES:
            raise ValueError(f"{name}={value!r} is not one of {', '.join(DTYPES)}")


def read_spec(path: str, strict: bool = False) -> tuple[Family, Spec, TensorReader]:
    """The family, the :class:`~posenc.hf.family.Spec` and the tensors of a Hugging Face folder,
    read strictly (:mod:`posenc.hf.fields`): a field the model may read and posenc does not map
    is refused; the fields no transformers model of the type reads are ``spec.ignored``
    (refused too with ``strict``)."""
    fields = read_config(path)
    source = os.path.join(path, CONFIG_FILE)
    family_of(fields, source)  # an unknown model_type is refused before the weights are opened
    reader = TensorReader(path)
    family, spec = spec_of_config(fields, source, reader.names(), strict=strict)
    return family, family.keep(spec, reader.read, reader.names()), reader


def family_of(fields: dict[str, Any], source: str) -> Family:
    """The family that reads a config's ``model_type`` (one line naming ``source`` if none)."""
    if "model_type" not in fields:
        raise ValueError(f"{source} has no model_type; is it a transformers config?")
    return for_model_type(fields["model_type"], source)


def spec_of_config(
    fields: dict[str, Any], source: str, names: set[str] = frozenset(), strict: bool = False
) -> tuple[Family, Spec]:
    """The family and :class:`~posenc.hf.family.Spec` of a parsed ``config.json`` (what
    :func:`read_spec` reads, without the weights): ``names`` are the checkpoint's tensor names
    (none: the config alone says whether the head is tied); ``source`` names it in messages."""
    family = family_of(fields, source)
    hf = HFConfig(fields, family.name, source, strict=strict)
    spec = family.read(hf, set(names))
    return family, dataclasses.replace(spec, ignored=hf.finish())


def report_ignored(path: str, spec: Spec) -> None:
    """Warns (:class:`~posenc.hf.fields.IgnoredFieldsWarning`, one line; the CLI prints it as
    ``posenc: warning: ...``) of the config fields an import ignored, if any."""
    if spec.ignored:
        source = os.path.join(path, CONFIG_FILE)
        warnings.warn(ignored_line(source, spec.ignored), IgnoredFieldsWarning, stacklevel=3)


def load_pretrained(
    path: str,
    dtype: str = "float32",
    param_dtype: str | None = None,
    sharding: jax.sharding.Sharding | None = None,
    mesh: jax.sharding.Mesh | None = None,
    strict: bool = False,
) -> tuple[Transformer | EncoderDecoder, Spec]:
    """A local Hugging Face model as a posenc model.

    ``model(tokens)`` gives ``[B, T, V]`` float32 logits for decoder-only families, and
    ``model(source_tokens, target_tokens)`` the decoder's logits for encoder-decoder ones.

    Args:
      path: a folder with ``config.json`` and ``model.safetensors`` (or shards and their index).
      dtype: the compute dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
      param_dtype: the parameters' dtype; None: float32 (posenc's); ``"bfloat16"`` halves the
        memory of a bfloat16 checkpoint.
      sharding: where each parameter goes as it is read (e.g. ``NamedSharding(mesh, P())``,
        replicated over a mesh); None: the default device. Tensors are read, converted, cast
        and placed one at a time, so the host never holds the whole checkpoint.
      mesh: instead of ``sharding``, put each parameter straight into its shards on this mesh
        (``posenc.devices.sharding.make_mesh(config)``), as training places it: FSDP and tensor
        parallelism split every parameter by its axis names, and no device ever holds a whole
        copy of a sharded one.
      strict: refuse the config fields no transformers model of its type reads, which are
        otherwise ignored (``spec.ignored``) with one warning.

    Returns:
      ``(model, spec)``: the spec holds the :class:`~posenc.layers.config.ModelConfig`
      (``spec.model``), the encoder's name and hyperparameters and the training length.

    Raises:
      FileNotFoundError: no such folder, no config or no weights.
      ValueError: an unsupported architecture or config field (with ``strict``, also an
        ignored one), a missing tensor or one whose shape does not match the config or that is
        not floating point, a dtype other than float32, bfloat16 or float16 (one line each).
    """
    check_dtypes(dtype, param_dtype)
    family, spec, reader = read_spec(path, strict=strict)
    report_ignored(path, spec)
    model = convert.fill(
        family, spec, reader, dtype=dtype, param_dtype=param_dtype, sharding=sharding, mesh=mesh
    )
    return model, spec
