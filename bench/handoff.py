"""The hand-off group: how soon a waiting turn in another process takes a freed thread.

::

    .venv/bin/python -m bench --only handoff --quick     # part of ``python -m bench``
    .venv/bin/python -m bench.handoff --quick            # the group alone

A holder process takes a thread (``start_turn``, as a turn does) and keeps it. Waiting
turns in other processes, each with an adapter of its own, wait for the same thread.
After a random hold the holder lets go (the release statement, as a turn that did not
commit). The hand-off is the first waiter's take minus the release's return. Both
times are ``CLOCK_MONOTONIC``, one clock for every process of the machine.

Each round the waiters' statements are counted in their processes (every call of the
adapter's ``_run``) over the hold's steady part, after the backoff's ramp. That gives
the statements a waiting turn sends each second. The server's CPU for them: directly,
the ``utime + stime`` of the waiters' own server sessions (``/proc``, found by
``application_name``) over the level's statements; through PgBouncer, PgBouncer's
own CPU (shared with whatever else uses it at the time).

Levels: 1 waiter in one process; 10 and 50 waiters on one hot thread, spread over
five processes. After the first take the other waiters take the thread in turn, so
that every round starts anew. Directly and through PgBouncer in transaction mode.

What ``LISTEN``/``NOTIFY`` would cost instead (:func:`notify_cost`): the commits a
second of 8 clients, each inserting a row a statement, with and without a
``pg_notify`` in the same statement, as a release that woke other processes would
send. Alternated twice, 4 s each, directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.lines import LineProcess

#: Waiting turns at each level, and the processes they are spread over.
LEVELS = ((1, 1), (10, 5), (50, 5))
#: Each waiter process's pool: a poll borrows a session for one statement.
WAITER_POOL = 3
#: Clients committing at once in :func:`notify_cost`.
NOTIFY_CLIENTS = 8
#: The backoff reaches its ceiling (25 ms) within this; statements are counted after.
RAMP = 0.06


# -- the child: one adapter in one process, driven by JSON lines on stdin ------------------------


async def child(dsn: str, schema: str) -> None:
    from intention_kernel.durability.postgres import PostgresDurability

    store = PostgresDurability(
        dsn, schema=schema, min_pool_size=WAITER_POOL, max_pool_size=WAITER_POOL
    )
    recorder: Any = await store.recorder()
    counted = [0]
    run = recorder._run

    async def counting(*args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return await run(*args, **kwargs)

    recorder._run = counting  # every statement of this adapter, counted
    held: asyncio.Event | None = None
    holding: asyncio.Task[float] | None = None
    waiting: list[asyncio.Task[float]] = []

    async def hold(thread: str, taken: asyncio.Future[float], free: asyncio.Event) -> float:
        async with recorder.start_turn(thread, uuid.uuid4().hex, None):
            taken.set_result(time.monotonic())
            await free.wait()
        return time.monotonic()

    async def wait(thread: str) -> float:
        async with recorder.start_turn(thread, uuid.uuid4().hex, None):
            return time.monotonic()

    def reply(**values: Any) -> None:
        sys.stdout.write(json.dumps(values) + "\n")
        sys.stdout.flush()

    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            break
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "hold":
            held = asyncio.Event()
            taken: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            holding = asyncio.create_task(hold(cmd["thread"], taken, held))
            reply(t=await taken)
        elif op == "release":
            assert held is not None and holding is not None
            before = time.monotonic()
            held.set()
            reply(before=before, after=await holding)
        elif op == "wait":
            waiting = [asyncio.create_task(wait(cmd["thread"])) for _ in range(cmd["k"])]
            reply(t=time.monotonic())
        elif op == "mark":
            reply(t=time.monotonic(), statements=counted[0])
        elif op == "collect":
            takes = list(await asyncio.gather(*waiting))
            reply(takes=takes, statements=counted[0])
        elif op == "quit":
            break
    await store.aclose()
    reply(done=True)


# -- the coordinator ------------------------------------------------------------------------------


class Child(LineProcess):
    """A child process and its adapter."""

    def __init__(self, dsn: str, schema: str, app: str) -> None:
        from psycopg.conninfo import make_conninfo

        named = make_conninfo(dsn, application_name=app)
        root = Path(__file__).parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.handoff", "--child", "--dsn", named, "--schema", schema],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )

    def died(self) -> str:
        return f"hand-off child {self.proc.pid} died"

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RuntimeError, OSError, ValueError):
                self.call("quit")
        self.proc.wait(timeout=30)


def _ticks(pids: list[int]) -> int:
    """CPU ticks (user and system) the processes ``pids`` used so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def _backends(dsn: str, app: str) -> list[int]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchall()
    return [int(row[0]) for row in rows]


