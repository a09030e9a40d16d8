"""The Pydantic AI desk run alone, as its documentation shows durability, in its own OS
process, for tests/test_compare_pydantic_ai.py.

The application keeps the conversation's message history in a file: it loads it before
a run and saves ``result.all_messages_json()`` after the run, the persistence Pydantic
AI's "Messages and chat history" documentation shows. A tool that needs approval ends
the run with ``DeferredToolRequests``; approving it is a second run on the saved history
with ``DeferredToolResults`` (the documentation's two-run pattern).

Run as ``python tests/pydantic_ai_alone_worker.py '<json config>'``: ``ledger``,
``history`` (the file), optional ``asks`` and ``die_at_request`` (see
``pydantic_ai_support.Desk``), and ``prompt`` (a message) or ``approve``
(``{"tool_call_id", "override_args"?}``). Prints the run's output as one JSON line:
``{"output": text}`` or ``{"approvals": [{"tool_name", "tool_call_id", "args"}]}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved
from pydantic_ai.agent import AgentRunResult
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from pydantic_ai_support import Desk


async def main(config: dict[str, Any], history: list[ModelMessage] | None) -> AgentRunResult[Any]:
    desk = Desk(
        config["ledger"], asks=config.get("asks"), die_at_request=config.get("die_at_request")
    )
    approve = config.get("approve")
    deferred = None
    if approve is not None:
        approval = ToolApproved(override_args=approve.get("override_args"))
        deferred = DeferredToolResults(approvals={approve["tool_call_id"]: approval})
    return await desk.agent.run(
        config.get("prompt"),
        message_history=history,
        deferred_tool_results=deferred,
        output_type=[str, DeferredToolRequests],
    )


def report(result: AgentRunResult[Any]) -> dict[str, Any]:
    output = result.output
    if isinstance(output, DeferredToolRequests):
        approvals = [
            {"tool_name": c.tool_name, "tool_call_id": c.tool_call_id, "args": c.args_as_dict()}
            for c in output.approvals
        ]
        return {"approvals": approvals}
    return {"output": output}


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    saved = Path(config["history"])
    history = ModelMessagesTypeAdapter.validate_json(saved.read_bytes()) if saved.exists() else None
    result = asyncio.run(main(config, history))
    saved.write_bytes(result.all_messages_json())  # after the run, as the documentation shows
    print(json.dumps(report(result)), flush=True)
