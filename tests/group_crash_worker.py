"""Many overlapping turns over one SQLite adapter in their own OS process, killed with a
group commit in flight, for tests/test_sqlite_group_commit_crash.py.

Run as ``python tests/group_crash_worker.py '<json config>'``:

- ``db``: the SQLite file; ``ledger``: the provider's ledger file (see
  :class:`proving_support.LedgerProvider`); ``acks``: the side file of acknowledgements.
- ``clients``: how many clients run at once, each on a thread of its own
  (``c<k>``), ``turns`` turns each, one after the other (turn ``<i>`` pays ``pi_c<k>_<i>``
  at once: a ``prepared`` receipt, the provider, ``completed``, the turn commit).
- ``kill``: ``{"point", "group"}``: the process dies (``os._exit(137)``, no cleanup) on
  the worker thread. It dies when the ``group``-th group of two or more writes reaches
  ``point``. At ``"before_commit"`` every write of the group ran, and ``COMMIT`` is not
  sent. At ``"after_commit"`` ``COMMIT`` returned, and no caller is told yet. With
  ``"careful": true`` it counts only a group's careful run, of any size. That is the
  transaction after an atomic write failed and rolled back the group's first one.
- ``doomed``: a client on thread ``doomed`` too, whose every commit writes its rows and
  then is refused as fenced, ``3 * turns`` turns of it. A group it lands in rolls back
  and runs its other writes again, carefully.

Each turn that returns is appended to ``acks`` (``{"thread_id", "turn_id"}``) and the
file fsynced before the event loop runs anything else: a line there is a turn this
process acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

from intention_kernel import Kernel
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.durability.sqlite import _bodies as bodies
from intention_kernel.errors import FencedCommitError
from intention_kernel.testing import faults
from intention_kernel.testing.sqlite import GroupAction, GroupPoint, WriterProbe
from proving_support import LedgerProvider, append_line, proving_agent


class Careful:
    """Whether the writer's transaction is a careful run, from the statements it sends.

    Only a careful run sends ``SAVEPOINT``: one around each atomic write in it.
    So a careful run with an atomic write in it is seen from its first savepoint.
    """

    def __init__(self) -> None:
        self.running = False  # the open transaction is a careful run
        self.committed = False  # the last COMMIT ended a careful run

    def trace(self, role: str, sql: str) -> None:
        if role != "writer":
            return
        if sql == "SAVEPOINT ik_write":
            self.running = True
        elif sql == "COMMIT":
            self.committed, self.running = self.running, False
        elif sql == "ROLLBACK":
            self.running = False


def arm(point: str, group: int, careful: Careful | None) -> GroupAction:
    seen = 0

    def die(reached: GroupPoint, size: int) -> None:
        nonlocal seen
        if reached != point:
            return
        if careful is None:
            if size < 2:
                return
        elif not (careful.running if point == "before_commit" else careful.committed):
            return
        seen += 1
        if seen == group:
            os._exit(faults.EXIT_STATUS)

    return die


def doom() -> None:
    """Refuse every commit of thread ``doomed`` once its rows are written, as fenced."""
    original = bodies.commit_turn

    def commit_turn(conn: Any, turn: tuple[Any, ...], *args: Any, **kwargs: Any) -> None:
        original(conn, turn, *args, **kwargs)
        if turn[0] == "doomed":
            raise bodies.Refusal("the thread version moved")

    bodies.commit_turn = commit_turn


async def main(config: dict[str, Any]) -> None:
    provider = LedgerProvider(path=config["ledger"], sync=False)  # survives SIGKILL as is
    kill = config.get("kill")
    careful = Careful() if kill is not None and kill.get("careful") else None
    points = None if kill is None else arm(kill["point"], kill["group"], careful)
    probe = WriterProbe(points=points)
    trace = None if careful is None else careful.trace
    if config.get("doomed"):
        doom()
    async with SQLiteDurability(config["db"], seam=probe, trace=trace) as durability:
        kernel = Kernel(proving_agent(provider), durability)

        async def client(k: int) -> None:
            for i in range(config["turns"]):
                thread_id, turn_id = f"c{k}", str(i)
                await kernel.turn(thread_id, turn_id, f"pay pi_c{k}_{i} 100")
                append_line(config["acks"], {"thread_id": thread_id, "turn_id": turn_id})

        async def doomed() -> None:
            for i in range(3 * config["turns"]):
                with contextlib.suppress(FencedCommitError):
                    await kernel.turn("doomed", str(i), f"pay pi_doomed_{i} 100")

        clients = [client(k) for k in range(config["clients"])]
        if config.get("doomed"):
            clients.append(doomed())
        await asyncio.gather(*clients)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
