"""The concurrency group: N overlapping turns over one kernel and one store.

The store is one SQLite file (``FULL``), or one PostgreSQL pool.

Each level runs ``n`` clients at once in one process, each on a thread of its own.
They share one ``Kernel`` and one ``SQLiteDurability(synchronous="FULL")``. Every
turn's interpretation awaits once (``asyncio.sleep(0)``), as a model call would. So up
to ``n`` turns are in flight (``bench.worker``'s ``overlap``).

Each block runs every measured pair once, in an order rotated block by block. The
pairs are the single-client floor (``floor-sqlite-full``, one turn at a time), the
single-client kernel row (``ik-sqlite-full``) and each level. A level's ratio is the median over
blocks of its turns/s over the floor's in the same block. CPU per turn is compared
likewise. PostgreSQL's rows (``ik-postgres-full-overlap``) are measured the same way.
Their floor is the asyncio floor on PostgreSQL (``floor-postgres-async``, one turn at a
time). The server group-commits by itself, so they show what the kernel adds there.

Flushes per turn are counted in a traced process of their own per level (the
``bench.counting`` trace callback). A transaction that wrote is one WAL write. With
``synchronous=FULL`` it is also one ``fsync`` of the WAL at its ``COMMIT``. WAL
checkpoints (two more syncs each, once per ~1,000 WAL pages) are not counted, for the
floor either. Statements per turn are counted there too, on every connection of the
process.

The SQLite adapter's worker thread's CPU per turn is a part of the row's CPU. It is
user and system time, from its thread clock. It is the share that competes with the
event loop for the interpreter, whenever it runs Python rather than SQLite's own code.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

LEVELS = (1, 4, 16, 64)
FLOOR_ROW, SINGLE_ROW, OVERLAP_ROW = "floor-sqlite-full", "ik-sqlite-full", "ik-sqlite-full-overlap"
PG_FLOOR_ROW, PG_OVERLAP_ROW = "floor-postgres-async", "ik-postgres-full-overlap"
#: Each row's ratio is to the floor on its own store.
FLOORS = {"floor": "floor", "single": "floor", "overlap": "floor", "base": "floor"}
FLOORS |= {"pgfloor": "pgfloor", "pgoverlap": "pgfloor"}
#: The issue's target for 64 overlapping turns (ratio to the single-client floor, and
#: WAL syncs per turn).
TARGET_RATIO, TARGET_SYNCS = 2.5, 0.2
#: Issue 35's target for one client on SQLite ``FULL``: this much of the floor's turns/s.
ONE_CLIENT_RATIO = 0.8
#: PostgreSQL at 64 concurrent turns, to its asyncio floor.
PG_TARGET_RATIO = 2.0


def concurrency(args: argparse.Namespace, mode: dict[str, Any]) -> dict[str, Any]:
    from bench.run import BASE_SUFFIX, Proc

    block = mode["conc_block"]
    entries = measured(postgres=not args.no_postgres, base=bool(args.base))
    names = {
        "floor": FLOOR_ROW,
        "single": SINGLE_ROW,
        "overlap": OVERLAP_ROW,
        "pgfloor": PG_FLOOR_ROW,
        "pgoverlap": PG_OVERLAP_ROW,
        # The same levels against another source tree, before/after in one run.
        "base": OVERLAP_ROW + BASE_SUFFIX,
    }
    # One worker process for each name that a measured pair uses, made once.
    used = dict.fromkeys(name for name, _ in entries)
    procs = {name: Proc(names[name], args, ident=f"c{name}") for name in used}
    blocks: dict[tuple[str, int], list[dict[str, Any]]] = {e: [] for e in entries}
    try:
        for p in procs.values():
            p.call("setup")
        for name, n in entries:  # warm-up
            _run(procs[name], name, n, block // 2)
        for b in range(mode["conc_blocks"]):
            for entry in entries[b % len(entries) :] + entries[: b % len(entries)]:
                blocks[entry].append(_run(procs[entry[0]], entry[0], entry[1], block))
            print(f"  concurrency block {b + 1}/{mode['conc_blocks']}", file=sys.stderr, flush=True)
    finally:
        for p in procs.values():
            p.stop()
    levels: list[dict[str, Any]] = []
    for entry in entries:
        data = blocks[entry]
        floor = blocks[(FLOORS[entry[0]], 1)]
        lat = [x for d in data for x in d["lat"]]
        levels.append(
            {
                "row": names[entry[0]],
                "n": entry[1],
                "tps": statistics.median(d["tps"] for d in data),
                "ratio": statistics.median(
                    d["tps"] / f["tps"] for d, f in zip(data, floor, strict=True)
                ),
                "cpu_us": statistics.median(d["cpu_us"] for d in data),
                "cpu_ratio": statistics.median(
                    d["cpu_us"] / f["cpu_us"] for d, f in zip(data, floor, strict=True)
                ),
                "p50_ms": 1000 * statistics.median(lat),
            }
        )
        writer = [d["writer_cpu_us"] for d in data if d.get("writer_cpu_us") is not None]
        if writer:  # the SQLite adapter's worker thread, a part of the CPU above
            levels[-1]["writer_cpu_us"] = statistics.median(writer)
    syncs = _count(args, mode["count"])
    for level in levels:
        if level["row"] == FLOOR_ROW:
            level.update(syncs["floor"])
        elif level["row"] == SINGLE_ROW:
            level.update(syncs["single"])
        elif level["row"] == OVERLAP_ROW:
            level.update(syncs[level["n"]])
    return {"levels": levels, "block": block, "blocks": mode["conc_blocks"]}


def measured(*, postgres: bool, base: bool) -> list[tuple[str, int]]:
    """The (process, turns in flight) pairs a run measures, in their first order.

    The base tree runs every level the current tree runs, level 1 included.
    A store's CPU per turn grows with the store.
    A base that skipped a level wrote fewer turns, and read faster than it is.
    """
    entries = [("floor", 1), ("single", 1)] + [("overlap", n) for n in LEVELS]
    if postgres:
        entries += [("pgfloor", 1)] + [("pgoverlap", n) for n in LEVELS]
    if base:
        entries += [("base", n) for n in LEVELS]
    return entries


def _run(proc: Any, name: str, n: int, count: int) -> dict[str, Any]:
    if name in ("overlap", "base", "pgoverlap"):
        done = proc.call("overlap", n=n, count=count)
    else:
        done = proc.call("turns", count=count)
    turns = len(done["lat"])
    out = {"tps": turns / done["wall"], "cpu_us": 1e6 * done["cpu"] / turns, "lat": done["lat"]}
    if done.get("writer_cpu") is not None:
        out["writer_cpu_us"] = 1e6 * done["writer_cpu"] / turns
    return out


def _count(args: argparse.Namespace, count: int) -> dict[Any, dict[str, Any]]:
    """WAL syncs (commits that wrote) and writer transactions per turn, per level,
    each counted in a traced process of its own."""
    from bench.run import Proc

    out: dict[Any, dict[str, Any]] = {}
    for key, row, n in [("floor", FLOOR_ROW, 1), ("single", SINGLE_ROW, 1)] + [
        (n, OVERLAP_ROW, n) for n in LEVELS
    ]:
        turns = max(count, 4 * n)
        p = Proc(row, args, ident=f"ccount{n}", trace=True)
        try:
            p.call("setup")
            _run(p, "overlap" if row == OVERLAP_ROW else "turns", n, n * 2)
            before = p.call("counters")
            done = _run(p, "overlap" if row == OVERLAP_ROW else "turns", n, turns)
            after = p.call("counters")
        finally:
            p.stop()
        done_turns = len(done["lat"])
        out[key] = {
            "syncs_per_turn": (after["commits"] - before["commits"]) / done_turns,
            # Every statement of every connection (the reader's and the floor's too).
            "statements_per_turn": (after["statements"] - before["statements"]) / done_turns,
            "syncs_counted_by": "sqlite3 trace callback: transactions that wrote (one WAL"
            " fsync each at synchronous=FULL; checkpoints not counted)",
        }
        if after.get("groups") is not None:
            out[key]["writer_transactions_per_turn"] = (
                after["groups"] - before["groups"]
            ) / done_turns
    return out


def report(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Concurrency (one kernel, n overlapping turns; {result['blocks']} blocks"
        f" of {result['block']} turns; each row against the single-client floor on its store):",
        "",
        "| row | turns in flight | turns/s | x floor | CPU µs/turn (x floor) "
        "| writer thread CPU µs/turn | p50 ms | WAL syncs/turn | writer transactions/turn "
        "| statements/turn |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in result["levels"]:
        wtx = lv.get("writer_transactions_per_turn")
        writer = lv.get("writer_cpu_us")
        lines.append(
            f"| {lv['row']} | {lv['n']} | {lv['tps']:.0f} | {lv['ratio']:.3f} "
            f"| {lv['cpu_us']:.0f} ({lv['cpu_ratio']:.2f}) "
            f"| {'-' if writer is None else f'{writer:.0f}'} | {lv['p50_ms']:.2f} "
            f"| {_figure(lv.get('syncs_per_turn'))} | {_figure(wtx)} "
            f"| {_figure(lv.get('statements_per_turn'))} |"
        )
    return lines


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def targets(result: dict[str, Any]) -> list[tuple[str, float, bool, str]]:
    def level(row: str, n: int) -> dict[str, Any] | None:
        return next((lv for lv in result["levels"] if lv["row"] == row and lv["n"] == n), None)

    # (row, turns in flight, what the target asks, the least ratio to its floor)
    ratios = (
        (
            PG_OVERLAP_ROW,
            64,
            f"64 turns in flight ≥ {PG_TARGET_RATIO}x the asyncio floor",
            PG_TARGET_RATIO,
        ),
        (SINGLE_ROW, 1, f"one client ≥ {ONE_CLIENT_RATIO}x the floor", ONE_CLIENT_RATIO),
        (
            OVERLAP_ROW,
            64,
            f"64 turns in flight ≥ {TARGET_RATIO}x the single-client floor",
            TARGET_RATIO,
        ),
    )
    out = []
    for row, n, what, least in ratios:
        measured = level(row, n)
        if measured is not None:
            ratio = measured["ratio"]
            out.append((f"{row}, {what}", ratio, ratio >= least, "x"))
    top = level(OVERLAP_ROW, 64)
    if top is not None:
        syncs = top["syncs_per_turn"]
        what = f"{OVERLAP_ROW}, 64 turns in flight ≤ {TARGET_SYNCS} WAL syncs per turn"
        out.append((what, syncs, syncs <= TARGET_SYNCS, " syncs/turn"))
    return out
