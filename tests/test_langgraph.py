"""The LangGraph bridge: a compiled graph's loop inside durable turns.

Reads reach the model. A write tool is called once however often its turn is
delivered. That holds also when a real process dies after the provider call. A tool
in ``approve`` pauses on an interrupt. The interrupt is held as a kernel interaction
bound to that exact call, and it survives a restart. An accept runs exactly that call
once, while a reject's reason reaches the model. Each model call is recorded in the
turn's journal before its tools run: a redelivered turn asks the model only what it
had not answered. The graph is LangGraph's prebuilt ReAct agent or a hand-built
``StateGraph`` with a ``ToolNode``.
No API key: the model is scripted (``tests/langgraph_support.py``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt

from bridge_support import MovingClock, Workers, read_ledger, words
from intention_kernel import (
    Answer,
    CompilationError,
    CorruptRecordError,
    EffectNotAppliedError,
    Kernel,
    ReceiptStatus,
)
from intention_kernel._checkpoint import operation_digest
from intention_kernel._effects import utcnow
from intention_kernel.durability import Durability
from intention_kernel.durability.abc import JournalEntry, RecordedDurability
from intention_kernel.integrations.langgraph import KernelAgent
from intention_kernel.testing import InMemoryDurability, faults
from langgraph_support import Desk, ScriptedChatModel, react_agent, tool_results
from proving_support import Store, make_sql_store, open_store

WORKER = Path(__file__).with_name("langgraph_worker.py")
SHAPES = ["react", "hand-built"]
STATUS_42 = {"order_id": "42", "status": "delivered", "cents": 1250}
REFUND = {
    "tool_name": "issue_refund",
    "tool_call_id": "call-refund",
    "args": {"order_id": "42", "cents": 1250},
}


def returns_of(desk: Desk) -> list[tuple[str | None, Any]]:
    """The tool results the model's last call carried."""
    return tool_results(desk.requests[-1])


async def journal(store: Durability, turn_id: str) -> list[str]:
    """The keys of the journal entries of ``turn_id`` on thread ``t1``."""
    assert isinstance(store, RecordedDurability)  # every store of the ``store`` fixture
    recorder = await store.recorder()
    return [entry.key for entry in await recorder.read_journal("t1", turn_id)]


def model_keys(keys: list[str]) -> list[str]:
    return [key for key in keys if ":langgraph.model." in key]


# -- in one process, every store ---------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_read_tools_result_reaches_the_model(
    store: Durability, tmp_path: Path, shape: Any
) -> None:
    desk = Desk(tmp_path / "ledger", shape=shape)
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    result = await kernel.turn("t1", "turn-1", "status of 42")
    assert returns_of(desk) == [("order_status", json.dumps(STATUS_42))]
    assert result.reply == f"order_status: {json.dumps(STATUS_42)}"
    assert [s.status for s in result.steps] == ["completed"]
    # The state is the thread's: the next turn's run continues it.
    await kernel.turn("t1", "turn-2", "status of 43")
    prompts = [m.content for m in desk.requests[-1] if m.type == "human"]
    assert prompts == ["status of 42", "status of 43"]
    assert read_ledger(desk.ledger) == []


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_write_tool_is_called_once_when_its_turn_is_redelivered(
    store: Durability, tmp_path: Path, shape: Any
) -> None:
    desk = Desk(tmp_path / "ledger", shape=shape)
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "cancel 42")
    assert len(read_ledger(desk.ledger)) == 1  # the write ran; the turn did not commit
    redelivered = await kernel.turn("t1", "turn-1", "cancel 42")
    assert not redelivered.replayed
    assert [s.status for s in redelivered.steps] == ["completed"]
    assert redelivered.reply == 'cancel_order: {"id": "cancel_42"}'
    again = await kernel.turn("t1", "turn-1", "cancel 42")
    assert again.replayed
    ledger = read_ledger(desk.ledger)
    assert [(c["operation"], c["key"]) for c in ledger] == [
        ("cancel", "desk.agent:cancel_order:42")
    ]
    receipts = await store.list_receipts(thread_id="t1")
    assert [(r.key, r.status) for r in receipts] == [
        ("desk.agent:cancel_order:42", ReceiptStatus.COMPLETED)
    ]


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_redelivered_turn_asks_the_model_only_what_it_had_not_answered(
    store: Durability, tmp_path: Path, shape: Any
) -> None:
    desk = Desk(tmp_path / "ledger", shape=shape)
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    # The turn dies after the cancel's receipt completed: call 1 (which asked for the
    # cancel) is recorded, call 2 (which reads its result) was never made.
    with (
        faults.injected(faults.AFTER_RECEIPT_COMPLETED, "raise"),
        pytest.raises(faults.InjectedFault),
    ):
        await kernel.turn("t1", "turn-1", "cancel 42")
    assert [len(r) for r in desk.requests] == [1]
    keys = await journal(store, "turn-1")
    assert keys[0] == "kernel.round.1"
    assert len(model_keys(keys)) == 1
    redelivered = await kernel.turn("t1", "turn-1", "cancel 42")
    # Only call 2 was asked: the prompt, the recorded response, the tool's result.
    assert [len(r) for r in desk.requests] == [1, 3]
    assert returns_of(desk) == [("cancel_order", '{"id": "cancel_42"}')]
    assert redelivered.reply == 'cancel_order: {"id": "cancel_42"}'
    assert [(c["operation"], c["order_id"]) for c in read_ledger(desk.ledger)] == [("cancel", "42")]
    assert await journal(store, "turn-1") == []  # the commit deleted it
    replayed = await kernel.turn("t1", "turn-1", "cancel 42")
    assert replayed.replayed
    assert len(desk.requests) == 2


