"""The latency group: N conversations at once, each turn's model call awaiting a latency.

Each level runs ``n`` conversations at once in one process. Each is on a thread of
its own and delivers ``turns`` turns in a row. Every turn's model call awaits
``latency`` seconds, as a real model would. It is an ``asyncio.sleep``, so the process
is free meanwhile. One kernel per row, and one store: SQLite (``FULL``), PostgreSQL with
a pool of 10 sessions, and the same PostgreSQL adapter through PgBouncer in transaction
mode (``scripts/pgbouncer.sh``). The peers do the same work with the same latency.
LangGraph's ``AsyncPostgresSaver`` runs a two-node graph on a pool of 10. Its model
node awaits the latency, with ``durability="sync"``. DBOS runs a workflow of two async
steps on a system database pool of 10.

What each level reports:

- turns/s: turns that committed, over the level's wall time.
- its ratio to the ideal, ``min(n / latency, the row's zero-latency turns/s at 64 in
  flight)``. No conversation can go faster than its model. The store is taken to go
  no faster than it does with nothing to wait for. That rate is measured in the same
  process just before, after a warm-up. That is the issue's ideal, not a bound: with hundreds of
  turns in flight SQLite groups more commits than at 64, and can exceed it.
- the store wait: from the turn's start to the model's call, which is the wait for the
  thread's lock (or lease) and the checkpoint's read; p50 and p99 over the turns that
  reached their model.
- sessions: the most server sessions the row had open, and in use. In use means
  running a statement, inside a transaction, or holding an advisory lock. They are
  sampled from ``pg_stat_activity`` every 0.2 s by the row's ``application_name``.
  Through PgBouncer, its own view is sampled too (``SHOW POOLS``). It shows server
  sessions lent to clients, and clients waiting for one.
- errors, by type: turns that raised (a pool timeout, a busy thread, a driver error).

The targets (issue 32): on PostgreSQL with a pool of 10, at least 0.7 of the ideal at
n = 500 and n = 2,000, with no error, directly and through PgBouncer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import threading
import time
from typing import Any

from bench.workload import FakeProvider, agent, message

PGBOUNCER_DSN = os.environ.get(
    "INTENTION_KERNEL_PGBOUNCER_DSN", "postgresql://postgres@127.0.0.1:6432/test"
)
ROWS = [
    "latency-ik-sqlite",
    "latency-ik-postgres",
    "latency-ik-pgbouncer",
    "latency-langgraph-postgres",
    "latency-dbos-postgres",
]
#: Sessions in each PostgreSQL row's pool.
POOL = 10
#: In flight for the zero-latency ceiling of the ideal.
CEILING_IN_FLIGHT = 64
#: The issue's target: this share of the ideal, at these levels, on these rows.
TARGET_RATIO = 0.7
TARGET_NS = (500, 2000)
TARGET_ROWS = ("latency-ik-postgres", "latency-ik-pgbouncer")

SESSIONS = """
    SELECT count(*),
           count(*) FILTER (WHERE state <> 'idle' OR EXISTS (
               SELECT 1 FROM pg_locks l
               WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted))
    FROM pg_stat_activity a WHERE application_name = %s
"""


class Clock:
    """When each conversation's current turn started, and how long each turn waited
    for the store before its model was called."""

    def __init__(self) -> None:
        self.latency = 0.0
        self.started: dict[str, float] = {}
        self.waits: list[float] = []

    async def model(self, thread_id: str) -> None:
        """The model's call: records the wait since the turn started, then awaits."""
        self.waits.append(time.perf_counter() - self.started[thread_id])
        if self.latency:
            await asyncio.sleep(self.latency)


