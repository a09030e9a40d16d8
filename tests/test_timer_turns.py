"""A timer's turn is exactly a turn (issue 37): the agent's loop runs every round of
it, journaled; ``Kernel.cancel`` stops it; a watcher can read its stream. A cancel
settles the timer: it is never fired again, and a recurring one goes on. On every
store."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    Queued,
    capability,
)
from intention_kernel._timers import timer_turn_id
from intention_kernel.durability import Durability
from intention_kernel.testing import ScriptedInterpreter
from timers_support import commit_order, events_of, lapsed_claim

CANCELLED = "Cancelled before it finished: enough"


def rounds_agent(calls: list[str]) -> tuple[Agent, ScriptedInterpreter]:
    """Three model rounds: look the balance up, pay it (a write), then the final text."""

    @capability("account.balance", description="The balance")
    async def balance(input: dict[str, Any], ctx: CapabilityContext) -> int:
        calls.append("balance")
        return 300

    @capability("payments.pay", effect="write", confirmation="capability", description="Pay")
    async def pay(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        def charge(authority: Any) -> str:
            calls.append("charge " + authority.idempotency_key)
            return "ch_1"

        effect = await ctx.run_effect("charge:" + str(input["amount"]), charge)
        return CapabilityResult(value=effect.value)

    def script(request: InterpretationRequest) -> Interpretation:
        assert request.timer is not None and request.timer.key == "monthly"
        if not request.rounds:
            return Interpretation([Intent("account.balance", {})], reply="looking")
        if len(request.rounds) == 1:
            due = request.rounds[0].steps[0].value
            return Interpretation([Intent("payments.pay", {"amount": due})], reply="paying")
        return Interpretation(reply=f"paid {request.rounds[1].steps[0].value}")

    model = ScriptedInterpreter(script, multi_round=True)
    agent = Agent(name="billing", version="1", capabilities=[balance, pay], interpreter=model)
    return agent, model


async def test_a_timer_turn_runs_every_round_of_the_agent_loop(store: Durability) -> None:
    calls: list[str] = []
    agent, model = rounds_agent(calls)
    kernel = Kernel(agent, store)
    await kernel.schedule("t", "monthly", after=timedelta(0), message="pay the bill")
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "fired" and fired.result is not None
    assert [len(r.rounds) for r in model.calls] == [0, 1, 2]
    assert all(r.message == "pay the bill" and r.timer is not None for r in model.calls)
    assert fired.result.reply == "paid ch_1"
    assert [s.capability_id for s in fired.result.steps] == ["account.balance", "payments.pay"]
    assert calls == ["balance", "charge payments.pay:charge:300"]
    # Delivered again (a second claim of the occurrence): replayed, nothing asked or run.
    await kernel.schedule("t", "monthly", at=fired.due_at, message="pay the bill")
    (again,) = await kernel.fire_due_timers()
    assert (again.outcome, again.turn_id) == ("replayed", fired.turn_id)
    assert len(model.calls) == 3 and len(calls) == 2


async def test_a_timer_turn_asks_a_confirmation_and_a_persons_answer_runs_the_write(
    store: Durability,
) -> None:
    """A timer's turn proposes a write that needs a confirmation: it holds the write
    and asks, as a person's turn does. The person's accept runs it once."""
    charges: list[str] = []

    @capability(
        "payments.pay", effect="write", description="Pay", confirm_within=timedelta(hours=1)
    )
    async def pay(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        def charge(authority: Any) -> str:
            charges.append(authority.idempotency_key)
            return "ch_1"

        effect = await ctx.run_effect("charge", charge)
        return CapabilityResult(value=effect.value)

    def script(request: InterpretationRequest) -> Interpretation:
        if request.timer is not None:
            return Interpretation([Intent("payments.pay", {"amount": 5})], reply="paying")
        return Interpretation(reply="ok")

    agent = Agent("billing", "1", [pay], ScriptedInterpreter(script))
    kernel = Kernel(agent, store)
    await kernel.schedule("t", "monthly", after=timedelta(0))
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "fired" and fired.result is not None
    asked = fired.result.interaction
    assert asked is not None and asked.capability_id == "payments.pay"
    assert charges == []  # held until answered
    pending = {t.key: t.status for t in await kernel.timers("t")}
    assert pending == {"monthly": "fired", "kernel:expire:" + asked.id: "pending"}
    answered = await kernel.turn("t", "2", answer="accept")
    assert [(s.capability_id, s.value) for s in answered.steps] == [("payments.pay", "ch_1")]
    assert len(charges) == 1 and answered.interaction is None
    # The answer takes the confirmation's expiry with it.
    assert [t.key for t in await kernel.timers("t")] == ["monthly"]


async def test_a_timer_turn_can_be_watched_as_it_ran(store: Durability) -> None:
    if getattr(store, "has_streams", False) is not True:
        pytest.skip("this store keeps no turn streams")
    agent, _ = rounds_agent([])
    kernel = Kernel(agent, store)
    await kernel.schedule("t", "monthly", after=timedelta(0))
    (fired,) = await kernel.fire_due_timers()
    watched = [e async for e in kernel.watch_turn("t", fired.turn_id)]
    kinds = [e.type for e in watched]
    assert kinds[-1] == "result" and watched[-1].data["reply"] == "paid ch_1"
    # Round 1's step was recorded with round 2's journal entry; what followed the
    # last recorded round comes as the result (as for a person's turn).
    assert kinds == ["step", "result"] and "account.balance" in str(watched[0].data)
    # Its status is read as any turn's, though a client may not deliver under its ID.
    status = await kernel.turn_status("t", fired.turn_id)
    assert status.status == "committed" and status.result is not None
    assert dataclasses.replace(status.result, replayed=False) == fired.result


class Stepper:
    """Two steps a turn: the first is held until the test lets it go."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.ran: list[str] = []

    def agent(self, **options: Any) -> Agent:
        @capability("jobs.first", description="Held")
        async def first(input: dict[str, Any], ctx: CapabilityContext) -> str:
            self.ran.append("first " + ctx.turn_id)
            self.entered.set()
            await asyncio.wait_for(self.release.wait(), 10)
            return "first"

        @capability("jobs.second", description="After")
        async def second(input: dict[str, Any], ctx: CapabilityContext) -> str:
            self.ran.append("second " + ctx.turn_id)
            return "second"

        def script(request: InterpretationRequest) -> Interpretation:
            return Interpretation([Intent("jobs.first", {}), Intent("jobs.second", {})])

        return Agent(
            name="steps",
            version="1",
            capabilities=[first, second],
            interpreter=ScriptedInterpreter(script),
            **options,
        )


