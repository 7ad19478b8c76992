"""Writes ``posenc/hf/consumed.json``: for every ``model_type`` posenc's families read, the
``config.json`` keys that transformers' config class of that type consumes (run by hand).

posenc's import refuses a config field that its family does not read when transformers'
config class consumes it (the model may read it; posenc does not map it), and records any other
unread field as ignored (:meth:`posenc.hf.fields.HFConfig.finish`). Which keys a config class
consumes is read here from transformers itself, so the rule is transformers' own and not a list
of names kept by hand:

- the class's fields (transformers 5 config classes are dataclasses; its ``__init__``
  parameters under transformers 4), PretrainedConfig's own among them;
- the keys of its ``attribute_map`` (``n_embd`` for ``hidden_size``, ...);
- the keys its ``__init__``/``__post_init__`` (and, for a class with ``rope_parameters``, the
  ``convert_rope_params_to_dict`` that runs for it) name as ``kwargs.pop("...")`` or
  ``kwargs.get("...")`` and that constructing the class with that key really takes (converts,
  moves or validates) rather than keeping as a plain attribute (:func:`_taken`): Pythia's
  ``rotary_emb_base``, Gemma 3's ``rope_local_base_freq``, ``torch_dtype``; GPT-NeoX's
  converter keeps a top-level ``rope_theta`` as a plain attribute its model never reads;
- for a class with sub-configs (Gemma 3's ``text_config``), the ``model_type`` of each, whose
  own keys are recorded under that type;
- the class's default of each field with a plain JSON default (``defaults``): a consumed field
  stated at that value is what transformers builds without it (``is_encoder_decoder: false`` in
  an old decoder-only file), so it is accepted rather than refused.

Keys that transformers drops while reading (generation defaults, ``_name_or_path``) or keeps as
plain attributes no model reads (``unk_token_id``, ``transformers.js_config``) are not consumed.

    /work/refvenv/bin/python tests/hf/make_consumed.py   # rewrites posenc/hf/consumed.json

The model types are those of ``posenc/hf/*.py`` (each family's ``model_types``, read from the
source, as this environment has transformers but not posenc) and :data:`MORE`, the types
families being added read.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import re
import sys
import textwrap

import transformers
from transformers import AutoConfig, PretrainedConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "posenc", "hf", "consumed.json")
# Model types of families landing with issue 32 (their modules may not exist yet here).
MORE = (
    "mistral",
    "qwen3",
    "smollm3",
    "cohere2",
    "gemma2",
    "gemma3_text",
    "gemma3",
    "olmo2",
    "olmo3",
)
# The methods of a config class that read config.json keys out of their keyword arguments.
READERS = ("__init__", "__post_init__")
ROPE_READERS = ("convert_rope_params_to_dict",)
_TAKEN = re.compile(r"""kwargs\.(?:pop|get)\(\s*["']([^"']+)["']""")


def family_model_types() -> list[str]:
    """The ``model_types`` of every family module, read from its source (literal tuples, or
    ``tuple(NAME)`` of a literal dict in the module)."""
    found = []
    folder = os.path.join(ROOT, "posenc", "hf")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(folder, name)).read())
        literals = {
            t.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target = node.targets[0]
            if not (isinstance(target, ast.Name) and target.id == "model_types"):
                continue
            value = node.value
            if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Name):
                value = literals.get(value.args[0].id, value)
            try:
                found += list(ast.literal_eval(value))
            except ValueError:
                print(f"{name}: model_types is no literal; add its types to MORE", file=sys.stderr)
    return found


def consumed(cls: type[PretrainedConfig]) -> set[str]:
    """The ``config.json`` keys config class ``cls`` consumes (module docstring)."""
    if dataclasses.is_dataclass(cls):
        keys = {f.name for f in dataclasses.fields(cls)}
    else:  # transformers 4: __init__ parameters, PretrainedConfig's own included
        keys = set()
        for c in cls.__mro__:
            if "__init__" in c.__dict__:
                keys |= set(inspect.signature(c.__init__).parameters)
        keys -= {"self", "kwargs", "args"}
    keys |= set(getattr(cls, "attribute_map", {}))
    readers = READERS + (ROPE_READERS if "rope_parameters" in keys else ())
    named = set()
    for name in readers:
        for c in cls.__mro__:
            if name not in c.__dict__ or not c.__module__.startswith("transformers"):
                continue
            try:
                source = textwrap.dedent(inspect.getsource(c.__dict__[name]))
            except (OSError, TypeError):  # a dataclass's generated __init__: look further up
                continue
            named |= set(_TAKEN.findall(source))
            if f"super().{name}(" not in source:
                break  # this definition replaces those above it
    return keys | {key for key in named - keys if _taken(cls, key)}


def defaults(cls: type[PretrainedConfig]) -> dict[str, object]:
    """The class's default of each consumed field that has a plain JSON default (a bool,
    number, string or null): a config stating that value is the model transformers builds when
    the config omits the field, which the golden files of each family were made with."""
    out = {}
    if dataclasses.is_dataclass(cls):
        pairs = [(f.name, f.default) for f in dataclasses.fields(cls)]
    else:
        pairs = []
        for c in reversed(cls.__mro__):
            if "__init__" in c.__dict__:
                params = inspect.signature(c.__init__).parameters.values()
                pairs += [(p.name, p.default) for p in params]
    for name, value in pairs:
        if value is None or isinstance(value, bool | int | float | str):
            out[name] = value
    return out


# A value no config class has as a default, to tell a key the class keeps from one it takes.
_PROBE = 12345.0


def _taken(cls: type[PretrainedConfig], key: str) -> bool:
    """Whether constructing ``cls`` with ``key`` takes it out of the keyword arguments (moves or
    converts it, or refuses the value) rather than keeping it as a plain attribute: a name a
    method only mentions in a branch that does not run for this class is not consumed."""
    try:
        config = cls(**{key: _PROBE})
    except Exception:  # noqa: BLE001 - the class validates the key: it reads it
        return True
    kept = dict(vars(config))
    if kept.pop(key, None) != _PROBE:
        return True
    return _holds(kept)  # kept, but also copied where the model reads it (Phi-3's rope dict)


def _holds(value) -> bool:
    """Whether :data:`_PROBE` is somewhere in ``value`` (nested dicts, lists, configs)."""
    if isinstance(value, float) and value == _PROBE:
        return True
    if isinstance(value, dict):
        return any(_holds(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds(v) for v in value)
    if isinstance(value, PretrainedConfig):
        return _holds(dict(vars(value)))
    return False


def main() -> int:
    types = sorted(set(family_model_types()) | set(MORE))
    table: dict[str, dict] = {}
    todo = list(types)
    while todo:
        model_type = todo.pop(0)
        if model_type in table:
            continue
        cls = type(AutoConfig.for_model(model_type))
        subs = {
            key: spec.model_type for key, spec in getattr(cls, "sub_configs_defaults", {}).items()
        }
        entry = {
            "class": cls.__name__,
            "keys": sorted(consumed(cls)),
            "defaults": dict(sorted(defaults(cls).items())),
        }
        if subs:
            entry["sub_configs"] = subs
            todo += list(subs.values())
        table[model_type] = entry
    out = {
        "about": "config.json keys each transformers config class consumes; written by "
        "tests/hf/make_consumed.py",
        "transformers_version": transformers.__version__,
        "model_types": dict(sorted(table.items())),
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(table)} model types, transformers {transformers.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
