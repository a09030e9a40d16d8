"""The sync group (``--only sync``): what ``SyncKernel`` costs per turn over ``Kernel``.

Two rows per SQLite setting, each in a worker process of its own, on the same work
unit (``bench.workload``):

- ``ik-sqlite-full`` / ``ik-sqlite-normal``: the async kernel, awaited on the worker's
  event loop (the throughput table's rows);
- ``sync-sqlite-full`` / ``sync-sqlite-normal``: ``SyncKernel`` over the same store
  settings, called from the worker's main thread, which runs no event loop at all (a
  script, a Celery task, a WSGI thread). A lone caller drives the kernel's loop in its
  own thread: each turn is a task and a ``run_until_complete``, which is the facade's
  cost (until 2026-12-05 each turn crossed to the loop's thread and back).

Blocks run the four rows in an order rotated block by block, as the throughput phase
does (``bench.run.throughput``). A setting's ratio is the median over blocks of the
sync row's turns/s over the async row's in the same block; the facade's overhead is
one minus it. CPU per turn (all threads of the process) is compared the same way. The
target: an overhead under 15 % of a turn, on ``FULL`` (the default) and ``NORMAL``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any, Literal

from bench.workload import THREADS, FakeProvider, agent, message

#: (async row, sync row) per SQLite setting.
PAIRS = (
    ("ik-sqlite-full", "sync-sqlite-full"),
    ("ik-sqlite-normal", "sync-sqlite-normal"),
)
#: The facade may cost at most this share of a turn.
TARGET_OVERHEAD = 0.15


def sync_group(args: argparse.Namespace, mode: dict[str, Any]) -> dict[str, Any]:
    from bench.run import BASE_SUFFIX, throughput

    pairs = list(PAIRS)
    if args.base:
        # The base tree's SyncKernel, against the same async row: before and after.
        pairs += [(a, s + BASE_SUFFIX) for a, s in PAIRS]
    rows = list(dict.fromkeys(row for pair in pairs for row in pair))
    rates = throughput(rows, args, mode)
    out: dict[str, Any] = {"rows": rates, "pairs": []}
    for async_row, sync_row in pairs:
        a, s = rates[async_row], rates[sync_row]
        tps = [x / y for x, y in zip(s["tps_blocks"], a["tps_blocks"], strict=True)]
        cpu = [x / y for x, y in zip(s["cpu_us_blocks"], a["cpu_us_blocks"], strict=True)]
        out["pairs"].append(
            {
                "async": async_row,
                "sync": sync_row,
                "ratio_blocks": tps,
                "ratio": statistics.median(tps),
                "overhead": 1 - statistics.median(tps),
                "cpu_ratio": statistics.median(cpu),
                "p50_delta_us": 1000 * (s["p50_ms"] - a["p50_ms"]),
            }
        )
    return out


def report(result: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "SyncKernel against Kernel (same work unit, SQLite; blocks interleaved)",
        "",
        "| setting | async turns/s | sync turns/s | x async | overhead | CPU x async "
        "| p50 ms async / sync | p50 +µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pair in result["pairs"]:
        a, s = result["rows"][pair["async"]], result["rows"][pair["sync"]]
        setting = pair["async"].removeprefix("ik-sqlite-").upper()
        if pair["sync"].endswith("@base"):
            setting += " (base's SyncKernel)"
        lines.append(
            f"| {setting} | {a['tps']:.0f} | {s['tps']:.0f} | {pair['ratio']:.3f} "
            f"| {100 * pair['overhead']:.1f} % | {pair['cpu_ratio']:.3f} "
            f"| {a['p50_ms']:.2f} / {s['p50_ms']:.2f} | {pair['p50_delta_us']:.0f} |"
        )
    return lines


def targets(result: dict[str, Any]) -> list[tuple[str, float, bool, str]]:
    checks = []
    for pair in result["pairs"]:
        if pair["sync"].endswith("@base"):
            continue  # the base tree's figures are shown, not judged
        target = f"{pair['sync']}: facade overhead < {TARGET_OVERHEAD:.0%} of a turn (x async)"
        held = pair["overhead"] < TARGET_OVERHEAD
        checks.append((target, pair["ratio"], held, "x"))
    return checks


# -- the worker side: a process whose main thread runs no event loop ---------------------------


class SyncKernelRow:
    """``SyncKernel`` over ``SQLiteDurability`` with the throughput rows' settings."""

    def __init__(self, path: str, synchronous: Literal["FULL", "NORMAL"]) -> None:
        self.path, self.synchronous = path, synchronous
        self.provider = FakeProvider()

    def setup(self) -> None:
        from intention_kernel import SyncKernel
        from intention_kernel.durability.sqlite import SQLiteDurability

        durability = SQLiteDurability(self.path, synchronous=self.synchronous)
        self.kernel = SyncKernel(agent(self.provider), durability)
        self.kernel.checkpoint("warm-up")  # opens the store, as the async row's setup does

    def close(self) -> None:
        self.kernel.close()

    def turn(self, thread: str, n: int) -> None:
        result = self.kernel.turn(thread, str(n), message(n))
        assert not result.replayed and result.steps[1].status == "completed", result

    def replay(self, thread: str, n: int) -> None:
        assert self.kernel.turn(thread, str(n), message(n)).replayed


def serve(row: SyncKernelRow, ident: str, out: Any) -> None:
    """``bench.worker.serve``'s protocol (setup, turns, replays, rss, stop), blocking."""
    from bench.worker import _rss

    n, committed = 0, []
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        answer: dict[str, Any]
        if op == "setup":
            row.setup()
            answer = {"rss_kb": _rss()}
        elif op == "turns":
            latencies = []
            start, t0, cpu = time.time(), time.perf_counter(), time.process_time()
            for _ in range(command["count"]):
                n += 1
                thread = f"{ident}-t{n % THREADS}"
                t = time.perf_counter()
                row.turn(thread, n)
                latencies.append(time.perf_counter() - t)
                committed.append((thread, n))
            answer = {
                "lat": latencies,
                "wall": time.perf_counter() - t0,
                "cpu": time.process_time() - cpu,
                "start": start,
                "end": time.time(),
            }
        elif op == "replays":
            calls, latencies = row.provider.calls, []
            for thread, k in random.sample(committed, min(command["count"], len(committed))):
                t = time.perf_counter()
                row.replay(thread, k)
                latencies.append(time.perf_counter() - t)
            answer = {"lat": latencies, "effects_rerun": row.provider.calls - calls}
        elif op == "rss":
            answer = {"rss_kb": _rss()}
        elif op == "stop":
            row.close()
            out.write(json.dumps({"ok": True}) + "\n")
            out.flush()
            break
        else:
            answer = {"error": f"unknown op {op}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