@pytest.mark.parametrize("every", [None, timedelta(hours=1)])
async def test_a_running_timer_turn_is_cancelled_and_settled(
    store: Durability, every: timedelta | None
) -> None:
    stepper = Stepper()
    kernel = Kernel(stepper.agent(), store)
    set_timer = await kernel.schedule("t", "job", after=timedelta(0), every=every)
    firing = asyncio.create_task(kernel.fire_due_timers())
    await asyncio.wait_for(stepper.entered.wait(), 10)
    turn_id = timer_turn_id("job", set_timer.due_at)
    cancel = await kernel.cancel("t", turn_id, reason="enough")
    assert cancel.status == "requested"
    stepper.release.set()
    (fired,) = await asyncio.wait_for(firing, 10)
    # It commits what it did, as cancelled: its second step never ran.
    assert (fired.outcome, fired.turn_id, fired.error) == ("cancelled", turn_id, None)
    assert fired.result is not None and not fired.result.replayed
    assert CANCELLED in fired.result.reply
    assert [s.capability_id for s in fired.result.steps] == ["jobs.first"]
    assert stepper.ran == ["first " + turn_id]
    (committed,) = await events_of(store, "turn.committed")
    assert committed.turn_id == turn_id
    (timer,) = await kernel.timers("t")
    if every is None:
        assert (timer.status, timer.turn_id) == ("fired", turn_id)
    else:  # the next occurrence stands
        assert timer.status == "pending" and timer.due_at == set_timer.due_at + every
    assert await kernel.fire_due_timers() == []  # not fired again


