"""The run-kind battery (posenc.testing.kinds) over every registered kind: each trains, resumes
bit for bit, evaluates, plans, reports and refuses another kind's config.

The checks that train (a few seconds to a minute per kind) run in the slow step; posenc's own
kinds are trained, resumed and evaluated by their own tests in the default one, and the plugin
kind of tests/kinds/test_plugin_kind.py runs every check there."""

from __future__ import annotations

import pytest

from posenc import kinds
from posenc.testing import kinds as battery

QUICK = ("declarations", "refuses_others")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: tmp_path_factory.mktemp(name) for name in kinds.names()}


@pytest.mark.parametrize(
    "check", [c if c in QUICK else pytest.param(c, marks=pytest.mark.slow) for c in battery.CHECKS]
)
@pytest.mark.parametrize("name", kinds.names())
def test_kind_contract(name, check, folders):
    kind = kinds.get(name)
    config = battery.example_config(kind, folders[name])
    battery.CHECKS[check](kind, config, folders[name])
