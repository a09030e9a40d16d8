"""One benchmark row in a process of its own, driven over a pipe by ``bench.run``.

Reads one JSON command per line on stdin and answers one JSON line on the protocol
descriptor (the original stdout; anything a library prints goes to stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import sqlite3
import statistics
import sys
import time
from typing import Any, Literal

from bench.run import UVLOOP_SUFFIX, plain
from bench.workload import THREADS, FakeProvider, agent, message


class KernelRow:
    def __init__(
        self,
        store: str,
        path: str,
        dsn: str,
        schema: str,
        synchronous: str,
        offload_writes: bool | None = None,
        sync_provider: bool = False,
        model_awaits: bool = False,
    ) -> None:
        self.store, self.path, self.dsn, self.schema = store, path, dsn, schema
        self.synchronous, self.offload_writes = synchronous, offload_writes
        self.sync_provider = sync_provider
        self.model_awaits = model_awaits
        self.provider = FakeProvider()

    async def setup(self) -> None:
        from intention_kernel import Kernel

        if self.store == "sqlite":
            from intention_kernel.durability.sqlite import SQLiteDurability

            options: dict[str, Any] = {"synchronous": self.synchronous}
            if self.offload_writes is not None:  # (also runs against older versions)
                options["offload_writes"] = self.offload_writes
            options.update(_seam())
            self.seam: Any = options.get("seam")
            self.durability: Any = SQLiteDurability(self.path, **options)
        else:
            from intention_kernel.durability.postgres import PostgresDurability

            self.durability = PostgresDurability(self.dsn, schema=self.schema)
        await self.durability.__aenter__()
        self.kernel = Kernel(
            agent(self.provider, sync_provider=self.sync_provider, model_awaits=self.model_awaits),
            self.durability,
        )

    async def close(self) -> None:
        await self.durability.aclose()

    async def turn(self, thread: str, n: int) -> None:
        result = await self.kernel.turn(thread, str(n), message(n))
        assert not result.replayed and result.steps[1].status == "completed", result

    async def replay(self, thread: str, n: int) -> None:
        result = await self.kernel.turn(thread, str(n), message(n))
        assert result.replayed

    def sizes(self, thread: str) -> dict[str, int]:
        """Bytes stored for the thread's checkpoint: the hot row and everything."""
        queries = {
            "core": "SELECT length(checkpoint) FROM ik_threads WHERE thread_id = {p}",
            "messages": "SELECT sum(length(body)) FROM ik_messages WHERE thread_id = {p}",
            "facts": "SELECT sum(length(body)) FROM ik_facts WHERE thread_id = {p}",
            "fact_rows": "SELECT count(*) FROM ik_facts WHERE thread_id = {p}",
            # SQLite only: its receipt index rows (PostgreSQL keeps the index in the core).
            "index": "SELECT sum(length(body)) FROM ik_receipt_index WHERE thread_id = {p}",
        }
        out: dict[str, int] = {}
        if self.store == "sqlite":
            conn = sqlite3.connect(self.path)
            for name, sql in queries.items():
                try:
                    out[name] = conn.execute(sql.format(p="?"), (thread,)).fetchone()[0] or 0
                except sqlite3.OperationalError:
                    out[name] = 0  # a schema without the table (the whole-document layout)
            conn.close()
        else:
            import psycopg

            with psycopg.connect(self.dsn, autocommit=True) as pg:
                pg.execute(f'SET search_path = "{self.schema}"')
                for name, sql in queries.items():
                    try:
                        row = pg.execute(sql.format(p="%s"), (thread,)).fetchone()
                        out[name] = int(row[0] or 0) if row else 0
                    except psycopg.errors.UndefinedTable:
                        out[name] = 0
        out["total"] = out["core"] + out["messages"] + out["facts"] + out["index"]
        return out