@pytest.mark.parametrize("every", [None, timedelta(hours=1)])
async def test_a_queued_timer_turn_cancelled_never_runs_and_is_settled(
    store: Durability, every: timedelta | None
) -> None:
    stepper = Stepper()
    kernel = Kernel(stepper.agent(on_busy="queue"), store)
    set_timer = await kernel.schedule("t", "job", after=timedelta(0), every=every)
    running = asyncio.create_task(kernel.turn("t", "1", "go"))
    await asyncio.wait_for(stepper.entered.wait(), 10)
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "queued"
    cancel = await kernel.cancel("t", fired.turn_id)
    assert cancel.status == "dequeued"
    (timer,) = await kernel.timers("t")
    if every is None:
        assert (timer.status, timer.turn_id) == ("void", fired.turn_id)
        (event,) = await events_of(store, "timer.cancelled")
        assert event.payload == {"key": "job", "reason": "its turn was cancelled"}
    else:
        assert timer.status == "pending" and timer.due_at == set_timer.due_at + every
    stepper.release.set()
    await running
    await asyncio.wait_for(kernel.drain("t"), 10)
    committed = [e.turn_id for e in await events_of(store, "turn.committed")]
    assert committed == ["1"]
    assert await kernel.fire_due_timers() == []


async def test_a_timer_turn_cancelled_before_it_is_claimed_runs_nothing(
    store: Durability,
) -> None:
    stepper = Stepper()
    stepper.release.set()
    kernel = Kernel(stepper.agent(), store)
    due = datetime.now(UTC) - timedelta(seconds=1)
    await kernel.schedule("t", "job", at=due)
    cancel = await kernel.cancel("t", timer_turn_id("job", due))
    assert cancel.status == "requested"  # nothing of it runs or waits yet
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "cancelled" and stepper.ran == []
    (timer,) = await kernel.timers("t")
    assert timer.status == "void"
    assert await events_of(store, "turn.committed") == []


async def test_a_timer_turn_cancelled_from_another_kernel_stops(store: Durability) -> None:
    """The cancel comes through another ``Kernel`` (as from another process): the
    timer's turn reads it from the store at its next safe point."""
    stepper = Stepper()
    worker, other = Kernel(stepper.agent(), store), Kernel(stepper.agent(), store)
    set_timer = await worker.schedule("t", "job", after=timedelta(0))
    firing = asyncio.create_task(worker.fire_due_timers())
    await asyncio.wait_for(stepper.entered.wait(), 10)
    turn_id = timer_turn_id("job", set_timer.due_at)
    assert (await other.cancel("t", turn_id, reason="enough")).status == "requested"
    stepper.release.set()
    (fired,) = await asyncio.wait_for(firing, 10)
    assert fired.outcome == "cancelled"
    assert fired.result is not None and CANCELLED in fired.result.reply
    assert stepper.ran == ["first " + turn_id]
    (timer,) = await worker.timers("t")
    assert (timer.status, timer.turn_id) == ("fired", turn_id)


@pytest.mark.parametrize(
    ("on_busy", "stop"),
    [("wait", "cancelled"), ("queue", "cancelled"), ("interrupt", "interrupted")],
)
async def test_two_passes_of_one_kernel_report_the_same_stopped_turn(
    store: Durability, on_busy: str, stop: str
) -> None:
    """Two fire passes of one kernel fire one occurrence at once: the first pass's
    claim lapsed while its turn ran. Its turn is stopped. Both passes report how it
    stopped, with the one committed turn; neither reports it fired, queued or replayed."""
    stepper = Stepper()
    kernel = Kernel(stepper.agent(on_busy=on_busy), store)
    set_timer = await kernel.schedule("t", "job", after=timedelta(0))
    turn_id = timer_turn_id("job", set_timer.due_at)
    first, second = await lapsed_claim(kernel, kernel, stepper.entered)
    await asyncio.sleep(0.05)  # the second pass is on its way to the occurrence's turn
    if stop == "cancelled":
        assert (await kernel.cancel("t", turn_id, reason="enough")).status == "requested"
    else:
        assert isinstance(await kernel.submit("t", "p", "stop that"), Queued)
    stepper.release.set()
    (one,), (two,) = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert (one.outcome, one.turn_id, one.error) == (stop, turn_id, None)
    assert one == two  # the same outcome, with the same committed turn
    assert one.result is not None and not one.result.replayed
    assert [s.capability_id for s in one.result.steps] == ["jobs.first"]
    assert [r for r in stepper.ran if r.endswith(turn_id)] == ["first " + turn_id]
    await asyncio.wait_for(kernel.drain("t") if on_busy != "wait" else asyncio.sleep(0), 10)
    await kernel.drained()
    committed = [e.turn_id for e in await events_of(store, "turn.committed")]
    assert committed == [turn_id] + (["p"] if stop == "interrupted" else [])
    (timer,) = await kernel.timers("t")
    assert (timer.status, timer.turn_id) == ("fired", turn_id)