class LatencyKernelRow:
    """intention-kernel on SQLite (``FULL``) or PostgreSQL (a pool of ``POOL``)."""

    def __init__(self, store: str, path: str, dsn: str, schema: str) -> None:
        self.store, self.path, self.dsn, self.schema = store, path, dsn, schema
        self.provider, self.clock = FakeProvider(), Clock()

    async def setup(self) -> None:
        from intention_kernel import Kernel

        if self.store == "sqlite":
            from intention_kernel.durability.sqlite import SQLiteDurability

            self.durability: Any = SQLiteDurability(self.path, synchronous="FULL")
        else:
            from intention_kernel.durability.postgres import PostgresDurability

            self.durability = PostgresDurability(self.dsn, schema=self.schema, max_pool_size=POOL)
        await self.durability.__aenter__()
        self.kernel = Kernel(agent(self.provider, model=self.clock.model), self.durability)

    async def close(self) -> None:
        await self.durability.aclose()

    async def turn(self, thread: str, n: int) -> None:
        result = await self.kernel.turn(thread, str(n), message(n))
        assert not result.replayed and result.steps[1].status == "completed", result


def row_schema(base: str, row: str) -> str:
    """The row's schema, which its sessions also carry as ``application_name``."""
    return f"{base}_{row.split('@', 1)[0].replace('-', '_')}"


def make_latency_row(name: str, path: str, dsn: str, base: str) -> Any:
    """The row ``latency-<system>-<store>``; each PostgreSQL row's sessions carry its
    schema as ``application_name``, which the session sampler counts by."""
    from psycopg.conninfo import make_conninfo

    schema = row_schema(base, name)
    _, system, store = name.split("@", 1)[0].split("-")
    server = PGBOUNCER_DSN if store == "pgbouncer" else dsn
    named = make_conninfo(server, application_name=schema)
    if system == "ik":
        return LatencyKernelRow("sqlite" if store == "sqlite" else "postgres", path, named, schema)
    if system == "langgraph":
        from bench.peers import LatencyLangGraphRow

        return LatencyLangGraphRow(named, schema)
    if system == "dbos":
        from bench.peers import LatencyDBOSRow

        return LatencyDBOSRow(dsn, schema)  # SQLAlchemy takes a URL, not a conninfo
    raise SystemExit(f"unknown row {name}")


async def run_level(row: Any, ident: str, n: int, turns: int, latency: float) -> dict[str, Any]:
    """``n`` conversations at once, ``turns`` turns each in a row, each model call
    awaiting ``latency`` seconds; a turn that raises is counted and the conversation
    goes on with its next turn."""
    clock: Clock = row.clock
    clock.latency, clock.waits = latency, []
    errors: dict[str, int] = {}
    first_error: dict[str, str] = {}
    durations: list[float] = []
    failed_after: list[float] = []
    level = f"{ident}-n{n}-l{latency:g}-{time.monotonic_ns()}"

    async def conversation(k: int) -> None:
        thread = f"{level}-c{k}"
        for number in range(1, turns + 1):
            t = time.perf_counter()
            clock.started[thread] = t
            try:
                await row.turn(thread, number)
            except Exception as exc:
                kind = type(exc).__name__
                errors[kind] = errors.get(kind, 0) + 1
                first_error.setdefault(kind, str(exc)[:300])
                failed_after.append(time.perf_counter() - t)
            else:
                durations.append(time.perf_counter() - t)
        clock.started.pop(thread, None)

    t0, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(conversation(k) for k in range(n)))
    return {
        "n": n,
        "turns_each": turns,
        "latency": latency,
        "committed": len(durations),
        "errors": errors,
        "first_error": first_error,
        "wall": time.perf_counter() - t0,
        "cpu": time.process_time() - cpu,
        "store_wait": clock.waits,
        "durations": durations,
        "failed_after": failed_after,
    }


