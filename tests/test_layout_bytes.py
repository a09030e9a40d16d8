"""Every store writes the very checkpoint rows an earlier tree wrote, byte for byte.

``tests/fixtures/layout/main-69130ef.json`` holds the rows that ``main`` at 69130ef
left after ``tests/layout_support.py``'s workload, on each bundled store. The workload
commits differences, trims messages and the receipt index, and moves receipt entries.
A migration then writes each checkpoint anew, and one more turn commits a difference.
A move of the stored layout's code that changed one byte of a core or a row fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layout_support import STORES, written

FIXTURE = Path(__file__).parent / "fixtures" / "layout" / "main-69130ef.json"


@pytest.mark.parametrize("name", STORES)
async def test_the_workload_stores_the_rows_the_earlier_tree_stored(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    dsn = request.getfixturevalue("postgres_dsn") if name == "postgres" else None
    expected = json.loads(FIXTURE.read_text(encoding="utf-8"))[name]
    found = await written(name, tmp_path, dsn)
    for stage in ("turns", "migrated", "after"):
        assert found[stage] == expected[stage], stage
    # The stages differ, so each compares rows the workload really wrote.
    assert expected["turns"] != expected["migrated"] != expected["after"]