def make_row(name: str, directory: str, dsn: str, schema: str) -> Any:
    from bench.floor import PostgresFloor, SQLiteFloor
    from bench.peers import DBOSRow, LangGraphRow

    path = os.path.join(directory, f"{name}.db")
    kind, store, sync, *options = [*plain(name).split("-"), "", ""]
    if kind == "loop":  # loop-ik-sqlite, loop-langgraph-postgres (bench/loop.py)
        from bench.loop import LoopKernelRow, LoopLangGraphRow

        if store == "ik":
            stream = "stream" in options
            return LoopKernelRow(name, sync, path, dsn, schema + "_loop_ik", stream)
        if store == "langgraph":
            return LoopLangGraphRow(name, sync, path, dsn, schema + "_loop_lg")
    if kind == "latency":  # latency-ik-postgres, latency-dbos-postgres (bench/latency.py)
        from bench.latency import make_latency_row

        return make_latency_row(name, path, dsn, schema)
    if kind == "bridge":  # bridge-ik-sqlite: the Pydantic AI bridge (bench/bridge.py)
        from bench.bridge import BridgeAloneRow, BridgeKernelRow

        if store == "alone":  # bridge-alone: the same agent without the kernel
            return BridgeAloneRow()
        return BridgeKernelRow(sync, path, dsn, schema + "_bridge")
    if kind == "ik":
        offload = True if "offload" in options else False if "inline" in options else None
        sync_provider = "syncfn" in (sync, *options)
        awaits = "overlap" in options  # the concurrency group's row (bench.concurrency)
        return KernelRow(
            store,
            path,
            dsn,
            schema + "_ik",
            (sync or "full").upper(),
            offload,
            sync_provider,
            awaits,
        )
    if kind == "floor" and store == "sqlite":
        return SQLiteFloor(path, sync.upper())
    if kind == "floor":  # floor-postgres, floor-postgres-async
        aio = sync == "async"
        return PostgresFloor(dsn, schema + ("_floor_async" if aio else "_floor"), aio=aio)
    if kind == "langgraph":
        return LangGraphRow(store, path, dsn, schema + "_lg")
    if kind == "dbos":
        return DBOSRow(store, path, dsn, schema + "_dbos")
    raise SystemExit(f"unknown row {name}")


