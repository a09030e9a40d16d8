"""A help-desk OpenAI Agents SDK agent for the bridge's tests, driven by a fake ``Model``.

The model is a pure function of the input items it is sent. So a redelivered turn, or
a new process, would ask for the same calls. It counts its requests (``requests``).
So a test sees when a recorded response saved one. Tools: ``order_status`` (a read),
``cancel_order`` (a write, keyed by the order) and ``issue_refund`` (a write keyed by
the order that needs approval). Each write appends one line to the ledger file, the
provider's own record, which outlives any process that dies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from agents import Agent as SDKAgent
from agents import function_tool, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

from bridge_support import ORDERS, record_write
from intention_kernel import Answer
from intention_kernel._authority import Approvers
from intention_kernel.integrations.openai_agents import KernelAgent, effect_authority

# No trace export: the tests have no API key, and the SDK would say so on every run.
set_tracing_disabled(True)

#: A model's script: the next response's output items from the input items it is sent.
Script = Callable[[list[dict[str, Any]]], list[Any]]


def text(value: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=value, annotations=[])],
    )


def call(name: str, arguments: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=json.dumps(arguments),
        id=f"fc-{call_id}",
        status="completed",
    )


def outputs(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The tool outputs that end ``items`` (after the last model output), each with the
    name of the tool it answers."""
    names = {i["call_id"]: i["name"] for i in items if i.get("type") == "function_call"}
    found: list[tuple[str, str]] = []
    for item in reversed(items):
        if item.get("type") != "function_call_output":
            break
        found.append((names.get(item["call_id"], "?"), item["output"]))
    return found[::-1]


def prompts(items: list[dict[str, Any]]) -> list[str]:
    return [i["content"] for i in items if i.get("role") == "user"]


class FakeModel(Model):
    """A ``Model`` that answers from a script and keeps every input it was sent."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[list[dict[str, Any]]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        items: list[dict[str, Any]] = (
            [{"role": "user", "content": input}]
            if isinstance(input, str)
            else [dict(item) for item in input]
        )
        self.requests.append(items)
        return ModelResponse(output=self.script(items), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fake model is not streamed")


class Desk:
    """The agent, its model's requests (``model.requests``) and the ledger it writes."""

    def __init__(
        self,
        ledger: str | Path,
        read_answer: Callable[[str], Answer | None] | None = None,
        approve_within: timedelta | None = None,
        approvers: Approvers = None,
        self_approval: bool = True,
        writes: dict[str, Callable[[dict[str, Any]], str]] | None = None,
        reads: list[str] | None = None,
    ) -> None:
        self.ledger = str(ledger)
        self.model = FakeModel(self.script)

        @function_tool
        def order_status(order_id: str) -> dict[str, Any]:
            """The order's state and what it cost."""
            return {"order_id": order_id, "status": "delivered", "cents": ORDERS[order_id]}

        @function_tool
        def cancel_order(order_id: str) -> dict[str, str]:
            """Cancel an order."""
            return self.write("cancel", order_id)

        @function_tool(needs_approval=True)
        def issue_refund(order_id: str, cents: int) -> dict[str, str]:
            """Refund an order."""
            return self.write("refund", order_id, cents=cents)

        self.agent: SDKAgent[Any] = SDKAgent(
            name="desk", model=self.model, tools=[order_status, cancel_order, issue_refund]
        )
        self.bridge: KernelAgent[Any] = KernelAgent(
            self.agent,
            name="desk",
            writes=writes
            if writes is not None
            else {
                "cancel_order": lambda args: args["order_id"],
                "issue_refund": lambda args: args["order_id"],
            },
            reads=reads if reads is not None else ["order_status"],
            read_answer=read_answer,
            approve_within=approve_within,
            approvers=approvers,
            self_approval=self_approval,
        )

    @property
    def requests(self) -> list[list[dict[str, Any]]]:
        return self.model.requests

    def write(self, operation: str, order_id: str, **extra: Any) -> dict[str, str]:
        return record_write(self.ledger, effect_authority, operation, order_id, **extra)

    def script(self, items: list[dict[str, Any]]) -> list[Any]:
        asked = prompts(items)
        prompt = asked[-1] if asked else ""
        turn = len(asked)  # call IDs are unique in the thread's history
        done = outputs(items)
        if done:
            tool, output = done[-1]
            if tool == "order_status" and prompt.startswith("refund"):
                status = json.loads(output.replace("'", '"'))
                arguments = {"order_id": status["order_id"], "cents": status["cents"]}
                return [call("issue_refund", arguments, f"call-refund-{turn}")]
            if tool == "issue_refund" and not output.startswith("{"):
                return [text(f"Not refunded: {output}")]  # the rejection's text
            return [text(f"{tool}: {output}")]
        order_id = prompt.rsplit(" ", 1)[-1]
        tool = "cancel_order" if prompt.startswith("cancel") else "order_status"
        return [call(tool, {"order_id": order_id}, f"call-{tool}-{turn}")]
