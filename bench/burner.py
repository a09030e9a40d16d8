"""CPU burners beside a run: ``python -m bench --burner N``.

A busy host runs other jobs beside the kernel. Issue 35 judges 64 turns in flight
with one core kept busy (load about 1). A burner is a child process that spins on one
core until the run ends. Each runs at the same priority as the benchmark.
The run's JSON records how many ran (``burner``), and the report's header says so.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

#: What each burner runs: a loop that never sleeps.
SPIN = "while True: pass"


def checked(count: int) -> int:
    """``count`` as a number of burners; ``ValueError`` if it is negative."""
    if count < 0:
        raise ValueError(f"--burner takes a count of cores, not {count}")
    return count


@contextlib.contextmanager
def burners(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Keep ``count`` cores busy while the block runs; none are left after it."""
    checked(count)
    spinning: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            spinning.append(subprocess.Popen([sys.executable, "-c", SPIN]))
        yield spinning
    finally:
        # Killed, then reaped: a burner left behind would slow every later run.
        for burner in spinning:
            burner.kill()
        for burner in spinning:
            burner.wait()


def header(count: int) -> str:
    """The report's line for a run with burners, or nothing."""
    if not count:
        return ""
    cores = "core" if count == 1 else "cores"
    return f"{count} CPU burner{'' if count == 1 else 's'} ({count} {cores}) ran beside this run"
