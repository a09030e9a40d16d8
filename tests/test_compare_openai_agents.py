"""Framework alone vs inside intention-kernel: the OpenAI Agents SDK, measured.

Each test runs one scenario twice, with the same agent, tools, fake model and provider
ledger (``tests/openai_agents_support.py``): once as an application would with the
SDK alone (``Runner.run``, a ``SQLiteSession``, ``RunState.to_json`` as the SDK's
human-in-the-loop guide stores it; ``tests/compare_openai_agents_worker.py``), once
inside intention-kernel (``KernelAgent``; ``tests/openai_agents_worker.py``). Crashes
are real: the process sends itself SIGKILL right after the write tool returned. The
numbers asserted here are the SDK's rows of the table in
docs/guides/frameworks-compared.md; where the SDK alone does it right, the test says so.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from agents import Agent as SDKAgent
from agents import Runner, RunState, function_tool
from agents.exceptions import ModelBehaviorError

from bridge_support import read_ledger
from bridge_support import run_worker as process
from intention_kernel import Answer, Kernel
from intention_kernel.integrations.openai_agents import KernelAgent
from intention_kernel.testing import InMemoryDurability, faults
from openai_agents_support import FakeModel, call, outputs, text
from proving_support import Store

ROOT = Path(__file__).parent
ALONE = ROOT / "compare_openai_agents_worker.py"
KERNEL = ROOT / "openai_agents_worker.py"
KILLED = -signal.SIGKILL

pytestmark = pytest.mark.slow


class Alone:
    """The SDK alone, one process per call."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.ledger = tmp_path / f"{name}.ledger"
        self.base = tmp_path / name

    async def __call__(self, status: int = 0, **config: Any) -> dict[str, Any] | None:
        lines = await process(ALONE, {"ledger": str(self.ledger), **config}, status)
        return lines[0] if lines else None

    def writes(self, operation: str) -> list[dict[str, Any]]:
        return [c for c in read_ledger(self.ledger) if c["operation"] == operation]


class Inside:
    """The same agent inside intention-kernel, on SQLite, one process per call."""

    def __init__(self, tmp_path: Path) -> None:
        self.ledger = tmp_path / "kernel.ledger"
        self.store = Store("sqlite", str(tmp_path / "kernel.db")).config()

    async def __call__(
        self, turn: dict[str, Any], *, kill_at: str | None = None, status: int = 0
    ) -> dict[str, Any] | None:
        config: dict[str, Any] = {"store": self.store, "ledger": str(self.ledger), "turns": [turn]}
        if kill_at is not None:
            config["fault"] = {"point": kill_at}
        lines = await process(KERNEL, config, status)
        return lines[0] if lines else None

    def writes(self, operation: str) -> list[dict[str, Any]]:
        return [c for c in read_ledger(self.ledger) if c["operation"] == operation]


# -- (a) one write, a crash right after its provider call, the delivery made again -------------


async def test_one_write_after_a_crash_and_redelivery(tmp_path: Path) -> None:
    # The SDK alone, its own rerun: nothing remembers that the cancel ran.
    rerun = Alone(tmp_path, "rerun")
    assert (
        await rerun(action="run", message="cancel 42", kill_after="cancel_order", status=KILLED)
        is None
    )
    again = await rerun(action="run", message="cancel 42")
    assert again is not None
    assert len(rerun.writes("cancel")) == 2  # provider calls: 2
    assert again["model_requests"] == 2  # the model asked again for both responses

    # The SDK alone with a SQLiteSession: the session keeps the conversation, not the
    # fact that the cancel's call ran; the message delivered again asks again.
    session = Alone(tmp_path, "session")
    store = str(tmp_path / "session.db")
    died = await session(
        action="run", message="cancel 42", session=store, kill_after="cancel_order", status=KILLED
    )
    assert died is None
    assert await session(action="run", message="cancel 42", session=store) is not None
    assert len(session.writes("cancel")) == 2  # provider calls: 2

    # Inside intention-kernel: the receipt answers, and the recorded response too.
    inside = Inside(tmp_path)
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    assert await inside(turn, kill_at=faults.AFTER_RECEIPT_COMPLETED, status=KILLED) is None
    redelivered = await inside(turn)
    assert redelivered is not None
    assert [s["status"] for s in redelivered["result"]["steps"]] == ["completed"]
    assert len(inside.writes("cancel")) == 1  # provider calls: 1
    assert redelivered["model_requests"] == 1  # only the response the crash cut off


# -- (b) an approval given after a restart ----------------------------------------------------


