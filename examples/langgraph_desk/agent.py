"""The help desk: a LangGraph ReAct agent, its tools, and the bridge that runs it in turns.

The graph is plain LangGraph: ``create_react_agent`` over three LangChain tools.
``order_status`` is a read, ``cancel_order`` a write, ``issue_refund`` a write the
person approves first. The bridge
(:class:`~intention_kernel.integrations.langgraph.KernelAgent`) is told which tools
read, which write and how each write derives its business operation ID from its
arguments. The model is a LangChain chat model playing a fixed script (no API key):
put ``ChatOpenAI(model="gpt-4o-mini")`` in its place to talk to a real one.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from examples._desk import ORDERS, FakeShop, read_answer, refund_question
from intention_kernel import Agent
from intention_kernel.integrations.langgraph import KernelAgent, effect_authority


def script(messages: list[BaseMessage]) -> AIMessage:
    """What a model would answer, from the messages it is sent."""
    prompt = next(str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage))
    order_id = prompt.rsplit(" ", 1)[-1]
    last = messages[-1]
    if not isinstance(last, ToolMessage):
        name = "cancel_order" if prompt.startswith("cancel") else "order_status"
        call = {"name": name, "args": {"order_id": order_id}, "id": f"call-{name}"}
        return AIMessage("", tool_calls=[call])
    if last.name == "order_status" and prompt.startswith("refund"):
        args = {"order_id": order_id, "cents": ORDERS[order_id]}
        return AIMessage("", tool_calls=[{"name": "issue_refund", "args": args, "id": "call-r"}])
    if last.status == "error":
        return AIMessage(f"I did not refund order {order_id}: {last.content}")
    return AIMessage(f"{last.name} for order {order_id}: {last.content}")


class ScriptedModel(BaseChatModel):
    """A LangChain chat model that answers with :func:`script`. With ``log``, each
    call it answers is a line of that file (how many messages it carried), which
    outlives a process that dies (``crash.py`` counts them)."""

    log: Path | None = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self  # the script knows the tools by name

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as f:
                f.write(f"{len(messages)}\n")
                f.flush()
                os.fsync(f.fileno())
        return ChatResult(generations=[ChatGeneration(message=script(messages))])


def build_graph(shop: FakeShop, model_log: Path | None = None) -> Any:
    @tool
    def order_status(order_id: str) -> dict[str, Any]:
        """An order's state and what it cost."""
        return {"order_id": order_id, "status": "delivered", "cents": ORDERS[order_id]}

    @tool
    def cancel_order(order_id: str) -> dict[str, str]:
        """Cancel an order."""
        return shop.apply("cancel", order_id, effect_authority().idempotency_key)

    @tool
    def issue_refund(order_id: str, cents: int) -> dict[str, str]:
        """Refund an order."""
        return shop.apply("refund", order_id, effect_authority().idempotency_key)

    with warnings.catch_warnings():
        # LangGraph 1.0 points to langchain's create_agent (another package); this is
        # still LangGraph's own prebuilt ReAct agent.
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(
            ScriptedModel(log=model_log), [order_status, cancel_order, issue_refund]
        )


def build_agent(shop: FakeShop, model_log: Path | None = None) -> Agent:
    bridge = KernelAgent(
        build_graph(shop, model_log),
        name="desk",
        reads={"order_status"},
        writes={
            "cancel_order": lambda args: args["order_id"],
            "issue_refund": lambda args: args["order_id"],
        },
        approve={"issue_refund"},
        prompt=refund_question,
        read_answer=read_answer,
    )
    return bridge.as_agent(version="1")


__all__ = ["build_agent", "build_graph"]
