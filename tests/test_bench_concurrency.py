"""The concurrency group measures the base tree as it measures the current one."""

from __future__ import annotations

import pytest
from bench.concurrency import LEVELS, measured


@pytest.mark.parametrize("postgres", [False, True])
def test_the_base_tree_runs_every_level_the_current_one_runs(postgres: bool) -> None:
    # A store's CPU per turn grows as it grows: a base that skipped level 1 read faster.
    entries = measured(postgres=postgres, base=True)
    levels = {name: [n for each, n in entries if each == name] for name, _ in entries}
    assert levels["base"] == levels["overlap"] == list(LEVELS)
    assert "base" not in dict(measured(postgres=postgres, base=False))
