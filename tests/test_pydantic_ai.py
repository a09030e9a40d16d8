"""The Pydantic AI bridge: an agent's loop inside durable turns.

Reads reach the model. A write tool is called once however often its turn is
delivered. That holds also when a real process dies after the provider call. A
``requires_approval=True`` tool is held as a kernel interaction bound to that exact
call, and it survives a restart. An accept runs exactly that call once, while a
reject's reason reaches the model as the denial. Each model response is recorded in
the turn's journal before its tools run: a redelivered turn asks the model only for
the requests it had not answered, streamed ones too. No API key: the model is a
``FunctionModel`` (``tests/pydantic_ai_support.py``).
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
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bridge_support import MovingClock, Workers, read_ledger, words
from intention_kernel import Answer, CorruptRecordError, Kernel, ReceiptStatus
from intention_kernel._checkpoint import operation_digest
from intention_kernel._effects import utcnow
from intention_kernel.durability import Durability
from intention_kernel.durability.abc import JournalEntry, RecordedDurability
from intention_kernel.integrations.pydantic_ai import KernelAgent
from intention_kernel.testing import faults
from proving_support import Store, make_sql_store, open_store
from pydantic_ai_support import Desk, tool_returns

WORKER = Path(__file__).with_name("pydantic_ai_worker.py")
REFUND = {
    "tool_name": "issue_refund",
    "tool_call_id": "call-refund",
    "args": {"order_id": "42", "cents": 1250},
}


def returns_of(desk: Desk) -> list[tuple[str, Any]]:
    """The tool results the model's last request carried."""
    return [(r.tool_name, r.content) for r in tool_returns(desk.requests[-1][-1])]


# -- in one process, every store ---------------------------------------------------------------


async def test_a_read_tools_result_reaches_the_model(store: Durability, tmp_path: Path) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    result = await kernel.turn("t1", "turn-1", "status of 42")
    status = {"order_id": "42", "status": "delivered", "cents": 1250}
    assert returns_of(desk) == [("order_status", status)]
    assert result.reply == f"order_status: {json.dumps(status)}"
    assert [s.status for s in result.steps] == ["completed"]
    # The history is the thread's: the next turn's run continues it.
    await kernel.turn("t1", "turn-2", "status of 43")
    prompts = [
        p
        for m in desk.requests[-1]
        for p in getattr(m, "parts", ())
        if p.part_kind == "user-prompt"
    ]
    assert [p.content for p in prompts] == ["status of 42", "status of 43"]
    assert read_ledger(desk.ledger) == []


def _run_starts(messages: list[Any]) -> list[int]:
    """Where runs start: each request holding the person's prompt."""
    return [
        i
        for i, m in enumerate(messages)
        if m.kind == "request" and any(p.part_kind == "user-prompt" for p in m.parts)
    ]


