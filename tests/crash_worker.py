"""One delivery of the proving agent in its own OS process, for tests/test_crash_matrix.py.

Run as ``python tests/crash_worker.py '<json config>'``:

- ``store``: :meth:`proving_support.Store.config` (SQLite file or PostgreSQL schema).
- ``ledger``: the provider's ledger file (see :class:`proving_support.LedgerProvider`).
- ``turns``: ``[{"thread_id", "turn_id", "message"}]``, run in order; a turn may carry
  an ``"answer"`` instead of (or beside) its message: ``Answer(**answer)``.
- ``approvals``: optional, how many distinct actors must accept a charge (default 1).
- ``hold``: optional; when true, the process waits after its last turn, to be killed.
- ``lease_expiry``: optional, the PostgreSQL adapter's (ignored for SQLite).
- ``cancel``: optional ``{"thread_id", "turn_id", "reason"}``: the process asks that
  turn to stop (``Kernel.cancel``) before any turn, and prints ``{"cancelled": status}``.
- ``on_busy``: optional, the agent's policy (``"queue"``: turns go through
  ``Kernel.submit``, and a queued one prints ``{"turn_id", "queued": position}``).
- ``fault``: optional ``{"point", "action", "skip"}`` armed (for one pass, after
  ``skip`` passes through the point, default 0) before the first turn. ``action`` is
  ``"exit"`` or ``"exit_when"``. With ``"exit"``, the process calls ``os._exit(137)``
  at the point. ``"exit_when"`` comes with ``"file"``. At the point, it starts a thread
  that exits the process as soon as ``file`` exists, and carries on. So the process
  dies while the server holds open the statement it just sent.

Each finished turn prints one JSON line: ``{"turn_id", "result"}`` with
``TurnResult.to_dict()``, or ``{"turn_id", "error", "message"}`` for a ``KernelError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import threading
import time
from typing import Any

from intention_kernel import Answer, Kernel, KernelError, Queued
from intention_kernel.testing import faults
from proving_support import LedgerProvider, open_store, proving_agent


def exit_when(path: str) -> None:
    def wait_then_exit() -> None:
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.002)
        os._exit(faults.EXIT_STATUS)

    threading.Thread(target=wait_then_exit, daemon=True).start()


def hold(point: str) -> None:
    print(json.dumps({"held": point}), flush=True)
    while True:  # the test kills the process here; nothing after the point runs
        time.sleep(60)


async def main(config: dict[str, Any]) -> None:
    provider = LedgerProvider(path=config["ledger"])
    options = {}
    if config["store"]["kind"] == "postgres" and "lease_expiry" in config:
        options["lease_expiry"] = config["lease_expiry"]
    async with open_store(config["store"], **options) as durability:
        agent = proving_agent(provider, approvals=config.get("approvals", 1))
        if "on_busy" in config:
            agent = dataclasses.replace(agent, on_busy=config["on_busy"])
        kernel = Kernel(agent, durability)
        fault = config.get("fault")
        if fault is not None:
            if fault["action"] == "exit_when":
                faults.inject(fault["point"], lambda point: exit_when(fault["file"]))
            elif fault["action"] == "hold":
                faults.inject(fault["point"], hold, skip=fault.get("skip", 0))
            else:
                faults.inject(fault["point"], fault["action"], skip=fault.get("skip", 0))
        if "cancel" in config:
            asked = config["cancel"]
            done = await kernel.cancel(
                asked["thread_id"], asked["turn_id"], reason=asked.get("reason")
            )
            print(json.dumps({"cancelled": done.status}), flush=True)
        for turn in config.get("turns", []):
            outcome: dict[str, Any] = {"turn_id": turn["turn_id"]}
            try:
                answer = Answer(**turn["answer"]) if "answer" in turn else None
                run = kernel.submit if config.get("on_busy") == "queue" else kernel.turn
                result = await run(
                    turn["thread_id"], turn["turn_id"], turn.get("message"), answer=answer
                )
            except KernelError as exc:
                outcome.update(error=type(exc).__name__, message=str(exc))
            else:
                if isinstance(result, Queued):
                    outcome["queued"] = result.position
                else:
                    outcome["result"] = result.to_dict()
            print(json.dumps(outcome), flush=True)
        if config.get("hold"):
            await asyncio.Event().wait()  # killed here, its turns committed


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
