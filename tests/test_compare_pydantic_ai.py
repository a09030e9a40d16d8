"""Pydantic AI alone against Pydantic AI inside intention-kernel: the numbers of the
Pydantic AI rows of the table in docs/guides/frameworks-compared.md.

Both columns run the same agent (``tests/pydantic_ai_support.py``: a ``FunctionModel``,
a cancel, a refund that needs approval, a ledger file as the provider's own record).
Alone, the application persists the message history as Pydantic AI's documentation
shows (``tests/pydantic_ai_alone_worker.py``: loaded before a run, saved after it) and
approves with ``DeferredToolResults``; inside, ``KernelAgent`` runs it in turns
(``tests/pydantic_ai_worker.py``). Processes are real and killed with SIGKILL. Each test
asserts the numbers its table cells show.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import (
    AgentRunResult,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
)
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition

from bridge_support import read_ledger
from bridge_support import run_worker as run
from intention_kernel import Answer, Kernel
from intention_kernel._checkpoint import operation_digest
from intention_kernel.durability import Durability
from intention_kernel.integrations.pydantic_ai import KernelAgent
from proving_support import Store, make_sql_store
from pydantic_ai_support import Desk, tool_returns

HERE = Path(__file__).parent
ALONE = HERE / "pydantic_ai_alone_worker.py"
INSIDE = HERE / "pydantic_ai_worker.py"
KILLED = -signal.SIGKILL


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path, file="desk.db")


@dataclass
class Files:
    """The provider's ledger, the model's log and the alone application's history."""

    ledger: Path
    asks: Path
    history: Path

    @classmethod
    def under(cls, dir: Path, name: str) -> Files:
        dir.joinpath(name).mkdir()
        return cls(*(dir / name / f for f in ("ledger", "asks", "history.json")))

    def config(self) -> dict[str, Any]:
        return {"ledger": str(self.ledger), "asks": str(self.asks), "history": str(self.history)}

    def provider_calls(self) -> int:
        return len(read_ledger(self.ledger))

    def model_requests(self) -> int:
        return len(read_ledger(self.asks))


# -- (a) one write, a process killed after it, the delivery made again -------------------------


@pytest.mark.slow
async def test_a_write_after_a_crash_and_redelivery_twice_alone_once_inside(
    sql_store: Store, tmp_path: Path
) -> None:
    """The process dies (SIGKILL) as the model is sent request 2, the one that reads the
    cancel's result; the delivery is made again in a new process."""
    alone = Files.under(tmp_path, "alone")
    prompt = {**alone.config(), "prompt": "cancel 42"}
    assert await run(ALONE, {**prompt, "die_at_request": 2}, KILLED) == []
    assert (alone.provider_calls(), alone.model_requests()) == (1, 1)
    assert not alone.history.exists()  # the run never ended: nothing was saved
    [rerun] = await run(ALONE, prompt)
    assert rerun == {"output": 'cancel_order: {"id": "cancel_42"}'}
    # The rerun starts over from the saved history: the model asks for the cancel again.
    assert (alone.provider_calls(), alone.model_requests()) == (2, 3)

    inside = Files.under(tmp_path, "inside")
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    config = {**inside.config(), "store": sql_store.config(), "turns": [turn]}
    assert await run(INSIDE, {**config, "die_at_request": 2}, KILLED) == []
    assert (inside.provider_calls(), inside.model_requests()) == (1, 1)
    [redelivered] = await run(INSIDE, config)
    assert redelivered["result"]["reply"] == 'cancel_order: {"id": "cancel_42"}'
    # Request 1 is recorded and the cancel's receipt completed: request 2 only.
    assert (inside.provider_calls(), inside.model_requests()) == (1, 2)


# -- (b) an approval given after a restart -----------------------------------------------------

REFUND = {"tool_name": "issue_refund", "tool_call_id": "call-refund"}


@pytest.mark.slow
async def test_an_approval_after_a_restart_runs_once_alone_until_a_crash_and_once_inside(
    sql_store: Store, tmp_path: Path
) -> None:
    """Process 1 asks; process 2, after the restart, approves. Then the same again, with
    process 2 killed (SIGKILL) after the refund, before its run ended, and the approval
    delivered again to process 3."""
    refund = {**REFUND, "args": {"order_id": "42", "cents": 1250}}
    approve = {"approve": {"tool_call_id": "call-refund"}}
    for crash in (False, True):
        alone = Files.under(tmp_path, f"alone-{crash}")
        [asked] = await run(ALONE, {**alone.config(), "prompt": "refund 42"})
        assert asked == {"approvals": [refund]}
        if crash:  # the resumed run's request 1 reads the refund's result
            await run(ALONE, {**alone.config(), **approve, "die_at_request": 1}, KILLED)
        [done] = await run(ALONE, {**alone.config(), **approve})
        assert done == {"output": 'issue_refund: {"id": "refund_42"}'}
        # Right after a restart; run again from the saved history after a crash.
        assert alone.provider_calls() == (2 if crash else 1)

    for crash in (False, True):
        inside = Files.under(tmp_path, f"inside-{crash}")
        config = {**inside.config(), "store": {**sql_store.config()}}
        thread = f"t-{crash}"
        ask = {"thread_id": thread, "turn_id": "turn-1", "message": "refund 42"}
        [asked] = await run(INSIDE, {**config, "turns": [ask]})
        interaction = asked["result"]["interaction"]
        assert interaction["details"] == [refund]
        accept = {
            "thread_id": thread,
            "turn_id": "turn-2",
            "answer": {"digest": interaction["digest"]},
        }
        if crash:
            await run(INSIDE, {**config, "turns": [accept], "die_at_request": 1}, KILLED)
        [done] = await run(INSIDE, {**config, "turns": [accept]})
        assert done["result"]["reply"] == 'issue_refund: {"id": "refund_42"}'
        assert inside.provider_calls() == 1