async def test_a_history_processor_bounds_the_conversation_fact_and_keeps_tool_pairs(
    store: Durability,
) -> None:
    """The bridge stores what the run returns, so Pydantic AI's ``ProcessHistory`` bounds
    the fact too. Each turn reads a tool (four messages a run). The processor keeps the
    last six messages from a run's start. Every request the model gets shows at most six,
    starting at a run and with each tool return beside its call. The stored history stays
    at most seven messages, and without the processor it keeps all forty."""
    last = 6

    def recent_runs(messages: list[ModelMessage]) -> list[ModelMessage]:
        starts = _run_starts(messages)
        kept = [i for i in starts if i >= len(messages) - last] or starts[-1:] or [0]
        return messages[kept[0] :]

    async def stored_after_ten_turns(processors: list[Any], thread: str) -> list[Any]:
        seen: list[list[ModelMessage]] = []

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append(list(messages))
            if messages[-1].parts[-1].part_kind == "user-prompt":
                return ModelResponse(parts=[ToolCallPart("order_status", {"order_id": "42"})])
            return ModelResponse(parts=[TextPart("delivered")])

        agent = PydanticAgent(FunctionModel(model), capabilities=processors)

        @agent.tool_plain
        def order_status(order_id: str) -> str:
            return "delivered"

        bridge = KernelAgent(agent, name="desk", writes={}, reads=["order_status"])
        kernel = Kernel(bridge.as_agent(version="1"), store)
        for n in range(10):
            result = await kernel.turn(thread, f"turn-{n}", f"status of 42, again ({n})")
            assert result.reply == "delivered", result.steps
        if processors:
            for messages in seen:
                assert len(messages) <= last and _run_starts(messages)[0] == 0
                called = {
                    p.tool_call_id for m in messages for p in m.parts if p.part_kind == "tool-call"
                }
                returned = {
                    p.tool_call_id
                    for m in messages
                    for p in m.parts
                    if p.part_kind == "tool-return"
                }
                assert returned <= called
        checkpoint = await kernel.checkpoint(thread)
        assert checkpoint is not None
        stored: list[Any] = checkpoint.facts["desk.conversation"].value["messages"]
        return stored

    bounded = await stored_after_ten_turns([ProcessHistory(recent_runs)], "bounded")
    assert 1 < len(bounded) <= last + 1
    assert len(await stored_after_ten_turns([], "whole")) == 40


