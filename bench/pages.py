"""Pages a turn writes on SQLite: ``python -m bench.pages [--turns N] [--overlap N]``.

Runs the benchmark's work unit (``bench.workload``) on a fresh SQLite file and prints
deterministic figures, where time on a shared machine is not:

- **WAL frames per turn** (one frame is one page and its 24-byte header, appended to
  the WAL at a commit), from the WAL file's growth (:class:`bench.counting.WALMeter`).
- **The hot rows**: bytes of the ``ik_threads`` row (the checkpoint's core), rewritten
  by every turn, and of an ``ik_turns`` row, inserted by every turn; and how many
  overflow pages they take (SQLite's ``dbstat`` table): a row longer than about a page
  spills into overflow pages, and each one is written again when the row is.

``--max-receipts N`` keeps N receipts in each checkpoint's index instead of the
agent's 100 (the index is rows of ``ik_receipt_index`` since migration 8; before, it
was most of the ``ik_threads`` row, which this option shrank). ``--overlap N`` runs N
clients at once, each on a thread of its own, the interpretation awaiting once (as
``bench.concurrency`` does), so that writes group.
Against another source tree: ``PYTHONPATH=/path/to/tree/src python -m bench.pages``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from bench.counting import WALMeter
from bench.worker import KernelRow, Worker


def hot_rows(path: str) -> dict[str, Any]:
    """Sizes of the rows every turn writes, and their overflow pages, from ``dbstat``."""
    conn = sqlite3.connect(path)
    try:
        threads = conn.execute(
            "SELECT count(*), avg(length(checkpoint)), max(length(checkpoint)) FROM ik_threads"
        ).fetchone()
        turns = conn.execute(
            "SELECT count(*), avg(length(result) + length(request_digest) + length(turn_id)"
            " + length(thread_id) + coalesce(length(announced), 0)) FROM ik_turns"
        ).fetchone()
        pages = dict(
            conn.execute(
                "SELECT name || ':' || pagetype, count(*) FROM dbstat"
                " WHERE name IN ('ik_threads', 'ik_turns') GROUP BY name, pagetype"
            ).fetchall()
        )
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    return {
        "page_size": page_size,
        "threads": threads[0],
        "core_bytes_avg": round(threads[1] or 0),
        "core_bytes_max": threads[2] or 0,
        "thread_overflow_pages_per_row": pages.get("ik_threads:overflow", 0) / max(threads[0], 1),
        "turn_row_bytes_avg": round(turns[1] or 0),
        "turn_overflow_pages_per_row": pages.get("ik_turns:overflow", 0) / max(turns[0], 1),
    }


async def measure(
    turns: int, overlap: int, warmup: int, synchronous: str, max_receipts: int | None = None
) -> dict[str, Any]:
    if max_receipts is not None:
        import dataclasses

        import bench.worker

        make = vars(bench.worker)["agent"]  # bench.workload.agent, as KernelRow calls it

        def agent(*args: Any, **options: Any) -> Any:
            return dataclasses.replace(make(*args, **options), max_receipts=max_receipts)

        vars(bench.worker)["agent"] = agent
    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "pages.db")
        row = KernelRow("sqlite", path, "", "", synchronous, model_awaits=overlap > 1)
        await row.setup()
        worker = Worker(row, "p")
        try:
            if overlap > 1:
                await worker.overlap(overlap, warmup)
            else:
                await worker.turns(warmup)
            with WALMeter(path) as meter:
                if overlap > 1:
                    done = len((await worker.overlap(overlap, turns))["lat"])
                else:
                    done = len((await worker.turns(turns))["lat"])
        finally:
            await row.close()
        return {
            "turns": done,
            "overlap": overlap,
            "warmup": warmup,
            "max_receipts": max_receipts,
            "wal_frames_per_turn": meter.frames / done,
            "wal_bytes_per_turn": meter.bytes / done,
            **hot_rows(path),
        }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pages")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=1000, help="turns before measuring")
    parser.add_argument("--overlap", type=int, default=1, help="clients at once")
    parser.add_argument("--synchronous", default="NORMAL", choices=["FULL", "NORMAL"])
    parser.add_argument("--max-receipts", type=int, help="the agent's receipt index size")
    parser.add_argument("--out", help="append the result as one JSON line to this file")
    parser.add_argument("--label", default="", help="recorded with the result")
    args = parser.parse_args()
    import intention_kernel

    result = asyncio.run(
        measure(args.turns, args.overlap, args.warmup, args.synchronous, args.max_receipts)
    )
    result["label"] = args.label
    result["library"] = os.path.dirname(str(intention_kernel.__file__))
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "a") as out:
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
