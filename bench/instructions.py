"""Instructions per turn under valgrind, where ``perf`` has no hardware counters.

Most virtual machines expose no instruction counter, so ``perf stat`` counts nothing.
Valgrind's cachegrind counts instructions by running the program on a simulated CPU.
Its count does not depend on the machine's load or speed.
So a change of one percent shows in one run, where CPU time needs many.

It counts user space only, like ``instructions:u``. A system call counts as the few
instructions that make it, however long the kernel works on it. So a turn's
``fdatasync`` counts almost nothing. The kernel's ratio to the floor in these terms is
the Python and SQLite work of each, without the syncs they share.

A row runs in two child processes, both under cachegrind. Both set the row up and warm
it. Then one runs ``turns`` more turns. The difference between the two counts, over
``turns``, is the count a turn: set-up and import cancel out. The children fix
``PYTHONHASHSEED``, so both iterate their sets and dicts alike. Two runs of the same
tree then agree within a few hundredths of a percent.

Only one client is counted. Valgrind runs one thread at a time. With many turns in
flight, the writer thread's groups would follow valgrind's scheduling, not the code.

The child: ``python -m bench.instructions ROW DIR DSN SCHEMA WARM TURNS``.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Cachegrind without its cache simulation: it only counts instructions.
VALGRIND = ("valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null")
#: A child that runs longer than this has hung.
#: Under valgrind a bridge turn takes well under a second.
TIMEOUT_S = 900
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def valgrind_available() -> tuple[bool, str]:
    """Whether valgrind is installed, and if not, why there is no count."""
    if shutil.which("valgrind") is None:
        return False, "valgrind not installed (Debian: valgrind)"
    return True, ""


def parse_cachegrind(stderr: str) -> int | None:
    """The ``I refs`` total in cachegrind's summary, or ``None`` if there is none."""
    found = _REFS.findall(stderr)
    return int(found[-1].replace(",", "")) if found else None


def count(
    row: str,
    *,
    tree: Path | None,
    directory: str,
    dsn: str,
    schema: str,
    warm: int,
    turns: int,
) -> tuple[float | None, str]:
    """Instructions per turn of ``row`` (one client), or ``None`` and why.

    ``tree`` is a source tree with ``src/`` (a ``--base``), or ``None`` for this one.
    """
    from bench.cost import _env

    # Bytecode caches on, in a directory of their own: compiling every module again
    # under valgrind costs a child more than its turns.
    env = {**_env(tree), "PYTHONHASHSEED": "0"}

    def run(prefix: tuple[str, ...], more: int) -> tuple[int | None, str]:
        """One child: its ``I refs`` (under valgrind), or ``None`` and why it failed."""
        with tempfile.TemporaryDirectory(dir=directory) as scratch:
            argv = [*prefix, sys.executable, "-m", "bench.instructions", row, scratch]
            argv += [dsn, f"{schema}_{more}", str(warm), str(more)]
            try:
                done = subprocess.run(
                    argv,
                    cwd=Path(__file__).parent.parent,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                return None, f"valgrind: {row} ran past {TIMEOUT_S} s"
        refs = parse_cachegrind(done.stderr)
        if done.returncode == 0 and (refs is not None or not prefix):
            return refs, ""
        # The child's own last line: valgrind's lines start with "==<pid>==".
        own = [line for line in done.stderr.splitlines() if line and line[:2] != "=="]
        return None, f"valgrind: {row} exited {done.returncode}: {(own or ['no output'])[-1]}"

    # The first run, without valgrind and uncounted, writes those caches: it imports what
    # the turns import. Both counted children then load them. Else only the first
    # would pay for compiling.
    _, why = run((), 0)
    if why:
        return None, why
    before, why = run(VALGRIND, 0)
    if before is None:
        return None, why
    after, why = run(VALGRIND, turns)
    if after is None:
        return None, why
    return (after - before) / turns, ""


async def _child(row: str, directory: str, dsn: str, schema: str, warm: int, turns: int) -> None:
    from bench.worker import Worker, make_row

    runner = make_row(row, directory, dsn, schema)
    await runner.setup()
    try:
        worker = Worker(runner, "vg")
        await worker.turns(warm)
        if turns:
            await worker.turns(turns)
    finally:
        await runner.close()
        if "postgres" in row:
            from bench.run import drop_schemas

            drop_schemas(schema)


def main() -> None:
    row, directory, dsn, schema, warm, turns = sys.argv[1:7]
    asyncio.run(_child(row, directory, dsn, schema, int(warm), int(turns)))


if __name__ == "__main__":
    main()
