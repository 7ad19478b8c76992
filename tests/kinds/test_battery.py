"""The run-kind battery (posenc.testing.kinds) over every registered kind: each trains, resumes
bit for bit, evaluates, plans, reports and refuses another kind's config."""

from __future__ import annotations

import pytest

from posenc import kinds
from posenc.testing import kinds as battery


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: tmp_path_factory.mktemp(name) for name in kinds.names()}


@pytest.mark.parametrize("check", list(battery.CHECKS))
@pytest.mark.parametrize("name", kinds.names())
def test_kind_contract(name, check, folders):
    kind = kinds.get(name)
    config = battery.example_config(kind, folders[name])
    battery.CHECKS[check](kind, config, folders[name])
