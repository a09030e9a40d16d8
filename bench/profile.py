"""Profile intention-kernel turns: ``python -m bench.profile [--store postgres] [--turns N]``.

Runs the benchmark's work unit in-process under pyinstrument (the ``bench`` extra)
and prints where the time goes; ``--cprofile`` prints cProfile's table instead;
``--sync-provider`` calls the provider's sync client (run in a worker thread).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

from bench.run import DSN, drop_schemas
from bench.worker import KernelRow, Worker


async def run(
    turns: int, store: str, synchronous: str, use_cprofile: bool, sync_provider: bool
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        schema = f"ikprofile_{os.getpid()}"
        row = KernelRow(
            store,
            str(Path(directory) / "p.db"),
            DSN,
            schema,
            synchronous,
            sync_provider=sync_provider,
        )
        await row.setup()
        worker = Worker(row, "p")
        await worker.turns(100)
        if use_cprofile:
            # CPU time, not wall time: on a shared machine, waits and preemptions
            # would otherwise land on whatever C call was running.
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            await worker.turns(turns)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(35)
        else:
            from pyinstrument import Profiler

            with Profiler(interval=0.0002, async_mode="disabled") as sampler:
                await worker.turns(turns)
            print(sampler.output_text(unicode=True, color=False, show_all=False))
        await row.close()
        if store == "postgres":
            drop_schemas(schema)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    parser.add_argument("--synchronous", default="NORMAL", choices=["FULL", "NORMAL"])
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--sync-provider", action="store_true")
    args = parser.parse_args()
    asyncio.run(run(args.turns, args.store, args.synchronous, args.cprofile, args.sync_provider))


if __name__ == "__main__":
    main()