class Worker:
    def __init__(self, row: Any, ident: str) -> None:
        self.row, self.ident = row, ident
        self.n = 0
        self.committed: list[tuple[str, int]] = []

    def thread(self, n: int) -> str:
        return f"{self.ident}-t{n % THREADS}"

    async def turns(self, count: int, start_at: float | None = None) -> dict[str, Any]:
        if start_at is not None:
            await asyncio.sleep(max(start_at - time.time(), 0))
        latencies = []
        start, t0, cpu = time.time(), time.perf_counter(), time.process_time()
        for _ in range(count):
            self.n += 1
            thread = self.thread(self.n)
            t = time.perf_counter()
            await self.row.turn(thread, self.n)
            latencies.append(time.perf_counter() - t)
            self.committed.append((thread, self.n))
        return {
            "lat": latencies,
            "wall": time.perf_counter() - t0,
            "cpu": time.process_time() - cpu,
            "start": start,
            "end": time.time(),
        }

    async def overlap(self, n: int, count: int) -> dict[str, Any]:
        """``count`` turns by ``n`` clients at once, each on a thread of its own, one
        turn after the other: up to ``n`` turns in flight over one kernel."""
        latencies: list[float] = []

        async def client(k: int) -> None:
            thread = f"{self.ident}-c{n}-{k}"
            for _ in range(count // n):
                self.n += 1
                number = self.n
                t = time.perf_counter()
                await self.row.turn(thread, number)
                latencies.append(time.perf_counter() - t)

        t0, cpu, writer = time.perf_counter(), time.process_time(), _writer_cpu(self.row)
        await asyncio.gather(*(client(k) for k in range(n)))
        done = {
            "lat": latencies,
            "turns": len(latencies),
            "wall": time.perf_counter() - t0,
            "cpu": time.process_time() - cpu,
        }
        if writer is not None:
            done["writer_cpu"] = (_writer_cpu(self.row) or 0.0) - writer
        return done

    async def replays(self, count: int) -> dict[str, Any]:
        provider = self.row.provider
        calls, model = provider.calls, getattr(provider, "model", None)
        latencies = []
        for thread, n in random.sample(self.committed, min(count, len(self.committed))):
            t = time.perf_counter()
            await self.row.replay(thread, n)
            latencies.append(time.perf_counter() - t)
        answer = {"lat": latencies, "effects_rerun": provider.calls - calls}
        if model is not None:  # a loop row: its model counts its calls too
            answer["model_rerun"] = provider.model - model
        return answer

    async def growth(self, points: list[int], pairs: int = 10) -> dict[str, Any]:
        """Turn latency around the given turn numbers of one long thread.

        Each point is compared with turns 6-15 of fresh threads, run alternately at
        the same moment: the machine's speed drifts too much over minutes. It takes
        ``pairs`` turns of each, in alternating order, a new fresh thread every ten."""
        long, done, out = f"{self.ident}-long", 0, []
        for point in points:
            while done < point - 5:
                done += 1
                await self.row.turn(long, done)
            long_lat, control_lat = [], []
            control, k = "", 15
            for i in range(pairs):
                if k == 15:  # turns 6-15 of a new fresh thread
                    control, k = f"{self.ident}-fresh-{point}-{i}", 0
                    for k in range(1, 6):
                        await self.row.turn(control, k)
                k += 1
                for which in ("long", "fresh") if i % 2 else ("fresh", "long"):
                    t = time.perf_counter()
                    if which == "long":
                        done += 1
                        await self.row.turn(long, done)
                        long_lat.append(time.perf_counter() - t)
                    else:
                        await self.row.turn(control, k)
                        control_lat.append(time.perf_counter() - t)
            out.append(
                {
                    "turn": point,
                    "long_p50": statistics.median(long_lat),
                    "fresh_p50": statistics.median(control_lat),
                    "pairs": pairs,
                    "sizes": self.row.sizes(long),
                }
            )
        return {"points": out, "turns": done, "rss_kb": _rss()}


def _writer_worker(row: Any) -> Any:
    """The SQLite adapter's worker thread (its ``GroupWriter``), if the row has one."""
    recorder = getattr(getattr(row, "durability", None), "_recorder", None)
    return getattr(recorder, "_worker", None)


def _writer_cpu(row: Any) -> float | None:
    """CPU seconds the SQLite adapter's worker thread has spent (user and system), read
    from its thread clock; ``None`` for a row without one."""
    thread = getattr(_writer_worker(row), "_thread", None)
    if thread is None or thread.ident is None:
        return None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def serve(args: argparse.Namespace, out: Any) -> None:
    counter, pg_counter = None, None
    if args.trace:
        from bench.counting import install_psycopg_trace, install_sqlite_trace

        counter, pg_counter = install_sqlite_trace(), install_psycopg_trace()
    row = make_row(args.row, args.dir, args.dsn, args.schema)
    worker = Worker(row, args.ident)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        command = json.loads(line)
        op = command.pop("op")
        answer: dict[str, Any]
        if op == "setup":
            await row.setup()
            answer = {"rss_kb": _rss()}
        elif op == "turns":
            answer = await worker.turns(**command)
        elif op == "replays":
            answer = await worker.replays(**command)
        elif op == "overlap":
            answer = await worker.overlap(**command)
        elif op == "latency":  # n conversations at once (bench/latency.py)
            from bench.latency import run_level

            answer = await run_level(row, args.ident, **command)
        elif op == "cost":  # bench.cost: one measured batch
            from bench.cost import measure

            answer = await measure(worker, **command)
        elif op == "growth":
            answer = await worker.growth(**command)
        elif op == "crash":  # a loop row: a delivery killed mid-loop, then delivered again
            from bench.loop import crash

            where = (args.row, args.dir, args.dsn, args.schema)
            answer = await crash(row, where, f"{args.ident}-crash", **command)
        elif op == "counters":
            answer = {
                "statements": counter.statements if counter else None,
                "pg_statements": pg_counter.statements if pg_counter else None,
                "commits": counter.commits if counter else None,
                "effects": row.provider.calls,
                "groups": _writer_groups(row),
            }
        elif op == "rss":
            answer = {"rss_kb": _rss()}
        elif op == "stop":
            await row.close()
            out.write(json.dumps({"ok": True}) + "\n")
            out.flush()
            break
        else:
            answer = {"error": f"unknown op {op}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def _seam() -> dict[str, Any]:
    """``seam=`` a new ``WriterProbe``, where the tree under test takes one."""
    try:
        from intention_kernel.testing.sqlite import WriterProbe

        return {"seam": WriterProbe()}
    except (ImportError, TypeError):  # a --base tree older than the seam option
        return {}


def _writer_groups(row: Any) -> int | None:
    """Transactions the SQLite adapter's writer thread ran (groups, or writes alone).

    ``None`` for another store, or a ``--base`` tree older than the probe.
    """
    seam = getattr(row, "seam", None)
    if seam is not None:
        return int(seam.groups)
    durability = getattr(row, "durability", None)
    try:
        from intention_kernel.durability.sqlite import SQLiteDurability
        from intention_kernel.testing.sqlite import WriterProbe
    except ImportError:
        return None
    if not isinstance(durability, SQLiteDurability):
        return None
    # The --base tree's older probe, which took the adapter; mypy sees only today's.
    return WriterProbe(durability).groups  # type: ignore[call-arg, arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("row")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--ident", default="w0")
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a library prints must not reach the protocol
    sys.stdout = sys.stderr
    if plain(args.row).startswith("sync-"):  # SyncKernel: no event loop in this thread
        from bench.sync import SyncKernelRow
        from bench.sync import serve as serve_blocking

        setting: Literal["FULL", "NORMAL"] = (
            "NORMAL" if plain(args.row).endswith("-normal") else "FULL"
        )
        path = os.path.join(args.dir, f"{args.row}.db")
        serve_blocking(SyncKernelRow(path, setting), args.ident, out)
    elif UVLOOP_SUFFIX in args.row:
        import uvloop

        uvloop.run(serve(args, out))
    else:
        asyncio.run(serve(args, out))


if __name__ == "__main__":
    main()
