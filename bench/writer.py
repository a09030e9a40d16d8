"""Where the SQLite writer thread's time goes: ``python -m bench.writer [--n 16 64]``.

It runs the concurrency group's row in-process: ``ik-sqlite-full-overlap``, n clients
at once over one kernel and one ``SQLiteDurability(synchronous="FULL")``. Each level
is a block of its own after a warm-up. Per level it prints:

- CPU per turn: the process's, and the adapter's worker thread's (its thread clock).
- Python calls per turn on the event loop's thread and on the worker. They are
  cProfile's counts, a deterministic figure where CPU time is noisy.
- Statements per turn on every connection, and writer transactions per turn.
- With ``--statements``, the worker's CPU per statement kind. It is thread time
  around each call, so the wrapper's own cost lands in the figures too.
- With ``--profile``, cProfile of the worker thread, by own time.
- With ``--batch``, what one ``executemany`` per statement kind per group would save.
  It compares that with one per kind per write, for the commit's row statements
  (messages, fact, events). Groups of ten writes run each way, alternating.

The block with the counters runs apart from the block timed. So neither the trace
callback nor the profiler weighs on the CPU figures. ``--out`` writes the figures as
JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import io
import json
import pstats
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from bench.counting import install_sqlite_trace, profiled_calls
from bench.worker import KernelRow, Worker, _writer_cpu, _writer_worker


class _Timed:
    """A connection whose statements' thread time is added up by kind."""

    def __init__(self, conn: sqlite3.Connection, kinds: dict[str, list[float]]) -> None:
        self._conn, self._kinds = conn, kinds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def _count(self, kind: str, started: float) -> None:
        entry = self._kinds[kind]
        entry[0] += 1
        entry[1] += time.thread_time() - started

    def execute(self, sql: str, *args: Any) -> Any:
        started = time.thread_time()
        try:
            return self._conn.execute(sql, *args)
        finally:
            self._count(" ".join(sql.split()[:3]), started)

    def executemany(self, sql: str, rows: Any) -> Any:
        started = time.thread_time()
        try:
            return self._conn.executemany(sql, rows)
        finally:
            self._count("many " + " ".join(sql.split()[:3]), started)


async def level(n: int, turns: int, statements: bool, profile: bool) -> dict[str, Any]:
    counter = install_sqlite_trace()
    with tempfile.TemporaryDirectory() as directory:
        row = KernelRow("sqlite", str(Path(directory) / "w.db"), "", "", "FULL", model_awaits=True)
        await row.setup()
        try:
            worker = Worker(row, "w")
            writer = _writer_worker(row)
            await worker.overlap(n, 4 * n)  # warm-up
            cpu0, writer0, groups0 = time.process_time(), _writer_cpu(row), writer.groups
            done = await worker.overlap(n, turns)
            count = done["turns"]
            out: dict[str, Any] = {
                "n": n,
                "turns": count,
                "cpu_us": 1e6 * (time.process_time() - cpu0) / count,
                "writer_cpu_us": 1e6 * ((_writer_cpu(row) or 0.0) - (writer0 or 0.0)) / count,
                "writer_transactions_per_turn": (writer.groups - groups0) / count,
            }
            # The counted block: Python calls on both threads, statements.
            loop_prof, writer_prof = cProfile.Profile(), cProfile.Profile()
            await writer.submit(writer_prof.enable)
            sent = counter.statements
            loop_prof.enable()
            done = await worker.overlap(n, turns)
            loop_prof.disable()
            await writer.submit(writer_prof.disable)
            count = done["turns"]
            out["loop_calls_per_turn"] = profiled_calls(loop_prof) / count
            out["writer_calls_per_turn"] = profiled_calls(writer_prof) / count
            out["statements_per_turn"] = (counter.statements - sent) / count
            if statements:
                out["statements"] = await _by_kind(worker, writer, n, turns)
            if profile:
                out["profile"] = await _profile(worker, writer, n, turns)
        finally:
            await row.close()
    return out


async def _by_kind(worker: Worker, writer: Any, n: int, turns: int) -> dict[str, Any]:
    from intention_kernel.durability.sqlite import _group

    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    original: Any = _group.GroupWriter._commit_group

    # ``rest``: what the tree's ``_commit_group`` takes after the group, if anything.
    # Trees before ``careful`` take nothing more.
    def timed(self: Any, conn: sqlite3.Connection, group: Any, *rest: Any) -> Any:
        return original(self, cast(sqlite3.Connection, _Timed(conn, kinds)), group, *rest)

    _group.GroupWriter._commit_group = timed  # type: ignore[method-assign,assignment]
    try:
        done = await worker.overlap(n, turns)
    finally:
        _group.GroupWriter._commit_group = original  # type: ignore[method-assign]
    count = done["turns"]
    return {
        kind: {"calls_per_turn": calls / count, "us_per_turn": 1e6 * spent / count}
        for kind, (calls, spent) in sorted(kinds.items(), key=lambda kv: -kv[1][1])
    }


