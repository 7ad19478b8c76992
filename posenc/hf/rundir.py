"""Pretrained models as posenc run directories (``posenc import-hf``) and run directories as
Hugging Face folders (``posenc export-hf``).

An imported run directory is an ordinary one::

    <workdir>/
      config.json        a run config: the model's options, its encoder (e.g. rope with its
                         rope_scaling), train.seq_len = the length it was trained at,
                         data.tokenizer = hf:tokenizer (relative to the run directory)
      checkpoints/1/     the parameters as an orbax checkpoint (step 1 = train.steps: finished)
      tokenizer/         the model's tokenizer files, as found
      pretrained.json    provenance: the family, the source folder, its config.json, the
                         fields of it no transformers model of its type reads (ignored)
      pretrained_parts.safetensors   a sequence classifier's parts the checkpoint holds beside
                         its masked LM (BERT: token-type table, pooler), which
                         ``posenc train --init-from`` starts a classifier's own parts from

so ``posenc eval`` (any lengths, sliding windows, RoPE scaling overrides), ``posenc report``,
``posenc.load_run`` and generation take it as they are, and ``posenc train --config
W/config.json --init-from W --workdir NEW`` fine-tunes it. Training in the imported directory
itself is refused (it holds no optimizer state and is not a training run).

Each assembly is the run posenc trains of that kind, so it goes down that kind's code paths:
a decoder-only model is a causal-LM run; a bidirectional one (BERT, RoBERTa) a masked-LM run
(``train.objective="masked_lm"``, the tokenizer's own mask token), evaluated as posenc's
masked-LM runs are and fine-tuned into a classifier with ``--init-from``; an encoder-decoder
(T5, Flan-T5) a translation run on ``configs/translation.py:base`` whose vocabulary
(``data.vocab``) is the model's tokenizer, evaluated (loss, beam search, BLEU) as translation
runs are.

Export writes ``config.json``, ``model.safetensors`` (sharded beyond 5 GB) and the tokenizer
files of a run: an imported one as its family, a posenc-trained one as the first family that
holds its options (RoPE: Llama or GPT-NeoX; learned: GPT-2; ALiBi with an embedding norm:
BLOOM; T5's bias: T5), else a one-line error saying what each family lacks.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from posenc import encodings
from posenc.data.hf_tokenizer import PREFIX as HF_PREFIX
from posenc.devices import sharding
from posenc.hf import convert
from posenc.hf.family import Family, Spec, families, get
from posenc.hf.fields import transformers_version
from posenc.hf.load import check_dtypes, read_config, read_spec, report_ignored
from posenc.hf.tensors import CONFIG_FILE, TensorReader, write_safetensors
from posenc.models.build import assembly, model_config
from posenc.workdir import (
    PRETRAINED_FILE,
    PRETRAINED_PARTS,
    TOKENIZER_DIR,
    RunDir,
    WorkdirError,
    config_from_dict,
    read_json,
    write_json,
)

# The files of a Hugging Face folder that describe its tokenizer (and generation defaults).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "generation_config.json",
)
_CONFIGS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs"
)
# The run config an import starts from, and the data it scores, per assembly: a decoder-only
# or masked LM is a language-model run; an encoder-decoder (T5) a translation run.
_BASES = {
    "lm": (os.path.join(_CONFIGS, "base.py"), "pystdlib"),
    "encoder_decoder": (os.path.join(_CONFIGS, "translation.py") + ":base", "parallel:default"),
}
# The step an imported checkpoint is saved at, and the run's train.steps: a finished run.
IMPORTED_STEP = 1


def base_config(
    spec: str | None = None, overrides: Sequence[str] = (), kind: str = "lm"
) -> ml_collections.ConfigDict:
    """The run config an import starts from: ``spec`` (``file.py[:variant]``), default the
    repository's ``configs/base.py`` (``configs/translation.py:base`` for an encoder-decoder,
    ``kind``), with ``overrides`` (``"eval.lengths=..."``) applied; the model, encoder and
    training length are then the pretrained model's."""
    from posenc.runs.config import apply_overrides, load_config

    return apply_overrides(load_config(spec or _BASES[kind][0]), overrides)


