"""The bridges fail closed on a tool they were not told about (issue 31).

A tool named in neither ``writes`` nor ``reads`` used to run as a read: no receipt, so
a redelivered turn ran it again. Now the bridge refuses it. A tool the bridge can see
when it is built is refused then, with ``CompilationError`` naming it. A Pydantic AI
tool listed only at run time (a toolset that prefixes or builds its tools) fails the
step before the model is asked: nothing runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent as SDKAgent
from agents import WebSearchTool, function_tool
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from intention_kernel import CompilationError, Kernel, StepStatus
from intention_kernel.durability import Durability
from intention_kernel.integrations.openai_agents import KernelAgent as SDKKernelAgent
from intention_kernel.integrations.pydantic_ai import KernelAgent
from openai_agents_support import FakeModel, call, outputs, text
from pydantic_ai_support import tool_returns

# -- Pydantic AI ---------------------------------------------------------------------------------


def desk(asked: list[int], ran: list[str]) -> PydanticAgent[None, str]:
    """A model that looks an order up, then answers; a lookup and a delete tool."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(len(messages))
        if tool_returns(messages[-1]):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("order_status", {"order_id": "42"})])

    agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(model))

    @agent.tool_plain
    def order_status(order_id: str) -> str:
        ran.append(f"status {order_id}")
        return "delivered"

    @agent.tool_plain
    def delete_account(user: str) -> str:
        ran.append(f"delete {user}")
        return "deleted"

    return agent


def test_pydantic_ai_refuses_a_tool_in_neither_writes_nor_reads_when_built() -> None:
    with pytest.raises(CompilationError) as caught:
        KernelAgent(desk([], []), name="desk", reads=["order_status"])
    message = str(caught.value)
    assert "'delete_account'" in message and "'order_status'" not in message
    assert "writes" in message and "reads" in message


def test_pydantic_ai_refuses_a_tool_in_both_writes_and_reads() -> None:
    with pytest.raises(CompilationError, match=r"'order_status' is in both"):
        KernelAgent(
            desk([], []),
            name="desk",
            writes={"order_status": lambda a: a["order_id"], "delete_account": lambda a: "x"},
            reads=["order_status"],
        )


async def test_pydantic_ai_runs_a_listed_read_without_a_receipt(store: Durability) -> None:
    asked: list[int] = []
    ran: list[str] = []
    bridge = KernelAgent(
        desk(asked, ran),
        name="desk",
        writes={"delete_account": lambda args: args["user"]},
        reads=["order_status"],
    )
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t", "1", "status 42")
    assert result.reply == "done" and ran == ["status 42"]
    assert await store.list_receipts(thread_id="t") == []


async def test_pydantic_ai_refuses_a_tool_listed_only_at_run_time_before_the_model_is_asked(
    store: Durability,
) -> None:
    asked: list[int] = []
    ran: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(len(messages))
        if tool_returns(messages[-1]):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("ext_wipe", {"what": "everything"})])

    external: FunctionToolset[None] = FunctionToolset()

    @external.tool_plain
    def wipe(what: str) -> str:
        ran.append(what)
        return "wiped"

    # ``prefixed`` names its tools only when a run lists them: ``ext_wipe``.
    agent: PydanticAgent[None, str] = PydanticAgent(
        FunctionModel(model), toolsets=[external.prefixed("ext")]
    )
    bridge = KernelAgent(agent, name="desk")
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t", "1", "wipe it")
    [step] = result.steps
    assert step.status == StepStatus.FAILED
    assert "'ext_wipe'" in (step.error or "") and "reads" in (step.error or "")
    assert ran == [] and asked == []

    listed = KernelAgent(agent, name="desk", reads=["ext_wipe"])
    again = await Kernel(listed.as_agent(version="1"), store).turn("u", "1", "wipe it")
    assert again.reply == "done" and ran == ["everything"]


# -- OpenAI Agents SDK ---------------------------------------------------------------------------


def sdk_desk(ran: list[str]) -> SDKAgent[Any]:
    def script(items: list[dict[str, Any]]) -> list[Any]:
        if outputs(items):
            return [text("done")]
        return [call("order_status", {"order_id": "42"}, "call-1")]

    @function_tool
    def order_status(order_id: str) -> str:
        """Look an order up."""
        ran.append(f"status {order_id}")
        return "delivered"

    @function_tool
    def delete_account(user: str) -> str:
        """Delete an account."""
        ran.append(f"delete {user}")
        return "deleted"

    return SDKAgent(name="desk", model=FakeModel(script), tools=[order_status, delete_account])


def test_openai_agents_refuses_a_tool_in_neither_writes_nor_reads_when_built() -> None:
    with pytest.raises(CompilationError) as caught:
        SDKKernelAgent(sdk_desk([]), name="desk", reads=["order_status"])
    message = str(caught.value)
    assert "'delete_account'" in message and "'order_status'" not in message
    assert "writes" in message and "reads" in message


def test_openai_agents_refuses_an_unlisted_hosted_tool_and_an_unknown_read() -> None:
    agent = sdk_desk([])
    hosted = agent.clone(tools=[*agent.tools, WebSearchTool()])
    writes = {"delete_account": lambda a: a["user"]}
    with pytest.raises(CompilationError, match="web_search"):
        SDKKernelAgent(hosted, name="desk", writes=writes, reads=["order_status"])
    with pytest.raises(CompilationError, match="'nothing_here'"):
        SDKKernelAgent(agent, name="desk", writes=writes, reads=["order_status", "nothing_here"])


async def test_openai_agents_runs_a_listed_read_without_a_receipt(store: Durability) -> None:
    ran: list[str] = []
    bridge = SDKKernelAgent(
        sdk_desk(ran),
        name="desk",
        writes={"delete_account": lambda args: args["user"]},
        reads=["order_status"],
    )
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t", "1", "status 42")
    assert result.reply == "done" and ran == ["status 42"]
    assert await store.list_receipts(thread_id="t") == []
