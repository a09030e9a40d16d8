"""The OpenAI Agents SDK bridge: a ``Runner`` loop inside durable turns.

Reads reach the model. A write tool is called once however often its turn is
delivered. That holds also when a real process is killed (SIGKILL) after the provider
call. The model is not asked again for a response the turn recorded. A
``needs_approval`` tool is held as a kernel interaction bound to that exact call. Its
paused ``RunState`` is kept in the thread's checkpoint. So an approval in a new process
resumes exactly that run and runs the call once. A reject's reason reaches the
model. No API key: the model is a fake ``Model`` (``tests/openai_agents_support.py``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from agents import Agent as SDKAgent
from agents import function_tool

from bridge_support import MovingClock, Workers, read_ledger, words
from intention_kernel import Answer, EffectNotAppliedError, Kernel, ReceiptStatus
from intention_kernel._checkpoint import operation_digest
from intention_kernel.durability import Durability
from intention_kernel.integrations.openai_agents import KernelAgent
from intention_kernel.testing import faults
from openai_agents_support import Desk, FakeModel, call, outputs, prompts, text
from proving_support import Store, make_sql_store, open_store

WORKER = Path(__file__).with_name("openai_agents_worker.py")
REFUND = {
    "tool_name": "issue_refund",
    "call_id": "call-refund-1",
    "arguments": {"order_id": "42", "cents": 1250},
}
STATUS_42 = str({"order_id": "42", "status": "delivered", "cents": 1250})


# -- in one process, every store ---------------------------------------------------------------


async def test_a_read_tools_result_reaches_the_model(store: Durability, tmp_path: Path) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    result = await kernel.turn("t1", "turn-1", "status of 42")
    assert outputs(desk.requests[-1]) == [("order_status", STATUS_42)]
    assert result.reply == f"order_status: {STATUS_42}"
    assert [s.status for s in result.steps] == ["completed"]
    # The input items are the thread's: the next turn's run continues them.
    await kernel.turn("t1", "turn-2", "status of 43")
    assert prompts(desk.requests[-1]) == ["status of 42", "status of 43"]
    assert read_ledger(desk.ledger) == []


async def test_a_write_tool_is_called_once_and_the_model_not_asked_again_on_redelivery(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "cancel 42")
    assert len(read_ledger(desk.ledger)) == 1  # the write ran; the turn did not commit
    assert len(desk.requests) == 2  # the call, then the text after its output
    redelivered = await kernel.turn("t1", "turn-1", "cancel 42")
    assert not redelivered.replayed
    assert len(desk.requests) == 2  # both responses were recorded: none asked again
    assert [s.status for s in redelivered.steps] == ["completed"]
    assert redelivered.reply == "cancel_order: {'id': 'cancel_42'}"
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
    # The commit deleted the turn's recorded responses: a new turn asks the model.
    await kernel.turn("t1", "turn-2", "status of 43")
    assert len(desk.requests) == 4


async def test_the_same_operation_asked_again_in_a_later_turn_meets_its_receipt(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    await kernel.turn("t1", "turn-1", "cancel 42")
    await kernel.turn("t1", "turn-2", "cancel 42")
    assert len(read_ledger(desk.ledger)) == 1
    assert outputs(desk.requests[-1]) == [("cancel_order", "{'id': 'cancel_42'}")]


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
    # The paused RunState is in the thread's checkpoint, as a fact.
    checkpoint = await store.load_checkpoint("t1")
    assert checkpoint is not None
    held = checkpoint.facts["desk.conversation"].value
    assert held["pending"] == [REFUND]
    assert held["state"]["$schemaVersion"]
    # While it waits, a new message gets the question again; the model is not asked.
    requests = len(desk.requests)
    waiting = await kernel.turn("t1", "turn-2", "status of 43")
    assert interaction.prompt in waiting.reply
    assert len(desk.requests) == requests
    assert waiting.interaction == interaction


async def test_an_old_approval_does_not_run_a_different_call(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    asked = await kernel.turn("t1", "turn-1", "refund 42")
    assert asked.interaction is not None
    other = operation_digest(
        "capability",
        "desk.agent",
        {
            "approvals": [{**REFUND, "arguments": {"order_id": "42", "cents": 99999}}],
            "prompt": None,
        },
    )
    refused = await kernel.turn("t1", "turn-2", answer=Answer(digest=other))
    assert refused.steps == ()
    assert refused.interaction == asked.interaction
    assert read_ledger(desk.ledger) == []
    # The first refund is rejected; the model proposes another call: the first
    # approval's digest does not run it.
    await kernel.turn("t1", "turn-3", answer=Answer(decision="reject", reason="not yet"))
    second = await kernel.turn("t1", "turn-4", "refund 42")
    assert second.interaction is not None
    assert second.interaction.details == [{**REFUND, "call_id": "call-refund-2"}]
    stale = await kernel.turn("t1", "turn-5", answer=Answer(digest=asked.interaction.digest))
    assert stale.steps == ()
    assert read_ledger(desk.ledger) == []
    accepted = await kernel.turn("t1", "turn-6", answer=Answer(digest=second.interaction.digest))
    assert [s.status for s in accepted.steps] == ["completed"]
    assert [(c["operation"], c["cents"]) for c in read_ledger(desk.ledger)] == [("refund", 1250)]


async def test_a_rejects_reason_reaches_the_model(store: Durability, tmp_path: Path) -> None:
    desk = Desk(tmp_path / "ledger")
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    await kernel.turn("t1", "turn-1", "refund 42")
    rejected = await kernel.turn(
        "t1", "turn-2", answer=Answer(decision="reject", reason="it arrived intact")
    )
    assert outputs(desk.requests[-1]) == [("issue_refund", "it arrived intact")]
    assert rejected.reply == "Not refunded: it arrived intact"
    assert rejected.interaction is None
    assert read_ledger(desk.ledger) == []
    # The run ended: the next message starts a new one on the same items.
    await kernel.turn("t1", "turn-3", "status of 43")
    assert outputs(desk.requests[-1])[0][0] == "order_status"
    assert prompts(desk.requests[-1]) == ["refund 42", "status of 43"]


async def test_an_approval_tool_without_a_key_is_refused_before_asking(
    store: Durability, tmp_path: Path
) -> None:
    # Listed as a read, the approval tool passes the bridge's list and fails at its call.
    desk = Desk(
        tmp_path / "ledger",
        writes={"cancel_order": lambda a: a["order_id"]},
        reads=["order_status", "issue_refund"],
    )
    result = await Kernel(desk.bridge.as_agent(version="1"), store).turn(
        "t1", "turn-1", "refund 42"
    )
    assert [s.status for s in result.steps] == ["failed"]
    assert "'issue_refund' needs approval but has no key in writes" in (result.steps[0].error or "")
    assert result.interaction is None
    assert read_ledger(desk.ledger) == []


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
    assert outputs(desk.requests[before]) == [
        ("issue_refund", "The approval request closed unanswered.")
    ]
    assert outputs(desk.requests[-1])[0][0] == "order_status"
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
    assert accepted.reply == "issue_refund: {'id': 'refund_42'}"
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
    assert outputs(desk.requests[-1]) == [("issue_refund", "{'id': 'refund_42'}")]
    assert done.reply == "issue_refund: {'id': 'refund_42'}"
    assert len(desk.requests) == 1  # the resumed run asked once: for the text
    assert len(read_ledger(desk.ledger)) == 1


def rewrite_strings(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [rewrite_strings(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: rewrite_strings(v, old, new) for k, v in value.items()}
    return value


async def test_a_paused_run_whose_call_differs_from_the_approved_one_runs_nothing(
    tmp_path: Path,
) -> None:
    """The accept is checked twice: its digest against the interaction, and the paused
    RunState's interruptions against the approved calls. A stored run whose refund was
    changed to another amount (the interaction still showing 1250) runs nothing."""
    import sqlite3

    from intention_kernel.durability.sqlite import SQLiteDurability

    path = tmp_path / "desk.db"
    async with SQLiteDurability(path) as first:
        asked = await Kernel(Desk(tmp_path / "ledger").bridge.as_agent(version="1"), first).turn(
            "t1", "turn-1", "refund 42"
        )
    assert asked.interaction is not None
    with sqlite3.connect(path) as db:
        (body,) = db.execute("SELECT body FROM ik_facts WHERE key = 'desk.conversation'").fetchone()
        fact = json.loads(body)
        fact["value"]["state"] = rewrite_strings(
            fact["value"]["state"], '"cents": 1250', '"cents": 99999'
        )
        db.execute(
            "UPDATE ik_facts SET body = ? WHERE key = 'desk.conversation'", (json.dumps(fact),)
        )
    desk = Desk(tmp_path / "ledger")
    async with SQLiteDurability(path) as second:
        kernel = Kernel(desk.bridge.as_agent(version="1"), second)
        refused = await kernel.turn("t1", "turn-2", answer=Answer(digest=asked.interaction.digest))
    assert [s.status for s in refused.steps] == ["failed"]
    assert "differ from the approved ones; nothing ran" in (refused.steps[0].error or "")
    assert read_ledger(desk.ledger) == []
    assert desk.requests == []


async def test_approvals_asked_together_are_held_and_answered_together(
    store: Durability,
) -> None:
    refunded: list[str] = []

    def script(items: list[dict[str, Any]]) -> list[Any]:
        done = outputs(items)
        if done:
            return [text(", ".join(output for _, output in done))]
        return [call("refund", {"order_id": o}, f"call-{o}") for o in ("42", "43")]

    @function_tool(needs_approval=True)
    def refund(order_id: str) -> str:
        """Refund an order."""
        refunded.append(order_id)
        return f"refunded {order_id}"

    agent: SDKAgent[Any] = SDKAgent(name="desk", model=FakeModel(script), tools=[refund])
    bridge: KernelAgent[Any] = KernelAgent(
        agent, name="desk", writes={"refund": lambda args: args["order_id"]}
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    first = await kernel.turn("t1", "turn-1", "refund both")
    assert first.interaction is not None
    assert [c["arguments"] for c in first.interaction.details] == [
        {"order_id": "42"},
        {"order_id": "43"},
    ]
    assert first.interaction.prompt.count("Run refund with") == 2
    accepted = await kernel.turn("t1", "turn-2", answer="accept")
    assert sorted(refunded) == ["42", "43"]
    assert accepted.reply == "refunded 42, refunded 43"
    await kernel.turn("t1", "turn-3", "refund both")
    rejected = await kernel.turn("t1", "turn-4", answer=Answer(decision="reject", reason="no"))
    assert sorted(refunded) == ["42", "43"]
    assert rejected.reply == "no, no"


def two_refunds_one_by_one() -> tuple[SDKAgent[Any], list[str]]:
    """A model that asks to refund 42, and once that is done, 43: two approvals in a row."""
    refunded: list[str] = []

    def script(items: list[dict[str, Any]]) -> list[Any]:
        done = [i for i in items if i.get("type") == "function_call_output"]
        if not done:
            return [call("refund", {"order_id": "42"}, "call-42")]
        if len(done) == 1:
            return [call("refund", {"order_id": "43"}, "call-43")]
        return [text("both refunded")]

    @function_tool(needs_approval=True)
    def refund(order_id: str) -> str:
        """Refund an order."""
        refunded.append(order_id)
        return f"refunded {order_id}"

    return SDKAgent(name="desk", model=FakeModel(script), tools=[refund]), refunded


def agent_requests(agent: SDKAgent[Any]) -> list[list[dict[str, Any]]]:
    assert isinstance(agent.model, FakeModel)
    return agent.model.requests


async def test_a_resumed_run_that_asks_for_another_approval_asks_it_in_the_same_turn(
    store: Durability,
) -> None:
    agent, refunded = two_refunds_one_by_one()
    bridge: KernelAgent[Any] = KernelAgent(
        agent, name="desk", writes={"refund": lambda args: args["order_id"]}, read_answer=words
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    first = await kernel.turn("t1", "turn-1", "refund both, one by one")
    assert first.interaction is not None
    assert [c["arguments"] for c in first.interaction.details] == [{"order_id": "42"}]
    second = await kernel.turn("t1", "turn-2", "yes")
    assert refunded == ["42"]
    assert second.interaction is not None  # the resumed run paused again: asked at once
    assert [c["arguments"] for c in second.interaction.details] == [{"order_id": "43"}]
    third = await kernel.turn("t1", "turn-3", "yes")
    assert refunded == ["42", "43"]
    assert third.reply == "both refunded"
    assert third.interaction is None


async def test_an_answer_only_turn_leaves_the_next_approval_for_the_next_message(
    store: Durability,
) -> None:
    """A turn with ``answer=`` and no message asks no interpreter: the resumed run's
    next approval is asked before the next message is read."""
    agent, refunded = two_refunds_one_by_one()
    bridge: KernelAgent[Any] = KernelAgent(
        agent, name="desk", writes={"refund": lambda args: args["order_id"]}
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    await kernel.turn("t1", "turn-1", "refund both, one by one")
    second = await kernel.turn("t1", "turn-2", answer="accept")
    assert refunded == ["42"]
    assert second.interaction is None
    third = await kernel.turn("t1", "turn-3", "and the other one?")
    assert third.interaction is not None
    assert [c["arguments"] for c in third.interaction.details] == [{"order_id": "43"}]
    assert third.interaction.prompt in third.reply
    done = await kernel.turn("t1", "turn-4", answer="accept")
    assert refunded == ["42", "43"]
    assert done.reply == "both refunded"
    # The message sent while the approval waited was not given to the agent.
    assert prompts(agent_requests(agent)[-1]) == ["refund both, one by one"]


async def test_a_model_named_in_the_run_config_is_resolved_by_its_provider_and_recorded(
    store: Durability, tmp_path: Path
) -> None:
    from agents import RunConfig
    from agents.models.interface import Model, ModelProvider

    desk = Desk(tmp_path / "ledger")
    asked: list[str | None] = []

    class Provider(ModelProvider):
        def get_model(self, model_name: str | None) -> Model:
            asked.append(model_name)
            return desk.model

    bridge: KernelAgent[Any] = KernelAgent(
        desk.agent.clone(model=None),
        name="desk",
        writes={
            "cancel_order": lambda args: args["order_id"],
            "issue_refund": lambda args: args["order_id"],
        },
        reads=["order_status"],
        run_config=RunConfig(model="desk-model-1", model_provider=Provider()),
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
        await kernel.turn("t1", "turn-1", "cancel 42")
    assert asked == ["desk-model-1"]
    assert len(desk.requests) == 2
    redelivered = await kernel.turn("t1", "turn-1", "cancel 42")
    assert redelivered.reply == "cancel_order: {'id': 'cancel_42'}"
    assert len(desk.requests) == 2  # recorded, through the config's model too
    assert len(read_ledger(desk.ledger)) == 1


# -- writes that fail, bad input ---------------------------------------------------------------


def single_tool_agent(tool: Any, arguments: dict[str, Any]) -> tuple[SDKAgent[Any], FakeModel]:
    def script(items: list[dict[str, Any]]) -> list[Any]:
        done = outputs(items)
        if done:
            return [text(f"tool said: {done[-1][1]}")]
        return [call(tool.name, arguments, f"call-{len(prompts(items))}")]

    model = FakeModel(script)
    return SDKAgent(name="desk", model=model, tools=[tool]), model


async def test_a_write_tool_that_did_nothing_fails_its_step_and_may_run_again(
    store: Durability,
) -> None:
    attempts: list[int] = []

    @function_tool
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise EffectNotAppliedError("the shop refused: try again")
        return "ok"

    agent, _ = single_tool_agent(cancel_order, {"order_id": "42"})
    bridge: KernelAgent[Any] = KernelAgent(
        agent, name="desk", writes={"cancel_order": lambda a: a["order_id"]}
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    first = await kernel.turn("t1", "turn-1", "cancel 42")
    assert [s.status for s in first.steps] == ["failed"]
    assert "the shop refused" in (first.steps[0].error or "")
    (receipt,) = await store.list_receipts(thread_id="t1")
    assert receipt.status == ReceiptStatus.FAILED
    second = await kernel.turn("t1", "turn-2", "cancel 42")
    assert second.reply == "tool said: ok"
    assert attempts == [1, 2]
    (receipt,) = await store.list_receipts(thread_id="t1")
    assert (receipt.status, receipt.attempt) == (ReceiptStatus.COMPLETED, 2)


async def test_a_write_tool_that_raises_is_uncertain_and_never_run_again(
    store: Durability,
) -> None:
    """The tool's failure handler would tell the model "an error occurred" and the run
    would go on as if nothing was written; the bridge leaves the receipt uncertain."""
    attempts: list[str] = []

    @function_tool
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        attempts.append(order_id)
        raise ConnectionError("the answer was lost")

    agent, _ = single_tool_agent(cancel_order, {"order_id": "42"})
    bridge: KernelAgent[Any] = KernelAgent(
        agent, name="desk", writes={"cancel_order": lambda a: a["order_id"]}
    )
    kernel = Kernel(bridge.as_agent(version="1"), store)
    first = await kernel.turn("t1", "turn-1", "cancel 42")
    assert [s.status for s in first.steps] == ["uncertain"]
    second = await kernel.turn("t1", "turn-2", "cancel 42")
    assert [s.status for s in second.steps] == ["uncertain"]
    assert attempts == ["42"]
    (receipt,) = await store.list_receipts(thread_id="t1")
    assert receipt.status == ReceiptStatus.UNCERTAIN


async def test_arguments_that_do_not_match_the_schema_reach_the_model_and_run_nothing(
    store: Durability,
) -> None:
    attempts: list[str] = []

    @function_tool(strict_mode=False)
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        attempts.append(order_id)
        return "ok"

    agent, _ = single_tool_agent(cancel_order, {"order": 42})
    bridge: KernelAgent[Any] = KernelAgent(
        agent, name="desk", writes={"cancel_order": lambda a: a["order_id"]}
    )
    result = await Kernel(bridge.as_agent(version="1"), store).turn("t1", "turn-1", "cancel 42")
    assert result.reply == (
        "tool said: Invalid arguments for tool cancel_order: "
        "'order_id' is a required property. Nothing ran."
    )
    assert [s.status for s in result.steps] == ["completed"]
    assert attempts == []
    assert await store.list_receipts(thread_id="t1") == []


async def test_a_key_function_that_gives_no_key_fails_the_step_and_runs_nothing(
    store: Durability, tmp_path: Path
) -> None:
    desk = Desk(
        tmp_path / "ledger",
        writes={"cancel_order": lambda a: "", "issue_refund": lambda a: a["order_id"]},
    )
    result = await Kernel(desk.bridge.as_agent(version="1"), store).turn(
        "t1", "turn-1", "cancel 42"
    )
    assert [s.status for s in result.steps] == ["failed"]
    assert "must return a non-empty string" in (result.steps[0].error or "")
    assert read_ledger(desk.ledger) == []
    assert await store.list_receipts(thread_id="t1") == []


async def test_a_recorded_response_that_cannot_be_decoded_is_a_typed_error(
    tmp_path: Path,
) -> None:
    """A journal entry that is JSON but no model response (a damaged row): the
    redelivery raises ``CorruptRecordError``, commits nothing and calls nothing."""
    import sqlite3

    from intention_kernel import CorruptRecordError
    from intention_kernel.durability.sqlite import SQLiteDurability

    path = tmp_path / "desk.db"
    desk = Desk(tmp_path / "ledger")
    async with SQLiteDurability(path) as store:
        kernel = Kernel(desk.bridge.as_agent(version="1"), store)
        with (
            faults.injected(faults.AFTER_RECEIPT_PREPARED, "raise"),
            pytest.raises(faults.InjectedFault),
        ):
            await kernel.turn("t1", "turn-1", "cancel 42")
        with sqlite3.connect(path) as db:
            keys = [k for (k,) in db.execute("SELECT key FROM ik_journal ORDER BY rowid")]
            assert "turn-1#1:model.1" in keys
            db.execute(
                "UPDATE ik_journal SET value = ? WHERE key = 'turn-1#1:model.1'",
                (json.dumps({"output": [{"type": "no such item"}], "usage": {}}),),
            )
        requests = len(desk.requests)
        with pytest.raises(CorruptRecordError, match=r"recorded model response 'model\.1'"):
            await kernel.turn("t1", "turn-1", "cancel 42")
        assert len(desk.requests) == requests
        assert await store.load_checkpoint("t1") is None
    assert read_ledger(desk.ledger) == []


def test_writes_must_name_function_tools_of_the_agent(tmp_path: Path) -> None:
    agent = Desk(tmp_path / "ledger").agent
    with pytest.raises(ValueError, match="'refund_order', which is not a function tool"):
        KernelAgent(agent, name="desk", writes={"refund_order": lambda a: a["order_id"]})


def test_a_kernel_agent_wraps_one_sdk_agent_without_handoffs(tmp_path: Path) -> None:
    agent = Desk(tmp_path / "ledger").agent
    with pytest.raises(TypeError, match="handoffs are not supported"):
        KernelAgent(agent.clone(handoffs=[SDKAgent(name="other")]), name="desk")
    with pytest.raises(TypeError, match=r"wraps an agents\.Agent"):
        KernelAgent("desk", name="desk")  # type: ignore[arg-type]


def test_importing_the_bridge_without_the_sdk_names_the_extra() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'agents' or name.startswith('agents.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import intention_kernel.integrations.openai_agents\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "pip install 'intention-kernel[openai-agents]'" in proc.stderr


# -- real processes, killed with SIGKILL: SQLite and PostgreSQL --------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path, file="desk.db", name_sessions=True)


KILLED = -signal.SIGKILL


@pytest.fixture
def workers(sql_store: Store, tmp_path: Path) -> Workers:
    return Workers(WORKER, sql_store, tmp_path / "provider.ledger")


@pytest.mark.slow
async def test_a_process_killed_after_the_write_is_redelivered_with_one_provider_call(
    workers: Workers,
) -> None:
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    died = await workers.run([turn], fault={"point": faults.AFTER_RECEIPT_COMPLETED}, status=KILLED)
    assert died == []
    assert len(read_ledger(workers.ledger)) == 1
    (redelivered,) = await workers.run([turn])
    result = redelivered["result"]
    assert result["replayed"] is False
    assert [s["status"] for s in result["steps"]] == ["completed"]
    assert redelivered["outputs"] == [["cancel_order", "{'id': 'cancel_42'}"]]
    # The response that asked for the cancel was recorded before the tool ran: the new
    # process asked the model only for the text after the cancel's output.
    assert redelivered["model_requests"] == 1
    calls = read_ledger(workers.ledger)
    assert len(calls) == 1  # provider_calls=1
    assert calls[0]["key"] == "desk.agent:cancel_order:42"


@pytest.mark.slow
async def test_a_process_killed_inside_the_provider_call_leaves_the_write_uncertain(
    workers: Workers,
) -> None:
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    await workers.run([turn], fault={"point": faults.IN_PROVIDER_AFTER_WRITE}, status=KILLED)
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
    # A new process accepts and is killed after the refund's provider call, before its
    # turn commits; the same delivery comes again, in another process, and again after.
    died = await workers.run(
        [accept], fault={"point": faults.AFTER_RECEIPT_COMPLETED}, status=KILLED
    )
    assert died == []
    assert len(read_ledger(workers.ledger)) == 1
    (done,) = await workers.run([accept])
    assert done["result"]["replayed"] is False
    assert done["outputs"] == [["issue_refund", "{'id': 'refund_42'}"]]
    assert done["result"]["reply"] == "issue_refund: {'id': 'refund_42'}"
    (again,) = await workers.run([accept])
    assert again["result"]["replayed"] is True
    assert again["model_requests"] == 0
    calls = read_ledger(workers.ledger)
    assert [(c["operation"], c["order_id"], c["cents"]) for c in calls] == [("refund", "42", 1250)]
    assert len({c["pid"] for c in calls}) == 1
