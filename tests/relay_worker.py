"""The library's outbox relay in its own OS process, for tests/test_soak.py.

Run as ``python tests/relay_worker.py '<json config>'``:

- ``store``: as in ``crash_worker.py``.
- ``sink``: a file; every event the relay publishes is appended to it as one JSON line
  (``{"id", "thread_id", "turn_id", "seq", "type", "pid"}``, one ``write`` with
  ``O_APPEND``) before the sink returns, that is before the relay marks it published.
  A process killed between the two republishes the event when a relay starts again.
- ``stop``: a file; once it exists the relay finishes its pass, publishes everything
  still due (``run_once``) and exits 0.

:class:`~intention_kernel.outbox.OutboxRelay` runs with its defaults but a short poll
interval, so that it follows the workers' commits closely.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from intention_kernel._turns import OutboxEvent
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.outbox import OutboxRelay
from proving_support import append_line, open_store

POLL_INTERVAL = 0.05


async def main(config: dict[str, Any]) -> None:
    pid = os.getpid()

    def publish(event: OutboxEvent) -> None:
        record = {
            "id": event.id,
            "thread_id": event.thread_id,
            "turn_id": event.turn_id,
            "seq": event.seq,
            "type": event.type,
            "pid": pid,
        }
        append_line(config["sink"], record, sync=False)  # survives the process, not the host

    stop = asyncio.Event()

    def wait_for_the_stop_file() -> None:
        while not os.path.exists(config["stop"]):
            time.sleep(POLL_INTERVAL)

    async def watch() -> None:
        await asyncio.to_thread(wait_for_the_stop_file)
        stop.set()

    store = open_store(config["store"])
    assert isinstance(store, RecordedDurability)  # every bundled adapter is one
    async with store, OutboxRelay(store, publish, poll_interval=POLL_INTERVAL) as relay:
        watching = asyncio.create_task(watch())
        await relay.run(stop)
        await watching
        while (await relay.run_once()).published:
            pass
        backlog = await relay.status()
        print(json.dumps({"unpublished": backlog.unpublished}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