@pytest.mark.parametrize("stop", ["cancelled", "interrupted"])
async def test_a_pass_of_another_kernel_replaying_a_stopped_turn_reports_how_it_stopped(
    store: Durability, stop: str
) -> None:
    """Kernel A fires an occurrence, and its claim lapses while the turn runs. Kernel B
    (another process, say) claims it too and waits for the thread. A's turn is stopped.
    B replays the committed turn and reports the stop that A's pass reports."""
    stepper = Stepper()
    first = Kernel(stepper.agent(on_busy="interrupt"), store)
    other = Kernel(stepper.agent(), store)  # waits for the thread: it replays
    set_timer = await first.schedule("t", "job", after=timedelta(0))
    turn_id = timer_turn_id("job", set_timer.due_at)
    one_pass, other_pass = await lapsed_claim(first, other, stepper.entered)
    await asyncio.sleep(0.05)  # the other pass waits for the thread
    if stop == "cancelled":
        assert (await first.cancel("t", turn_id, reason="enough")).status == "requested"
    else:
        assert isinstance(await first.submit("t", "p", "stop that"), Queued)
    stepper.release.set()
    (one,), (two,) = await asyncio.wait_for(asyncio.gather(one_pass, other_pass), 10)
    assert (one.outcome, one.turn_id, one.error) == (stop, turn_id, None)
    assert (two.outcome, two.turn_id, two.error) == (stop, turn_id, None)
    assert two.result is not None and two.result.replayed
    assert dataclasses.replace(two.result, replayed=False) == one.result
    assert [r for r in stepper.ran if r.endswith(turn_id)] == ["first " + turn_id]
    await asyncio.wait_for(first.drained(), 10)
    (timer,) = await first.timers("t")
    assert (timer.status, timer.turn_id) == ("fired", turn_id)


async def test_a_pass_waiting_for_another_fires_the_occurrence_if_that_one_is_cancelled(
    store: Durability,
) -> None:
    """The pass firing an occurrence is cancelled (its task, as a host's loop is at
    shutdown) while a second pass of the kernel waits for its outcome: the second
    fires the occurrence itself."""
    stepper = Stepper()
    kernel = Kernel(stepper.agent(), store)
    set_timer = await kernel.schedule("t", "job", after=timedelta(0))
    turn_id = timer_turn_id("job", set_timer.due_at)
    first, second = await lapsed_claim(kernel, kernel, stepper.entered)
    await asyncio.sleep(0.05)  # the second pass waits for the first one's outcome
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    stepper.release.set()
    (fired,) = await asyncio.wait_for(second, 10)
    assert (fired.outcome, fired.turn_id) == ("fired", turn_id)
    assert stepper.ran == ["first " + turn_id, "first " + turn_id, "second " + turn_id]
    (committed,) = await events_of(store, "turn.committed")
    assert committed.turn_id == turn_id
    (timer,) = await kernel.timers("t")
    assert (timer.status, timer.turn_id) == ("fired", turn_id)


