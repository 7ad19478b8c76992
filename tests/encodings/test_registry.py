"""The encoder registry (posenc.encodings.registry): decorator registration, discovery of the
package's modules, entry-point plugins; and the founding encoders' declarations."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from posenc import encodings, testing
from posenc.encodings import Dims, registry

FOUNDING = ("alibi", "learned", "nope", "rope", "shaw", "sinusoidal", "t5", "xl")

# Which hooks each founding encoder provides, and where its parameters live (DESIGN.md).
EXPECTED_HOOKS = {
    "sinusoidal": ("embed",),
    "learned": ("embed",),
    "shaw": ("content_logits", "value_term"),
    "xl": ("content_logits",),
    "t5": ("bias",),
    "rope": ("rotate",),
    "alibi": ("bias",),
    "nope": (),
}
SHARED = {"sinusoidal", "learned", "t5"}
ABSOLUTE = {"sinusoidal", "learned"}  # the rest see positions only through differences
EVAL_SAFE = {
    "xl": ("clamp_len",),  # the original Transformer-XL clamps only at evaluation
    # Context extension without retraining (PI, NTK, dynamic NTK, YaRN, Llama 3.1's bands,
    # LongRoPE's per-pair factors, STRING).
    "rope": (
        "scaling",
        "factor",
        "original_max_len",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "low_freq_factor",
        "high_freq_factor",
        "short_factor",
        "long_factor",
        # STRING (An et al. 2024), an inference-time shift of the far distances.
        "string_shift",
        "string_window",
    ),
}


def test_the_eight_founding_encoders_are_registered():
    assert set(FOUNDING) <= set(encodings.names())
    assert list(encodings.names()) == sorted(encodings.names())


@pytest.mark.parametrize("name", FOUNDING)
def test_each_founding_encoder_declares_its_hooks_scope_paper_and_contract(name):
    enc = encodings.get(name)
    assert enc.name == name and enc.paper
    assert enc.hooks == EXPECTED_HOOKS[name]
    assert enc.param_scope == ("shared" if name in SHARED else "layer")
    assert enc.relative is (name not in ABSOLUTE)
    assert enc.eval_safe_hparams == EVAL_SAFE.get(name, ())
    assert "dims" not in enc.hparams()
    assert set(enc.hparams()) == set(encodings.hparam_names(name))


def test_unknown_encoder_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown encoding.name 'ropee'") as info:
        encodings.get("ropee")
    for name in FOUNDING:
        assert name in str(info.value)


def test_unknown_hyperparameter_is_named_with_the_accepted_ones():
    with pytest.raises(ValueError, match="theta") as info:
        encodings.get("rope", theta=1e4)
    for field in ("base", "layout", "fraction"):
        assert field in str(info.value)
    with pytest.raises(ValueError, match=r"accepts: \(none\)"):
        encodings.get("nope", base=1.0)
    # dims is set by bind, not a hyperparameter.
    with pytest.raises(ValueError, match="dims"):
        encodings.get("alibi", dims=Dims(1, 1, 1))


def test_bind_fills_dims_and_rejects_bad_shapes():
    enc = encodings.get("rope")
    with pytest.raises(RuntimeError, match="not bound"):
        _ = enc.bound_dims
    dims = Dims(num_heads=2, head_dim=8, model_dim=16)
    bound = enc.bind(dims)
    assert bound.dims == dims and enc.dims is None  # bind returns a copy
    with pytest.raises(ValueError, match="model.num_heads"):
        enc.bind(Dims(num_heads=0, head_dim=8, model_dim=16))


def test_encoders_are_frozen_and_hashable():
    enc = encodings.get("shaw", max_distance=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        enc.max_distance = 5
    assert hash(enc) == hash(encodings.get("shaw", max_distance=4))


def test_register_refuses_a_second_class_under_a_taken_name():
    @dataclasses.dataclass(frozen=True)
    class Impostor(encodings.Encoding):
        name = "rope"

    with pytest.raises(ValueError, match="'rope' is already registered by posenc.encodings.rope"):
        encodings.register(Impostor)
    assert encodings.get_class("rope") is encodings.RoPE
    assert encodings.register(encodings.RoPE) is encodings.RoPE  # the same class again: no-op
    with pytest.raises(TypeError, match="Encoding subclass"):
        encodings.register(object)

    class Nameless(encodings.Encoding):
        pass

    with pytest.raises(ValueError, match="Nameless has no `name`"):
        encodings.register(Nameless)


# -- discovery: package modules and entry points ----------------------------------------------


ENCODER_MODULE = """
import dataclasses