async def test_a_turn_that_died_before_its_commit_asks_the_model_nothing_again(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "status of 42")
    assert len(desk.requests) == 2
    assert len(model_keys(await journal(store, "turn-1"))) == 2
    redelivered = await kernel.turn("t1", "turn-1", "status of 42")
    assert len(desk.requests) == 2
    assert redelivered.reply == f"order_status: {json.dumps(STATUS_42)}"
    # The committed state holds the recorded responses: the next turn continues it.
    await kernel.turn("t1", "turn-2", "status of 43")
    assert [len(r) for r in desk.requests] == [1, 3, 5, 7]


class StreamingChatModel(ScriptedChatModel):
    """The scripted model, answering as a stream of chunks (``streaming=True``)."""

    streaming: bool = False
    streamed: list[int] = []  # noqa: RUF012  (one list per test's instance, set there)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kw: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        self.streamed.append(len(messages))
        message = self.script(messages)
        if message.tool_calls:
            chunk = AIMessageChunk(
                content="",
                tool_call_chunks=[
                    {
                        "name": c["name"],
                        "args": json.dumps(c["args"]),
                        "id": c["id"],
                        "index": i,
                        "type": "tool_call_chunk",
                    }
                    for i, c in enumerate(message.tool_calls)
                ],
            )
            yield ChatGenerationChunk(message=chunk)
            return
        for word in str(message.content).split(" "):
            yield ChatGenerationChunk(message=AIMessageChunk(content=word + " "))


async def test_a_streamed_model_call_is_read_to_its_end_and_recorded(
    store: Durability, tmp_path: Path
) -> None:
    from langgraph_support import desk_script

    desk = Desk(tmp_path / "ledger")
    model = StreamingChatModel(script=desk_script, requests=[], streaming=True, streamed=[])
    bridge = KernelAgent(
        react_agent(model, desk.tools),
        name="desk",
        reads={"order_status"},
        writes={"cancel_order": lambda a: a["order_id"], "issue_refund": lambda a: a["order_id"]},
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "cancel 42")
    assert model.streamed == [1, 3]
    assert model.requests == []  # streamed, never asked whole
    redelivered = await kernel.turn("t1", "turn-1", "cancel 42")
    assert model.streamed == [1, 3]  # the model was not asked again
    assert redelivered.reply.strip() == 'cancel_order: {"id": "cancel_42"}'
    assert len(read_ledger(desk.ledger)) == 1


async def test_a_recorded_response_that_cannot_be_decoded_commits_nothing(
    store: Durability, tmp_path: Path
) -> None:
    # The journal key of a model call is its digest: the same turn on another store
    # records the same keys.
    probe = Desk(tmp_path / "probe-ledger")
    async with InMemoryDurability() as other:
        with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
            await Kernel(probe.bridge.as_agent(version="1"), other).turn(
                "t1", "turn-1", "cancel 42"
            )
        first = model_keys(await journal(other, "turn-1"))[0]
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    assert isinstance(store, RecordedDurability)
    recorder = await store.recorder()
    entry = JournalEntry("t1", "turn-1", first, None, '{"parts": 3}', utcnow())
    async with recorder.lock("t1"):
        await recorder.write_journal(entry)
    with pytest.raises(CorruptRecordError, match="cannot be decoded"):
        await kernel.turn("t1", "turn-1", "cancel 42")
    assert desk.requests == []
    assert read_ledger(desk.ledger) == []
    assert await store.load_checkpoint("t1") is None