async def test_a_timer_neither_interrupts_nor_steers_a_persons_turn(store: Durability) -> None:
    for on_busy in ("interrupt", "steer"):
        stepper = Stepper()
        kernel = Kernel(stepper.agent(on_busy=on_busy), store)
        thread = "t-" + on_busy
        await kernel.schedule(thread, "job", after=timedelta(0))
        running = asyncio.create_task(kernel.turn(thread, "1", "go"))
        await asyncio.wait_for(stepper.entered.wait(), 10)
        (fired,) = await kernel.fire_due_timers()
        assert fired.outcome == "queued"
        stepper.release.set()
        result = await asyncio.wait_for(running, 10)
        assert [s.capability_id for s in result.steps] == ["jobs.first", "jobs.second"]
        await asyncio.wait_for(kernel.drain(thread), 10)
        (timer,) = await kernel.timers(thread)
        assert timer.status == "fired"


async def test_concurrent_messages_and_a_timer_run_in_acceptance_order(
    store: Durability,
) -> None:
    """Messages sent at once with the timer's claim: the turns run in exactly the
    order the inbox accepted them, the timer's among them, each once."""
    stepper = Stepper()
    kernel = Kernel(stepper.agent(on_busy="queue"), store)
    await kernel.schedule("t", "job", after=timedelta(0))
    running = asyncio.create_task(kernel.turn("t", "1", "go"))
    await asyncio.wait_for(stepper.entered.wait(), 10)
    answers = await asyncio.gather(
        kernel.submit("t", "a", "m"),
        kernel.submit("t", "b", "m"),
        kernel.fire_due_timers(),
        kernel.submit("t", "c", "m"),
        kernel.submit("t", "d", "m"),
    )
    assert all(isinstance(a, Queued) for a in answers[:2] + answers[3:])
    (fired,) = answers[2]
    assert fired.outcome == "queued"
    accepted = [e.turn_id for e in await store.read_inbox("t")]  # type: ignore[attr-defined]
    assert sorted(accepted) == sorted(["a", "b", "c", "d", fired.turn_id])
    stepper.release.set()
    await running
    await asyncio.wait_for(kernel.drain("t"), 10)
    await kernel.drained()
    # In commit order: each turn's checkpoint version, as its stored result says.
    assert await commit_order(kernel, ["1", *accepted]) == ["1", *accepted]
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 6


@pytest.mark.parametrize("every", [None, timedelta(hours=1)])
async def test_a_persons_message_interrupts_a_running_timer_turn(
    store: Durability, every: timedelta | None
) -> None:
    stepper = Stepper()
    kernel = Kernel(stepper.agent(on_busy="interrupt"), store)
    set_timer = await kernel.schedule("t", "job", after=timedelta(0), every=every)
    firing = asyncio.create_task(kernel.fire_due_timers())
    await asyncio.wait_for(stepper.entered.wait(), 10)
    assert isinstance(await kernel.submit("t", "p", "stop that"), Queued)
    stepper.release.set()
    (fired,) = await asyncio.wait_for(firing, 10)
    # It commits what it did, and its outcome says a message stopped it.
    assert (fired.outcome, fired.error) == ("interrupted", None)
    assert fired.result is not None and not fired.result.replayed
    assert [s.capability_id for s in fired.result.steps] == ["jobs.first"]
    assert kernel.agent.replies.turn_interrupted() in fired.result.reply
    (timer,) = await kernel.timers("t")
    if every is None:
        assert (timer.status, timer.turn_id) == ("fired", fired.turn_id)
    else:  # the next occurrence stands
        assert timer.status == "pending" and timer.due_at == set_timer.due_at + every
    assert await kernel.fire_due_timers() == []  # not fired again
    await asyncio.wait_for(kernel.drain("t"), 10)
    await kernel.drained()
    committed = [e.turn_id for e in await events_of(store, "turn.committed")]
    assert committed == [fired.turn_id, "p"]


