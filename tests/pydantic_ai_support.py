"""A help-desk Pydantic AI agent for the bridge's tests, driven by a ``FunctionModel``.

The model is a pure function of the messages it is sent, so a redelivered turn, or
a new process, asks for the same calls. With ``asks``, each request the model is sent
is also a line of that file. The line holds its process and how many messages it
carried. The file outlives a process that dies. With ``die_at_request=N``, the process
sends itself SIGKILL as its model is about to be sent its N-th request. That request
is not logged.

Tools: ``order_status`` (a read), ``cancel_order`` (a write, keyed by the order) and
``issue_refund`` (a write keyed by the order that needs approval). Each write appends
one line to the ledger file, the provider's own record, which outlives any process that
dies. ``Desk.agent`` is the plain Pydantic AI agent (run alone, its writes carry no
idempotency key); ``Desk.bridge`` runs it inside turns.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from datetime import timedelta
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

from bridge_support import ORDERS, record_write
from intention_kernel import Answer
from intention_kernel._authority import Approvers
from intention_kernel.integrations.pydantic_ai import KernelAgent, effect_authority


def tool_returns(message: ModelMessage) -> list[ToolReturnPart]:
    if not isinstance(message, ModelRequest):
        return []
    return [part for part in message.parts if isinstance(part, ToolReturnPart)]


class Desk:
    """The agent, its model's requests (``requests``) and the ledger it writes."""

    def __init__(
        self,
        ledger: str | Path,
        read_answer: Callable[[str], Answer | None] | None = None,
        approve_within: timedelta | None = None,
        approvers: Approvers = None,
        self_approval: bool = True,
        asks: str | Path | None = None,
        die_at_request: int | None = None,
    ) -> None:
        self.ledger = str(ledger)
        self.asks = None if asks is None else str(asks)
        self.die_at_request = die_at_request
        self.requests: list[list[ModelMessage]] = []
        agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(self.model), name="desk")

        @agent.tool_plain
        def order_status(order_id: str) -> dict[str, Any]:
            """The order's state and what it cost."""
            return {"order_id": order_id, "status": "delivered", "cents": ORDERS[order_id]}

        @agent.tool_plain
        def cancel_order(order_id: str) -> dict[str, str]:
            """Cancel an order."""
            return self.write("cancel", order_id)

        @agent.tool_plain(requires_approval=True)
        def issue_refund(order_id: str, cents: int) -> dict[str, str]:
            """Refund an order."""
            return self.write("refund", order_id, cents=cents)

        self.agent = agent
        self.bridge = KernelAgent(
            agent,
            name="desk",
            writes={
                "cancel_order": lambda args: args["order_id"],
                "issue_refund": lambda args: args["order_id"],
            },
            reads=["order_status"],
            read_answer=read_answer,
            approve_within=approve_within,
            approvers=approvers,
            self_approval=self_approval,
        )

    def write(self, operation: str, order_id: str, **extra: Any) -> dict[str, str]:
        return record_write(self.ledger, effect_authority, operation, order_id, **extra)

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if self.die_at_request is not None and len(self.requests) + 1 == self.die_at_request:
            os.kill(os.getpid(), signal.SIGKILL)
        self.requests.append(list(messages))
        if self.asks is not None:
            with open(self.asks, "a", encoding="utf-8") as f:
                f.write(json.dumps({"pid": os.getpid(), "messages": len(messages)}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        last = messages[-1]
        returns = tool_returns(last)
        if returns:
            done = returns[-1]
            if done.tool_name == "order_status" and self._asked("refund"):
                status = done.content
                assert isinstance(status, dict)
                call = ToolCallPart(
                    "issue_refund",
                    {"order_id": status["order_id"], "cents": status["cents"]},
                    tool_call_id="call-refund",
                )
                return ModelResponse(parts=[call])
            if getattr(done, "outcome", "success") == "denied":
                return ModelResponse(parts=[TextPart(f"Not refunded: {done.content}")])
            return ModelResponse(parts=[TextPart(f"{done.tool_name}: {json.dumps(done.content)}")])
        prompt = self._prompt(messages)
        order_id = prompt.rsplit(" ", 1)[-1]
        if prompt.startswith("cancel"):
            name, tool_call_id = "cancel_order", "call-cancel"
        else:
            name, tool_call_id = "order_status", "call-status"
        return ModelResponse(parts=[ToolCallPart(name, {"order_id": order_id}, tool_call_id)])

    def _asked(self, word: str) -> bool:
        return word in self._prompt(self.requests[-1])

    @staticmethod
    def _prompt(messages: list[ModelMessage]) -> str:
        for message in reversed(messages):
            if isinstance(message, ModelRequest):
                for part in message.parts:
                    if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                        return part.content
        return ""