async def test_the_same_operation_asked_again_in_a_later_turn_meets_its_receipt(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    await kernel.turn("t1", "turn-1", "cancel 42")
    await kernel.turn("t1", "turn-2", "cancel 42")
    assert len(read_ledger(desk.ledger)) == 1
    assert returns_of(desk) == [("cancel_order", '{"id": "cancel_42"}')]


@pytest.mark.parametrize("shape", SHAPES)
async def test_an_approval_is_held_as_an_interaction_bound_to_the_exact_call(
    store: Durability, tmp_path: Path, shape: Any
) -> None:
    desk = Desk(tmp_path / "ledger", shape=shape)
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    asked = await kernel.turn("t1", "turn-1", "refund 42")
    interaction = asked.interaction
    assert interaction is not None
    assert interaction.kind == "capability"
    (held,) = interaction.details
    assert {k: held[k] for k in ("tool_name", "tool_call_id", "args")} == REFUND
    assert held["value"] == REFUND
    assert interaction.input == {"approvals": [held], "prompt": None}
    assert interaction.digest == operation_digest("capability", "desk.agent", interaction.input)
    assert '{"cents": 1250, "order_id": "42"}' in interaction.prompt
    assert interaction.prompt in asked.reply
    assert [s.status for s in asked.steps] == ["completed", "awaiting_confirmation"]
    assert read_ledger(desk.ledger) == []
    assert await store.list_receipts(thread_id="t1") == []  # asked before any receipt
    # While it waits, a new message gets the question again; the model is not asked.
    requests = len(desk.requests)
    waiting = await kernel.turn("t1", "turn-2", "status of 43")
    assert interaction.prompt in waiting.reply
    assert len(desk.requests) == requests
    assert waiting.interaction == interaction
    accepted = await kernel.turn("t1", "turn-3", answer=Answer(digest=interaction.digest))
    assert accepted.reply == 'issue_refund: {"id": "refund_42"}'
    assert [(c["operation"], c["cents"]) for c in read_ledger(desk.ledger)] == [("refund", 1250)]


async def test_an_accept_with_another_digest_runs_nothing(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    asked = await kernel.turn("t1", "turn-1", "refund 42")
    assert asked.interaction is not None
    (held,) = asked.interaction.details
    other = operation_digest(
        "capability",
        "desk.agent",
        {"approvals": [{**held, "args": {"order_id": "42", "cents": 99999}}], "prompt": None},
    )
    refused = await kernel.turn("t1", "turn-2", answer=Answer(digest=other))
    assert refused.steps == ()
    assert refused.interaction == asked.interaction
    assert read_ledger(desk.ledger) == []
    accepted = await kernel.turn("t1", "turn-3", answer=Answer(digest=asked.interaction.digest))
    assert [s.status for s in accepted.steps] == ["completed"]
    assert [(c["operation"], c["cents"]) for c in read_ledger(desk.ledger)] == [("refund", 1250)]


async def test_a_rejects_reason_reaches_the_model(store: Durability, tmp_path: Path) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    await kernel.turn("t1", "turn-1", "refund 42")
    rejected = await kernel.turn(
        "t1", "turn-2", answer=Answer(decision="reject", reason="it arrived intact")
    )
    assert returns_of(desk) == [("issue_refund", "it arrived intact")]
    last = desk.requests[-1][-1]
    assert isinstance(last, ToolMessage)
    assert last.status == "error"
    assert rejected.reply == "Not refunded: it arrived intact"
    assert rejected.interaction is None
    assert read_ledger(desk.ledger) == []
    # The run ended: the next message starts a new one on the same state.
    await kernel.turn("t1", "turn-3", "status of 43")
    assert returns_of(desk)[0][0] == "order_status"


async def test_an_approval_that_expires_reaches_the_model_as_rejected(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger", approve_within=timedelta(minutes=15))
    clock = MovingClock()
    kernel = Kernel(desk.bridge.as_agent(version="1"), store, clock=clock)
    asked = await kernel.turn("t1", "turn-1", "refund 42")
    assert asked.interaction is not None
    assert asked.interaction.expires_at == clock.now + timedelta(minutes=15)
    clock.now += timedelta(minutes=15)
    before = len(desk.requests)
    later = await kernel.turn("t1", "turn-2", "status of 43")
    assert later.interaction is None
    assert tool_results(desk.requests[before]) == [
        ("issue_refund", "The approval request closed unanswered.")
    ]
    assert returns_of(desk)[0][0] == "order_status"
    assert read_ledger(desk.ledger) == []
    late = await kernel.turn("t1", "turn-3", answer=Answer(digest=asked.interaction.digest))
    assert late.steps == ()
    assert read_ledger(desk.ledger) == []


async def test_a_message_may_answer_the_pending_approval(store: Durability, tmp_path: Path) -> None:
    desk = Desk(tmp_path / "ledger", read_answer=words)
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    await kernel.turn("t1", "turn-1", "refund 42")
    unrelated = await kernel.turn("t1", "turn-2", "status of 43")  # not an answer: asked again
    assert unrelated.interaction is not None
    assert unrelated.steps == ()
    rejected = await kernel.turn("t1", "turn-3", "no, it arrived intact")
    assert rejected.reply == "Not refunded: it arrived intact"
    await kernel.turn("t1", "turn-4", "refund 42")
    accepted = await kernel.turn("t1", "turn-5", "yes")
    assert accepted.reply == 'issue_refund: {"id": "refund_42"}'
    assert accepted.interaction is None
    assert [(c["operation"], c["cents"]) for c in read_ledger(desk.ledger)] == [("refund", 1250)]


async def test_an_approval_survives_a_new_kernel_on_the_same_store(tmp_path: Path) -> None:
    from intention_kernel.durability.sqlite import SQLiteDurability

    path = tmp_path / "desk.db"
    async with SQLiteDurability(path) as first:
        asked = await Kernel(Desk(tmp_path / "ledger").bridge.as_agent(version="1"), first).turn(
            "t1", "turn-1", "refund 42"
        )
    assert asked.interaction is not None
    desk = Desk(tmp_path / "ledger")
    async with SQLiteDurability(path) as second:
        kernel = Kernel(desk.bridge.as_agent(version="1"), second)
        done = await kernel.turn("t1", "turn-2", answer=Answer(digest=asked.interaction.digest))
    assert returns_of(desk) == [("issue_refund", '{"id": "refund_42"}')]
    assert done.reply == 'issue_refund: {"id": "refund_42"}'
    assert len(read_ledger(desk.ledger)) == 1


def no_key(args: dict[str, Any]) -> str:
    raise KeyError("order")


@pytest.mark.parametrize(
    ("key_of", "error"),
    [
        (lambda a: "", "must return a non-empty string, got ''; nothing ran"),
        (no_key, "failed on {'order_id': '42'}: KeyError: 'order'; nothing ran"),
    ],
)
async def test_a_key_function_that_gives_no_key_fails_the_step_and_runs_nothing(
    store: Durability, tmp_path: Path, key_of: Any, error: str
) -> None:
    desk = Desk(tmp_path / "ledger")
    bridge = KernelAgent(
        react_agent(desk.model, desk.tools),
        name="desk",
        reads={"order_status"},
        writes={"cancel_order": key_of, "issue_refund": lambda a: a["order_id"]},
    )
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t1", "turn-1", "cancel 42")
    assert [s.status for s in result.steps] == ["failed"]
    assert error in (result.steps[0].error or "")
    assert read_ledger(desk.ledger) == []
    assert await store.list_receipts(thread_id="t1") == []


@pytest.mark.parametrize(
    ("listing", "problem"),
    [
        (
            {"writes": {"cancel_order": str, "issue_refund": str}},
            "tool 'order_status' is neither in writes nor in reads",
        ),
        (
            {"reads": {"order_status"}, "writes": {"cancel_order": str}},
            "tool 'issue_refund' is neither in writes nor in reads",
        ),
        (
            {
                "reads": {"order_status", "issue_refund"},
                "writes": {"cancel_order": str, "refund": str},
            },
            "writes names 'refund', which no ToolNode of the graph has",
        ),
        (
            {"reads": {"order_status", "issue_refund"}, "writes": {"cancel_order": str}},
            "approve names 'issue_refund', which is not in writes",
        ),
    ],
)
def test_every_tool_must_be_listed_before_the_graph_runs(
    tmp_path: Path, listing: dict[str, Any], problem: str
) -> None:
    desk = Desk(tmp_path / "ledger")
    graph = react_agent(desk.model, desk.tools)
    approve = {"issue_refund"} if "approve names" in problem else set()
    with pytest.raises(CompilationError, match=problem):
        KernelAgent(graph, name="desk", approve=approve, **listing)


async def test_a_write_tool_that_did_nothing_fails_its_step_and_may_run_again(
    store: Durability,
) -> None:
    attempts: list[int] = []

    @tool
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise EffectNotAppliedError("the shop refused: try again")
        return "ok"

    def script(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            return AIMessage("cancelled")
        call = {"name": "cancel_order", "args": {"order_id": "42"}, "id": "c1"}
        return AIMessage("", tool_calls=[call])

    graph = react_agent(ScriptedChatModel(script=script), [cancel_order])
    bridge = KernelAgent(graph, name="desk", writes={"cancel_order": lambda a: a["order_id"]})
    kernel = Kernel(bridge.as_agent(version="1"), store)
    first = await kernel.turn("t1", "turn-1", "cancel 42")
    assert [s.status for s in first.steps] == ["failed"]
    (receipt,) = await store.list_receipts(thread_id="t1")
    assert receipt.status == ReceiptStatus.FAILED
    second = await kernel.turn("t1", "turn-2", "cancel 42")
    assert second.reply == "cancelled"
    assert attempts == [1, 2]
    (receipt,) = await store.list_receipts(thread_id="t1")
    assert (receipt.status, receipt.attempt) == (ReceiptStatus.COMPLETED, 2)


@pytest.mark.parametrize("handle_tool_errors", [False, True])
async def test_a_write_tool_that_raised_is_uncertain_and_never_run_again(
    store: Durability, handle_tool_errors: bool
) -> None:
    """Also when the ``ToolNode`` turns tool errors into messages for the model: the
    write may have happened before the exception."""
    calls: list[str] = []

    @tool
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        calls.append(order_id)
        raise RuntimeError("the connection dropped after the request was sent")

    def script(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            return AIMessage(f"tool said: {messages[-1].content}")
        call = {"name": "cancel_order", "args": {"order_id": "42"}, "id": "c1"}
        return AIMessage("", tool_calls=[call])

    model = ScriptedChatModel(script=script)
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", ToolNode([cancel_order], handle_tool_errors=handle_tool_errors))
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    builder.add_edge("tools", END)
    bridge = KernelAgent(
        builder.compile(), name="desk", writes={"cancel_order": lambda a: a["order_id"]}
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    first = await kernel.turn("t1", "turn-1", "cancel 42")
    assert [s.status for s in first.steps] == ["uncertain"]
    second = await kernel.turn("t1", "turn-2", "cancel 42")
    assert [s.status for s in second.steps] == ["uncertain"]
    assert calls == ["42"]
    (receipt,) = await store.list_receipts(thread_id="t1")
    assert receipt.status == ReceiptStatus.UNCERTAIN


async def test_arguments_the_tool_refuses_hold_no_receipt(
    store: Durability, tmp_path: Path
) -> None:
    def script(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            return AIMessage(f"{messages[-1].status}")
        call = {"name": "cancel_order", "args": {"order": "42"}, "id": "c1"}
        return AIMessage("", tool_calls=[call])

    desk = Desk(tmp_path / "ledger", script=script)
    result = await Kernel(desk.bridge.as_agent(version="1"), store).turn("t1", "turn-1", "x")
    assert result.reply == "error"  # the model read the validation error
    assert await store.list_receipts(thread_id="t1") == []
    assert read_ledger(desk.ledger) == []


async def test_a_model_answering_outside_the_journal_fails_the_step_before_any_tool_runs(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    desk.model.cache = False  # its calls skip every cache, the journal's too
    result = await Kernel(desk.bridge.as_agent(version="1"), store).turn(
        "t1", "turn-1", "cancel 42"
    )
    assert [s.status for s in result.steps] == ["failed"]
    assert "answered without the turn's journal" in (result.steps[0].error or "")
    assert read_ledger(desk.ledger) == []
    assert await store.list_receipts(thread_id="t1") == []


async def test_a_write_tool_called_outside_a_tool_node_is_refused_before_it_runs(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    cancel = desk.tools[1]
    builder = StateGraph(MessagesState)
    builder.add_node(
        "own", lambda s: {"messages": [AIMessage(str(cancel.invoke({"order_id": "42"})))]}
    )
    builder.add_node("tools", ToolNode(desk.tools))
    builder.add_edge(START, "own")
    builder.add_edge("own", END)
    bridge = KernelAgent(
        builder.compile(),
        name="desk",
        reads={"order_status"},
        writes={"cancel_order": str, "issue_refund": str},
    )
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t1", "turn-1", "go")
    assert [s.status for s in result.steps] == ["failed"]
    assert "tool 'cancel_order' ran outside a ToolNode" in (result.steps[0].error or "")
    assert read_ledger(desk.ledger) == []


async def test_an_interrupt_in_a_node_is_asked_and_resumed_with_the_answer(
    store: Durability,
) -> None:
    class State(MessagesState):
        plan: str

    def review(state: State) -> dict[str, Any]:
        answer = interrupt({"plan": "restart the server"})
        verdict = "go" if answer["decision"] == "accept" else f"stop ({answer['reason']})"
        return {"messages": [AIMessage(f"{verdict}: {answer['value']}")]}

    builder = StateGraph(State)
    builder.add_node("review", review)
    builder.add_edge(START, "review")
    builder.add_edge("review", END)
    bridge = KernelAgent(builder.compile(), name="ops")
    kernel = Kernel(bridge.as_agent(version="1"), store)
    asked = await kernel.turn("t1", "turn-1", "restart")
    assert asked.interaction is not None
    (held,) = asked.interaction.details
    assert held["value"] == {"plan": "restart the server"}
    assert held["tool_name"] is None
    assert "Run interrupt with" in asked.interaction.prompt
    accepted = await kernel.turn(
        "t1", "turn-2", answer=Answer(digest=asked.interaction.digest, value="at noon")
    )
    assert accepted.reply == "go: at noon"
    await kernel.turn("t1", "turn-3", "restart")
    rejected = await kernel.turn("t1", "turn-4", answer=Answer(decision="reject", reason="busy"))
    assert rejected.reply == "stop (busy): None"


def test_a_kernel_agent_needs_a_compiled_graph() -> None:
    builder = StateGraph(MessagesState)
    with pytest.raises(TypeError, match="needs a compiled LangGraph graph"):
        KernelAgent(builder, name="desk")  # type: ignore[arg-type]


def test_importing_the_bridge_without_langgraph_names_the_extra() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'langgraph' or name.startswith('langgraph.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import intention_kernel.integrations.langgraph\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "pip install 'intention-kernel[langgraph]'" in proc.stderr


# -- real processes: SQLite and PostgreSQL -----------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path, file="desk.db", name_sessions=True)


@pytest.fixture
def workers(sql_store: Store, tmp_path: Path) -> Workers:
    return Workers(WORKER, sql_store, tmp_path / "provider.ledger")


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
async def test_a_process_killed_after_the_write_is_redelivered_with_one_provider_call(
    workers: Workers, tmp_path: Path, shape: str
) -> None:
    """SIGKILL after the write: the redelivery asks the model only for call 2 (call 1
    is recorded) and the shop is called once."""
    asks = tmp_path / "asks.jsonl"
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    died = await workers.run(
        [turn],
        shape=shape,
        asks=str(asks),
        fault={"point": faults.AFTER_RECEIPT_COMPLETED, "action": "sigkill"},
        status=-signal.SIGKILL,
    )
    assert died == []
    assert len(read_ledger(workers.ledger)) == 1
    (first,) = read_ledger(asks)
    assert first["messages"] == 1
    # The kernel's round 1 (run the graph) and the graph's model call 1.
    assert workers.store.query("SELECT count(*) FROM ik_journal") == [(2,)]
    (redelivered,) = await workers.run([turn], shape=shape, asks=str(asks))
    result = redelivered["result"]
    assert result["replayed"] is False
    assert [s["status"] for s in result["steps"]] == ["completed"]
    assert redelivered["returns"] == [{"tool": "cancel_order", "content": '{"id": "cancel_42"}'}]
    again = [a for a in read_ledger(asks) if a["pid"] != first["pid"]]
    assert [a["messages"] for a in again] == [3]  # call 2 only
    calls = read_ledger(workers.ledger)
    assert len(calls) == 1  # provider_calls=1
    assert calls[0]["key"] == "desk.agent:cancel_order:42"
    assert workers.store.query("SELECT count(*) FROM ik_journal") == [(0,)]


@pytest.mark.slow
async def test_a_process_killed_between_model_calls_asks_only_the_unanswered_one(
    workers: Workers, tmp_path: Path
) -> None:
    asks = tmp_path / "asks.jsonl"
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "status of 42"}
    await workers.run([turn], asks=str(asks), die_at_request=2, status=-signal.SIGKILL)
    (first,) = read_ledger(asks)
    (done,) = await workers.run([turn], asks=str(asks))
    assert done["result"]["reply"] == f"order_status: {json.dumps(STATUS_42)}"
    again = [a for a in read_ledger(asks) if a["pid"] != first["pid"]]
    assert [a["messages"] for a in again] == [3]


@pytest.mark.slow
async def test_a_process_killed_inside_the_provider_call_leaves_the_write_uncertain(
    workers: Workers,
) -> None:
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    await workers.run(
        [turn],
        fault={"point": faults.IN_PROVIDER_AFTER_WRITE, "action": "sigkill"},
        status=-signal.SIGKILL,
    )
    (redelivered,) = await workers.run([turn])
    steps = redelivered["result"]["steps"]
    assert [s["status"] for s in steps] == ["uncertain"]
    assert len(read_ledger(workers.ledger)) == 1  # never retried blindly
    async with open_store(workers.store.config()) as durability:
        receipts = await durability.list_receipts(thread_id="t1")
    assert [r.status for r in receipts] == [ReceiptStatus.UNCERTAIN]


@pytest.mark.slow
async def test_an_approval_given_after_a_restart_runs_the_approved_call_once_across_a_crash(
    workers: Workers,
) -> None:
    (asked,) = await workers.run([{"thread_id": "t1", "turn_id": "turn-1", "message": "refund 42"}])
    interaction = asked["result"]["interaction"]
    (held,) = interaction["details"]
    assert held["value"] == REFUND
    accept = {"thread_id": "t1", "turn_id": "turn-2", "answer": {"digest": interaction["digest"]}}
    # A new process accepts and dies after the refund's provider call, before its turn
    # commits; the same delivery comes again, in another process, and again after that.
    died = await workers.run(
        [accept],
        fault={"point": faults.AFTER_RECEIPT_COMPLETED, "action": "sigkill"},
        status=-signal.SIGKILL,
    )
    assert died == []
    assert len(read_ledger(workers.ledger)) == 1
    (done,) = await workers.run([accept])
    assert done["result"]["replayed"] is False
    assert done["returns"] == [{"tool": "issue_refund", "content": '{"id": "refund_42"}'}]
    assert done["result"]["reply"] == 'issue_refund: {"id": "refund_42"}'
    (again,) = await workers.run([accept])
    assert again["result"]["replayed"] is True
    calls = read_ledger(workers.ledger)
    assert [(c["operation"], c["order_id"], c["cents"]) for c in calls] == [("refund", "42", 1250)]
    assert len({c["pid"] for c in calls}) == 1


# -- what runs after an accept is what was shown -----------------------------------------------


async def test_an_accept_runs_nothing_when_the_saved_graph_waits_on_another_call(
    tmp_path: Path,
) -> None:
    """The interaction shows refund 42; a saved state that waits on refund 43 (a record
    the kernel did not write) must not resume: nobody approved refund 43."""
    import dataclasses

    from intention_kernel._checkpoint import encode_checkpoint

    desk = Desk(tmp_path / "ledger")
    async with InMemoryDurability() as store:
        kernel = Kernel(desk.bridge.as_agent(version="1"), store)
        asked = await kernel.turn("t1", "turn-1", "refund 42")
        await kernel.turn("t2", "turn-1", "refund 43")
        assert asked.interaction is not None
        first, other = await store.load_checkpoint("t1"), await store.load_checkpoint("t2")
        assert first is not None and other is not None
        record = first.facts["desk.conversation"]
        swapped = {**record.value, "state": other.facts["desk.conversation"].value["state"]}
        facts = {**first.facts, "desk.conversation": dataclasses.replace(record, value=swapped)}
        text = encode_checkpoint(dataclasses.replace(first, facts=facts))
        await store.tamper().write_checkpoint_text("t1", text)
        accepted = await kernel.turn("t1", "turn-2", answer=Answer(digest=asked.interaction.digest))
    assert [s.status for s in accepted.steps] == ["failed"]
    assert "no longer waits on the answered interrupts; nothing ran" in (
        accepted.steps[0].error or ""
    )
    assert read_ledger(desk.ledger) == []


def write_and_refunds(messages: list[BaseMessage]) -> AIMessage:
    """A cancel and two refunds in one response, then what came back."""
    if isinstance(messages[-1], ToolMessage):
        done = [m for m in messages if isinstance(m, ToolMessage)]
        return AIMessage(", ".join(f"{m.name}={m.content}" for m in done[-3:]))
    calls = [
        {"name": "cancel_order", "args": {"order_id": "42"}, "id": "c1"},
        {"name": "issue_refund", "args": {"order_id": "43", "cents": 800}, "id": "c2"},
        {"name": "issue_refund", "args": {"order_id": "42", "cents": 1250}, "id": "c3"},
    ]
    return AIMessage("", tool_calls=calls)


def held_orders(result: Any) -> list[str]:
    assert result.interaction is not None
    return [call["args"]["order_id"] for call in result.interaction.details]


async def test_approvals_asked_together_are_answered_together(
    store: Durability, tmp_path: Path
) -> None:
    """The ReAct agent runs each call of a response as a task of its own: both
    refunds pause at once, one interaction holds them, one accept runs both."""
    desk = Desk(tmp_path / "ledger", script=write_and_refunds, read_answer=words)
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    asked = await kernel.turn("t1", "turn-1", "go")
    assert held_orders(asked) == ["43", "42"]
    assert asked.interaction is not None
    assert asked.interaction.prompt.count("Run issue_refund with") == 2
    assert [c["operation"] for c in read_ledger(desk.ledger)] == ["cancel"]
    done = await kernel.turn("t1", "turn-2", "yes")
    assert done.interaction is None
    assert done.reply == (
        'cancel_order={"id": "cancel_42"}, issue_refund={"id": "refund_43"}, '
        'issue_refund={"id": "refund_42"}'
    )
    ledger = sorted((c["operation"], c["order_id"]) for c in read_ledger(desk.ledger))
    assert ledger == [("cancel", "42"), ("refund", "42"), ("refund", "43")]


async def test_calls_of_one_tool_node_task_pause_one_at_a_time(
    store: Durability, tmp_path: Path
) -> None:
    """A hand-built ``ToolNode`` runs a response's calls in one task: each refund is
    asked in turn, and an accept never resumes a call the person was not shown."""
    desk = Desk(
        tmp_path / "ledger", shape="hand-built", script=write_and_refunds, read_answer=words
    )
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    first = await kernel.turn("t1", "turn-1", "go")
    assert held_orders(first) == ["43"]
    assert [c["operation"] for c in read_ledger(desk.ledger)] == ["cancel"]
    second = await kernel.turn("t1", "turn-2", "yes")
    assert held_orders(second) == ["42"]
    assert [(c["operation"], c["order_id"]) for c in read_ledger(desk.ledger)] == [
        ("cancel", "42"),
        ("refund", "43"),
    ]
    done = await kernel.turn("t1", "turn-3", "yes")
    assert done.interaction is None
    assert done.reply == (
        'cancel_order={"id": "cancel_42"}, issue_refund={"id": "refund_43"}, '
        'issue_refund={"id": "refund_42"}'
    )
    assert [(c["operation"], c["order_id"]) for c in read_ledger(desk.ledger)] == [
        ("cancel", "42"),
        ("refund", "43"),
        ("refund", "42"),
    ]
    receipts = await store.list_receipts(thread_id="t1")
    assert {r.status for r in receipts} == {ReceiptStatus.COMPLETED}
    assert len(receipts) == 3


def test_a_tool_node_with_a_sync_wrapper_only_is_refused(tmp_path: Path) -> None:
    desk = Desk(tmp_path / "ledger")
    builder = StateGraph(MessagesState)
    node = ToolNode(desk.tools, wrap_tool_call=lambda request, execute: execute(request))
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    with pytest.raises(CompilationError, match="sync wrap_tool_call only"):
        KernelAgent(
            builder.compile(),
            name="desk",
            reads={"order_status"},
            writes={"cancel_order": str, "issue_refund": str},
        )


async def test_the_applications_tool_wrapper_runs_outside_the_receipt(
    store: Durability, tmp_path: Path
) -> None:
    seen: list[str] = []

    async def audit(request: Any, execute: Any) -> Any:
        seen.append(request.tool_call["name"])
        return await execute(request)

    desk = Desk(tmp_path / "ledger")
    model = desk.model
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", ToolNode(desk.tools, awrap_tool_call=audit))
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    builder.add_edge("tools", END)
    bridge = KernelAgent(
        builder.compile(),
        name="desk",
        reads={"order_status"},
        writes={"cancel_order": lambda a: a["order_id"], "issue_refund": str},
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    await kernel.turn("t1", "turn-1", "cancel 42")
    await kernel.turn("t1", "turn-2", "cancel 42")
    assert seen == ["cancel_order", "cancel_order"]
    assert len(read_ledger(desk.ledger)) == 1  # the second met its receipt


async def test_an_applications_llm_cache_still_serves_calls_outside_turns(tmp_path: Path) -> None:
    from langchain_core.caches import InMemoryCache
    from langchain_core.globals import get_llm_cache, set_llm_cache
    from langchain_core.messages import HumanMessage

    before = get_llm_cache()
    cache = InMemoryCache()
    set_llm_cache(cache)
    try:
        desk = Desk(tmp_path / "ledger")  # installs the journal's cache over it
        assert get_llm_cache() is not cache
        await desk.model.ainvoke([HumanMessage("status of 42")])
        await desk.model.ainvoke([HumanMessage("status of 42")])
        assert len(desk.requests) == 1  # the second came from the application's cache
        async with InMemoryDurability() as store:
            kernel = Kernel(desk.bridge.as_agent(version="1"), store)
            result = await kernel.turn("t1", "turn-1", "status of 42")
        # Inside the turn, the journal answers, never the application's cache: the
        # model was asked for call 1 too.
        assert result.reply == f"order_status: {json.dumps(STATUS_42)}"
        assert [len(r) for r in desk.requests] == [1, 1, 3]
    finally:
        set_llm_cache(before)


async def test_a_write_left_running_by_a_failed_tool_node_ends_within_its_step(
    store: Durability, tmp_path: Path
) -> None:
    """A ``ToolNode`` ends its task at a call's exception without cancelling the
    others: the kernel's step waits for a write still running, so its receipt is
    settled (not left ``prepared``) and its provider call counted once."""
    import asyncio

    ledger = tmp_path / "ledger"

    @tool
    def order_status(order_id: str) -> str:
        """An order's state."""
        raise RuntimeError("the status service is down")

    @tool
    async def cancel_order(order_id: str) -> dict[str, str]:
        """Cancel an order."""
        from bridge_support import record_write
        from intention_kernel.integrations.langgraph import effect_authority

        await asyncio.sleep(0.05)
        return record_write(str(ledger), effect_authority, "cancel", order_id)

    def script(messages: list[BaseMessage]) -> AIMessage:
        calls = [
            {"name": "order_status", "args": {"order_id": "42"}, "id": "s1"},
            {"name": "cancel_order", "args": {"order_id": "42"}, "id": "c1"},
        ]
        return AIMessage("", tool_calls=calls)

    model = ScriptedChatModel(script=script)
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda s: {"messages": [model.invoke(s["messages"])]})
    builder.add_node("tools", ToolNode([order_status, cancel_order]))
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    builder.add_edge("tools", END)
    bridge = KernelAgent(
        builder.compile(),
        name="desk",
        reads={"order_status"},
        writes={"cancel_order": lambda a: a["order_id"]},
    )
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t1", "turn-1", "go")
    assert [s.status for s in result.steps] == ["failed"]
    assert "the status service is down" in (result.steps[0].error or "")
    (receipt,) = await store.list_receipts(thread_id="t1")
    assert receipt.status == ReceiptStatus.COMPLETED
    assert len(read_ledger(ledger)) == 1


async def test_a_model_called_synchronously_in_an_async_node_fails_the_step(
    store: Durability, tmp_path: Path
) -> None:
    """Its journal lookup would block the event loop that must run it: refused, and
    the model is never asked."""
    desk = Desk(tmp_path / "ledger")
    model = desk.model

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_edge(START, "model")
    builder.add_edge("model", END)
    bridge = KernelAgent(builder.compile(), name="desk")
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t1", "turn-1", "hi")
    assert [s.status for s in result.steps] == ["failed"]
    assert "call it with ainvoke there" in (result.steps[0].error or "")
    assert desk.requests == []


async def test_a_journal_cache_replaced_by_the_application_fails_the_step(
    store: Durability, tmp_path: Path
) -> None:
    from langchain_core.globals import get_llm_cache, set_llm_cache

    desk = Desk(tmp_path / "ledger")
    before = get_llm_cache()
    set_llm_cache(None)  # after the bridge installed its cache
    try:
        result = await Kernel(desk.bridge.as_agent(version="1"), store).turn(
            "t1", "turn-1", "cancel 42"
        )
    finally:
        set_llm_cache(before)
    assert [s.status for s in result.steps] == ["failed"]
    assert "answered without the turn's journal" in (result.steps[0].error or "")
    assert read_ledger(desk.ledger) == []


def test_a_graph_run_by_one_kernel_agent_is_refused_by_another(tmp_path: Path) -> None:
    desk = Desk(tmp_path / "ledger")
    with pytest.raises(CompilationError, match="run by another KernelAgent already"):
        KernelAgent(
            desk.graph,
            name="other",
            reads={"order_status"},
            writes={"cancel_order": str, "issue_refund": str},
        )


async def test_an_interrupt_left_unanswered_reaches_its_node_as_a_reject(
    store: Durability,
) -> None:
    seen: list[Any] = []

    def review(state: MessagesState) -> dict[str, Any]:
        answer = interrupt({"plan": "restart the server"})
        seen.append(answer)
        return {"messages": [AIMessage(f"{answer['decision']}: {answer['reason']}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("review", review)
    builder.add_edge(START, "review")
    builder.add_edge("review", END)
    bridge = KernelAgent(builder.compile(), name="ops", approve_within=timedelta(minutes=5))
    clock = MovingClock()
    kernel = Kernel(bridge.as_agent(version="1"), store, clock=clock)
    asked = await kernel.turn("t1", "turn-1", "restart")
    assert asked.interaction is not None
    clock.now += timedelta(minutes=5)
    await kernel.turn("t1", "turn-2", "restart")
    assert seen[0] == {
        "decision": "reject",
        "reason": "The approval request closed unanswered.",
        "value": None,
        "actor": None,
    }


async def test_an_interrupt_in_a_subgraph_resumes_in_a_later_turn(store: Durability) -> None:
    """The saved state holds the paused subgraph's checkpoint too, until it ends."""

    def review(state: MessagesState) -> dict[str, Any]:
        answer = interrupt({"plan": "deploy"})
        return {"messages": [AIMessage(f"reviewed: {answer['decision']}")]}

    inner = StateGraph(MessagesState)
    inner.add_node("review", review)
    inner.add_edge(START, "review")
    inner.add_edge("review", END)
    outer = StateGraph(MessagesState)
    outer.add_node("inner", inner.compile())
    outer.add_node("after", lambda s: {"messages": [AIMessage(f"then {s['messages'][-1].text}")]})
    outer.add_edge(START, "inner")
    outer.add_edge("inner", "after")
    outer.add_edge("after", END)
    bridge = KernelAgent(outer.compile(), name="ops")
    kernel = Kernel(bridge.as_agent(version="1"), store)

    async def namespaces() -> list[str]:
        checkpoint = await store.load_checkpoint("t1")
        assert checkpoint is not None
        return [entry["ns"] for entry in checkpoint.facts["ops.conversation"].value["state"]]

    for run in ("1", "2"):
        asked = await kernel.turn("t1", f"ask-{run}", "go")
        assert asked.interaction is not None
        assert [c["value"] for c in asked.interaction.details] == [{"plan": "deploy"}]
        (subgraph,) = [ns for ns in await namespaces() if ns]
        assert subgraph.startswith("inner:")
        answer = Answer(digest=asked.interaction.digest)
        done = await kernel.turn("t1", f"answer-{run}", answer=answer)
        assert done.reply == "then reviewed: accept"
        # The finished subgraph's checkpoint is not kept: the fact does not grow.
        assert await namespaces() == [""]


async def test_an_interrupt_inside_a_write_tools_body_leaves_its_receipt_uncertain(
    store: Durability,
) -> None:
    """The pause comes after the receipt was held: whether the write ran before it is
    unknown, so it is never run again (``approve`` asks before the receipt)."""

    @tool
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        interrupt({"cancel": order_id})
        return "cancelled"

    def script(messages: list[BaseMessage]) -> AIMessage:
        call = {"name": "cancel_order", "args": {"order_id": "42"}, "id": "c1"}
        return AIMessage("", tool_calls=[call])

    graph = react_agent(ScriptedChatModel(script=script), [cancel_order])
    bridge = KernelAgent(graph, name="desk", writes={"cancel_order": lambda a: a["order_id"]})
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t1", "turn-1", "cancel")
    assert [s.status for s in result.steps] == ["uncertain"]
    (receipt,) = await store.list_receipts(thread_id="t1")
    assert receipt.status == ReceiptStatus.UNCERTAIN


@pytest.mark.slow
async def test_two_processes_on_one_thread_take_turns_and_lose_nothing(
    workers: Workers, tmp_path: Path
) -> None:
    """Two processes submit a turn of one thread at the same instant (LangGraph #8796:
    two writers on one thread). The kernel's lock serializes them: one turn's model
    calls all come before the other's, and the thread's state holds both exchanges."""
    import asyncio

    asks = tmp_path / "asks.jsonl"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    both: dict[str, Any] = {
        "asks": str(asks),
        "delay": 0.3,
        "barrier": {"dir": str(barrier), "count": 2},
    }
    first, second = await asyncio.gather(
        workers.run([{"thread_id": "t1", "turn_id": "a", "message": "status of 42"}], **both),
        workers.run([{"thread_id": "t1", "turn_id": "b", "message": "status of 43"}], **both),
    )
    calls = read_ledger(asks)
    pids = [c["pid"] for c in sorted(calls, key=lambda c: c["at"])]
    assert len(pids) == 4
    assert pids[0] == pids[1] != pids[2] == pids[3]  # never interleaved
    # Both were submitted before the first turn's last model call: they overlapped.
    assert max(first[0]["started"], second[0]["started"]) < calls[1]["at"]
    assert [c["messages"] for c in calls] == [1, 3, 5, 7]  # the second read the first
    third = {"thread_id": "t1", "turn_id": "c", "message": "status of 42"}
    (done,) = await workers.run([third], asks=str(asks))
    assert done["result"]["reply"] == f"order_status: {json.dumps(STATUS_42)}"
    # The next turn reads both exchanges (4 messages each) and its own message.
    assert [c["messages"] for c in read_ledger(asks)[4:]] == [9, 11]


async def test_a_subgraph_with_a_history_of_its_own_keeps_it_across_turns(
    store: Durability,
) -> None:
    """``compile(checkpointer=True)``: the subgraph's namespace names no task, and its
    checkpoint is kept from turn to turn."""

    class Inner(MessagesState, total=False):
        runs: int  # the subgraph's own: the parent's state has no such key

    def count(state: Inner) -> dict[str, Any]:
        runs = state.get("runs", 0) + 1
        return {"runs": runs, "messages": [AIMessage(f"run {runs}")]}

    inner = StateGraph(Inner)
    inner.add_node("count", count)
    inner.add_edge(START, "count")
    inner.add_edge("count", END)
    outer = StateGraph(MessagesState)
    outer.add_node("inner", inner.compile(checkpointer=True))
    outer.add_edge(START, "inner")
    outer.add_edge("inner", END)
    kernel = Kernel(KernelAgent(outer.compile(), name="ops").as_agent(version="1"), store)
    replies = [(await kernel.turn("t1", f"turn-{i}", "go")).reply for i in range(3)]
    assert replies == ["run 1", "run 2", "run 3"]