import jax.numpy as jnp

from posenc.encodings import Encoding, register


@register
@dataclasses.dataclass(frozen=True)
class {cls}(Encoding):
    name = "{name}"
    paper = "a test"
    relative = True

    def bias(self, params, q_pos, k_pos):
        return jnp.zeros((1, 1, q_pos.shape[-1], k_pos.shape[-1]))
"""


@pytest.fixture
def fresh_registry(monkeypatch, request):
    """A registry that loads again on its next query, restored (with sys.modules) afterwards."""
    modules = set(sys.modules)
    with testing.temporary_registry():
        monkeypatch.setattr(registry, "_loaded", False)
        monkeypatch.setattr(registry, "_FAILED_PLUGINS", {})
        yield
    for name in set(sys.modules) - modules:
        if name.startswith(("plugin_", "posenc.encodings.zz_")):
            del sys.modules[name]


def _distribution(root, name, entry_points, modules):
    """Writes an installed distribution (dist-info with entry points) and its modules."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = [f"{key} = {value}" for key, value in entry_points.items()]
    (info / "entry_points.txt").write_text("[posenc.encodings]\n" + "\n".join(lines) + "\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


def test_a_module_added_to_the_package_is_discovered_without_editing_a_list(
    fresh_registry, monkeypatch, tmp_path
):
    # A directory appended to the package's __path__ stands for a new file in posenc/encodings/.
    (tmp_path / "zz_discovered.py").write_text(ENCODER_MODULE.format(cls="Found", name="found"))
    monkeypatch.setattr(encodings, "__path__", [*encodings.__path__, str(tmp_path)])
    assert "found" in encodings.names()
    assert encodings.get_class("found").__module__ == "posenc.encodings.zz_discovered"
    monkeypatch.delattr(encodings, "zz_discovered")


def test_entry_points_register_modules_and_classes(fresh_registry, monkeypatch, tmp_path):
    plain = ENCODER_MODULE.replace("@register\n", "")  # an undecorated class, named directly
    site = _distribution(
        tmp_path,
        "posenc_plugin_demo",
        {"by-module": "plugin_by_module", "by-class": "plugin_by_class:Plain"},
        {
            "plugin_by_module": ENCODER_MODULE.format(cls="ByModule", name="by-module"),
            "plugin_by_class": plain.format(cls="Plain", name="by-class"),
        },
    )
    monkeypatch.syspath_prepend(str(site))
    assert registry._loaded is False
    assert {"by-module", "by-class"} <= set(encodings.names())
    assert encodings.get("by-class").bias is not None
    assert set(FOUNDING) <= set(encodings.names())


def test_a_broken_plugin_warns_naming_its_entry_point(fresh_registry, monkeypatch, tmp_path):
    site = _distribution(
        tmp_path,
        "posenc_plugin_broken",
        {
            "broken": "plugin_broken",
            "missing": "plugin_not_there",
            "impostor": "plugin_impostor",
        },
        {
            "plugin_broken": "raise RuntimeError('kaboom')\n",
            "plugin_impostor": ENCODER_MODULE.format(cls="Impostor", name="rope"),
        },
    )
    monkeypatch.syspath_prepend(str(site))
    with pytest.warns(RuntimeWarning) as warned:
        known = encodings.names()
    messages = "\n".join(str(w.message) for w in warned)
    assert "'broken = plugin_broken'" in messages and "kaboom" in messages
    assert "'missing = plugin_not_there'" in messages and "ModuleNotFoundError" in messages
    assert "'impostor = plugin_impostor'" in messages and "already registered" in messages
    assert set(FOUNDING) <= set(known) and "broken" not in known
    assert encodings.get_class("rope") is encodings.RoPE
    with pytest.raises(ValueError, match="unknown encoding.name 'broken'; known encodings: alibi"):
        encodings.get("broken")


def test_a_fresh_process_that_only_calls_get_sees_plugins(tmp_path):
    # What the CLI and sweep child processes do: import posenc.encodings and call get(name).
    site = _distribution(
        tmp_path,
        "posenc_plugin_child",
        {"child": "plugin_child"},
        {"plugin_child": ENCODER_MODULE.format(cls="Child", name="child")},
    )
    code = "from posenc import encodings; print(type(encodings.get('child')).__name__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "Child"