def _pgbouncer_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "pgbouncer":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _load() -> float:
    return os.getloadavg()[0]


def level(
    holder: Child,
    waiters: list[Child],
    thread: str,
    k: int,
    rounds: int,
    hold: tuple[float, float],
) -> dict[str, Any]:
    """``rounds`` hand-offs of ``thread`` from ``holder`` to ``k`` waiting turns over
    ``waiters``; figures in ms, statements per waiting turn and second."""
    share = [k // len(waiters) + (1 if i < k % len(waiters) else 0) for i in range(len(waiters))]
    handoffs: list[float] = []  # from the release's return
    from_start: list[float] = []  # from the release's start
    releases: list[float] = []
    polls, steady = 0, 0.0
    statements = 0
    started = time.perf_counter()
    for _ in range(rounds):
        holder.call("hold", thread=thread)
        for child, n in zip(waiters, share, strict=True):
            child.call("wait", thread=thread, k=n)
        seconds = random.uniform(*hold)
        time.sleep(RAMP)
        first = [child.call("mark") for child in waiters]
        time.sleep(seconds - RAMP)
        last = [child.call("mark") for child in waiters]
        released = holder.call("release")
        polls += sum(b["statements"] - a["statements"] for a, b in zip(first, last, strict=True))
        steady += statistics.mean(b["t"] - a["t"] for a, b in zip(first, last, strict=True))
        collected = [child.call("collect") for child in waiters]
        takes = [t for c in collected for t in c["takes"]]
        handoffs.append(1000 * (min(takes) - released["after"]))
        from_start.append(1000 * (min(takes) - released["before"]))
        releases.append(1000 * (released["after"] - released["before"]))
        statements += sum(b["statements"] for b in collected) - sum(a["statements"] for a in first)
    return {
        "waiters": k,
        "processes": len(waiters),
        "rounds": rounds,
        "handoff_p50_ms": statistics.median(handoffs),
        "handoff_p99_ms": _pct(handoffs, 0.99),
        "handoff_max_ms": max(handoffs),
        "from_start_p50_ms": statistics.median(from_start),
        "from_start_p99_ms": _pct(from_start, 0.99),
        "release_p50_ms": statistics.median(releases),
        "polls_per_s": polls / steady,
        "polls_per_s_each": polls / steady / k,
        "seconds": time.perf_counter() - started,
        "handoffs": handoffs,
    }


def target(name: str, dsn: str, schema: str, mode: dict[str, Any]) -> dict[str, Any]:
    """Every level through ``dsn``: a holder and five waiter processes."""
    apps = [f"{schema}_{name}_{i}" for i in range(6)]
    children = [Child(dsn, schema, app) for app in apps]
    out: dict[str, Any] = {"levels": []}
    try:
        for child in children:  # each opens its adapter before its first answer
            child.call("mark")
        holder, waiters = children[0], children[1:]
        from bench.run import DSN

        backends = [pid for app in apps[1:] for pid in _backends(DSN, app)]
        bouncer = _pgbouncer_pids() if name == "pgbouncer" else []
        for k, processes in LEVELS:
            rounds = mode["handoff_rounds"] if k == 1 else mode["handoff_hot_rounds"]
            thread = f"hot-{k}-{uuid.uuid4().hex[:8]}"
            load = _load()
            ticks = _ticks(bouncer or backends)
            before = sum(c.call("mark")["statements"] for c in waiters)
            lv = level(holder, waiters[:processes], thread, k, rounds, mode["handoff_hold"])
            sent = sum(c.call("mark")["statements"] for c in waiters) - before
            used = (_ticks(bouncer or backends) - ticks) / os.sysconf("SC_CLK_TCK")
            lv.update(
                load=load,
                statements=sent,
                cpu_seconds=used,
                cpu_us_per_statement=1e6 * used / sent if sent else None,
                cpu_of={"pgbouncer": "PgBouncer's process"}.get(name, "the waiters' backends"),
            )
            out["levels"].append(lv)
            print(
                f"  handoff {name} waiters={k}: p50 {lv['handoff_p50_ms']:.1f} ms,"
                f" p99 {lv['handoff_p99_ms']:.1f} ms, {lv['polls_per_s']:.0f} statements/s,"
                f" load {load:.1f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        for child in children:
            child.stop()
    return out


async def _commits(schema: str, notify: bool, seconds: float) -> dict[str, float]:
    """Commits a second of ``NOTIFY_CLIENTS`` clients, each inserting one row a statement
    (``synchronous_commit`` on), with or without a ``pg_notify`` in the statement."""
    import psycopg

    from bench.run import DSN

    returned = "pg_notify('ik_bench_handoff', id::text)" if notify else "id"
    statement = (
        f'WITH w AS (INSERT INTO "{schema}".commits (v) VALUES (1) RETURNING id) '
        f"SELECT {returned} FROM w"
    ).encode()
    until = time.monotonic() + seconds
    latencies: list[float] = []

    async def client() -> int:
        conn = await psycopg.AsyncConnection.connect(DSN, autocommit=True, prepare_threshold=None)
        async with conn:
            n = 0
            while time.monotonic() < until:
                t = time.perf_counter()
                await conn.execute(statement)
                latencies.append(time.perf_counter() - t)
                n += 1
            return n

    counts = await asyncio.gather(*(client() for _ in range(NOTIFY_CLIENTS)))
    return {
        "notify": notify,
        "commits_per_s": sum(counts) / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * _pct(latencies, 0.99),
        "load": _load(),
    }


def notify_cost(schema: str, seconds: float = 4.0) -> list[dict[str, float]]:
    """Without and with ``pg_notify``, alternated twice (see the module's docstring)."""
    import psycopg

    from bench.run import DSN

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'.encode())
        conn.execute(f'CREATE TABLE "{schema}".commits (id bigserial PRIMARY KEY, v int)'.encode())
    return [asyncio.run(_commits(schema, notify, seconds)) for notify in (False, True) * 2]


def handoff_group(args: argparse.Namespace, mode: dict[str, Any]) -> dict[str, Any]:
    """The group for ``python -m bench``: directly, then through PgBouncer."""
    from bench.latency import PGBOUNCER_DSN, _answers
    from bench.run import DSN

    out: dict[str, Any] = {"targets": {}, "uptime": _uptime()}
    for name, dsn in (("direct", DSN), ("pgbouncer", PGBOUNCER_DSN)):
        if name == "pgbouncer" and not _answers(dsn):
            out["targets"][name] = {"skipped": f"no PgBouncer at {dsn}"}
            continue
        out["targets"][name] = target(name, dsn, f"{args.schema}_handoff", mode)
    out["notify_cost"] = notify_cost(f"{args.schema}_notify")
    for run in out["notify_cost"]:
        print(
            f"  commits with pg_notify={run['notify']}: {run['commits_per_s']:.0f}/s,"
            f" p50 {run['p50_ms']:.1f} ms, load {run['load']:.1f}",
            file=sys.stderr,
            flush=True,
        )
    out["uptime_after"] = _uptime()
    return out


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def report(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Hand-off across processes (a thread freed by one process, taken by a waiting turn"
        " in another; polling with backoff, 1 to 25 ms):",
        f"load: {result['uptime']}",
        "",
        "| target | waiting turns (processes) | rounds | hand-off p50 / p99 / max ms "
        "| from the release's start p50 / p99 ms | statements/s (per waiting turn) "
        "| server CPU µs/statement | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in result["targets"].items():
        if "skipped" in t:
            lines.append(f"| {name} | skipped: {t['skipped']} | | | | | | |")
            continue
        for lv in t["levels"]:
            cpu = lv["cpu_us_per_statement"]
            lines.append(
                f"| {name} | {lv['waiters']} ({lv['processes']}) | {lv['rounds']} "
                f"| {lv['handoff_p50_ms']:.1f} / {lv['handoff_p99_ms']:.1f} / "
                f"{lv['handoff_max_ms']:.1f} "
                f"| {lv['from_start_p50_ms']:.1f} / {lv['from_start_p99_ms']:.1f} "
                f"| {lv['polls_per_s']:.0f} "
                f"({lv['polls_per_s_each']:.1f}) "
                f"| {'-' if cpu is None else f'{cpu:.0f}'} ({lv['cpu_of']}) | {lv['load']:.1f} |"
            )
    lines += [
        "",
        f"What a NOTIFY in each commit costs ({NOTIFY_CLIENTS} clients, one insert a statement,"
        " synchronous_commit on):",
        "",
        "| pg_notify in the statement | commits/s | p50 / p99 ms | load |",
        "|---|---|---|---|",
    ]
    for run in result.get("notify_cost", []):
        lines.append(
            f"| {'yes' if run['notify'] else 'no'} | {run['commits_per_s']:.0f} "
            f"| {run['p50_ms']:.2f} / {run['p99_ms']:.2f} | {run['load']:.1f} |"
        )
    lines.append(f"load after: {result['uptime_after']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.handoff", description=__doc__)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--schema", default=f"ikbench_{os.getpid()}")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.dsn, args.schema))
        return
    from bench.run import MODES, drop_schemas

    mode = MODES["quick" if args.quick else "full"]
    try:
        result = handoff_group(args, mode)
    finally:
        drop_schemas(args.schema)
    print("\n".join(report(result)))


if __name__ == "__main__":
    main()
