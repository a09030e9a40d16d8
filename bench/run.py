"""The benchmark coordinator: ``python -m bench [--quick]``.

Phases, each comparing rows only within this run:

1. Throughput. Every row (intention-kernel, the hand-written floor, LangGraph, DBOS;
   on SQLite and PostgreSQL) runs in a worker process of its own. After a warm-up,
   blocks run every row once, in an order rotated block by block, each for the same
   number of turns round-robin over ten threads, then as many replays. A row's
   ratio is the median over blocks of its turns/s over its floor's in the same block.
2. Commits per turn, counted (see ``bench.counting``), and whether a resubmitted
   turn ran its effect again.
3. Cost growth: latency around the 10th, 1,000th and 10,000th turn of one thread
   whose facts and messages grow, each against a fresh thread at the same moment,
   with the checkpoint's stored size; the worker's peak RSS after the run.
4. PostgreSQL scale-out: 1, 2, 4 and 8 worker processes on distinct threads against
   as many floor processes, run alternately.
5. The agent loop (``bench.loop``): turns of three model rounds against a fake model.
   intention-kernel runs beside LangGraph's prebuilt ReAct agent, in blocks as in 1.
   It counts commits per turn, and what a resubmitted turn re-ran. It also counts what
   a turn killed mid-loop asks the model again when it is delivered again.
6. Concurrency (``bench.concurrency``): n overlapping turns over one kernel.
7. Latency (``bench.latency``): n conversations at once whose model calls take a
   second or more, over one kernel and a pool of 10, directly and through PgBouncer.
   Then the hand-off (``bench.handoff``): a thread freed by one process, taken by
   turns waiting in others; and what a ``NOTIFY`` in each commit would cost.
8. The sync facade (``bench.sync``): ``SyncKernel`` against ``Kernel`` on SQLite, the
   turn called from a thread without an event loop, interleaved in blocks as in 1.
9. Timers (``bench.timers``): from a timer's due time to its turn's start, with
   10,000 timers pending (full mode), on SQLite and PostgreSQL, in a process of its own.
10. The cost meter (``bench.cost``, ``--only cost`` only): CPU, Python calls and
   instructions per turn, per path, and the package's import time.

The report ends with the issue's targets, each judged on this run's figures (``targets``).

A row name ending in ``@uvloop`` runs its worker on uvloop's event loop (what
``intention-kernel serve`` runs on where installed) instead of asyncio's.

Raw results go to ``bench/results/<UTC date>-<mode>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.burner import burners, checked, header
from bench.lines import LineProcess

DSN = os.environ.get("INTENTION_KERNEL_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
SQLITE_ROWS = [
    "ik-sqlite-full",
    "ik-sqlite-full-offload",
    "ik-sqlite-full-syncfn",
    "floor-sqlite-full",
    "ik-sqlite-normal",
    "ik-sqlite-normal-offload",
    "ik-sqlite-normal-syncfn",
    "floor-sqlite-normal",
    "langgraph-sqlite",
    "dbos-sqlite",
]
POSTGRES_ROWS = [
    "ik-postgres",
    "ik-postgres@uvloop",
    "floor-postgres",
    "floor-postgres-async",
    "floor-postgres-async@uvloop",
    "langgraph-postgres",
    "dbos-postgres",
]
#: The agent-loop rows (``bench.loop``); each intention-kernel row is compared with the
#: LangGraph row on the same store, in the same blocks.
LOOP_ROWS = [
    "loop-ik-sqlite",
    "loop-langgraph-sqlite",
    "loop-ik-postgres",
    "loop-langgraph-postgres",
]
FLOOR = {
    "ik-sqlite-full": "floor-sqlite-full",
    "ik-sqlite-full-offload": "floor-sqlite-full",
    "ik-sqlite-full-syncfn": "floor-sqlite-full",
    "ik-sqlite-normal": "floor-sqlite-normal",
    "ik-sqlite-normal-offload": "floor-sqlite-normal",
    "ik-sqlite-normal-syncfn": "floor-sqlite-normal",
    "langgraph-sqlite": "floor-sqlite-full",
    "dbos-sqlite": "floor-sqlite-full",
    "ik-postgres": "floor-postgres",
    "floor-postgres-async": "floor-postgres",
    "langgraph-postgres": "floor-postgres",
    "dbos-postgres": "floor-postgres",
}
#: The groups a run without ``--only`` runs, in order. The cost meter (``bench.cost``)
#: is left out: it runs only when asked for, as it adds minutes to a run.
PHASES = (
    "throughput",
    "growth",
    "scale",
    "loop",
    "concurrency",
    "latency",
    "handoff",
    "sync",
    "timers",
)
#: A row name ending so runs that row against the source tree given with ``--base``
#: (its ``src`` imported first), interleaved with the current one: before/after in one run.
BASE_SUFFIX = "@base"
#: A row name ending so runs that row's worker on uvloop's event loop instead of asyncio's.
UVLOOP_SUFFIX = "@uvloop"


def plain(row: str) -> str:
    """The row without its suffixes: ``ik-postgres@uvloop@base`` is an ``ik-postgres``."""
    return row.split("@", 1)[0]


MODES: dict[str, dict[str, Any]] = {
    "quick": {
        "warmup": 20,
        "blocks": 6,
        "block": 25,
        "count": 20,
        "growth": [10, 100, 1000],
        "growth_pairs": 20,
        "scale": [1, 2, 4, 8],
        "rounds": 2,
        "scale_turns": 40,
        "loop_warmup": 5,
        "loop_blocks": 6,
        "loop_block": 20,
        "conc_blocks": 4,
        "conc_block": 128,
        # The latency group (bench/latency.py): (conversations, seconds per model call).
        "lat_levels": [(50, 1.0), (200, 1.0)],
        "lat_turns": 2,
        "lat_ceiling_turns": 2,
        # The hand-off group (bench/handoff.py): rounds with one waiting turn, with 10
        # and 50 (a hot thread), and the holder's hold in seconds.
        "handoff_rounds": 200,
        "handoff_hot_rounds": 15,
        "handoff_hold": (0.08, 0.16),
        # The timers group (bench/timers.py): timers pending, and timers due.
        "timers_pending": 1000,
        "timers_due": 50,
        "cost_warmup": 64,
        "cost_blocks": 3,
        "cost_block": 128,
        "cost_calls": 128,
        # Instructions under valgrind, where perf counts none (bench/instructions.py).
        "cost_valgrind_warm": 16,
        "cost_valgrind_turns": 32,
        "import_runs": 5,
    },
    "full": {
        "warmup": 50,
        "blocks": 15,
        # Each block spans several of SQLite's WAL checkpoints (one every ~35 turns, a
        # few ms each) and the kernel's warm-up after the other rows ran; with 60-turn
        # blocks both weighed on each block's ratio (see README.md, "Block length").
        "block": 200,
        "count": 40,
        "growth": [10, 1000, 10000],
        "growth_pairs": 60,
        "scale": [1, 2, 4, 8],
        # Rounds are short (150 turns per worker); eight make each level's median
        # steadier on a machine whose speed drifts between rounds.
        "rounds": 8,
        "scale_turns": 150,
        # LangGraph's ReAct agent takes tens of ms a turn: shorter blocks keep the
        # phase within a few minutes.
        "loop_warmup": 10,
        "loop_blocks": 15,
        "loop_block": 50,
        # 64 clients take four turns each per block at the top level.
        "conc_blocks": 10,
        "conc_block": 256,
        "lat_levels": [(100, 1.0), (500, 1.0), (2000, 1.0), (100, 5.0), (500, 5.0), (2000, 5.0)],
        "lat_turns": 3,
        "lat_ceiling_turns": 8,
        "handoff_rounds": 500,
        "handoff_hot_rounds": 50,
        "handoff_hold": (0.08, 0.16),
        "timers_pending": 10_000,
        "timers_due": 200,
        # Calls per turn are deterministic: one batch is enough. CPU per turn is not.
        "cost_warmup": 128,
        "cost_blocks": 9,
        "cost_block": 256,
        "cost_calls": 512,
        # A valgrind count is deterministic too: one pair of processes a row.
        "cost_valgrind_warm": 64,
        "cost_valgrind_turns": 128,
        "import_runs": 9,
    },
}


class Proc(LineProcess):
    """A worker process running one row."""

    def __init__(
        self, row: str, base: argparse.Namespace, ident: str = "w0", trace: bool = False
    ) -> None:
        self.row = row
        command = [
            sys.executable,
            "-m",
            "bench.worker",
            row,
            "--dir",
            base.dir,
            "--dsn",
            DSN,
            "--schema",
            # Rows that differ only by suffix must not share turns.
            base.schema + "".join(f"_{suffix}" for suffix in row.split("@")[1:]),
            "--ident",
            ident,
        ]
        if trace:
            command.append("--trace")
        env = None
        if row.endswith(BASE_SUFFIX):
            # The same row against another source tree, imported first.
            env = {**os.environ, "PYTHONPATH": str(Path(base.base) / "src")}
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent,
            env=env,
        )

    def died(self) -> str:
        return f"worker {self.row} died (exit {self.proc.wait()})"

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.call("stop")
        self.proc.wait(timeout=60)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):  # a worker that died
                    pipe.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def throughput(rows: list[str], args: argparse.Namespace, mode: dict[str, Any]) -> dict[str, Any]:
    procs = {row: Proc(row, args) for row in rows}
    try:
        for p in procs.values():
            p.call("setup")
            p.call("turns", count=mode["warmup"])
            p.call("replays", count=5)
        blocks: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
        for b in range(mode["blocks"]):
            order = rows[b % len(rows) :] + rows[: b % len(rows)]
            for row in order:
                done = procs[row].call("turns", count=mode["block"])
                again = procs[row].call("replays", count=mode["block"])
                blocks[row].append(
                    {
                        "tps": mode["block"] / done["wall"],
                        "cpu_us": 1e6 * done["cpu"] / mode["block"],
                        "lat": done["lat"],
                        "replay": again["lat"],
                        "effects_rerun": again["effects_rerun"],
                        "model_rerun": again.get("model_rerun"),
                    }
                )
            print(f"  block {b + 1}/{mode['blocks']}", file=sys.stderr, flush=True)
        rss = {row: procs[row].call("rss")["rss_kb"] for row in rows}
    finally:
        for p in procs.values():
            p.stop()
    out: dict[str, Any] = {}
    for row in rows:
        data = blocks[row]
        lat = [x for block in data for x in block["lat"]]
        replay = [x for block in data for x in block["replay"]]
        out[row] = {
            "tps_blocks": [block["tps"] for block in data],
            "tps": statistics.median(block["tps"] for block in data),
            # The worker process's CPU per turn (all its threads): unlike turns/s, it
            # leaves out the time other jobs hold the cores (not the caches they evict).
            "cpu_us_blocks": [block["cpu_us"] for block in data],
            "cpu_us": statistics.median(block["cpu_us"] for block in data),
            "p50_ms": 1000 * statistics.median(lat),
            "p99_ms": 1000 * _pct(lat, 0.99),
            "replay_p50_ms": 1000 * statistics.median(replay),
            "effects_rerun_on_resubmit": sum(block["effects_rerun"] for block in data),
            "resubmits": len(replay),
            "rss_kb": rss[row],
        }
        if data and data[0]["model_rerun"] is not None:  # a loop row's model calls
            out[row]["model_rerun_on_resubmit"] = sum(block["model_rerun"] for block in data)
        # Against the asyncio floor on the same event loop.
        same_loop = "floor-postgres-async" + (UVLOOP_SUFFIX if UVLOOP_SUFFIX in row else "")
        if row.startswith("ik-postgres") and same_loop in blocks:
            pairs = zip(data, blocks[same_loop], strict=True)
            out[row]["async_floor"] = same_loop
            out[row]["ratio_async_floor"] = statistics.median(a["tps"] / f["tps"] for a, f in pairs)
        floor = FLOOR.get(plain(row))
        if floor in blocks:
            ratios = [a["tps"] / f["tps"] for a, f in zip(data, blocks[floor], strict=True)]
            out[row]["floor"] = floor
            out[row]["ratio_blocks"] = ratios
            out[row]["ratio"] = statistics.median(ratios)
            cpu = [a["cpu_us"] / f["cpu_us"] for a, f in zip(data, blocks[floor], strict=True)]
            out[row]["cpu_ratio"] = statistics.median(cpu)
    return out


def loop(rows: list[str], args: argparse.Namespace, mode: dict[str, Any]) -> dict[str, Any]:
    """The agent-loop phase: throughput in interleaved blocks (each intention-kernel row
    against the LangGraph row on the same store, block by block), commits counted, and
    a turn killed in its third model call, delivered again (``bench.loop.crash``)."""
    settings = {
        **mode,
        "warmup": mode["loop_warmup"],
        "blocks": mode["loop_blocks"],
        "block": mode["loop_block"],
    }
    rates = throughput(rows, args, settings)
    for row, r in rates.items():
        peer = row.replace("loop-ik-", "loop-langgraph-")
        if row.startswith("loop-ik-") and peer in rates:
            pairs = zip(r["tps_blocks"], rates[peer]["tps_blocks"], strict=True)
            r["langgraph"] = peer
            r["ratio_langgraph_blocks"] = [a / b for a, b in pairs]
            r["ratio_langgraph"] = statistics.median(r["ratio_langgraph_blocks"])
    commits = sqlite_commits([r for r in rows if "sqlite" in r], args, mode["count"])
    commits.update(postgres_commits([r for r in rows if "postgres" in r], args, mode["count"]))
    crashes = {}
    for row in rows:
        p = Proc(row, args, ident="crash")
        try:
            p.call("setup")
            crashes[row] = p.call("crash", n=1)
        finally:
            p.stop()
    return {"throughput": rates, "commits": commits, "crash": crashes}


def _next_xid() -> int:
    import psycopg

    from bench.counting import NEXT_XID

    with psycopg.connect(DSN, autocommit=True) as conn:
        row = conn.execute(NEXT_XID).fetchone()
        assert row is not None
        return int(row[0])


def postgres_commits(rows: list[str], args: argparse.Namespace, count: int) -> dict[str, Any]:
    """Transaction IDs are server-wide: other clients' writes land in a window too, so
    each row is counted alone, over several windows, keeping the smallest."""
    out = {}
    for row in rows:
        p = Proc(row, args, ident="count", trace=True)
        try:
            p.call("setup")
            p.call("turns", count=10)
            turns, replays, statements = [], [], []
            for _ in range(3):
                sent = p.call("counters")["pg_statements"]
                before = _next_xid()
                p.call("turns", count=count)
                middle = _next_xid()
                statements.append((p.call("counters")["pg_statements"] - sent) / count)
                p.call("replays", count=count)
                turns.append((middle - before) / count)
                replays.append((_next_xid() - middle) / count)
        finally:
            p.stop()
        out[row] = {
            "commits_per_turn": min(turns),
            "commits_per_replay": min(replays),
            "commits_counted_by": "PostgreSQL transaction IDs assigned (writing transactions),"
            " the least of three windows",
            "statements_per_turn": min(statements),
            "statements_counted_by": "psycopg cursor executes (one round trip each, outside a"
            " pipeline)",
        }
    return out


def sqlite_commits(rows: list[str], args: argparse.Namespace, count: int) -> dict[str, Any]:
    out = {}
    for row in rows:
        p = Proc(row, args, ident="count", trace=True)
        try:
            p.call("setup")
            p.call("turns", count=10)
            before = p.call("counters")
            p.call("turns", count=count)
            middle = p.call("counters")
            p.call("replays", count=count)
            after = p.call("counters")
        finally:
            p.stop()
        out[row] = {
            "commits_per_turn": (middle["commits"] - before["commits"]) / count,
            "statements_per_turn": (middle["statements"] - before["statements"]) / count,
            "commits_per_replay": (after["commits"] - middle["commits"]) / count,
            "commits_counted_by": "sqlite3 trace callback (transactions that wrote)",
        }
    return out


def growth(row: str, args: argparse.Namespace, points: list[int], pairs: int) -> dict[str, Any]:
    p = Proc(row, args, ident="growth")
    try:
        setup = p.call("setup")
        result = p.call("growth", points=points, pairs=pairs)
    finally:
        p.stop()
    first = result["points"][0]
    for point in result["points"]:
        point["vs_fresh"] = point["long_p50"] / point["fresh_p50"]
        point["vs_first_raw"] = point["long_p50"] / first["long_p50"]
    result["rss_after_setup_kb"] = setup["rss_kb"]
    return result


SCALE_GROUPS = {
    "ik": "ik-postgres",
    "floor": "floor-postgres",
    "floor_async": "floor-postgres-async",
    "ik_uvloop": "ik-postgres" + UVLOOP_SUFFIX,
    "floor_async_uvloop": "floor-postgres-async" + UVLOOP_SUFFIX,
}


def scale_out(args: argparse.Namespace, mode: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    scale_groups = dict(SCALE_GROUPS)
    if args.base:
        scale_groups["ik_base"] = "ik-postgres" + BASE_SUFFIX
    for workers in mode["scale"]:
        groups = {
            name: [Proc(row, args, ident=f"s{workers}-{k}") for k in range(workers)]
            for name, row in scale_groups.items()
        }
        try:
            for procs in groups.values():
                for p in procs:
                    p.send("setup")
                for p in procs:
                    p.receive()
                for p in procs:
                    p.send("turns", count=10)
                for p in procs:
                    p.receive()
            names = list(groups)
            rounds: dict[str, list[float]] = {name: [] for name in names}
            usage: dict[str, list[dict[str, float | None]]] = {name: [] for name in names}
            for r in range(mode["rounds"]):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    start_at = time.time() + 0.3
                    for p in groups[name]:
                        p.send("turns", count=mode["scale_turns"], start_at=start_at)
                    time.sleep(max(start_at - time.time(), 0))
                    before = cpu_sample()
                    done = [p.receive() for p in groups[name]]
                    turns = workers * mode["scale_turns"]
                    rounds[name].append(turns / (max(d["end"] for d in done) - start_at))
                    usage[name].append(cpu_usage(before, cpu_sample(), done, turns))
        finally:
            for procs in groups.values():
                for p in procs:
                    p.stop()

        def ratio(floor: str, row: str = "ik", rounds: dict[str, list[float]] = rounds) -> float:
            pairs = zip(rounds[row], rounds[floor], strict=True)
            return statistics.median(a / f for a, f in pairs)

        level = {
            "workers": workers,
            "ik_tps": statistics.median(rounds["ik"]),
            "floor_tps": statistics.median(rounds["floor"]),
            "floor_async_tps": statistics.median(rounds["floor_async"]),
            "ratio": ratio("floor"),
            "ratio_async": ratio("floor_async"),
            "uvloop_tps": statistics.median(rounds["ik_uvloop"]),
            "uvloop_ratio": ratio("floor", "ik_uvloop"),
            "floor_async_uvloop_tps": statistics.median(rounds["floor_async_uvloop"]),
            "uvloop_ratio_async": ratio("floor_async_uvloop", "ik_uvloop"),
            "rounds": rounds,
            "cpu": {name: median_usage(usage[name]) for name in names},
        }
        if "ik_base" in rounds:
            pairs = zip(rounds["ik_base"], rounds["floor"], strict=True)
            level["base_tps"] = statistics.median(rounds["ik_base"])
            level["base_ratio"] = statistics.median(a / f for a, f in pairs)
        results.append(level)
        print(f"  scale-out {workers} workers done", file=sys.stderr, flush=True)
    return results


def cpu_sample() -> dict[str, float | None]:
    """The machine's busy and total CPU time, and the CPU time of the PostgreSQL server's
    processes when the server runs here (Linux ``/proc``), in seconds."""
    sample: dict[str, float | None] = {"busy": None, "total": None, "server": None}
    with contextlib.suppress(OSError, ValueError):
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        idle = ticks[3] + ticks[4]  # idle + iowait
        sample.update(busy=(sum(ticks[:8]) - idle) / hz, total=sum(ticks[:8]) / hz)
        server = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().startswith("postgres"):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    server += int(fields[11]) + int(fields[12])
        sample["server"] = server / hz if server else None
    return sample


def cpu_usage(
    before: dict[str, float | None],
    after: dict[str, float | None],
    done: list[dict[str, Any]],
    turns: int,
) -> dict[str, float | None]:
    """Per turn: the workers' CPU and the server's, in ms; and how busy the machine was
    (all cores, 1.0 = every core busy all the time)."""

    def delta(key: str) -> float | None:
        a, b = before[key], after[key]
        return None if a is None or b is None else b - a

    busy, total, server = delta("busy"), delta("total"), delta("server")
    return {
        "client_ms": 1000 * sum(d["cpu"] for d in done) / turns,
        "server_ms": None if server is None else 1000 * server / turns,
        "machine_busy": None if busy is None or not total else busy / total,
    }


def median_usage(rounds: list[dict[str, float | None]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if r[key] is not None]
        out[key] = statistics.median(values) if values else None  # type: ignore[type-var]
    return out


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in (
        "intention-kernel",
        "pydantic",
        "psycopg",
        "langgraph",
        "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint-postgres",
        "dbos",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    with contextlib.suppress(Exception):
        import psycopg

        with psycopg.connect(DSN, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            versions["postgresql"] = row[0] if row else "?"
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "versions": versions,
    }


def drop_schemas(prefix: str) -> None:
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (prefix + "%",)
            )
        ]
        for name in names:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


# The targets, as ratios within one run (see bench/README.md).
SQLITE_TARGET, POSTGRES_TARGET, REPLAY_TARGET_MS, GROWTH_TARGET = 0.7, 0.8, 1.0, 1.2
#: The agent loop: at least this many times LangGraph's ReAct agent's turns per second.
LOOP_TARGET = 3.0


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target this run measured: what it asks, the figure, and whether it held.

    A PostgreSQL row is judged against the floor written with the kernel's own driver.
    That is psycopg's asyncio connection, on the same event loop. The ratio is then the
    framework's overhead, which is what the floor is for. The ratio to the floor on
    psycopg's synchronous driver is listed after each, with ``held`` ``None``. It is a
    reference, not a target. It also counts the asyncio driver's own cost per statement
    (``python -m bench.driver``), which an async API pays with any framework.
    """
    # (target, measured, held, unit): ratios ("x") with three decimals, so that a 0.796
    # that misses 0.8 does not print as 0.80; held None: a reference, not judged
    checks: list[tuple[str, float, bool | None, str]] = []
    throughput = results["throughput"]
    for row in ("ik-sqlite-full", "ik-sqlite-normal"):
        if row in throughput:
            ratio, replay = throughput[row]["ratio"], throughput[row]["replay_p50_ms"]
            checks.append(
                (f"{row} ≥ {SQLITE_TARGET}x its floor", ratio, ratio >= SQLITE_TARGET, "x")
            )
            replay_held = replay < REPLAY_TARGET_MS
            checks.append(
                (f"{row} replay p50 < {REPLAY_TARGET_MS:g} ms", replay, replay_held, " ms")
            )
    # (what, ratio to the asyncio floor on the same loop, ratio to the synchronous floor)
    postgres = [
        (f"{row}, one client", throughput[row]["ratio_async_floor"], throughput[row]["ratio"])
        for row in ("ik-postgres", "ik-postgres" + UVLOOP_SUFFIX)
        if "ratio_async_floor" in throughput.get(row, {})
    ]
    postgres += [
        (
            f"ik-postgres{loop}, {s['workers']} worker{'s' if s['workers'] > 1 else ''}",
            s[prefix + "ratio_async"],
            s[prefix + "ratio"],
        )
        for s in results["scale_out"]
        for loop, prefix in (("", ""), (UVLOOP_SUFFIX, "uvloop_"))
    ]
    for what, ratio, sync_ratio in postgres:
        target = f"{what}, ≥ {POSTGRES_TARGET}x the floor on its driver and loop"
        checks.append((target, ratio, ratio >= POSTGRES_TARGET, "x"))
        checks.append((f"{what}: x the synchronous floor (reference)", sync_ratio, None, "x"))
    for row, g in results["growth"].items():
        last = g["points"][-1]
        growth = last["vs_fresh"]
        target = f"{row}: turn {last['turn']} ≤ {GROWTH_TARGET}x a young thread's"
        checks.append((target, growth, growth <= GROWTH_TARGET, "x"))
    looped = results.get("loop") or {}
    for row, r in looped.get("throughput", {}).items():
        if "ratio_langgraph" in r:
            target = f"{row} ≥ {LOOP_TARGET:g}x LangGraph's ReAct agent's turns/s"
            ratio = r["ratio_langgraph"]
            checks.append((target, ratio, ratio >= LOOP_TARGET, "x"))
    for row, crashed in looped.get("crash", {}).items():
        if row.startswith("loop-ik-"):
            again = crashed["same turn ID"]["answered_rounds_asked_again"]
            target = f"{row}: a crashed turn's redelivery asks the model no round it answered"
            checks.append((target, again, again == 0, " rounds asked again"))
    if results.get("concurrency"):
        from bench.concurrency import targets as concurrency_targets

        checks += concurrency_targets(results["concurrency"])
    if results.get("latency"):
        from bench.latency import targets as latency_targets

        checks += latency_targets(results["latency"])
    if results.get("sync"):
        from bench.sync import targets as sync_targets

        checks += sync_targets(results["sync"])
    if results.get("timers"):
        from bench.timers import targets as timer_targets

        checks += timer_targets(results["timers"])
    if results.get("cost"):
        from bench.cost import targets as cost_targets

        checks += cost_targets(results["cost"])
    return [
        {
            "target": t,
            "measured": m,
            "held": held,
            "figure": f"{m:.3f}x"
            if unit == "x"
            else f"{m:.0f}{unit}"
            if unit.startswith((" rounds", " errors", " levels"))
            else f"{m:.2f}{unit}",
        }
        for t, m, held, unit in checks
    ]