class SessionSampler:
    """Samples, every 0.2 s on a thread of its own, the server sessions a row has open
    and in use (by ``application_name``); and through PgBouncer, its pool of the
    ``test`` database (``SHOW POOLS``), which other clients of that PgBouncer share."""

    def __init__(self, dsn: str, app: str, pgbouncer: bool) -> None:
        self.dsn, self.app, self.pgbouncer = dsn, app, pgbouncer
        self.samples: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SessionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        with contextlib.ExitStack() as stack:
            server = stack.enter_context(psycopg.connect(self.dsn, autocommit=True))
            admin, database = None, "test"
            if self.pgbouncer:
                with contextlib.suppress(psycopg.Error):
                    database = str(conninfo_to_dict(PGBOUNCER_DSN).get("dbname", "test"))
                    admin_dsn = make_conninfo(PGBOUNCER_DSN, dbname="pgbouncer")
                    # The admin console speaks the simple protocol only: never prepare.
                    admin = stack.enter_context(
                        psycopg.connect(admin_dsn, autocommit=True, prepare_threshold=None)
                    )
            stopped = False
            while not stopped:  # a last sample once stopped: a short level gets one too
                stopped = self._stop.wait(0.2)
                row = server.execute(SESSIONS, (self.app,)).fetchone()
                sample = {"open": int(row[0]), "busy": int(row[1])} if row else {}
                if admin is not None:
                    cur = admin.execute("SHOW POOLS")
                    names = [c.name for c in cur.description or []]
                    for values in cur.fetchall():
                        pool = dict(zip(names, values, strict=True))
                        if pool["database"] == database:
                            sample["pgbouncer_servers_lent"] = int(pool["sv_active"])
                            sample["pgbouncer_clients_waiting"] = int(pool["cl_waiting"])
                self.samples.append(sample)

    def peaks(self) -> dict[str, int]:
        keys = {key for sample in self.samples for key in sample}
        return {key: max(s.get(key, 0) for s in self.samples) for key in sorted(keys)}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def latency(args: argparse.Namespace, mode: dict[str, Any]) -> dict[str, Any]:
    """Each row in a worker process of its own: its zero-latency ceiling at
    ``CEILING_IN_FLIGHT``, then each level of ``mode["lat_levels"]``."""
    rows = list(mode.get("lat_rows") or ROWS)
    if args.no_postgres:
        rows = [r for r in rows if "sqlite" in r]
    if args.no_peers:
        rows = [r for r in rows if "-ik-" in r]
    named = [r for r in rows if r in (getattr(args, "rows", None) or "").split(",")]
    rows = named or rows  # ``--rows`` may name latency rows too
    out: dict[str, Any] = {"rows": {}, "levels": mode["lat_levels"], "turns": mode["lat_turns"]}
    for row in rows:
        if row.endswith("pgbouncer") and not _answers(PGBOUNCER_DSN):
            out["rows"][row] = {"skipped": f"no PgBouncer at {PGBOUNCER_DSN}"}
            print(f"  {row}: skipped, no PgBouncer answers", file=sys.stderr, flush=True)
            continue
        try:
            out["rows"][row] = _row(row, args, mode)
        except RuntimeError as exc:  # the worker died: its traceback is on stderr
            out["rows"][row] = {"failed": str(exc)}
            print(f"  {row}: {exc}", file=sys.stderr, flush=True)
    return out


