"""A ``module:callable`` sink for relay processes (``--to relay_log_sink:deliver``) that
keeps a durable delivery log: one JSON line per event it acknowledges, appended and
fsync'd before it returns, so that the log survives ``kill -9`` of its process.

Set by the spawning test, in the environment:

- ``IK_RELAY_LOG``: the log file (one per process: lines never interleave);
- ``IK_RELAY_DELAY``: seconds each delivery takes (default 0);
- ``IK_RELAY_HANG_AFTER``: from this delivery on, the sink logs each event it is
  handed (the destination got it) but never returns, so the relay never marks it:
  the process is then mid-batch until the test kills it.
"""

from __future__ import annotations

import asyncio
import os
import time

from intention_kernel import OutboxEvent
from proving_support import append_line

_delivered = 0


async def deliver(event: OutboxEvent) -> None:
    global _delivered
    delay = float(os.environ.get("IK_RELAY_DELAY", "0"))
    if delay:
        await asyncio.sleep(delay)
    append_line(
        os.environ["IK_RELAY_LOG"],
        {
            "pid": os.getpid(),
            "thread_id": event.thread_id,
            "seq": event.seq,
            "id": event.id,
            "at": time.monotonic(),
        },
    )
    _delivered += 1
    hang_after = int(os.environ.get("IK_RELAY_HANG_AFTER", "0"))
    if hang_after and _delivered >= hang_after:
        await asyncio.sleep(3600)
