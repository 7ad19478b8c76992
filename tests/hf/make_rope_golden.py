"""Records how transformers itself reads the rotary embedding of a table of Llama configs, into
``tests/hf/rope_golden.json`` (run by hand; the default test, test_rope_golden.py, needs
neither torch nor transformers).

Each row is the tiny golden Llama's ``config.json`` (tests/hf/golden/llama) with its RoPE fields
replaced: transformers 5's ``rope_parameters``, the older ``rope_scaling``, both at once (where
transformers' ``convert_rope_params_to_dict`` lets a non-empty ``rope_scaling`` replace
``rope_parameters`` whole), and malformed ones. For each, transformers loads the config as
``from_pretrained`` does (``AutoConfig`` on a folder) and builds ``LlamaRotaryEmbedding``; the
golden holds what it resolved (``rope_parameters``), the inverse frequencies and attention
scaling it computes, the error it raised and the warnings it logged. Each row also states what
posenc must do: ``"reads"`` (the same frequencies and scaling) or ``"refuses"`` (a one-line
error; the test checks that transformers raised or warned on such a row).

    python tests/hf/make_rope_golden.py     # rewrites tests/hf/rope_golden.json
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "rope_golden.json")
BASE = os.path.join(HERE, "golden", "llama", "config.json")
_DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}
_LLAMA3 = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}

# name -> (posenc's duty, the RoPE fields of config.json); a field set to None is removed.
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    # both present: a non-empty rope_scaling replaces rope_parameters
    "params_default_scaling_linear": (
        "reads",
        {"rope_parameters": _DEFAULT, "rope_scaling": {"type": "linear", "factor": 2.0}},
    ),
    "params_linear2_scaling_linear4": (
        "reads",
        {
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            "rope_scaling": {"rope_type": "linear", "factor": 4.0},
        },
    ),
    "params_yarn_scaling_empty": ("reads", {"rope_parameters": _YARN, "rope_scaling": {}}),
    "params_yarn_scaling_null": ("reads", {"rope_parameters": _YARN, "rope_scaling": None}),
    "params_theta_scaling_without_theta": (
        "reads",
        {
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
    "params_theta_scaling_and_top_theta": (
        "reads",
        {
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "rope_theta": 20000.0,
        },
    ),
    "params_llama3_scaling_yarn": ("reads", {"rope_parameters": _LLAMA3, "rope_scaling": _YARN}),
    "params_theta_and_top_theta": (
        "reads",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "rope_theta": 1e4},
    ),
    "type_and_rope_type": (
        "reads",
        {
            "rope_parameters": None,
            "rope_scaling": {"type": "dynamic", "rope_type": "linear", "factor": 2.0},
        },
    ),
    # old-style configs: rope_scaling and rope_theta beside the other fields
    "old_linear": (
        "reads",
        {
            "rope_parameters": None,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "rope_theta": 5e4,
        },
    ),
    "old_dynamic": (
        "reads",
        {"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
    ),
    "old_yarn": (
        "reads",
        {"rope_parameters": None, "rope_scaling": {"type": "yarn", "factor": 2.0}},
    ),
    "old_llama3": ("reads", {"rope_parameters": None, "rope_scaling": _LLAMA3}),
    "old_no_rope_fields": ("reads", {"rope_parameters": None}),
    # malformed: transformers raises or warns; posenc refuses
    "old_linear_without_factor": (
        "refuses",
        {"rope_parameters": None, "rope_scaling": {"type": "linear"}},
    ),
    "old_llama3_without_freq_factors": (
        "refuses",
        {
            "rope_parameters": None,
            "rope_scaling": {"rope_type": "llama3", "factor": 4.0},
        },
    ),
    "old_yarn_without_factor": (
        "refuses",
        {"rope_parameters": None, "rope_scaling": {"type": "yarn"}},
    ),
    "old_scaling_a_list": (
        "refuses",
        {"rope_parameters": None, "rope_scaling": ["linear", 2.0]},
    ),
    "scaling_unknown_type": (
        "refuses",
        {"rope_parameters": _DEFAULT, "rope_scaling": {"type": "stretchy", "factor": 2.0}},
    ),
    "scaling_negative_factor": (
        "refuses",
        {"rope_parameters": _DEFAULT, "rope_scaling": {"type": "linear", "factor": -2.0}},
    ),
    "scaling_string_factor": (
        "refuses",
        {"rope_parameters": _DEFAULT, "rope_scaling": {"type": "linear", "factor": "2"}},
    ),
    "scaling_factor_below_one": (
        "refuses",
        {"rope_parameters": _DEFAULT, "rope_scaling": {"type": "linear", "factor": 0.5}},
    ),
    "params_negative_factor": (
        "refuses",
        {"rope_parameters": {"rope_type": "linear", "factor": -2.0, "rope_theta": 1e4}},
    ),
    "params_unknown_type": (
        "refuses",
        {"rope_parameters": {"rope_type": "stretchy", "factor": 2.0, "rope_theta": 1e4}},
    ),
}


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def transformers_reading(fields: dict[str, Any]) -> dict[str, Any]:
    """What transformers resolves of ``fields`` (a whole config.json): see the module docstring."""
    out: dict[str, Any] = {"error": None, "warnings": []}
    handler = _Warnings()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    transformers.logging.set_verbosity_warning()
    try:
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(fields, f)
            config = transformers.AutoConfig.from_pretrained(folder)
            out["rope_parameters"] = _plain(config.rope_parameters)
            rotary = LlamaRotaryEmbedding(config)
            out["inv_freq"] = [float(x) for x in rotary.inv_freq]
            out["attention_scaling"] = float(rotary.attention_scaling)
    except Exception as e:  # noqa: BLE001 - recorded: posenc must refuse such a row
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        logger.removeHandler(handler)
    out["warnings"] = handler.lines
    return out


def main() -> None:
    with open(BASE) as f:
        base = json.load(f)
    rows = {}
    for name, (duty, rope) in ROWS.items():
        fields = {k: v for k, v in base.items() if k not in ("rope_parameters", "rope_scaling")}
        for key, value in rope.items():
            if value is None:
                fields.pop(key, None)
            else:
                fields[key] = value
        rows[name] = {
            "posenc": duty,
            "config": fields,
            "transformers": transformers_reading(fields),
        }
    with open(OUT, "w") as f:
        json.dump({"transformers_version": transformers.__version__, "rows": rows}, f, indent=1)
        f.write("\n")
    for name, row in rows.items():
        t = row["transformers"]
        print(f"{name:40s} {row['posenc']:8s} {t['error'] or t.get('rope_parameters')}")
        for w in t["warnings"]:
            print("    warning:", w[:150])


if __name__ == "__main__":
    main()
