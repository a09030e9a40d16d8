"""The help desk: a Pydantic AI agent, its tools, and the bridge that runs it in turns.

The agent is plain Pydantic AI: ``order_status`` is a read, ``cancel_order`` a write,
``issue_refund`` a write with ``requires_approval=True``. The bridge
(:class:`~intention_kernel.integrations.pydantic_ai.KernelAgent`) is told which tools
write and how each derives its business operation ID from its arguments. The model is
Pydantic AI's ``FunctionModel`` playing a fixed script (no API key): put
``"openai:gpt-4o-mini"`` in its place to talk to a real one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from examples._desk import ORDERS, FakeShop, read_answer, refund_question
from intention_kernel import Agent
from intention_kernel.integrations.pydantic_ai import KernelAgent, effect_authority


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """What a model would answer, from the messages it is sent."""
    last = messages[-1]
    done = [p for p in getattr(last, "parts", ()) if isinstance(p, ToolReturnPart)]
    prompt = next(
        p.content
        for m in reversed(messages)
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart) and isinstance(p.content, str)
    )
    order_id = prompt.rsplit(" ", 1)[-1]
    if not done:
        tool = "cancel_order" if prompt.startswith("cancel") else "order_status"
        return ModelResponse(parts=[ToolCallPart(tool, {"order_id": order_id})])
    result = done[-1]
    if result.tool_name == "order_status" and prompt.startswith("refund"):
        cents = ORDERS[order_id]
        return ModelResponse(
            parts=[ToolCallPart("issue_refund", {"order_id": order_id, "cents": cents})]
        )
    if getattr(result, "outcome", "success") == "denied":
        return ModelResponse(
            parts=[TextPart(f"I did not refund order {order_id}: {result.content}")]
        )
    return ModelResponse(
        parts=[TextPart(f"{result.tool_name} for order {order_id}: {json.dumps(result.content)}")]
    )


def logged(path: Path) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    """:func:`script`, and each request it is sent a line of ``path`` (how many messages
    it carried), which outlives a process that dies (``crash.py`` counts them)."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        with path.open("a", encoding="utf-8") as f:
            f.write(f"{len(messages)}\n")
            f.flush()
            os.fsync(f.fileno())
        return script(messages, info)

    return model


def build_desk(shop: FakeShop, model_log: Path | None = None) -> PydanticAgent[None, str]:
    model = FunctionModel(script if model_log is None else logged(model_log))
    desk: PydanticAgent[None, str] = PydanticAgent(model, name="desk")

    @desk.tool_plain
    def order_status(order_id: str) -> dict[str, Any]:
        """An order's state and what it cost."""
        return {"order_id": order_id, "status": "delivered", "cents": ORDERS[order_id]}

    @desk.tool_plain
    def cancel_order(order_id: str) -> dict[str, str]:
        """Cancel an order."""
        return shop.apply("cancel", order_id, effect_authority().idempotency_key)

    @desk.tool_plain(requires_approval=True)
    def issue_refund(order_id: str, cents: int) -> dict[str, str]:
        """Refund an order."""
        return shop.apply("refund", order_id, effect_authority().idempotency_key)

    return desk


def build_agent(shop: FakeShop, model_log: Path | None = None) -> Agent:
    bridge = KernelAgent(
        build_desk(shop, model_log),
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