async def test_a_write_tool_is_called_once_when_its_turn_is_redelivered(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    faults.inject(faults.BEFORE_COMMIT, "raise")
    try:
        with pytest.raises(faults.InjectedFault):
            await kernel.turn("t1", "turn-1", "cancel 42")
    finally:
        faults.clear()
    assert len(read_ledger(desk.ledger)) == 1  # the write ran; the turn did not commit
    redelivered = await kernel.turn("t1", "turn-1", "cancel 42")
    assert not redelivered.replayed
    assert [s.status for s in redelivered.steps] == ["completed"]
    assert returns_of(desk) == [("cancel_order", {"id": "cancel_42"})]  # the stored value
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


async def journal(store: Durability, turn_id: str) -> list[str]:
    """The keys of the journal entries of ``turn_id`` on thread ``t1``."""
    assert isinstance(store, RecordedDurability)  # every store of the ``store`` fixture
    recorder = await store.recorder()
    return [entry.key for entry in await recorder.read_journal("t1", turn_id)]


async def test_a_redelivered_turn_asks_the_model_only_for_the_requests_it_did_not_record(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    # The turn dies after the cancel's receipt completed: request 1 (which asked for
    # the cancel) is recorded, request 2 (which reads its result) was never made.
    with (
        faults.injected(faults.AFTER_RECEIPT_COMPLETED, "raise"),
        pytest.raises(faults.InjectedFault),
    ):
        await kernel.turn("t1", "turn-1", "cancel 42")
    assert [len(r) for r in desk.requests] == [1]
    # The kernel's round 1 (run the agent) and the agent's request 1.
    assert await journal(store, "turn-1") == ["kernel.round.1", "turn-1#1:pydantic_ai.model.1"]
    redelivered = await kernel.turn("t1", "turn-1", "cancel 42")
    # Only request 2 was asked: the prompt, the recorded response, the tool's result.
    assert [len(r) for r in desk.requests] == [1, 3]
    assert returns_of(desk) == [("cancel_order", {"id": "cancel_42"})]
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
    assert await journal(store, "turn-1") == [
        "kernel.round.1",
        "turn-1#1:pydantic_ai.model.1",
        "turn-1#1:pydantic_ai.model.2",
    ]
    redelivered = await kernel.turn("t1", "turn-1", "status of 42")
    assert len(desk.requests) == 2
    status = {"order_id": "42", "status": "delivered", "cents": 1250}
    assert redelivered.reply == f"order_status: {json.dumps(status)}"
    # The committed history holds the recorded responses: the next turn continues it.
    await kernel.turn("t1", "turn-2", "status of 43")
    assert [len(r) for r in desk.requests] == [1, 3, 5, 7]


async def test_a_streamed_model_request_is_recorded_and_its_events_replayed(
    store: Durability, tmp_path: Path
) -> None:
    from collections.abc import AsyncIterable

    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai import RunContext
    from pydantic_ai.capabilities import ProcessEventStream
    from pydantic_ai.messages import PartDeltaEvent, PartStartEvent
    from pydantic_ai.models.function import (
        DeltaToolCall,
        DeltaToolCalls,
        FunctionModel,
    )

    cancelled: list[str] = []
    streamed: list[int] = []
    text: list[str] = []

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        streamed.append(len(messages))
        if tool_returns(messages[-1]):
            for word in ("cancelled ", "order ", "42"):
                yield word
            return
        yield {0: DeltaToolCall("cancel_order", '{"order_id": "42"}', tool_call_id="call-cancel")}

    async def handler(ctx: RunContext[None], events: AsyncIterable[Any]) -> None:
        async for event in events:
            if isinstance(event, PartStartEvent) and event.part.part_kind == "text":
                text.append(event.part.content)
            elif isinstance(event, PartDeltaEvent) and event.delta.part_delta_kind == "text":
                text.append(event.delta.content_delta)

    agent: PydanticAgent[None, str] = PydanticAgent(
        # A run with an event stream handler streams its model requests.
        FunctionModel(stream_function=stream),
        capabilities=[ProcessEventStream(handler)],
    )

    @agent.tool_plain
    def cancel_order(order_id: str) -> str:
        cancelled.append(order_id)
        return "ok"

    bridge = KernelAgent(agent, name="desk", writes={"cancel_order": lambda a: a["order_id"]})
    kernel = Kernel(bridge.as_agent(version="1"), store)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "cancel 42")
    assert streamed == [1, 3]
    assert "".join(text) == "cancelled order 42"
    text.clear()
    redelivered = await kernel.turn("t1", "turn-1", "cancel 42")
    assert streamed == [1, 3]  # the model was not asked again
    assert cancelled == ["42"]
    assert redelivered.reply == "cancelled order 42"
    assert "".join(text) == "cancelled order 42"  # made again from the recorded parts


async def test_a_recorded_response_that_cannot_be_decoded_commits_nothing(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    assert isinstance(store, RecordedDurability)
    recorder = await store.recorder()
    entry = JournalEntry(
        "t1", "turn-1", "turn-1#1:pydantic_ai.model.1", None, '{"parts": 3}', utcnow()
    )
    async with recorder.lock("t1"):
        await recorder.write_journal(entry)
    with pytest.raises(CorruptRecordError, match=r"'pydantic_ai\.model\.1' of step 'turn-1#1'"):
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
    assert returns_of(desk) == [("cancel_order", {"id": "cancel_42"})]


async def test_an_approval_tool_is_held_as_an_interaction_bound_to_the_exact_call(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    asked = await kernel.turn("t1", "turn-1", "refund 42")
    interaction = asked.interaction
    assert interaction is not None
    assert interaction.kind == "capability"
    assert interaction.input == {"approvals": [REFUND], "prompt": None}
    assert interaction.details == [REFUND]
    assert interaction.digest == operation_digest("capability", "desk.agent", interaction.input)
    assert '{"cents": 1250, "order_id": "42"}' in interaction.prompt
    assert interaction.prompt in asked.reply
    assert [s.status for s in asked.steps] == ["completed", "awaiting_confirmation"]
    assert read_ledger(desk.ledger) == []
    # While it waits, a new message gets the question again; the model is not asked.
    requests = len(desk.requests)
    waiting = await kernel.turn("t1", "turn-2", "status of 43")
    assert interaction.prompt in waiting.reply
    assert len(desk.requests) == requests
    assert waiting.interaction == interaction


async def test_an_accept_with_another_digest_runs_nothing(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    asked = await kernel.turn("t1", "turn-1", "refund 42")
    assert asked.interaction is not None
    other = operation_digest(
        "capability",
        "desk.agent",
        {"approvals": [{**REFUND, "args": {"order_id": "42", "cents": 99999}}], "prompt": None},
    )
    refused = await kernel.turn("t1", "turn-2", answer=Answer(digest=other))
    assert refused.steps == ()
    assert refused.interaction == asked.interaction
    assert read_ledger(desk.ledger) == []
    accepted = await kernel.turn("t1", "turn-3", answer=Answer(digest=asked.interaction.digest))
    assert [s.status for s in accepted.steps] == ["completed"]
    assert [(c["operation"], c["cents"]) for c in read_ledger(desk.ledger)] == [("refund", 1250)]


async def test_a_rejects_reason_reaches_the_model_as_the_denial(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    await kernel.turn("t1", "turn-1", "refund 42")
    rejected = await kernel.turn(
        "t1", "turn-2", answer=Answer(decision="reject", reason="it arrived intact")
    )
    assert returns_of(desk) == [("issue_refund", "it arrived intact")]
    assert tool_returns(desk.requests[-1][-1])[0].outcome == "denied"
    assert rejected.reply == "Not refunded: it arrived intact"
    assert rejected.interaction is None
    assert read_ledger(desk.ledger) == []
    # The run ended: the next message starts a new one on the same history.
    await kernel.turn("t1", "turn-3", "status of 43")
    assert returns_of(desk)[0][0] == "order_status"


async def test_an_approval_tool_without_a_key_is_refused_before_asking(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    # Listed as a read, the approval tool passes the bridge's list and fails at its call.
    bridge = KernelAgent(
        desk.agent,
        name="desk",
        writes={"cancel_order": lambda a: a["order_id"]},
        reads=["order_status", "issue_refund"],
    )
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t1", "turn-1", "refund 42")
    assert [s.status for s in result.steps] == ["failed"]
    assert "'issue_refund' needs approval but has no key in writes" in (result.steps[0].error or "")
    assert result.interaction is None
    assert read_ledger(desk.ledger) == []


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
        desk.agent,
        name="desk",
        writes={"cancel_order": key_of, "issue_refund": lambda a: a["order_id"]},
        reads=["order_status"],
    )
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t1", "turn-1", "cancel 42")
    assert [s.status for s in result.steps] == ["failed"]
    assert error in (result.steps[0].error or "")
    assert read_ledger(desk.ledger) == []
    assert await store.list_receipts(thread_id="t1") == []


async def test_an_approval_that_expires_reaches_the_model_as_denied(
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
    denial = tool_returns(desk.requests[before][-1])
    assert [(r.tool_name, r.content) for r in denial] == [
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
    assert returns_of(desk) == [("issue_refund", "it arrived intact")]
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
    assert returns_of(desk) == [("issue_refund", {"id": "refund_42"})]
    assert done.reply == 'issue_refund: {"id": "refund_42"}'
    assert len(read_ledger(desk.ledger)) == 1


def test_importing_the_bridge_without_pydantic_ai_names_the_extra() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pydantic_ai' or name.startswith('pydantic_ai.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import intention_kernel.integrations.pydantic_ai\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "pip install 'intention-kernel[pydantic-ai]'" in proc.stderr


# -- real processes: SQLite and PostgreSQL -----------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path, file="desk.db", name_sessions=True)


@pytest.fixture
def workers(sql_store: Store, tmp_path: Path) -> Workers:
    return Workers(WORKER, sql_store, tmp_path / "provider.ledger")


@pytest.mark.slow
async def test_a_process_killed_after_the_write_is_redelivered_with_one_provider_call(
    workers: Workers, tmp_path: Path
) -> None:
    """SIGKILL after round 1's write: the redelivery asks the model only for request 2
    (request 1 is recorded) and the shop is called once."""
    asks = tmp_path / "asks.jsonl"
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    died = await workers.run(
        [turn],
        asks=str(asks),
        fault={"point": faults.AFTER_RECEIPT_COMPLETED, "action": "sigkill"},
        status=-signal.SIGKILL,
    )
    assert died == []
    assert len(read_ledger(workers.ledger)) == 1
    (first,) = read_ledger(asks)
    assert first["messages"] == 1
    # The kernel's round 1 (run the agent) and the agent's request 1.
    assert workers.store.query("SELECT count(*) FROM ik_journal") == [(2,)]
    (redelivered,) = await workers.run([turn], asks=str(asks))
    result = redelivered["result"]
    assert result["replayed"] is False
    assert [s["status"] for s in result["steps"]] == ["completed"]
    assert redelivered["returns"] == [{"tool": "cancel_order", "content": {"id": "cancel_42"}}]
    again = [a for a in read_ledger(asks) if a["pid"] != first["pid"]]
    assert [a["messages"] for a in again] == [3]  # request 2 only
    calls = read_ledger(workers.ledger)
    assert len(calls) == 1  # provider_calls=1
    assert calls[0]["key"] == "desk.agent:cancel_order:42"
    assert workers.store.query("SELECT count(*) FROM ik_journal") == [(0,)]


@pytest.mark.slow
async def test_a_process_killed_inside_the_provider_call_leaves_the_write_uncertain(
    workers: Workers,
) -> None:
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    await workers.run(
        [turn],
        fault={"point": faults.IN_PROVIDER_AFTER_WRITE, "action": "exit"},
        status=faults.EXIT_STATUS,
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
    assert interaction["details"] == [REFUND]
    accept = {"thread_id": "t1", "turn_id": "turn-2", "answer": {"digest": interaction["digest"]}}
    # A new process accepts and dies after the refund's provider call, before its turn
    # commits; the same delivery comes again, in another process, and again after that.
    died = await workers.run(
        [accept],
        fault={"point": faults.AFTER_RECEIPT_COMPLETED, "action": "exit"},
        status=faults.EXIT_STATUS,
    )
    assert died == []
    assert len(read_ledger(workers.ledger)) == 1
    (done,) = await workers.run([accept])
    assert done["result"]["replayed"] is False
    assert done["returns"] == [{"tool": "issue_refund", "content": {"id": "refund_42"}}]
    assert done["result"]["reply"] == 'issue_refund: {"id": "refund_42"}'
    (again,) = await workers.run([accept])
    assert again["result"]["replayed"] is True
    calls = read_ledger(workers.ledger)
    assert [(c["operation"], c["order_id"], c["cents"]) for c in calls] == [("refund", "42", 1250)]
    assert len({c["pid"] for c in calls}) == 1


async def test_approvals_asked_together_are_held_and_answered_together(
    store: Durability, tmp_path: Path
) -> None:
    """Pydantic AI resumes a run only with a result for every call it deferred: one
    interaction holds them all, and its digest binds each."""
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    refunded: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages[-1])
        if returns:
            return ModelResponse(parts=[TextPart(", ".join(str(r.content) for r in returns))])
        return ModelResponse(
            parts=[
                ToolCallPart("refund", {"order_id": order}, tool_call_id=f"call-{order}")
                for order in ("42", "43")
            ]
        )

    agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(model))

    # Sequential: Pydantic AI runs a response's tool calls concurrently otherwise, and
    # the order of the two refunds is what this test reads.
    @agent.tool_plain(requires_approval=True, sequential=True)
    def refund(order_id: str) -> str:
        refunded.append(order_id)
        return f"refunded {order_id}"

    bridge = KernelAgent(agent, name="desk", writes={"refund": lambda args: args["order_id"]})
    kernel = Kernel(bridge.as_agent(version="1"), store)
    first = await kernel.turn("t1", "turn-1", "refund both")
    assert first.interaction is not None
    assert [c["args"] for c in first.interaction.details] == [
        {"order_id": "42"},
        {"order_id": "43"},
    ]
    assert first.interaction.prompt.count("Run refund with") == 2
    accepted = await kernel.turn("t1", "turn-2", answer="accept")
    assert refunded == ["42", "43"]
    assert accepted.reply == "refunded 42, refunded 43"
    await kernel.turn("t1", "turn-3", "refund both")
    rejected = await kernel.turn("t1", "turn-4", answer=Answer(decision="reject", reason="no"))
    assert refunded == ["42", "43"]  # (the receipts would have answered a second run too)
    assert rejected.reply == "no, no"


def test_a_kernel_agent_needs_an_agent_with_a_model_instance() -> None:
    from pydantic_ai import Agent as PydanticAgent

    with pytest.raises(TypeError, match="needs an agent with a model"):
        KernelAgent(PydanticAgent(), name="desk")


async def test_a_write_tool_that_did_nothing_fails_its_step_and_may_run_again(
    store: Durability, tmp_path: Path
) -> None:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from intention_kernel import EffectNotAppliedError

    attempts: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if tool_returns(messages[-1]):
            return ModelResponse(parts=[TextPart("cancelled")])
        return ModelResponse(parts=[ToolCallPart("cancel_order", {"order_id": "42"})])

    agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(model))

    @agent.tool_plain
    def cancel_order(order_id: str) -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise EffectNotAppliedError("the shop refused: try again")
        return "ok"

    bridge = KernelAgent(agent, name="desk", writes={"cancel_order": lambda a: a["order_id"]})
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


async def test_an_approved_call_whose_arguments_its_schema_coerced_runs(
    store: Durability,
) -> None:
    """The binding compares the arguments as the tool's schema validates them: a number
    the model sent as text is the number the person was shown."""
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    refunds: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if tool_returns(messages[-1]):
            return ModelResponse(parts=[TextPart("refunded")])
        call = ToolCallPart("refund", {"order_id": "42", "cents": "1250"}, tool_call_id="c1")
        return ModelResponse(parts=[call])

    agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(model))

    @agent.tool_plain(requires_approval=True)
    def refund(order_id: str, cents: int) -> str:
        refunds.append(cents)
        return "ok"

    bridge = KernelAgent(agent, name="desk", writes={"refund": lambda args: args["order_id"]})
    kernel = Kernel(bridge.as_agent(version="1"), store)
    held = await kernel.turn("t1", "turn-1", "refund")
    assert held.interaction is not None
    assert held.interaction.details[0]["args"] == {"order_id": "42", "cents": "1250"}
    accepted = await kernel.turn("t1", "turn-2", answer="accept")
    assert accepted.reply == "refunded"
    assert refunds == [1250]


async def test_a_turn_validates_the_stored_history_once_however_long_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history is read once a turn, by the run that needs it: the interpreter
    reads only the calls held for approval. Validating every message twice a turn
    made each turn cost more, the longer its thread."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from intention_kernel.integrations.pydantic_ai import _held
    from intention_kernel.testing import InMemoryDurability

    validated: list[int] = []
    real = ModelMessagesTypeAdapter

    class Counting:
        def validate_python(self, value: Any) -> Any:
            validated.append(len(value))
            return real.validate_python(value)

        def dump_python(self, value: Any, **options: Any) -> Any:
            return real.dump_python(value, **options)

    monkeypatch.setattr(_held, "ModelMessagesTypeAdapter", Counting())
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), InMemoryDurability())
    for n in range(4):
        validated.clear()
        result = await kernel.turn("t1", f"turn-{n}", "status of 42")
        assert result.steps[0].status == "completed"
        # The capability's own read of the history; the first turn has none yet.
        assert len(validated) == (1 if n else 0)
    assert validated[0] > 0  # the history of the earlier turns