def run_config(
    spec: Spec, base: ml_collections.ConfigDict, *, source: str, tokenizer: str
) -> ml_collections.ConfigDict:
    """The run config of an imported model (module docstring): a bidirectional model is a
    masked-LM run (``train.objective="masked_lm"``), an encoder-decoder a translation run whose
    vocabulary (``data.vocab``) is the model's tokenizer."""
    fields = base.to_dict()
    fields["model"] = {**fields["model"], **dataclasses.asdict(spec.model)}
    if spec.assembly != "lm":
        fields["model"]["assembly"] = spec.assembly
    fields["encoding"] = {"name": spec.encoding, "hparams": dict(spec.hparams)}
    if spec.pattern:
        fields["layers"] = {"pattern": spec.pattern, "kinds": spec.kinds}
    fields["data"].update(source=source, tokenizer=tokenizer)
    if spec.assembly == "encoder_decoder":
        fields["data"]["vocab"] = tokenizer
    fields["train"].update(seq_len=spec.train_len, steps=IMPORTED_STEP, init_from=None)
    if spec.assembly == "lm":
        fields["train"]["objective"] = "causal_lm" if spec.model.causal else "masked_lm"
    return config_from_dict(fields)


def import_hf(
    hf_dir: str,
    workdir: str,
    *,
    data: str | None = None,
    dtype: str = "float32",
    param_dtype: str | None = None,
    tokenizer: bool = True,
    base: str | None = None,
    overrides: Sequence[str] = (),
    strict: bool = False,
) -> dict[str, Any]:
    """Writes the run directory of a local Hugging Face model (module docstring).

    Args:
      hf_dir: the model's folder (``config.json``, safetensors, tokenizer files).
      workdir: the run directory to create (must hold no run).
      data: the run's ``data.source`` (what ``posenc eval`` scores); None: ``pystdlib`` for a
        language model (causal or masked), ``parallel:default`` for an encoder-decoder.
      dtype: the compute dtype recorded in the config (``model.dtype``).
      param_dtype: the checkpoint's parameter dtype; None: float32.
      tokenizer: require the model's ``tokenizer.json`` (False: import the weights alone; the
        run then tokenises as bytes, which fits only a model with >= 257 ids).
      base: the run config to start from (``file.py[:variant]``); default ``configs/base.py``
        (``configs/translation.py:base`` for an encoder-decoder).
      overrides: ``"field=value"`` overrides of that config (``data.data_dir``, ``eval.*``).
      strict: refuse the config fields no transformers model of its type reads; otherwise
        they are recorded in ``pretrained.json`` (``ignored``) and reported in one warning.

    Returns:
      The provenance record written to ``pretrained.json``.
    """
    check_dtypes(dtype, param_dtype)
    family, spec, reader = read_spec(hf_dir, strict=strict)
    has_tokenizer = os.path.isfile(os.path.join(hf_dir, "tokenizer.json"))
    if tokenizer and not has_tokenizer:
        raise FileNotFoundError(
            f"{hf_dir} has no tokenizer.json: posenc evaluates text with the model's own "
            "tokenizer (the tokenizers library's file); add it, or import the weights alone "
            "with --no-tokenizer"
        )
    if tokenizer:
        check_tokenizer(hf_dir)
    else:
        _check_byte_vocabulary(spec)
    run = RunDir(workdir)
    if os.path.exists(run.file("config.json")) or run.has_checkpoints():
        raise WorkdirError(f"{workdir} already holds a run; import into a new work directory")
    # Relative to the run directory (RunDir.read_config resolves it), so a moved or copied run
    # reads its own tokenizer.
    tokenizer_spec = f"{HF_PREFIX}{TOKENIZER_DIR}" if tokenizer else "bytes"
    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, dtype=dtype))
    base_run = base_config(base, overrides, spec.assembly)
    _check_base_kind(base_run, base, family, spec)
    source = data or _BASES[spec.assembly][1]
    config = run_config(spec, base_run, source=source, tokenizer=tokenizer_spec)
    # With FSDP or tensor parallelism in the config's mesh, each tensor goes straight into its
    # shards (and the checkpoint is written from them); else onto the default device.
    mesh = sharding.make_mesh(config)
    model = convert.fill(
        family,
        spec,
        reader,
        param_dtype=param_dtype,
        mesh=mesh if sharding.splits_parameters(mesh) else None,
    )
    parts = head_parts(family, spec, reader)
    from flax import nnx

    record = {
        "family": family.name,
        "source": os.path.abspath(hf_dir),
        "hf_config": read_config(hf_dir),
        "extra": spec.extra,
        # Fields no transformers model of the type reads (by transformers' own config class).
        "ignored": spec.ignored,
        "ignored_by": f"transformers {transformers_version()} config classes",
        "param_dtype": param_dtype or "float32",
        "tensors": len(reader.names()),
    }
    with run.starting() as started, run.lock():
        run.record_config(config)
        if tokenizer:
            _copy_tokenizer(hf_dir, run.file(TOKENIZER_DIR))
        checkpoints = run.checkpoints()
        try:
            params = nnx.state(model, nnx.Param)
            checkpoints.save(IMPORTED_STEP, params, {"imported": IMPORTED_STEP})
        finally:
            checkpoints.close()
        if parts:
            from safetensors.numpy import save_file

            save_file(parts, run.file(PRETRAINED_PARTS))
        write_json(run.file(PRETRAINED_FILE), record)
        started()
    report_ignored(hf_dir, spec)
    return record


