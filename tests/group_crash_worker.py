"""Many overlapping turns over one SQLite adapter in their own OS process, killed with a
group commit in flight, for tests/test_sqlite_group_commit_crash.py.

Run as ``python tests/group_crash_worker.py '<json config>'``:

- ``db``: the SQLite file; ``ledger``: the provider's ledger file (see
  :class:`proving_support.LedgerProvider`); ``acks``: the side file of acknowledgements.
- ``clients``: how many clients run at once, each on a thread of its own
  (``c<k>``), ``turns`` turns each, one after the other (turn ``<i>`` pays ``pi_c<k>_<i>``
  at once: a ``prepared`` receipt, the provider, ``completed``, the turn commit).
- ``kill``: ``{"point", "group"}``: the process dies (``os._exit(137)``, no cleanup) on
  the worker thread when the ``group``-th group of two or more writes reaches
  ``point``: ``"before_commit"`` (every write of the group ran, ``COMMIT`` not sent)
  or ``"after_commit"`` (``COMMIT`` returned, no caller told yet).

Each turn that returns is appended to ``acks`` (``{"thread_id", "turn_id"}``) and the
file fsynced before the event loop runs anything else: a line there is a turn this
process acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from intention_kernel import Kernel
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing import faults
from intention_kernel.testing.sqlite import GroupAction, GroupPoint, WriterProbe
from proving_support import LedgerProvider, append_line, proving_agent


def arm(point: str, group: int) -> GroupAction:
    seen = 0

    def die(reached: GroupPoint, size: int) -> None:
        nonlocal seen
        if reached == point and size >= 2:
            seen += 1
            if seen == group:
                os._exit(faults.EXIT_STATUS)

    return die


async def main(config: dict[str, Any]) -> None:
    provider = LedgerProvider(path=config["ledger"], sync=False)  # survives SIGKILL as is
    kill = config.get("kill")
    probe = WriterProbe(points=None if kill is None else arm(kill["point"], kill["group"]))
    async with SQLiteDurability(config["db"], seam=probe) as durability:
        kernel = Kernel(proving_agent(provider), durability)

        async def client(k: int) -> None:
            for i in range(config["turns"]):
                thread_id, turn_id = f"c{k}", str(i)
                await kernel.turn(thread_id, turn_id, f"pay pi_c{k}_{i} 100")
                append_line(config["acks"], {"thread_id": thread_id, "turn_id": turn_id})

        await asyncio.gather(*(client(k) for k in range(config["clients"])))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