async def test_an_approval_given_after_a_restart_runs_the_approved_call(tmp_path: Path) -> None:
    # The SDK alone, the paused run kept in memory only: the restarted process has no
    # run to resume. The approved call never runs; the person is asked again.
    lost = Alone(tmp_path, "lost")
    shown = await lost(action="ask", message="refund 42")
    assert shown is not None
    (asked,) = shown["interruptions"]
    after = await lost(action="approve", message="refund 42", call_id=asked["call_id"])
    assert after is not None
    assert len(lost.writes("refund")) == 0  # the approved call ran 0 times
    assert len(after["interruptions"]) == 1  # and a new approval is asked for

    # The SDK alone, the paused run stored with RunState.to_json (the SDK's guide):
    # the approval in a new process resumes it and runs the call once. Right.
    kept = Alone(tmp_path, "kept")
    state = str(tmp_path / "kept.state.json")
    shown = await kept(action="ask", message="refund 42", state=state)
    assert shown is not None
    (asked,) = shown["interruptions"]
    done = await kept(action="approve", state=state, call_id=asked["call_id"])
    assert done is not None
    assert done["output"] == "issue_refund: {'id': 'refund_42'}"
    assert len(kept.writes("refund")) == 1  # the approved call ran once

    # ...but the approving process killed after the refund, and the approval delivered
    # again: the stored state is still the paused one, and the refund runs again.
    crashed = Alone(tmp_path, "crashed")
    state = str(tmp_path / "crashed.state.json")
    shown = await crashed(action="ask", message="refund 42", state=state)
    assert shown is not None
    (asked,) = shown["interruptions"]
    approve = {"action": "approve", "state": state, "call_id": asked["call_id"]}
    assert await crashed(**approve, kill_after="issue_refund", status=KILLED) is None
    assert await crashed(**approve) is not None
    assert len(crashed.writes("refund")) == 2  # the approved call ran twice

    # Inside intention-kernel: the paused run is in the checkpoint; the accept in a new
    # process, killed after the refund and delivered again, runs it once.
    inside = Inside(tmp_path)
    proposed = await inside({"thread_id": "t1", "turn_id": "turn-1", "message": "refund 42"})
    assert proposed is not None
    digest = proposed["result"]["interaction"]["digest"]
    accept = {"thread_id": "t1", "turn_id": "turn-2", "answer": {"digest": digest}}
    assert await inside(accept, kill_at=faults.AFTER_RECEIPT_COMPLETED, status=KILLED) is None
    accepted = await inside(accept)
    assert accepted is not None
    assert accepted["result"]["reply"] == "issue_refund: {'id': 'refund_42'}"
    assert len(inside.writes("refund")) == 1  # the approved call ran once


# -- (c) an approval bound to the arguments that ran ------------------------------------------


def varying_desk(cents: dict[str, int], call_ids: str) -> tuple[SDKAgent[Any], list[int]]:
    """A model that proposes a refund of ``cents["now"]``: the amount changes between
    runs, as a model's answer may. ``call_ids`` is ``"same"`` (a server that numbers
    its calls from 0) or ``"new"``."""
    ran: list[int] = []

    def script(items: list[dict[str, Any]]) -> list[Any]:
        done = outputs(items)
        if done:
            return [text(done[-1][1])]
        call_id = "call_0" if call_ids == "same" else f"call-{cents['now']}"
        return [call("refund", {"order_id": "42", "cents": cents["now"]}, call_id)]

    @function_tool(needs_approval=True)
    def refund(order_id: str, cents: int) -> str:
        """Refund an order."""
        ran.append(cents)
        return f"refunded {cents}"

    return SDKAgent(name="desk", model=FakeModel(script), tools=[refund]), ran


@pytest.mark.parametrize("call_ids", ["same", "new"])
async def test_an_approval_is_bound_to_the_arguments_it_was_given_for(call_ids: str) -> None:
    # The SDK alone: the person approves the call of 1250 cents they were shown; the
    # run it is applied to proposes 99999. The SDK binds a decision to the call ID and
    # its arguments' fingerprint: nothing unapproved runs. Right.
    cents = {"now": 1250}
    agent, ran = varying_desk(cents, call_ids)
    shown = await Runner.run(agent, "refund 42")
    approved = (await RunState.from_json(agent, shown.to_state().to_json())).get_interruptions()
    cents["now"] = 99999
    other = (await Runner.run(agent, "refund 42")).to_state()
    if call_ids == "same":
        with pytest.raises(ModelBehaviorError, match="reused a tool call ID"):
            other.approve(approved[0])
    else:
        other.approve(approved[0])
        resumed = await Runner.run(agent, other)
        assert len(resumed.interruptions) == 1  # asked again, for the 99999
    assert ran == []  # unapproved calls run: 0

    # Inside intention-kernel: the answer carries the digest of the call shown; a
    # different held call is not run by it, and the approved one runs as shown.
    cents = {"now": 1250}
    agent, ran = varying_desk(cents, call_ids)
    bridge: KernelAgent[Any] = KernelAgent(
        agent, name="desk", writes={"refund": lambda args: f"{args['order_id']}"}
    )
    kernel = Kernel(bridge.as_agent(version="1"), InMemoryDurability())
    first = await kernel.turn("t1", "turn-1", "refund 42")
    assert first.interaction is not None
    await kernel.turn("t1", "turn-2", answer=Answer(decision="reject", reason="later"))
    cents["now"] = 99999
    second = await kernel.turn("t1", "turn-3", "refund 42")
    assert second.interaction is not None
    stale = await kernel.turn("t1", "turn-4", answer=Answer(digest=first.interaction.digest))
    assert stale.steps == ()
    assert ran == []  # unapproved calls run: 0
    await kernel.turn("t1", "turn-5", answer=Answer(digest=second.interaction.digest))
    assert ran == [99999]  # the call shown in turn 3, as shown
