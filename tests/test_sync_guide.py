"""The guide ``docs/guides/synchronous.md`` runs as written and prints what it says.

Each ``python`` block runs in a process of its own, offline, on a temporary SQLite
file; a block marked ``<!-- docs: skip (...) -->`` needs a service or a framework the
tests do not start (Django, Celery's broker) and is only compiled.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).parent.parent / "docs" / "guides" / "synchronous.md"
BLOCK = re.compile(r"(<!-- docs: skip[^\n]*-->\n)?```python\n(.*?)```", re.S)
BLOCKS = BLOCK.findall(GUIDE.read_text(encoding="utf-8"))

#: What the prose after each runnable block says it prints.
PRINTS = {
    0: "completed {'due': 4200}\nTrue\n",
    1: "step\nresult\n",
    4: "requested\nCancelled before it finished: the person pressed stop\n",
    5: "False True {'due': 4200}\n",
}


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_block_of_the_guide_runs_as_written(index: int) -> None:
    skip, code = BLOCKS[index]
    compile(code, f"{GUIDE.name} block {index}", "exec")
    if skip:
        return
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    if index in PRINTS:
        assert done.stdout == PRINTS[index]


def test_the_guide_has_the_blocks_its_expectations_name() -> None:
    assert len(BLOCKS) == 8
    assert [bool(skip) for skip, _ in BLOCKS] == [False] * 6 + [True, True]
