"""Turns of the LangGraph desk in their own OS process, for tests/test_langgraph.py.

Run as ``python tests/langgraph_worker.py '<json config>'``: ``store`` (see
:meth:`proving_support.Store.config`), ``ledger`` (the provider's file), ``turns``
(``[{"thread_id", "turn_id", "message"}]`` or ``"answer": {Answer fields}`` instead of
``"message"``), optional ``shape``, ``asks`` and ``die_at_request`` (see
``langgraph_support.Desk``), ``delay`` (seconds each model call takes), ``barrier``
(``{"dir", "count"}``: wait for that many workers first) and an optional ``fault``
``{"point", "action"}`` armed before the first turn; the action ``"sigkill"`` sends
the process SIGKILL. Each finished turn prints one JSON line: ``{"turn_id", "result",
"returns", "started"}``: ``returns``, the tool results the model's last call carried;
``started``, the time the turn was submitted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from intention_kernel import Answer, Kernel
from intention_kernel.testing import faults
from langgraph_support import Desk, tool_results
from proving_support import open_store


def meet(barrier: dict[str, Any]) -> None:
    """Wait until ``count`` workers reached ``dir`` (each leaves a file there), so that
    their turns start together."""
    folder = Path(barrier["dir"])
    folder.joinpath(str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < barrier["count"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the other workers never came")
        time.sleep(0.01)


async def main(config: dict[str, Any]) -> None:
    desk = Desk(
        config["ledger"],
        shape=config.get("shape", "react"),
        asks=config.get("asks"),
        die_at_request=config.get("die_at_request"),
        delay=config.get("delay", 0.0),
    )
    async with open_store(config["store"]) as durability:
        kernel = Kernel(desk.bridge.as_agent(version="1"), durability)
        fault = config.get("fault")
        if fault is not None:
            action = fault["action"]
            if action == "sigkill":
                faults.inject(fault["point"], lambda point: os.kill(os.getpid(), signal.SIGKILL))
            else:
                faults.inject(fault["point"], action)
        if "barrier" in config:
            meet(config["barrier"])
        for turn in config["turns"]:
            started = time.time()
            answer = Answer(**turn["answer"]) if "answer" in turn else None
            result = await kernel.turn(
                turn["thread_id"], turn["turn_id"], turn.get("message"), answer=answer
            )
            returns = (
                [
                    {"tool": name, "content": content}
                    for name, content in tool_results(desk.requests[-1])
                ]
                if desk.requests
                else []
            )
            print(
                json.dumps(
                    {
                        "turn_id": turn["turn_id"],
                        "result": result.to_dict(),
                        "returns": returns,
                        "started": started,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
