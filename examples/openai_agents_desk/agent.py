"""The help desk: an OpenAI Agents SDK agent, its tools, and the bridge that runs it.

The agent is plain Agents SDK: ``order_status`` is a read, ``cancel_order`` a write,
``issue_refund`` a write with ``needs_approval=True``. The bridge
(:class:`~intention_kernel.integrations.openai_agents.KernelAgent`) is told which tools
write and how each derives its business operation ID from its arguments. The model is
a scripted ``agents.Model`` (no API key): put ``model="gpt-4o-mini"`` in its place to
talk to a real one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent as SDKAgent
from agents import function_tool, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

from examples._desk import ORDERS, FakeShop, read_answer, refund_question
from intention_kernel import Agent
from intention_kernel.integrations.openai_agents import KernelAgent, effect_authority


def _text(value: str) -> ResponseOutputMessage:
    content: list[ResponseOutputText | ResponseOutputRefusal] = [
        ResponseOutputText(type="output_text", text=value, annotations=[])
    ]
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed", content=content
    )


def _call(name: str, arguments: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=call_id, name=name, arguments=json.dumps(arguments)
    )


def script(items: list[dict[str, Any]]) -> list[ResponseOutputItem]:
    """What a model would answer, from the input items it is sent."""
    prompts = [i["content"] for i in items if i.get("role") == "user"]
    prompt, turn = prompts[-1], len(prompts)  # call IDs: unique in the thread's history
    order_id = prompt.rsplit(" ", 1)[-1]
    last = items[-1]
    if last.get("type") != "function_call_output":
        tool = "cancel_order" if prompt.startswith("cancel") else "order_status"
        return [_call(tool, {"order_id": order_id}, f"call-{turn}")]
    tool = next(i["name"] for i in items if i.get("call_id") == last["call_id"])
    output = last["output"]
    if tool == "order_status" and prompt.startswith("refund"):
        arguments = {"order_id": order_id, "cents": ORDERS[order_id]}
        return [_call("issue_refund", arguments, f"call-{turn}-refund")]
    if tool == "issue_refund" and not output.startswith("{"):
        return [_text(f"I did not refund order {order_id}: {output}")]  # the rejection
    return [_text(f"{tool} for order {order_id}: {output}")]


class ScriptedModel(Model):
    """An ``agents.Model`` that plays :func:`script`."""

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
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        output = script([dict(item) for item in items])
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(
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
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise TypeError("the scripted model does not stream")


def build_desk(shop: FakeShop) -> SDKAgent[None]:
    @function_tool
    def order_status(order_id: str) -> dict[str, Any]:
        """An order's state and what it cost."""
        return {"order_id": order_id, "status": "delivered", "cents": ORDERS[order_id]}

    @function_tool
    def cancel_order(order_id: str) -> dict[str, str]:
        """Cancel an order."""
        return shop.apply("cancel", order_id, effect_authority().idempotency_key)

    @function_tool(needs_approval=True)
    def issue_refund(order_id: str, cents: int) -> dict[str, str]:
        """Refund an order."""
        return shop.apply("refund", order_id, effect_authority().idempotency_key)

    return SDKAgent(
        name="desk",
        instructions="You run the help desk.",
        model=ScriptedModel(),
        tools=[order_status, cancel_order, issue_refund],
    )


def build_agent(shop: FakeShop) -> Agent:
    set_tracing_disabled(True)  # offline: no traces to export
    bridge: KernelAgent[None] = KernelAgent(
        build_desk(shop),
        name="desk",
        writes={
            "cancel_order": lambda args: args["order_id"],
            "issue_refund": lambda args: args["order_id"],
        },
        reads=["order_status"],
        prompt=refund_question,
        read_answer=read_answer,
    )
    return bridge.as_agent(version="1")
