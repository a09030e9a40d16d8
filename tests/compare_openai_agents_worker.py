"""The Agents SDK desk run by the SDK alone, in its own OS process, for
tests/test_compare_openai_agents.py: what an application gets from ``Runner.run``, a
``SQLiteSession`` and ``RunState.to_json`` without intention-kernel.

Run as ``python tests/compare_openai_agents_worker.py '<json config>'``: ``ledger`` (the
provider's file), ``action`` and its settings:

- ``"run"``: ``Runner.run(agent, message)``, with ``session`` (a ``SQLiteSession`` file)
  if given;
- ``"ask"``: run ``message`` and, if ``state`` is given, write the paused run's
  ``RunState.to_json()`` there (the SDK's human-in-the-loop guide);
- ``"approve"``: the person approved the call ``call_id`` they were shown: restore the
  ``state`` file, approve that interruption and resume. Without a ``state`` file the
  application has nothing to resume: it runs ``message`` again, as a restarted process
  would, and reports what the new run asks.

``kill_after`` names a tool: the process sends itself SIGKILL as soon as that tool
returned (``RunHooks.on_tool_end``), before the application can store anything. The
process prints one JSON line: ``{"output", "interruptions", "model_requests"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agents import Agent, RunHooks, Runner, RunState, SQLiteSession
from agents.run_context import RunContextWrapper
from agents.tool import Tool

from openai_agents_support import Desk


class KillAfter(RunHooks[Any]):
    def __init__(self, tool_name: str | None) -> None:
        self.tool_name = tool_name

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: Any
    ) -> None:
        if tool.name == self.tool_name:
            os.kill(os.getpid(), signal.SIGKILL)  # a real death: nothing after this runs


def calls(result: Any) -> list[dict[str, Any]]:
    return [
        {"tool_name": i.tool_name, "call_id": i.call_id, "arguments": json.loads(i.arguments)}
        for i in result.interruptions
    ]


async def main(config: dict[str, Any]) -> None:
    desk = Desk(config["ledger"])
    agent = desk.agent
    hooks = KillAfter(config.get("kill_after"))
    action = config["action"]
    state_path = Path(config["state"]) if config.get("state") else None
    if action == "run":
        session = SQLiteSession("t1", config["session"]) if config.get("session") else None
        result = await Runner.run(agent, config["message"], hooks=hooks, session=session)
    elif action == "ask":
        result = await Runner.run(agent, config["message"], hooks=hooks)
        if state_path is not None and result.interruptions:
            state_path.write_text(json.dumps(result.to_state().to_json()))
    elif action == "approve" and state_path is not None and state_path.exists():
        state = await RunState.from_json(agent, json.loads(state_path.read_text()))
        for item in state.get_interruptions():
            if item.call_id == config["call_id"]:
                state.approve(item)
        result = await Runner.run(agent, state, hooks=hooks)
    else:  # the paused run was not kept: a restarted process can only run the message again
        result = await Runner.run(agent, config["message"], hooks=hooks)
    print(
        json.dumps(
            {
                "output": result.final_output,
                "interruptions": calls(result),
                "model_requests": len(desk.requests),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