def _verdict(held: bool | None) -> str:
    return "reference" if held is None else "yes" if held else "**no**"


def report(results: dict[str, Any]) -> str:
    lines = [
        f"intention-kernel benchmarks — {results['date']} — {results['mode']} mode",
        f"{results['machine']['cpu']}, {results['machine']['cores']} cores; "
        + ", ".join(f"{k} {v}" for k, v in results["machine"]["versions"].items()),
        *([header(results["burner"])] if results.get("burner") else []),
        "",
    ]
    if results["throughput"]:
        lines.append(
            "| row | turns/s | x floor | CPU µs/turn (x floor) | p50 ms | p99 ms "
            "| replay p50 ms | commits/turn | statements/turn | resubmit re-ran the effect "
            "| does not guarantee |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for row, r in results["throughput"].items():
        counted = results["commits"].get(row, {})
        commits = counted.get("commits_per_turn", r.get("commits_per_turn"))
        statements = counted.get("statements_per_turn")
        rerun = r["effects_rerun_on_resubmit"]
        reran = f"yes ({rerun}/{r['resubmits']})" if rerun else "no"
        cpu_us = f"{r['cpu_us']:.0f} ({r.get('cpu_ratio', 1.0):.2f})" if "cpu_us" in r else ""
        lines.append(
            f"| {row} | {r['tps']:.0f} | {r.get('ratio', 1.0):.2f} | {cpu_us} | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['replay_p50_ms']:.2f} "
            f"| {'' if commits is None else f'{commits:.1f}'} "
            f"| {'' if statements is None else f'{statements:.1f}'} "
            f"| {reran} "
            f"| {results['caveats'].get(row.split('-')[0], '')} |"
        )
    against_async = [
        f"{row} x{r['ratio_async_floor']:.2f}"
        for row, r in results["throughput"].items()
        if "ratio_async_floor" in r
    ]
    if against_async:
        lines += [
            "",
            "intention-kernel against the floor written with psycopg's asyncio driver, on "
            "the same event loop: " + ", ".join(against_async),
        ]
    lines += (
        []
        if not results["growth"]
        else [
            "",
            "Cost growth (one thread, a new fact and two messages per turn; 'x turn 10, same"
            " moment': against turns 6-15 of fresh threads run alternately with it; 'x own turn"
            " 10': against this thread's 10th turn, minutes earlier, so drift included):",
            "",
            "| store | turn | p50 ms | x turn 10, same moment | x own turn 10 | hot row bytes "
            "| checkpoint bytes | facts |",
            "|---|---|---|---|---|---|---|---|",
        ]
    )
    for row, g in results["growth"].items():
        for p in g["points"]:
            s = p["sizes"]
            lines.append(
                f"| {row} | {p['turn']} | {1000 * p['long_p50']:.2f} "
                f"| {p['vs_fresh']:.2f} | {p['vs_first_raw']:.2f} | {s['core']} "
                f"| {s['total']} | {s['fact_rows']} |"
            )
        lines.append(
            f"| {row} | peak RSS after {g['turns']} turns: "
            f"{g['rss_kb'] / 1024:.0f} MiB (after setup {g['rss_after_setup_kb'] / 1024:.0f}"
            " MiB) | | | | | | |"
        )
    if results["scale_out"]:
        lines += [
            "",
            "PostgreSQL scale-out (distinct threads per worker process):",
            "",
            "Each pair is (on asyncio's loop, on uvloop); 'x async floor' compares with the "
            "asyncio floor on the same loop.",
            "",
            "| workers | floor turns/s | async floor turns/s | intention-kernel turns/s "
            "| x floor | x async floor "
            "| CPU ms/turn, client + server: ik, ik on uvloop / floor / async floor, on uvloop "
            "| machine busy (ik rounds) |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def cpu(usage: dict[str, Any]) -> str:
            server = usage.get("server_ms")
            return f"{usage['client_ms']:.2f} + {'?' if server is None else f'{server:.2f}'}"

        for s in results["scale_out"]:
            base = f" base {s['base_tps']:.0f}, x{s['base_ratio']:.2f} |" if "base_tps" in s else ""
            use = s.get("cpu", {})
            busy = use.get("ik", {}).get("machine_busy")
            usage = " / ".join(
                ", ".join(cpu(use[g]) for g in pair if g in use)
                for pair in (("ik", "ik_uvloop"), ("floor",), ("floor_async", "floor_async_uvloop"))
            )
            lines.append(
                f"| {s['workers']} | {s['floor_tps']:.0f} "
                f"| {s['floor_async_tps']:.0f}, {s['floor_async_uvloop_tps']:.0f} "
                f"| {s['ik_tps']:.0f}, {s['uvloop_tps']:.0f} "
                f"| {s['ratio']:.2f}, {s['uvloop_ratio']:.2f} "
                f"| {s['ratio_async']:.2f}, {s['uvloop_ratio_async']:.2f} "
                f"| {usage} | {'' if busy is None else f'{busy:.0%}'} |{base}"
            )
    lines += loop_report(results.get("loop") or {})
    if results.get("concurrency"):
        from bench.concurrency import report as concurrency_report

        lines += concurrency_report(results["concurrency"])
    if results.get("latency"):
        from bench.latency import report as latency_report

        lines += latency_report(results["latency"])
    if results.get("sync"):
        from bench.sync import report as sync_report

        lines += sync_report(results["sync"])
    if results.get("handoff"):
        from bench.handoff import report as handoff_report

        lines += handoff_report(results["handoff"])
    if results.get("timers"):
        from bench.timers import report as timers_report

        lines += timers_report(results["timers"])
    if results.get("cost"):
        from bench.cost import report as cost_report

        lines += cost_report(results["cost"])
    checked = results.get("targets", [])
    if checked:
        judged = [t["held"] for t in checked if t["held"] is not None]
        lines += [
            "",
            f"Targets (bench/README.md): {sum(judged)} of {len(judged)} held in this run"
            + (
                " (a quick run is a smoke test: judge the targets on a full one)"
                if results["mode"] == "quick"
                else ""
            ),
            "",
            "| target | this run | held |",
            "|---|---|---|",
        ]
        lines += [f"| {t['target']} | {t['figure']} | {_verdict(t['held'])} |" for t in checked]
    return "\n".join(lines)


def loop_report(looped: dict[str, Any]) -> list[str]:
    """The agent-loop table: per row, throughput against LangGraph's ReAct agent, commits,
    and what a resubmitted turn and a crashed turn's redelivery ran again."""
    if not looped.get("throughput"):
        return []
    lines = [
        "",
        "Agent loop (three model rounds a turn: read, read, final text; a fake model with no"
        " latency). Resubmitted: a committed turn delivered again. Crashed: a delivery killed"
        " in its third model call, then delivered again (rounds are 1-based):",
        "",
        "| row | turns/s | x LangGraph | p50 ms | commits/turn | statements/turn "
        "| resubmitted: model calls, tool calls per turn "
        "| crashed, delivered again: rounds asked, tool calls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row, r in looped["throughput"].items():
        counted = looped.get("commits", {}).get(row, {})
        commits, statements = counted.get("commits_per_turn"), counted.get("statements_per_turn")
        resubmits = r["resubmits"] or 1
        rerun = (
            f"{r.get('model_rerun_on_resubmit', 0) / resubmits:.0f}, "
            f"{r['effects_rerun_on_resubmit'] / resubmits:.0f}"
        )
        crashed = "; ".join(
            f"{how}: {[n + 1 for n in c['redelivery_rounds_asked']]}, {c['tool_calls']}"
            for how, c in looped.get("crash", {}).get(row, {}).items()
        )
        ratio = r.get("ratio_langgraph")
        lines.append(
            f"| {row} | {r['tps']:.0f} | {'' if ratio is None else f'{ratio:.2f}'} "
            f"| {r['p50_ms']:.2f} | {'' if commits is None else f'{commits:.1f}'} "
            f"| {'' if statements is None else f'{statements:.1f}'} | {rerun} | {crashed} |"
        )
    return lines


def base_tree(base: str) -> str:
    """``--base``'s source tree: the directory itself, or a git ref's ``src/`` (and
    ``pyproject.toml``) extracted into a temporary directory."""
    if (Path(base) / "src").is_dir():
        return base
    target = tempfile.mkdtemp(prefix="ikbench-base-")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", base, "src", "pyproject.toml"],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
    return target


#: The groups each in a module of their own, imported when they run: (phase, module,
#: function, what the run prints as it starts it). They run in this order.
GROUPS = (
    ("concurrency", "bench.concurrency", "concurrency", "concurrency"),
    ("latency", "bench.latency", "latency", "latency"),
    ("handoff", "bench.handoff", "handoff_group", "hand-off"),
    ("sync", "bench.sync", "sync_group", "sync facade"),
    ("timers", "bench.timers", "timers_group", "timers"),
    ("cost", "bench.cost", "cost", "cost"),
)
#: Groups that measure PostgreSQL alone: ``--no-postgres`` skips them.
POSTGRES_ONLY = ("handoff",)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 1-2 minute run")
    parser.add_argument("--no-peers", action="store_true", help="skip LangGraph and DBOS")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument(
        "--only",
        choices=[*PHASES, "cost"],
        action="append",
    )
    parser.add_argument("--rows", help="comma-separated throughput or latency rows (default: all)")
    parser.add_argument(
        "--cost-rows", help="comma-separated worker rows of the cost meter (default: all)"
    )
    parser.add_argument("--label", default="", help="appended to the result file's name")
    parser.add_argument(
        "--base",
        help="a source tree (with src/) or a git ref to compare against: adds an "
        f"'{BASE_SUFFIX}' twin of each intention-kernel row (and a scale-out group), "
        "interleaved with the current code",
    )
    parser.add_argument(
        "--block",
        type=int,
        help="turns per row and block in the throughput table (default: "
        "the mode's, 200 in full mode)",
    )
    parser.add_argument(
        "--latency-levels",
        help="the latency group's levels as conversations x seconds, comma-separated "
        "(default: the mode's; full mode 100x1,500x1,2000x1,100x5,500x5,2000x5)",
    )
    parser.add_argument(
        "--burner",
        type=int,
        default=0,
        metavar="N",
        help="keep N cores busy with CPU burners during the run, as a busy host is "
        "(issue 35 judges 64 turns in flight beside one)",
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    try:
        checked(args.burner)
    except ValueError as exc:
        parser.error(str(exc))
    mode_name = "quick" if args.quick else "full"
    mode = dict(MODES[mode_name])
    if args.block:
        mode["block"] = args.block
    if args.latency_levels:
        mode["lat_levels"] = [
            (int(n), float(seconds))
            for n, seconds in (level.split("x") for level in args.latency_levels.split(","))
        ]
    phases = set(args.only or PHASES)
    args.base_ref = args.base
    if args.base:
        args.base = base_tree(args.base)
    rows = SQLITE_ROWS + ([] if args.no_postgres else POSTGRES_ROWS)
    if args.no_peers:
        rows = [r for r in rows if r.startswith(("ik", "floor"))]
    if args.rows:
        rows = [r for r in args.rows.split(",") if r]
    if args.base:
        rows += [r + BASE_SUFFIX for r in rows if r.startswith("ik-")]
    args.dir = tempfile.mkdtemp(prefix="ikbench-")
    args.schema = f"ikbench_{os.getpid()}"
    from bench.peers import DBOS_CAVEAT, LANGGRAPH_CAVEAT

    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": mode_name,
        "settings": mode,
        "machine": machine(),
        "caveats": {"langgraph": LANGGRAPH_CAVEAT, "dbos": DBOS_CAVEAT},
        "throughput": {},
        "commits": {},
        "growth": {},
        "scale_out": [],
        "loop": {},
        "concurrency": {},
        "latency": {},
        "handoff": {},
        "sync": {},
        "timers": {},
        "cost": {},
        "burner": args.burner,
    }
    started = time.perf_counter()
    # The burners spin until every phase has ended, the clean-up included.
    with burners(args.burner):
        try:
            if "throughput" in phases:
                print("throughput", file=sys.stderr, flush=True)
                results["throughput"] = throughput(rows, args, mode)
                results["commits"] = sqlite_commits(
                    [r for r in rows if "sqlite" in r], args, mode["count"]
                )
                results["commits"].update(
                    postgres_commits([r for r in rows if "postgres" in r], args, mode["count"])
                )
            if "growth" in phases:
                print("growth", file=sys.stderr, flush=True)
                grown = ["ik-sqlite-full"] + ([] if args.no_postgres else ["ik-postgres"])
                if args.base:
                    grown = [r for row in grown for r in (row, row + BASE_SUFFIX)]
                for row in grown:
                    results["growth"][row] = growth(row, args, mode["growth"], mode["growth_pairs"])
            if "scale" in phases and not args.no_postgres:
                print("scale-out", file=sys.stderr, flush=True)
                results["scale_out"] = scale_out(args, mode)
            if "loop" in phases:
                print("agent loop", file=sys.stderr, flush=True)
                looped = [r for r in LOOP_ROWS if not (args.no_postgres and "postgres" in r)]
                if args.no_peers:
                    looped = [r for r in looped if "langgraph" not in r]
                results["loop"] = loop(looped, args, mode)
            for phase, module, function, what in GROUPS:
                if phase in phases and not (phase in POSTGRES_ONLY and args.no_postgres):
                    print(what, file=sys.stderr, flush=True)
                    group = getattr(importlib.import_module(module), function)
                    results[phase] = group(args, mode)
        finally:
            shutil.rmtree(args.dir, ignore_errors=True)
            if args.base and args.base != args.base_ref:
                shutil.rmtree(args.base, ignore_errors=True)
            if not args.no_postgres:
                drop_schemas(args.schema)
    results["seconds"] = time.perf_counter() - started
    results["targets"] = targets(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"{stamp}-{mode_name}{'-' + args.label if args.label else ''}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(report(results))
    print(f"\nraw results: {path} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
