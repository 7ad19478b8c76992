"""A kind of run added by a plugin: one file (tests/kinds/toy_kind.py), registered through the
``posenc.kinds`` entry points with no edit to posenc, trains, resumes, evaluates, plans and
reports through the generic machinery (the kind battery)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from posenc import kinds
from posenc.kinds import registry
from posenc.testing import kinds as battery

HERE = Path(__file__).resolve().parent


@pytest.fixture
def plugin(monkeypatch, tmp_path):
    """An installed distribution whose ``posenc.kinds`` entry point names tests/kinds/toy_kind.py;
    the registry loads again, and forgets the kind afterwards."""
    info = tmp_path / "site" / "posenc_toy_kind-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: posenc-toy-kind\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[posenc.kinds]\ncounting = toy_kind\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_loaded", False)
    yield tmp_path
    sys.modules.pop("toy_kind", None)


def test_the_entry_point_registers_the_kind_and_it_is_chosen_by_its_config(plugin):
    assert "counting" in kinds.names()
    kind = kinds.get("counting")
    assert type(kind).__module__ == "toy_kind"
    config = battery.example_config(kind, plugin / "run")
    assert kinds.kind_of(config) is kind
    # posenc's own kinds still choose their configs.
    for name in ("causal_lm", "task"):
        own = battery.example_config(kinds.get(name), plugin / name)
        assert kinds.kind_of(own).name == name


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """One folder for every check, so that the run trained by the first is read by the rest."""
    return tmp_path_factory.mktemp("counting")


@pytest.mark.parametrize("check", list(battery.CHECKS))
def test_the_plugin_kind_passes_the_battery(plugin, folder, check):
    kind = kinds.get("counting")
    config = battery.example_config(kind, folder)
    battery.CHECKS[check](kind, config, folder)