def check_tokenizer(hf_dir: str) -> None:
    """Refuses (one line naming the file) a ``tokenizer.json`` the tokenizers library cannot
    read, a ``tokenizer_config.json`` that is not JSON or names special tokens the vocabulary
    lacks: ``posenc eval`` would fail on it after the import."""
    from posenc.data.hf_tokenizer import HFTokenizer

    HFTokenizer(hf_dir)


def _check_byte_vocabulary(spec: Spec) -> None:
    """``--no-tokenizer`` tokenises text as bytes: refused (one line) unless the model has an
    id for every byte token (a language model: the 256 bytes and the separator, and a masked
    LM's mask token; a translation
    run's byte vocabulary exactly its table), as evaluation would otherwise index past the
    table (loss nan) or ask for a vocabulary size the imported weights cannot have."""
    from posenc.data import VOCAB_SIZE
    from posenc.data.masking import MASK_ID
    from posenc.data.vocab import ByteVocab

    size = spec.model.vocab_size
    if spec.assembly == "encoder_decoder":
        need = ByteVocab().vocab_size
        fits, wanted = size == need, f"exactly {need}"
    else:  # a masked LM also needs the byte tokenizer's mask token, id 257
        need = VOCAB_SIZE if spec.model.causal else MASK_ID + 1
        fits, wanted = size >= need, f"at least {need}"
    if not fits:
        raise ValueError(
            f"--no-tokenizer tokenises text as bytes, which needs {wanted} ids; this model has "
            f"{size}: import it with its tokenizer.json"
        )


def _check_base_kind(
    base_run: ml_collections.ConfigDict, base: str | None, family: Family, spec: Spec
) -> None:
    """Refuses (one line) a ``--config`` base of another kind of run than the model is
    imported as (a Llama as a translation run, a T5 as a language model)."""
    got = assembly(base_run)
    if got != spec.assembly:
        kind = "a translation run" if spec.assembly == "encoder_decoder" else "a language-model run"
        raise ValueError(
            f"--config {base}: a {family.name} model is imported as {kind}, which needs a base "
            f"config of model.assembly={spec.assembly!r} (default {_BASES[spec.assembly][0]}); "
            f"this one has model.assembly={got!r}"
        )


def head_parts(family: Family, spec: Spec, reader: TensorReader) -> dict[str, np.ndarray]:
    """The classifier parts of a checkpoint (:meth:`Family.head_rules`) as float32 arrays
    keyed by their dotted posenc path (``"segment_embed.embedding"``)."""
    parts = {}
    for rule in family.head_rules(spec, reader.names()):
        array = reader.read(rule.hf).astype(np.float32)
        if tuple(array.shape) != rule.shape:
            raise ValueError(
                f"{reader.folder}: tensor {rule.hf!r} has shape {tuple(array.shape)}, the config "
                f"({family.name}) says {rule.shape}"
            )
        for path, value in zip(rule.paths, rule.load(array), strict=True):
            parts[".".join(str(p) for p in path)] = np.ascontiguousarray(value, np.float32)
    return parts