# -- (c) is the approval bound to the arguments that ran? --------------------------------------


@dataclass
class HalveRefunds(AbstractCapability[Any]):
    """A capability that rewrites a refund's validated arguments (pydantic-ai #6968)."""

    async def after_tool_validate(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any
    ) -> Any:
        if isinstance(args, dict) and "cents" in args:
            return {**args, "cents": args["cents"] // 2}
        return args


def refund_agent(refunds: list[int]) -> PydanticAgent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages[-1])
        if returns:
            return ModelResponse(parts=[TextPart(str(returns[0].content))])
        call = ToolCallPart("refund", {"order_id": "42", "cents": 1250}, tool_call_id="c1")
        return ModelResponse(parts=[call])

    agent: PydanticAgent[None, str] = PydanticAgent(
        FunctionModel(model), capabilities=[HalveRefunds()]
    )

    @agent.tool_plain(requires_approval=True)
    def refund(order_id: str, cents: int) -> str:
        refunds.append(cents)
        return f"refunded {cents}"

    return agent


async def test_arguments_rewritten_after_approval_run_alone_and_are_refused_inside(
    store: Durability,
) -> None:
    refunds: list[int] = []
    agent = refund_agent(refunds)
    asked: AgentRunResult[str | DeferredToolRequests] = await agent.run(
        "refund", output_type=[str, DeferredToolRequests]
    )
    assert isinstance(asked.output, DeferredToolRequests)
    assert asked.output.approvals[0].args_as_dict() == {"order_id": "42", "cents": 1250}
    await agent.run(
        message_history=asked.all_messages(),
        deferred_tool_results=DeferredToolResults(approvals={"c1": True}),
        output_type=[str, DeferredToolRequests],
    )
    assert refunds == [625]  # shown 1250, ran 625

    refunds.clear()
    bridge = KernelAgent(agent, name="desk", writes={"refund": lambda args: args["order_id"]})
    kernel = Kernel(bridge.as_agent(version="1"), store)
    held = await kernel.turn("t1", "turn-1", "refund")
    assert held.interaction is not None
    assert held.interaction.details[0]["args"] == {"order_id": "42", "cents": 1250}
    accepted = await kernel.turn("t1", "turn-2", answer=Answer(digest=held.interaction.digest))
    [step] = accepted.steps
    assert step.status == "failed"
    assert "would run with {'order_id': '42', 'cents': 625}, not the approved" in (step.error or "")
    assert refunds == []
    assert await store.list_receipts(thread_id="t1") == []


async def test_an_approval_carrying_other_arguments_runs_them_alone_and_nothing_inside(
    store: Durability, tmp_path: Path
) -> None:
    """The person is shown a refund of 1250 cents; the approval that comes back carries
    99999: ``ToolApproved(override_args=...)`` alone, an answer bound to that operation,
    or an edit, inside."""
    other = {"order_id": "42", "cents": 99999}
    alone = Desk(tmp_path / "alone.ledger")
    asked: AgentRunResult[str | DeferredToolRequests] = await alone.agent.run(
        "refund 42", output_type=[str, DeferredToolRequests]
    )
    assert isinstance(asked.output, DeferredToolRequests)
    shown = asked.output.approvals[0]
    assert shown.args_as_dict() == {"order_id": "42", "cents": 1250}
    results = DeferredToolResults(approvals={shown.tool_call_id: ToolApproved(override_args=other)})
    await alone.agent.run(
        message_history=asked.all_messages(),
        deferred_tool_results=results,
        output_type=[str, DeferredToolRequests],
    )
    assert [c["cents"] for c in read_ledger(alone.ledger)] == [99999]

    inside = Desk(tmp_path / "inside.ledger")
    kernel = Kernel(inside.bridge.as_agent(version="1"), store)
    held = await kernel.turn("t1", "turn-1", "refund 42")
    assert held.interaction is not None
    edited = {"approvals": [{**REFUND, "args": other}], "prompt": None}
    bound_elsewhere = await kernel.turn(
        "t1", "turn-2", answer=Answer(digest=operation_digest("capability", "desk.agent", edited))
    )
    assert bound_elsewhere.steps == ()
    with_edit = await kernel.turn("t1", "turn-3", answer=Answer(input=edited))
    assert "its input cannot be edited" in (with_edit.steps[0].error or "")
    assert read_ledger(inside.ledger) == []
    accepted = await kernel.turn("t1", "turn-4", answer=Answer(digest=held.interaction.digest))
    assert accepted.reply == 'issue_refund: {"id": "refund_42"}'
    assert [c["cents"] for c in read_ledger(inside.ledger)] == [1250]
