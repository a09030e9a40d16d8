"""What one statement costs the client, by driver: ``python -m bench.driver``.

The same trivial statement (``SELECT %s::int + 1``, one row back) on one PostgreSQL
session, issued by psycopg's synchronous driver, by its asyncio driver on asyncio's
event loop and on uvloop's, and by the synchronous driver on a worker thread awaited
from the event loop (what an async library could do instead of the asyncio driver),
one statement or two per hop. Each variant runs ``--rounds`` times in rotating order;
the figures are medians of the client's CPU (``process_time``, every thread of the
process) and wall time per statement, and their ratios to the synchronous driver.
No kernel code runs here: this is the floor under every asyncio PostgreSQL turn.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from bench.run import DSN

QUERY = "SELECT %s::int + 1"
WARM_UP = 200

Timing = tuple[float, float]  # client CPU and wall time per statement, in µs


def _per_statement(count: int, cpu: float, wall: float) -> Timing:
    return (time.process_time() - cpu) / count * 1e6, (time.perf_counter() - wall) / count * 1e6


def sync_driver(count: int) -> Timing:
    with psycopg.connect(DSN, autocommit=True) as conn:
        cur = conn.cursor()
        for i in range(WARM_UP):
            cur.execute(QUERY, (i,)).fetchone()
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(count):
            cur.execute(QUERY, (i,)).fetchone()
        return _per_statement(count, cpu, wall)


async def async_driver(count: int) -> Timing:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = conn.cursor()
        for i in range(WARM_UP):
            await (await cur.execute(QUERY, (i,))).fetchone()
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(count):
            await (await cur.execute(QUERY, (i,))).fetchone()
        return _per_statement(count, cpu, wall)


async def sync_driver_on_a_thread(count: int, per_hop: int) -> Timing:
    loop = asyncio.get_running_loop()
    with psycopg.connect(DSN, autocommit=True) as conn, ThreadPoolExecutor(1) as thread:
        cur = conn.cursor()

        def hop(i: int) -> None:
            for _ in range(per_hop):
                cur.execute(QUERY, (i,)).fetchone()

        for i in range(WARM_UP):
            await loop.run_in_executor(thread, hop, i)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(count // per_hop):
            await loop.run_in_executor(thread, hop, i)
        return _per_statement(count // per_hop * per_hop, cpu, wall)


def _uvloop_run(main: Coroutine[Any, Any, Timing]) -> Timing:
    import uvloop

    return uvloop.run(main)


def variants(count: int) -> dict[str, Callable[[], Timing]]:
    return {
        "sync driver": lambda: sync_driver(count),
        "asyncio driver, asyncio loop": lambda: asyncio.run(async_driver(count)),
        "asyncio driver, uvloop": lambda: _uvloop_run(async_driver(count)),
        "sync driver on a thread, 1 per hop, uvloop": lambda: _uvloop_run(
            sync_driver_on_a_thread(count, 1)
        ),
        "sync driver on a thread, 2 per hop, uvloop": lambda: _uvloop_run(
            sync_driver_on_a_thread(count, 2)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.driver")
    parser.add_argument("--statements", type=int, default=3000, help="per variant and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs = variants(args.statements)
    names = list(runs)
    timings: dict[str, list[Timing]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            timings[name].append(runs[name]())
    cpu = {name: statistics.median(t[0] for t in timings[name]) for name in names}
    wall = {name: statistics.median(t[1] for t in timings[name]) for name in names}
    base = names[0]
    print(f"One statement ({QUERY!r}), medians of {args.rounds} rounds of {args.statements}:")
    print("| driver | client CPU µs | x sync | wall µs | x sync |")
    print("|---|---|---|---|---|")
    for name in names:
        print(
            f"| {name} | {cpu[name]:.1f} | {cpu[name] / cpu[base]:.2f} "
            f"| {wall[name]:.1f} | {wall[name] / wall[base]:.2f} |"
        )


if __name__ == "__main__":
    main()