async def _profile(worker: Worker, writer: Any, n: int, turns: int) -> str:
    profile = cProfile.Profile(time.thread_time)
    await writer.submit(profile.enable)
    await worker.overlap(n, turns)
    await writer.submit(profile.disable)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def batch(groups: int = 4000, size: int = 10) -> dict[str, float]:
    """Thread CPU per write of the commit's row statements, median over ``groups``
    groups of ``size`` writes run each way in alternation (``synchronous=OFF``: the
    statements, not the flush)."""
    import os
    import statistics

    from intention_kernel.durability.sqlite import SQLiteDurability
    from intention_kernel.durability.sqlite._statements import (
        INSERT_EVENT,
        INSERT_MESSAGE,
        UPSERT_FACT,
    )

    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "b.db")

        async def create() -> None:
            async with SQLiteDurability(path):
                pass

        asyncio.run(create())
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous = OFF")
        numbers = iter(range(1, 10**9))
        kinds_sql = (INSERT_MESSAGE, UPSERT_FACT, INSERT_EVENT)

        def rows(thread: str) -> tuple[list[Any], list[Any], list[Any]]:
            n = next(numbers)
            messages = [(thread, 2 * n, "m" * 120), (thread, 2 * n + 1, "r" * 120)]
            facts = [(thread, f"k{n}", '{"v": 1}')]
            events = [
                (os.urandom(8).hex(), thread, str(n), 3 * n + i, "e", '{"a": 1}', "2026")
                for i in range(3)
            ]
            return messages, facts, events

        def group(batched: bool) -> None:
            conn.execute("BEGIN IMMEDIATE")
            kinds: list[list[Any]] = [[], [], []]
            for w in range(size):
                for kind, found in zip(kinds, rows(f"t{w}"), strict=True):
                    if batched:
                        kind += found
                    else:
                        kind[:] = found
                if not batched:
                    for sql, found in zip(kinds_sql, kinds, strict=True):
                        conn.executemany(sql, found)
            if batched:
                for sql, found in zip(kinds_sql, kinds, strict=True):
                    conn.executemany(sql, found)
            conn.execute("COMMIT")

        spent: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(groups):
            for batched in (False, True):
                started = time.thread_time()
                group(batched)
                spent[batched].append(time.thread_time() - started)
        conn.close()
    return {
        "per_write_us": 1e6 * statistics.median(spent[False]) / size,
        "per_group_us": 1e6 * statistics.median(spent[True]) / size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.writer")
    parser.add_argument("--n", type=int, nargs="*", default=[16, 64])
    parser.add_argument("--turns", type=int, default=1280)
    parser.add_argument("--statements", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--batch", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    levels: list[dict[str, Any]] = []
    if args.batch:
        saved = batch()
        levels.append({"batch": saved})
        print(
            "the commit's row statements (2 messages, 1 fact, 3 events), thread CPU per"
            f" write: one executemany per kind per write {saved['per_write_us']:.2f} µs,"
            f" one per kind per group of ten {saved['per_group_us']:.2f} µs"
        )
    for n in args.n:
        found = asyncio.run(level(n, args.turns, args.statements, args.profile))
        levels.append(found)
        print(
            f"n={n}: CPU {found['cpu_us']:.0f} µs/turn, writer thread {found['writer_cpu_us']:.0f};"
            f" Python calls/turn: loop {found['loop_calls_per_turn']:.1f},"
            f" writer {found['writer_calls_per_turn']:.1f};"
            f" statements/turn {found['statements_per_turn']:.2f};"
            f" writer transactions/turn {found['writer_transactions_per_turn']:.3f}"
        )
        for kind, spent in found.get("statements", {}).items():
            print(
                f"    {kind:40s} {spent['calls_per_turn']:6.3f}/turn"
                f" {spent['us_per_turn']:7.1f} µs/turn"
            )
        if "profile" in found:
            print(found["profile"])
    if args.out:
        Path(args.out).write_text(json.dumps({"levels": levels}, indent=1) + "\n")


if __name__ == "__main__":
    main()
