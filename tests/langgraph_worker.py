"""Turns of the LangGraph desk in their own OS process, for tests/test_langgraph.py.

Run as ``python tests/langgraph_worker.py '<json config>'``: ``store`` (see
:meth:`proving_support.Store.config`), ``ledger`` (the provider's file), ``turns``
(``[{"thread_id", "turn_id", "message"}]`` or ``"answer": {Answer fields}`` instead of
``"message"``), optional ``shape``, ``asks`` and ``die_at_request`` (see
``langgraph_support.Desk``) and an optional ``fault`` ``{"point", "action"}`` armed
before the first turn; the action ``"sigkill"`` sends the process SIGKILL. Each
finished turn prints one JSON line: ``{"turn_id", "result", "returns"}``, ``returns``
being the tool results the model's last call carried.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from intention_kernel import Answer, Kernel
from intention_kernel.testing import faults
from langgraph_support import Desk, tool_results
from proving_support import open_store


async def main(config: dict[str, Any]) -> None:
    desk = Desk(
        config["ledger"],
        shape=config.get("shape", "react"),
        asks=config.get("asks"),
        die_at_request=config.get("die_at_request"),
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
        for turn in config["turns"]:
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
                    {"turn_id": turn["turn_id"], "result": result.to_dict(), "returns": returns}
                ),
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
