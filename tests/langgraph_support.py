"""A help-desk LangGraph agent for the bridge's tests, driven by a scripted chat model.

The model is a pure function of the messages it is sent, so a redelivered turn, or
a new process, asks for the same calls. With ``asks``, each call the model answers is
also a line of that file (its process and how many messages it carried), which
outlives a process that dies; with ``die_at_request=N`` the process sends itself
SIGKILL as its model is about to answer its N-th call (that call is not logged); with
``delay``, each call takes that many seconds.

Tools: ``order_status`` (a read), ``cancel_order`` (a write, keyed by the order) and
``issue_refund`` (a write keyed by the order that needs approval). Each write appends
one line to the ledger file, the provider's own record. ``Desk.graph`` is the plain
LangGraph agent (``create_react_agent``, or a hand-built ``StateGraph`` with a
``ToolNode``); ``Desk.bridge`` runs it inside turns.
"""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pydantic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from bridge_support import ORDERS, record_write
from intention_kernel import Answer
from intention_kernel.integrations.langgraph import KernelAgent, effect_authority

Script = Callable[[list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose answer is ``script(messages)``; ``requests`` holds what it
    was sent. Tools are bound by name only: the script decides the calls."""

    script: Script
    requests: list[list[BaseMessage]] = pydantic.Field(default_factory=list)
    asks: str | None = None
    die_at_request: int | None = None
    delay: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "ik-scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if self.die_at_request is not None and len(self.requests) + 1 == self.die_at_request:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(self.delay)  # a provider that takes its time: turns overlap
        self.requests.append(list(messages))
        if self.asks is not None:
            line = {"pid": os.getpid(), "messages": len(messages), "at": time.time()}
            with open(self.asks, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return ChatResult(generations=[ChatGeneration(message=self.script(messages))])


def prompt_of(messages: Sequence[BaseMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, HumanMessage) and isinstance(message.content, str):
            return message.content
    return ""


def desk_script(messages: list[BaseMessage]) -> AIMessage:
    """The desk's model: a read or a cancel for the message; a refund after a status
    read when the person asked for one; the last tool's result as the answer."""
    last = messages[-1]
    prompt = prompt_of(messages)
    if isinstance(last, ToolMessage):
        if last.name == "order_status" and "refund" in prompt:
            status = json.loads(str(last.content))
            args = {"order_id": status["order_id"], "cents": status["cents"]}
            return AIMessage(
                "", tool_calls=[{"name": "issue_refund", "args": args, "id": "call-refund"}]
            )
        if last.status == "error":
            return AIMessage(f"Not refunded: {last.content}")
        return AIMessage(f"{last.name}: {last.content}")
    order_id = prompt.rsplit(" ", 1)[-1]
    if prompt.startswith("cancel"):
        name, call_id = "cancel_order", "call-cancel"
    else:
        name, call_id = "order_status", "call-status"
    return AIMessage("", tool_calls=[{"name": name, "args": {"order_id": order_id}, "id": call_id}])


def tool_results(messages: Sequence[BaseMessage]) -> list[tuple[str | None, Any]]:
    """The tool results at the end of ``messages`` (the last model call's)."""
    results: list[tuple[str | None, Any]] = []
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            break
        results.insert(0, (message.name, message.content))
    return results


def react_agent(model: BaseChatModel, tools: list[Any], checkpointer: Any = None) -> Any:
    with warnings.catch_warnings():
        # Deprecated since LangGraph 1.0 for langchain's create_agent (another package);
        # still LangGraph's own prebuilt ReAct agent.
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model, tools, checkpointer=checkpointer)


def desk_tools(write: Callable[..., dict[str, str]], *, interrupting: bool = False) -> list[Any]:
    """The desk's tools; ``interrupting``: the refund asks with ``interrupt()`` first
    (LangGraph alone), and runs only on ``{"decision": "accept"}``."""

    @tool
    def order_status(order_id: str) -> dict[str, Any]:
        """The order's state and what it cost."""
        return {"order_id": order_id, "status": "delivered", "cents": ORDERS[order_id]}

    @tool
    def cancel_order(order_id: str) -> dict[str, str]:
        """Cancel an order."""
        return write("cancel", order_id)

    @tool
    def issue_refund(order_id: str, cents: int) -> Any:
        """Refund an order."""
        if interrupting:
            answer = interrupt(
                {"tool_name": "issue_refund", "args": {"order_id": order_id, "cents": cents}}
            )
            if answer.get("decision") != "accept":
                return f"Not refunded: {answer.get('reason')}"
        return write("refund", order_id, cents=cents)

    return [order_status, cancel_order, issue_refund]


def hand_built(model: BaseChatModel, tools: list[Any]) -> Any:
    """The ReAct loop as LangGraph's guides build it: a model node, a ``ToolNode``."""

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile()


class Desk:
    """The graph, its model's requests (``requests``) and the ledger it writes."""

    def __init__(
        self,
        ledger: str | Path,
        *,
        shape: Literal["react", "hand-built"] = "react",
        read_answer: Callable[[str], Answer | None] | None = None,
        approve_within: timedelta | None = None,
        asks: str | Path | None = None,
        die_at_request: int | None = None,
        script: Script = desk_script,
        alone: bool = False,
        checkpointer: Any = None,
        delay: float = 0.0,
        **policy: Any,
    ) -> None:
        self.ledger = str(ledger)
        self.model = ScriptedChatModel(
            script=script,
            requests=[],
            asks=None if asks is None else str(asks),
            die_at_request=die_at_request,
            delay=delay,
        )

        self.tools = desk_tools(self.write, interrupting=alone)
        if alone:
            # LangGraph alone, as its guides show it: the refund asks with interrupt()
            # and the graph keeps its state in the checkpointer it is compiled with.
            self.graph = react_agent(self.model, self.tools, checkpointer=checkpointer)
            return
        build = react_agent if shape == "react" else hand_built
        self.graph = build(self.model, self.tools)
        self.bridge = KernelAgent(
            self.graph,
            name="desk",
            reads={"order_status"},
            writes={
                "cancel_order": lambda args: args["order_id"],
                "issue_refund": lambda args: args["order_id"],
            },
            approve={"issue_refund"},
            read_answer=read_answer,
            approve_within=approve_within,
            **policy,
        )

    @property
    def requests(self) -> list[list[BaseMessage]]:
        return self.model.requests

    def write(self, operation: str, order_id: str, **extra: Any) -> dict[str, str]:
        return record_write(self.ledger, effect_authority, operation, order_id, **extra)
