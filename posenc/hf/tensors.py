"""Reading and writing a Hugging Face folder's weights (safetensors), one tensor at a time.

Reading never holds more than the tensor being converted: :class:`TensorReader` opens the
folder's ``model.safetensors`` (or the shards its ``model.safetensors.index.json`` lists) and
returns one numpy array per call, which the caller converts into its final dtype and places on
the device before asking for the next. Writing (:func:`write_safetensors`) takes an iterator of
``(name, array)`` and fills shards of at most ``shard_bytes``, with an index when there is more
than one shard, as ``transformers`` writes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import ml_dtypes  # noqa: F401 - registers numpy's "bfloat16", which safetensors' BF16 reads as
import numpy as np

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"


class TensorReader:
    """The tensors of a Hugging Face folder, by name (module docstring).

    Args:
      folder: a folder holding ``model.safetensors`` or ``model.safetensors.index.json``.

    Raises:
      FileNotFoundError: neither file (PyTorch ``.bin`` files are named and refused).
    """

    def __init__(self, folder: str):
        self.folder = folder
        index = os.path.join(folder, INDEX_FILE)
        single = os.path.join(folder, WEIGHTS_FILE)
        if os.path.isfile(index):
            self._files = _read_index(folder, index)
        elif os.path.isfile(single):
            self._files = {name: single for name in _keys(single)}
        else:
            bins = [n for n in os.listdir(folder) if n.endswith(".bin")]
            hint = (
                f" (it has PyTorch files {bins[:2]}: posenc reads safetensors only; convert them "
                "with transformers' save_pretrained(..., safe_serialization=True))"
                if bins
                else ""
            )
            raise FileNotFoundError(f"{folder} has no {WEIGHTS_FILE} or {INDEX_FILE}{hint}")

    def names(self) -> set[str]:
        return set(self._files)

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as stored (float32, float16 or bfloat16 numpy array)."""
        from safetensors import SafetensorError, safe_open

        if name not in self._files:
            raise ValueError(f"{self.folder}: the checkpoint has no tensor {name!r}")
        path = self._files[name]
        try:
            with safe_open(path, "numpy") as f:
                return f.get_tensor(name)
        except (SafetensorError, OSError, TypeError) as e:  # bytes changed since the header read
            raise ValueError(f"{path}: cannot read tensor {name!r} ({_first_line(e)})") from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _keys(path: str) -> set[str]:
    """The tensor names of one safetensors file, refused in one line naming the file when it is
    not one (truncated, empty, another format): safetensors checks the header and that the
    file is as long as the header says."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "numpy") as f:
            return set(f.keys())
    except (SafetensorError, OSError) as e:
        raise ValueError(
            f"{path} is not a readable safetensors file ({_first_line(e)}); download it again"
        ) from None


def _read_index(folder: str, index: str) -> dict[str, str]:
    """``model.safetensors.index.json``'s ``weight_map`` (tensor -> shard path), each shard
    opened once to check that it holds the tensors the index maps to it: a one-line error names
    the index and the shard otherwise, before any tensor is converted."""
    try:
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{index} is not valid JSON ({_first_line(e)})") from None
    except AttributeError:  # the file is JSON, but not an object
        weight_map = None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ValueError(
            f"{index} has no weight_map object (tensor name -> shard file), as transformers "
            "writes it"
        )
    files = {name: os.path.join(folder, shard) for name, shard in weight_map.items()}
    for path in sorted(set(files.values())):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{index} maps tensors to {os.path.basename(path)}, which {folder} lacks"
            )
        held = _keys(path)
        lacking = sorted(n for n, p in files.items() if p == path and n not in held)
        if lacking:
            raise ValueError(
                f"{index} maps {lacking[0]!r} to {os.path.basename(path)}, which does not hold "
                f"it ({len(lacking)} such tensors); is the index the one of these shards?"
            )
    return files


def write_safetensors(
    folder: str, tensors: Iterable[tuple[str, np.ndarray]], shard_bytes: int = 5 << 30
) -> list[str]:
    """Writes ``(name, array)`` pairs as safetensors shards in ``folder``; returns the files.

    One file, ``model.safetensors``, while the tensors fit in ``shard_bytes``; otherwise
    ``model-0000i-of-0000n.safetensors`` and ``model.safetensors.index.json``. Each shard is
    written as soon as it is full, so at most one shard is held in memory.
    """
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = []
    current: dict[str, np.ndarray] = {}
    size = 0
    written: list[str] = []

    def flush() -> None:
        nonlocal current, size
        if current:
            path = os.path.join(folder, f".shard-{len(written)}.safetensors")
            save_file(current, path, metadata={"format": "pt"})
            written.append(path)
            shards.append({name: None for name in current})
        current, size = {}, 0

    for name, array in tensors:
        array = np.ascontiguousarray(array)
        if size and size + array.nbytes > shard_bytes:
            flush()
        current[name] = array
        size += array.nbytes
    flush()
    if len(written) == 1:
        final = [os.path.join(folder, WEIGHTS_FILE)]
        os.replace(written[0], final[0])
        return final
    final, weight_map = [], {}
    for i, (path, names) in enumerate(zip(written, shards, strict=True)):
        name = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        os.replace(path, os.path.join(folder, name))
        final.append(os.path.join(folder, name))
        weight_map.update({n: name for n in names})
    with open(os.path.join(folder, INDEX_FILE), "w") as f:
        json.dump({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    return final