class Gates:
    """A turn's first step waits at the gate named by its turn ID, until opened.

    Person's turn ``"1"`` sets timer ``job`` again, at ``due`` with another message."""

    def __init__(self, due: datetime) -> None:
        self.due = due
        self.entered: dict[str, asyncio.Event] = {}
        self.opened: dict[str, asyncio.Event] = {}
        self.ran: list[str] = []

    def gate(self, turn_id: str) -> tuple[asyncio.Event, asyncio.Event]:
        return (
            self.entered.setdefault(turn_id, asyncio.Event()),
            self.opened.setdefault(turn_id, asyncio.Event()),
        )

    def agent(self) -> Agent:
        @capability("jobs.hold", description="Held at its gate")
        async def hold(input: dict[str, Any], ctx: CapabilityContext) -> str:
            if ctx.turn_id == "1":
                ctx.schedule("job", at=self.due, message="the new one")
            entered, opened = self.gate(ctx.turn_id)
            entered.set()
            await asyncio.wait_for(opened.wait(), 10)
            self.ran.append("hold " + ctx.turn_id)
            return "held"

        @capability("jobs.after", description="After the hold")
        async def after(input: dict[str, Any], ctx: CapabilityContext) -> str:
            self.ran.append("after " + ctx.turn_id)
            return "after"

        def script(request: InterpretationRequest) -> Interpretation:
            return Interpretation([Intent("jobs.hold", {}), Intent("jobs.after", {})])

        return Agent(
            name="gates",
            version="1",
            capabilities=[hold, after],
            interpreter=ScriptedInterpreter(script),
        )


async def test_a_stale_pass_of_one_turn_id_leaves_the_stop_of_the_pass_that_runs_it(
    store: Durability,
) -> None:
    """Two passes of one kernel wait for the thread under one turn ID, for two
    occurrences: the timer was set again at the same due time, with another message.
    The first pass finds its occurrence gone (``stale``). The second runs the turn, and
    a cancel stops it: it reports ``cancelled``, not ``fired``."""
    due = datetime.now(UTC) - timedelta(seconds=1)
    gates = Gates(due)
    kernel = Kernel(gates.agent(), store)
    await kernel.schedule("t", "job", at=due, message="the first one")
    turn_id = timer_turn_id("job", due)
    one = asyncio.create_task(kernel.turn("t", "1", "go"))  # sets the timer again
    await asyncio.wait_for(gates.gate("1")[0].wait(), 10)
    two = asyncio.create_task(kernel.turn("t", "2", "go"))  # waits for the thread
    await asyncio.sleep(0.05)
    first_pass = asyncio.create_task(kernel.fire_due_timers(claim_for=30.0))
    await asyncio.sleep(0.05)  # it claimed the first occurrence, and waits behind "2"
    gates.gate("1")[1].set()
    await asyncio.wait_for(one, 10)
    await asyncio.wait_for(gates.gate("2")[0].wait(), 10)
    (moved,) = await kernel.timers("t")
    assert (moved.due_at, moved.message, moved.claimed_until) == (due, "the new one", None)
    second_pass = asyncio.create_task(kernel.fire_due_timers(claim_for=30.0))
    await asyncio.sleep(0.05)  # it claimed the second occurrence, and waits too
    gates.gate("2")[1].set()
    await asyncio.wait_for(two, 10)
    # The second pass runs the turn. In memory the first pass, ahead of it for the
    # lock, has ended stale by now. The SQL stores' waiters poll: either may go first.
    # A first pass that comes after the commit finds its turn ID taken: void.
    await asyncio.wait_for(gates.gate(turn_id)[0].wait(), 10)
    assert (await kernel.cancel("t", turn_id, reason="enough")).status == "requested"
    gates.gate(turn_id)[1].set()
    (stale,), (stopped,) = await asyncio.wait_for(asyncio.gather(first_pass, second_pass), 10)
    assert (stale.outcome, stale.turn_id) in (("stale", turn_id), ("void", turn_id))
    assert stale.result is None
    assert (stopped.outcome, stopped.turn_id) == ("cancelled", turn_id)
    assert stopped.result is not None and stopped.result.reply.endswith(CANCELLED)
    assert "after " + turn_id not in gates.ran
    (timer,) = await kernel.timers("t")
    assert (timer.status, timer.turn_id, timer.message) == ("fired", turn_id, "the new one")