def _copy_tokenizer(src: str, dst: str) -> list[str]:
    os.makedirs(dst, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
            copied.append(name)
    return copied


def spec_of_run(config: ml_collections.ConfigDict, extra: dict[str, Any] | None = None) -> Spec:
    """The :class:`Spec` of a run config (hyperparameters with their defaults filled in, the
    layer pattern and kinds as ``config.layers`` holds them)."""
    hparams = encodings.get(config.encoding.name, **config.encoding.hparams.to_dict()).hparams()
    section = config.get("layers")
    pattern = tuple(section.get("pattern", ())) if section is not None else ()
    layers = {"pattern": pattern, "kinds": section.kinds.to_dict()} if pattern else {}
    return Spec(
        model=model_config(config),
        assembly=assembly(config),
        encoding=config.encoding.name,
        hparams=hparams,
        train_len=config.train.seq_len,
        extra=dict(extra or {}),
        layers=layers,
    )


def choose_family(spec: Spec, recorded: str | None = None) -> Family:
    """The family to export ``spec`` as: the recorded one (an imported run), else the first
    that holds every option; a one-line error says what each family lacks."""
    if recorded is not None:
        candidates = {recorded: get(recorded)}
    else:
        candidates = families()
    reasons = []
    for name, family in candidates.items():
        misfits = family.fits(spec)
        if not misfits:
            return family
        reasons.append(f"{name}: {', '.join(misfits)}")
    raise ValueError(
        "no Hugging Face family posenc writes holds this model (" + "; ".join(reasons) + ")"
    )


def export_hf(workdir: str, out: str, *, dtype: str = "float32") -> dict[str, Any]:
    """Writes a run's model as a Hugging Face folder ``out`` (module docstring).

    Returns:
      ``{"family", "files", "step"}``.
    """
    from flax import nnx

    from posenc.models.restore import restore_model

    check_dtypes(dtype, None)
    run = RunDir(workdir)
    config = run.read_config()
    record = read_json(run.file(PRETRAINED_FILE)) or {}
    spec = spec_of_run(config, record.get("extra"))
    family = choose_family(spec, record.get("family"))
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise WorkdirError(f"--out {out} exists and is not an empty folder; choose a new one")
    if record and os.path.exists(run.file(PRETRAINED_PARTS)):
        from safetensors.numpy import load_file

        extra = family.from_parts(spec.extra, load_file(run.file(PRETRAINED_PARTS)))
        spec = dataclasses.replace(spec, extra=extra)
    with run.lock():
        model, step = restore_model(run, config)
    params = nnx.state(model, nnx.Param)
    files = write_folder(
        out, family, spec, params, dtype=dtype, token_ids=_token_ids(record.get("hf_config", {}))
    )
    tokenizer = run.file(TOKENIZER_DIR)
    if os.path.isdir(tokenizer):
        files += [os.path.join(out, n) for n in _copy_tokenizer(tokenizer, out)]
    return {"family": family.name, "files": files, "step": step}


def write_folder(
    out: str,
    family: Family,
    spec: Spec,
    params: Any,
    *,
    dtype: str = "float32",
    token_ids: dict[str, Any] | None = None,
) -> list[str]:
    """Writes ``config.json`` and the safetensors of a model's parameters (``nnx.Param`` state)
    as ``family``; returns the files written."""
    files = write_safetensors(out, convert.hf_tensors(family, spec, params, dtype))
    hf_config = {
        "architectures": [family.export_architecture],
        "model_type": family.export_type,
        **dict.fromkeys(family.null_token_ids),
        **(token_ids or {}),
        **family.write(spec),
        "torch_dtype": dtype,
    }
    write_json(os.path.join(out, CONFIG_FILE), hf_config)
    return [*files, os.path.join(out, CONFIG_FILE)]


def save_pretrained(model: Any, spec: Spec, out: str, dtype: str = "float32") -> str:
    """Writes a posenc model (one :func:`~posenc.hf.load_pretrained` gave, or any model whose
    options a family holds) as a Hugging Face folder ``out``; returns the family's name.

    Unlike ``posenc export-hf`` this takes every assembly (T5's encoder-decoder, BERT's masked
    LM); no tokenizer files are written.
    """
    from flax import nnx

    check_dtypes(dtype, None)
    family = choose_family(spec)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise WorkdirError(f"{out} exists and is not an empty folder; choose a new one")
    write_folder(out, family, spec, nnx.state(model, nnx.Param), dtype=dtype)
    return family.name


def _token_ids(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The special token ids an imported model's config named (kept on export)."""
    keys = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
    return {k: hf_config[k] for k in keys if k in hf_config}