def _row(row: str, args: argparse.Namespace, mode: dict[str, Any]) -> dict[str, Any]:
    from bench.run import DSN, Proc

    p = Proc(row, args, ident="lat")
    schema = row_schema(args.schema, row)
    try:
        p.call("setup")
        # A warm-up first: the ceiling is a warm store's, not a new process's first turns.
        p.call("latency", n=CEILING_IN_FLIGHT, turns=1, latency=0.0)
        ceiling = p.call(
            "latency", n=CEILING_IN_FLIGHT, turns=mode["lat_ceiling_turns"], latency=0.0
        )
        ceiling_tps = ceiling["committed"] / ceiling["wall"]
        levels = []
        for n, seconds in mode["lat_levels"]:
            with SessionSampler(DSN, schema, row.endswith("pgbouncer")) as sampler:
                done = p.call("latency", n=n, turns=mode["lat_turns"], latency=seconds)
            sessions = {} if "sqlite" in row else sampler.peaks()
            levels.append(_level(done, ceiling_tps, sessions))
            print(
                f"  {row} n={n} latency={seconds:g}s: {levels[-1]['tps']:.1f} turns/s,"
                f" x ideal {levels[-1]['ratio']:.2f}, errors {done['errors']}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        p.stop()
    return {
        "ceiling_tps": ceiling_tps,
        "ceiling_errors": ceiling["errors"],
        "ceiling_first_error": ceiling["first_error"],
        "levels": levels,
    }


def _level(done: dict[str, Any], ceiling_tps: float, sessions: dict[str, int]) -> dict[str, Any]:
    tps = done["committed"] / done["wall"]
    ideal = min(done["n"] / done["latency"], ceiling_tps)
    waits = done["store_wait"]
    return {
        "n": done["n"],
        "latency": done["latency"],
        "turns": done["n"] * done["turns_each"],
        "committed": done["committed"],
        "tps": tps,
        "ideal": ideal,
        "ratio": tps / ideal if ideal else 0.0,
        "wait_p50_ms": None if not waits else 1000 * statistics.median(waits),
        "wait_p99_ms": None if not waits else 1000 * (_pct(waits, 0.99) or 0.0),
        "turn_p50_s": None if not done["durations"] else statistics.median(done["durations"]),
        "errors": sum(done["errors"].values()),
        "errors_by_type": done["errors"],
        "first_error": done["first_error"],
        "failed_after_p50_s": None
        if not done["failed_after"]
        else statistics.median(done["failed_after"]),
        "wall": done["wall"],
        "cpu": done["cpu"],
        "sessions": sessions,
    }


def _answers(dsn: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=3, prepare_threshold=None) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def report(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Latency (n conversations at once, {result['turns']} turns each in a row, every model"
        f" call awaiting the latency; pool of {POOL} on PostgreSQL; ideal = min(n / latency,"
        f" the row's zero-latency turns/s at {CEILING_IN_FLIGHT} in flight)):",
        "",
        "| row | n | latency s | turns/s | ideal | x ideal | store wait p50 / p99 ms "
        "| sessions open / in use (peak) | PgBouncer: servers lent / clients waiting (peak) "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, r in result["rows"].items():
        if "skipped" in r or "failed" in r:
            why = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r['failed']}"
            lines.append(f"| {row} | {why} | | | | | | | | |")
            continue
        for lv in r["levels"]:
            s = lv["sessions"]
            sessions = f"{s['open']} / {s['busy']}" if "open" in s else "-"
            bouncer = (
                f"{s['pgbouncer_servers_lent']} / {s['pgbouncer_clients_waiting']}"
                if "pgbouncer_servers_lent" in s
                else "-"
            )
            kinds = ", ".join(f"{k} {v}" for k, v in lv["errors_by_type"].items())
            errors = f"{kinds} of {lv['turns']}" if lv["errors"] else "0"
            lines.append(
                f"| {row} | {lv['n']} | {lv['latency']:g} | {lv['tps']:.1f} | {lv['ideal']:.0f} "
                f"| {lv['ratio']:.3f} | {_ms(lv['wait_p50_ms'])} / {_ms(lv['wait_p99_ms'])} "
                f"| {sessions} | {bouncer} | {errors} |"
            )
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def targets(result: dict[str, Any]) -> list[tuple[str, float, bool, str]]:
    """At n = 500 and 2,000 (every latency the run measured), on PostgreSQL directly
    and through PgBouncer: at least ``TARGET_RATIO`` of the ideal, and no error."""
    out: list[tuple[str, float, bool, str]] = []
    for row in TARGET_ROWS:
        r = result.get("rows", {}).get(row)
        if r is None or "skipped" in r:
            continue
        if "failed" in r:  # its worker died: every target of the row missed
            out.append((f"{row}: the row ran", 0, False, " levels run"))
            continue
        for lv in r["levels"]:
            if lv["n"] not in TARGET_NS:
                continue
            where = f"{row}, n={lv['n']}, latency {lv['latency']:g} s"
            ratio = lv["ratio"]
            out.append((f"{where}: ≥ {TARGET_RATIO}x the ideal", ratio, ratio >= TARGET_RATIO, "x"))
            out.append((f"{where}: no turn fails", lv["errors"], lv["errors"] == 0, " errors"))
    return out
