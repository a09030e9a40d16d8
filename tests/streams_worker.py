"""One streamed delivery of a turn in rounds, in its own OS process, for
tests/test_turn_streams.py.

Run as ``python tests/streams_worker.py '<json config>'``:

- ``store``: :meth:`proving_support.Store.config`;
- ``turn``: ``{"thread_id", "turn_id", "message"}``;
- ``hang``: optional, a round at which the model streams one provisional piece of text
  and then waits forever (the test kills the process there);
- ``slow``: optional, the seconds round 2 sleeps first;
- ``after``: optional, the event ID the stream resumes after.

It prints one JSON line per event (``{"id", "type", "data"}``), flushed at once.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from proving_support import open_store
from streams_support import StreamingRounds, streams_kernel


async def main(config: dict[str, Any]) -> None:
    turn = config["turn"]
    async with open_store(config["store"]) as store:
        model = StreamingRounds(hang=config.get("hang"), slow=config.get("slow", 0.0))
        kernel = streams_kernel(store, model)
        stream = kernel.stream_turn(
            turn["thread_id"], turn["turn_id"], turn["message"], after=config.get("after")
        )
        async for event in stream:
            line = json.dumps({"id": event.id, "type": event.type, "data": event.data})
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
