"""Turns of the Pydantic AI desk in their own OS process, for tests/test_pydantic_ai.py
and tests/test_compare_pydantic_ai.py.

Run as ``python tests/pydantic_ai_worker.py '<json config>'``: ``store`` (see
:meth:`proving_support.Store.config`), ``ledger`` (the provider's file), ``turns``
(``[{"thread_id", "turn_id", "message"}]`` or ``"answer": {Answer fields}`` instead of
``"message"``), optional ``asks`` and ``die_at_request`` (see
``pydantic_ai_support.Desk``) and an optional ``fault`` ``{"point", "action"}`` armed
before the first turn; the action ``"sigkill"`` sends the process SIGKILL. Each
finished turn prints one JSON line: ``{"turn_id", "result", "returns"}``, ``returns``
being the tool results the model's last request carried.
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
from proving_support import open_store
from pydantic_ai_support import Desk, tool_returns


async def main(config: dict[str, Any]) -> None:
    desk = Desk(
        config["ledger"], asks=config.get("asks"), die_at_request=config.get("die_at_request")
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
                    {"tool": r.tool_name, "content": r.content}
                    for r in tool_returns(desk.requests[-1][-1])
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
