"""Timers and scheduled turns (issue 37): a timer is a future turn of its thread.

It is set in a turn (``ctx.schedule``, committed with it) or by the application
(``Kernel.schedule``). It fires once as a turn under a turn ID made of its key and due
time. On every store."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import re
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from intention_kernel import (
    Agent,
    CapabilityContext,
    CompilationError,
    FiredTimer,
    Intent,
    Interpretation,
    InterpretationRequest,
    InvalidRequestError,
    Kernel,
    Queued,
    ReservedTurnIdError,
    ThreadBusyError,
    capability,
)
from intention_kernel._timer_runner import _fire
from intention_kernel.durability import Durability
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.operations import expire_interactions, prune
from intention_kernel.testing import InMemoryDurability
from sqlite_history import undo_migration_14
from timers_support import START, Clock, approval_agent, commit_order, events_of, lapsed_claim


class Interpreter:
    """Rules for the tests: "remind in N" sets a timer; a timer's turn runs the
    ``notes.note`` capability with what the timer carried."""

    def __init__(self) -> None:
        self.requests: list[InterpretationRequest] = []

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        self.requests.append(request)
        if request.timer is not None:
            return Interpretation(
                [Intent("notes.note", {"text": f"timer {request.timer.key}"})],
                reply=f"timer {request.timer.key} fired",
            )
        words = request.message.split()
        if words[:1] == ["remind"]:
            return Interpretation([Intent("notes.remind", {"key": words[1], "minutes": 5})])
        if words[:1] == ["cancel"]:
            return Interpretation([Intent("notes.cancel", {"key": words[1]})])
        if words[:1] == ["broken"]:
            return Interpretation([Intent("notes.broken", {"key": words[1]})])
        return Interpretation(reply="ok")


@capability("notes.remind", effect="read", description="Set a reminder")
async def remind(input: dict[str, Any], ctx: CapabilityContext) -> str:
    ctx.schedule(
        input["key"], after=timedelta(minutes=input["minutes"]), message="remind", data={"n": 1}
    )
    return "set"


@capability("notes.cancel", effect="read", description="Cancel a reminder")
async def cancel(input: dict[str, Any], ctx: CapabilityContext) -> str:
    ctx.cancel_timer(input["key"])
    return "cancelled"


@capability("notes.broken", effect="read", description="Set a reminder, then fail")
async def broken(input: dict[str, Any], ctx: CapabilityContext) -> str:
    ctx.schedule(input["key"], after=timedelta(minutes=1))
    raise RuntimeError("the step fails after staging its timer")


@capability("notes.note", effect="read", description="Note something")
async def note(input: dict[str, Any], ctx: CapabilityContext) -> str:
    return str(input["text"])


def make_kernel(store: Durability, clock: Clock) -> tuple[Kernel, Interpreter]:
    interpreter = Interpreter()
    agent = Agent(
        name="notes",
        version="1",
        capabilities=[remind, cancel, broken, note],
        interpreter=interpreter,
    )
    return Kernel(agent, store, clock=clock), interpreter


async def test_a_timer_set_in_a_turn_fires_once_as_a_turn_when_due(store: Durability) -> None:
    clock = Clock()
    kernel, interpreter = make_kernel(store, clock)
    await kernel.turn("t", "1", "remind r1")
    (timer,) = await kernel.timers("t")
    assert (timer.key, timer.status, timer.due_at) == (
        "r1",
        "pending",
        START + timedelta(minutes=5),
    )
    assert timer.data == {"n": 1} and timer.message == "remind"
    assert await kernel.fire_due_timers() == []  # not due yet
    clock.move(minutes=5)
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "fired"
    assert fired.turn_id == "timer:r1@20261205T090500.000000Z"
    assert fired.result is not None and fired.result.reply.startswith("timer r1 fired")
    assert fired.result.steps[0].value == "timer r1"
    seen = interpreter.requests[-1]
    assert seen.timer == FiredTimer("r1", START + timedelta(minutes=5), "remind", {"n": 1})
    assert await kernel.fire_due_timers() == []  # fired once
    (settled,) = await kernel.timers("t")
    assert (settled.status, settled.turn_id) == ("fired", fired.turn_id)
    assert [e.turn_id for e in await events_of(store, "timer.fired")] == [fired.turn_id]
    assert [e.turn_id for e in await events_of(store, "timer.set")] == ["1"]
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 2
    # No person spoke in the timer's turn: only the assistant's line is added.
    assert [m.role for m in checkpoint.messages if m.turn_id == fired.turn_id] == ["assistant"]


async def test_a_step_that_fails_sets_no_timer(store: Durability) -> None:
    kernel, _ = make_kernel(store, Clock())
    result = await kernel.turn("t", "1", "broken r1")
    assert result.steps[0].status == "failed"
    assert await kernel.timers("t") == []
    assert await events_of(store, "timer.set") == []


async def test_setting_a_key_again_moves_the_timer(store: Durability) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    await kernel.turn("t", "1", "remind r1")
    clock.move(minutes=3)
    await kernel.turn("t", "2", "remind r1")
    (timer,) = await kernel.timers("t")
    assert timer.due_at == START + timedelta(minutes=8)
    clock.move(minutes=2)
    assert await kernel.fire_due_timers() == []  # the first due time is gone
    clock.move(minutes=3)
    assert [f.outcome for f in await kernel.fire_due_timers()] == ["fired"]


async def test_a_cancelled_timer_never_fires(store: Durability) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    await kernel.turn("t", "1", "remind r1")
    await kernel.turn("t", "2", "cancel r1")
    assert await kernel.timers("t") == []
    await kernel.schedule("t", "r2", after=timedelta(minutes=1))
    assert await kernel.cancel_timer("t", "r2") is True
    assert await kernel.cancel_timer("t", "r2") is False
    clock.move(hours=1)
    assert await kernel.fire_due_timers() == []
    assert len(await events_of(store, "timer.cancelled")) == 2


async def test_cancelling_a_key_with_no_timer_emits_nothing(store: Durability) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    result = await kernel.turn("t", "1", "cancel nothing")
    assert result.steps[0].status == "completed"
    assert await events_of(store, "timer.cancelled") == []
    await kernel.turn("t", "2", "remind r1")
    await kernel.turn("t", "3", "cancel r1")
    await kernel.turn("t", "4", "cancel r1")  # cancelled already: nothing to announce
    clock.move(hours=1)
    await kernel.schedule("t", "r2", at=START)
    assert len(await kernel.fire_due_timers()) == 1
    await kernel.turn("t", "5", "cancel r2")  # fired: no pending timer to cancel
    assert [e.turn_id for e in await events_of(store, "timer.cancelled")] == ["3"]
    # The fired timer's row stays, as Kernel.cancel_timer leaves it.
    assert [(t.key, t.status) for t in await kernel.timers("t")] == [("r2", "fired")]
    assert await kernel.cancel_timer("t", "r2") is False


async def test_a_key_set_and_cancelled_in_one_turn_announces_both(store: Durability) -> None:
    @capability("notes.flip", effect="read", description="Set a reminder, then cancel it")
    async def flip(input: dict[str, Any], ctx: CapabilityContext) -> str:
        ctx.cancel_timer("k")  # nothing yet: no event
        ctx.schedule("k", after=timedelta(minutes=1))
        ctx.cancel_timer("k")
        ctx.cancel_timer("k")  # cancelled already: no event
        return "flipped"

    class Flipper:
        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            return Interpretation([Intent("notes.flip", {})])

    agent = Agent(name="f", version="1", capabilities=[flip], interpreter=Flipper())
    kernel = Kernel(agent, store)
    await kernel.turn("t", "1", "go")
    events = [e.type for e in await store.read_outbox(limit=100) if e.type.startswith("timer.")]
    assert events == ["timer.set", "timer.cancelled"]
    assert await kernel.timers("t") == []


async def test_kernel_schedule_sets_a_timer_from_application_code(store: Durability) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    at = START + timedelta(hours=2)
    timer = await kernel.schedule("t", "weekly", at=at, message="summary", data=[1, 2])
    assert timer.due_at == at
    (event,) = await events_of(store, "timer.set")
    assert event.turn_id is None and event.payload["key"] == "weekly"
    clock.move(hours=2)
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "fired" and fired.result is not None
    assert fired.result.checkpoint_version == 1


async def test_a_timer_is_void_if_the_thread_moved_on(store: Durability) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    await kernel.turn("t", "1", "hello")
    await kernel.schedule("t", "nudge", after=timedelta(minutes=1), unless_version_after=1)
    await kernel.schedule("t", "kept", after=timedelta(minutes=1), unless_version_after=2)
    await kernel.turn("t", "2", "hello again")  # version 2: the nudge is void
    clock.move(minutes=1)
    outcomes = {f.key: f.outcome for f in await kernel.fire_due_timers()}
    assert outcomes == {"nudge": "void", "kept": "fired"}
    statuses = {t.key: t.status for t in await kernel.timers("t")}
    assert statuses == {"nudge": "void", "kept": "fired"}
    assert await kernel.fire_due_timers() == []


async def test_a_recurring_timer_fires_each_occurrence_once_and_a_missed_one_once(
    store: Durability,
) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    await kernel.schedule("t", "tick", after=timedelta(minutes=1), every=timedelta(minutes=1))
    clock.move(minutes=1)
    (first,) = await kernel.fire_due_timers()
    clock.move(minutes=10)  # nine occurrences missed while no worker ran
    (second,) = await kernel.fire_due_timers()
    assert await kernel.fire_due_timers() == []
    assert first.turn_id != second.turn_id
    assert (first.outcome, second.outcome) == ("fired", "fired")
    (timer,) = await kernel.timers("t")
    assert timer.status == "pending" and timer.due_at == START + timedelta(minutes=12)


async def test_a_timer_key_set_again_at_a_fired_time_replays_and_settles(
    store: Durability,
) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    at = START + timedelta(minutes=1)
    await kernel.schedule("t", "once", at=at)
    clock.move(minutes=1)
    (fired,) = await kernel.fire_due_timers()
    await kernel.schedule("t", "once", at=at)  # the same occurrence again
    (again,) = await kernel.fire_due_timers()
    assert again.outcome == "replayed" and again.turn_id == fired.turn_id
    assert await kernel.fire_due_timers() == []
    assert len(await events_of(store, "turn.committed")) == 1


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ({}, "exactly one of at= and after="),
        ({"at": START, "after": timedelta(0)}, "exactly one of at= and after="),
        ({"at": datetime(2026, 12, 5, 9, 0)}, "timezone-aware"),
        ({"at": "tomorrow"}, "must be a datetime"),
        ({"after": timedelta(seconds=-1)}, "must not be negative"),
        ({"after": 5}, "must be a datetime.timedelta"),
        ({"after": timedelta(0), "data": {1, 2}}, "must be JSON"),
        ({"after": timedelta(0), "message": 5}, "message must be a string"),
        ({"after": timedelta(0), "unless_version_after": -1}, "unless_version_after"),
        ({"after": timedelta(0), "every": timedelta(0)}, "every must be at least"),
    ],
)
async def test_bad_timer_input_is_refused_and_changes_nothing(
    store: Durability, when: dict[str, Any], problem: str
) -> None:
    kernel, _ = make_kernel(store, Clock())
    with pytest.raises(InvalidRequestError, match=problem):
        await kernel.schedule("t", "k", **when)
    assert await kernel.timers() == []
    assert await store.read_outbox() == []


@pytest.mark.parametrize("key", ["", "x" * 300, "a\x00b", 7])
async def test_a_bad_timer_key_is_refused(store: Durability, key: Any) -> None:
    kernel, _ = make_kernel(store, Clock())
    with pytest.raises(InvalidRequestError):
        await kernel.schedule("t", key, after=timedelta(0))
    with pytest.raises(InvalidRequestError):
        await kernel.cancel_timer("t", key)
    assert await kernel.timers() == []


async def test_a_client_may_not_use_a_timer_turn_id(store: Durability) -> None:
    kernel, _ = make_kernel(store, Clock())
    with pytest.raises(ReservedTurnIdError):
        await kernel.turn("t", "timer:r1@20261205T090500.000000Z", "hello")


async def test_a_capability_may_not_emit_timer_events(store: Durability) -> None:
    @capability("notes.forge", effect="read", description="Forge")
    async def forge(input: dict[str, Any], ctx: CapabilityContext) -> str:
        ctx.emit("timer.fired", {})
        return "forged"

    class Forger:
        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            return Interpretation([Intent("notes.forge", {})])

    kernel = Kernel(Agent(name="f", version="1", capabilities=[forge], interpreter=Forger()), store)
    result = await kernel.turn("t", "1", "go")
    assert result.steps[0].status == "failed"
    assert await events_of(store, "timer.fired") == []


async def test_a_sqlite_store_from_before_timers_is_upgraded_and_keeps_its_threads(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"
    clock = Clock()
    async with SQLiteDurability(path) as before:
        kernel, _ = make_kernel(before, clock)
        await kernel.turn("t", "1", "hello")
    with sqlite3.connect(path) as conn:
        undo_migration_14(conn)
    async with SQLiteDurability(path) as upgraded:
        kernel, _ = make_kernel(upgraded, clock)
        await kernel.turn("t", "2", "remind r1")
        clock.move(minutes=5)
        (fired,) = await kernel.fire_due_timers()
        assert fired.outcome == "fired" and fired.result is not None
        assert fired.result.checkpoint_version == 3


class Held:
    """A capability held until the test lets it go."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    def agent(self) -> Agent:
        @capability("jobs.hold", effect="read", description="Hold")
        async def hold(input: dict[str, Any], ctx: CapabilityContext) -> str:
            self.entered.set()
            await asyncio.wait_for(self.release.wait(), 10)
            return "held"

        class Interpreter:
            async def interpret(self, request: InterpretationRequest) -> Interpretation:
                return Interpretation([Intent("jobs.hold", {})])

        return Agent(name="h", version="1", capabilities=[hold], interpreter=Interpreter())


async def test_a_timer_on_a_busy_thread_waits_for_the_running_turn(store: Durability) -> None:
    held = Held()
    kernel = Kernel(held.agent(), store)
    running = asyncio.create_task(kernel.turn("t", "1", "go"))
    await asyncio.wait_for(held.entered.wait(), 10)
    # Kernel.schedule waits for the thread's lock: at once on another thread.
    await kernel.schedule("other", "x", after=timedelta(0))
    setting = asyncio.create_task(kernel.schedule("t", "soon", after=timedelta(0)))
    await asyncio.sleep(0.05)
    assert not setting.done()  # waits for the running turn
    held.release.set()
    await running
    await setting
    outcomes = {(f.thread_id, f.outcome) for f in await kernel.fire_due_timers()}
    assert outcomes == {("t", "fired"), ("other", "fired")}
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 2


@pytest.mark.parametrize("on_busy", ["queue", "steer", "interrupt"])
async def test_a_timer_on_a_busy_inbox_thread_queues_behind_earlier_messages(
    store: Durability, on_busy: Literal["queue", "steer", "interrupt"]
) -> None:
    held = Held()
    agent = dataclasses.replace(held.agent(), on_busy=on_busy)
    kernel = Kernel(agent, store)
    await kernel.schedule("t", "soon", after=timedelta(0))
    running = asyncio.create_task(kernel.turn("t", "1", "go"))
    await asyncio.wait_for(held.entered.wait(), 10)
    for turn_id in ("2", "3"):
        assert isinstance(await kernel.submit("t", turn_id, "more"), Queued)
    # The timer's turn enters the inbox at once, behind the messages accepted before it.
    (fired,) = await asyncio.wait_for(kernel.fire_due_timers(), 10)
    assert fired.outcome == "queued"
    inbox = [e.turn_id for e in await store.read_inbox("t")]  # type: ignore[attr-defined]
    assert inbox == ["2", "3", fired.turn_id]
    assert isinstance(await kernel.submit("t", "4", "more"), Queued)  # behind the timer
    held.release.set()
    await running
    await asyncio.wait_for(kernel.drain("t"), 10)
    await kernel.drained()
    order = ["1", "2", "3", fired.turn_id, "4"]
    assert await commit_order(kernel, order) == order  # each once, in this order
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 5  # no other turn
    (timer,) = await kernel.timers("t")
    assert (timer.status, timer.turn_id) == ("fired", fired.turn_id)
    # A second claim of the same occurrence (its row set again) replays, runs nothing.
    await kernel.schedule("t", "soon", at=fired.due_at)
    (again,) = await kernel.fire_due_timers()
    assert (again.outcome, again.turn_id) == ("replayed", fired.turn_id)
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 5  # nothing ran again


async def test_a_timer_firing_waits_for_a_turn_running_on_its_thread(store: Durability) -> None:
    held = Held()
    kernel = Kernel(held.agent(), store)
    await kernel.schedule("t", "soon", after=timedelta(0))
    running = asyncio.create_task(kernel.turn("t", "1", "go"))
    await asyncio.wait_for(held.entered.wait(), 10)
    firing = asyncio.create_task(kernel.fire_due_timers())
    await asyncio.sleep(0.05)
    assert not firing.done()  # its turn waits for the thread's lock
    held.release.set()  # the timer's own turn then runs through the capability too
    await running
    (fired,) = await asyncio.wait_for(firing, 10)
    assert fired.outcome == "fired" and fired.result is not None
    assert fired.result.checkpoint_version == 2


async def test_a_claim_that_lapses_while_its_turn_runs_is_replayed_not_run_twice(
    store: Durability,
) -> None:
    held = Held()
    first, second = Kernel(held.agent(), store), Kernel(held.agent(), store)
    await first.schedule("t", "once", after=timedelta(0))
    firing, again = await lapsed_claim(first, second, held.entered)
    held.release.set()
    (one,), (two,) = await firing, await again
    assert (one.outcome, two.outcome) == ("fired", "replayed")
    assert one.turn_id == two.turn_id
    events = await events_of(store, "turn.committed")
    assert [e.turn_id for e in events] == [one.turn_id]
    (timer,) = await first.timers("t")
    assert timer.status == "fired"


async def test_prune_removes_settled_timers_and_keeps_pending_ones(store: Durability) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    await kernel.schedule("t", "done", after=timedelta(0))
    await kernel.schedule("t", "later", after=timedelta(days=30))
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "fired"
    report = await prune(store, older_than=timedelta(days=1), now=START)  # type: ignore[arg-type]
    assert report.timers == 0  # settled at START: not older than the cutoff
    report = await prune(store, older_than=timedelta(0), now=START + timedelta(days=2))  # type: ignore[arg-type]
    assert report.timers == 1
    assert [t.key for t in await kernel.timers("t")] == ["later"]
    # The fired timer's turn ID stays committed: its occurrence cannot run again.
    await kernel.schedule("t", "done", at=START)
    (again,) = await kernel.fire_due_timers()
    assert again.outcome in ("replayed", "void") and again.turn_id == fired.turn_id


def approval_kernel(store: Durability, clock: Clock) -> Kernel:
    return Kernel(approval_agent(remind_before=timedelta(minutes=10)), store, clock=clock)


async def test_a_confirmation_expires_on_time_by_itself_after_a_reminder(
    store: Durability,
) -> None:
    clock = Clock()
    kernel = approval_kernel(store, clock)
    opened = await kernel.turn("t", "1", "ship o1")
    assert opened.interaction is not None
    interaction_id = opened.interaction.id
    clock.move(minutes=19)
    assert await kernel.fire_due_timers() == []
    clock.move(minutes=1)  # ten minutes before the deadline: the reminder
    (reminder,) = await kernel.fire_due_timers()
    assert reminder.outcome == "fired" and reminder.result is not None
    assert reminder.result.reply.startswith("Reminder: Ship order o1?")
    (reminded,) = await events_of(store, "interaction.reminded")
    assert reminded.payload["interaction_id"] == interaction_id
    clock.move(minutes=10)  # the deadline: the expiry, with no one writing
    (expiry,) = await kernel.fire_due_timers()
    assert expiry.outcome == "fired" and expiry.turn_id == f"expire:{interaction_id}"
    (expired,) = await events_of(store, "interaction.expired")
    assert expired.turn_id == expiry.turn_id
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.interaction is None and checkpoint.agenda == ()
    assert await kernel.fire_due_timers() == []
    # The kernel's own timers announce nothing of themselves.
    assert await events_of(store, "timer.fired") == []


async def test_an_answered_confirmation_takes_its_timers_with_it(store: Durability) -> None:
    clock = Clock()
    kernel = approval_kernel(store, clock)
    await kernel.turn("t", "1", "ship o1")
    assert {t.key.split(":")[1] for t in await kernel.timers("t")} == {"expire", "remind"}
    await kernel.turn("t", "2", answer="accept")
    assert await kernel.timers("t") == []
    clock.move(hours=1)
    assert await kernel.fire_due_timers() == []


async def test_the_sweep_and_the_expiry_timer_expire_a_confirmation_once(
    store: Durability,
) -> None:
    clock = Clock()
    kernel = approval_kernel(store, clock)
    await kernel.turn("t", "1", "ship o1")
    clock.move(minutes=31)
    report = await expire_interactions(store, clock=clock)  # type: ignore[arg-type]
    assert report.expired == 1
    # The sweep's commit took the expiry and reminder timers with it.
    assert await kernel.timers("t") == []
    assert await kernel.fire_due_timers() == []
    assert len(await events_of(store, "interaction.expired")) == 1


async def test_an_expiry_timer_claimed_before_the_sweep_replays_its_turn(
    store: Durability,
) -> None:
    clock = Clock()
    kernel = approval_kernel(store, clock)
    opened = await kernel.turn("t", "1", "ship o1")
    assert opened.interaction is not None
    clock.move(minutes=31)
    recorder = await store.recorder()  # type: ignore[attr-defined]
    now = clock()
    claimed = await recorder.claim_timers(now, now + timedelta(seconds=60), 10)
    assert len(claimed) == 2  # a worker claimed both, then the sweep ran first
    await expire_interactions(store, clock=clock)  # type: ignore[arg-type]
    assert await kernel.timers("t") == []
    # The worker goes on with what it claimed: the expiry replays the sweep's turn,
    # the reminder finds its row gone; neither commits anything.
    outcomes = {t.key.split(":")[1]: (await _fire(kernel, recorder, t)).outcome for t in claimed}
    assert outcomes == {"expire": "replayed", "remind": "stale"}
    assert await kernel.timers("t") == []
    assert len(await events_of(store, "interaction.expired")) == 1
    assert len(await events_of(store, "turn.committed")) == 2


async def test_a_kernel_timer_key_is_refused_to_applications(store: Durability) -> None:
    kernel, _ = make_kernel(store, Clock())
    with pytest.raises(InvalidRequestError, match="keeps for its own timers"):
        await kernel.schedule("t", "kernel:expire:x", after=timedelta(0))


async def test_a_timer_set_for_another_tenant_than_the_threads_is_void(
    store: Durability,
) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    await kernel.turn("t", "1", "hello", tenant_id="acme")
    await kernel.schedule("t", "foreign", after=timedelta(0), tenant_id="other")
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "void" and "TenantMismatchError" in (fired.error or "")
    (timer,) = await kernel.timers("t")
    assert timer.status == "void"
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 1
    assert await kernel.fire_due_timers() == []


async def test_a_timer_set_in_a_tenants_turn_fires_in_that_tenant(store: Durability) -> None:
    clock = Clock()
    kernel, _ = make_kernel(store, clock)
    await kernel.turn("t", "1", "remind r1", tenant_id="acme")
    (timer,) = await kernel.timers("t")
    assert timer.tenant_id == "acme"
    clock.move(minutes=5)
    (fired,) = await kernel.fire_due_timers()
    assert fired.outcome == "fired"


async def test_a_cron_timer_fires_at_each_of_its_times_once(store: Durability) -> None:
    clock = Clock()  # Saturday 2026-12-05 09:00 UTC
    kernel, _ = make_kernel(store, clock)
    timer = await kernel.schedule("t", "weekly", cron="0 9 * * MON", message="summary")
    assert timer.due_at == datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    clock.now = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    (first,) = await kernel.fire_due_timers()
    assert first.turn_id == "timer:weekly@20261207T090000.000000Z"
    (moved,) = await kernel.timers("t")
    assert (moved.status, moved.due_at) == ("pending", datetime(2026, 12, 14, 9, 0, tzinfo=UTC))
    clock.now = datetime(2027, 1, 1, tzinfo=UTC)  # three Mondays missed
    (late,) = await kernel.fire_due_timers()
    assert late.outcome == "fired" and await kernel.fire_due_timers() == []
    (after,) = await kernel.timers("t")
    assert after.due_at == datetime(2027, 1, 4, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ({"cron": "every monday"}, "is not a cron expression"),
        ({"cron": "0 9 * * MON", "after": timedelta(0)}, "cron= says when on its own"),
        ({"cron": "0 9 * * MON", "every": timedelta(days=1)}, "cron= says when on its own"),
        ({"cron": 5}, "must be a cron expression"),
    ],
)
async def test_a_bad_cron_timer_is_refused(
    store: Durability, when: dict[str, Any], problem: str
) -> None:
    kernel, _ = make_kernel(store, Clock())
    with pytest.raises(InvalidRequestError, match=problem):
        await kernel.schedule("t", "k", **when)
    assert await kernel.timers() == []


# -- the loop, busy threads and bad arguments ------------------------------------------------


async def test_run_timers_fires_what_is_due_without_pausing_between_full_passes(
    store: Durability,
) -> None:
    """Three timers due, one claimed a pass: a full pass is followed by the next at
    once, not after the poll interval (a minute here). The loop ends when told."""
    kernel, _ = make_kernel(store, Clock())
    for key in ("a", "b", "c"):
        await kernel.schedule("t", key, after=timedelta(0))
    stop = asyncio.Event()
    loop = asyncio.create_task(kernel.run_timers(poll_interval=60, limit=1, stop=stop))
    deadline = asyncio.get_running_loop().time() + 20
    while {t.status for t in await kernel.timers("t")} != {"fired"}:
        assert asyncio.get_running_loop().time() < deadline, "the loop paused between passes"
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(loop, 10)  # the poll's wait ends with the stop
    assert len(await events_of(store, "timer.fired")) == 3


def let_go(holder: Any) -> None:
    """End the holding connection's transaction, and close it."""
    holder.rollback()
    holder.close()


@contextlib.asynccontextmanager
async def store_that_waits_little(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Durability, Callable[[], Callable[[], None]]]]:
    """A store whose statements give up soon on a lock, and ``hold``: it takes, from
    another connection, the lock that a timer's claim needs, and returns its release.

    SQLite: the database's write lock (``BEGIN EXCLUSIVE``); the claim answers busy.
    PostgreSQL: ``ik_timers`` in ``EXCLUSIVE`` mode, which reads pass but the claim's
    update does not; its session's ``lock_timeout`` ends the wait."""
    if kind == "sqlite":
        path = tmp_path / "store.db"

        def hold_sqlite() -> Callable[[], None]:
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")
            return functools.partial(let_go, holder)

        async with SQLiteDurability(path, busy_timeout=0.05) as sqlite_store:
            yield sqlite_store, hold_sqlite
        return
    import psycopg
    from psycopg import sql

    from intention_kernel.durability.postgres import PostgresDurability

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = "ik_store_" + uuid.uuid4().hex[:12]

    def hold_postgres() -> Callable[[], None]:
        holder = psycopg.connect(dsn)
        holder.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        holder.execute("LOCK TABLE ik_timers IN EXCLUSIVE MODE")
        return functools.partial(let_go, holder)

    waits_little = dsn + ("&" if "?" in dsn else "?") + "options=-c%20lock_timeout%3D100"
    try:
        async with PostgresDurability(waits_little, schema=schema) as pg_store:
            yield pg_store, hold_postgres
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_failed_pass_is_logged_and_the_loop_fires_the_timer_once_the_store_is_back(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another connection holds the lock that a timer's claim needs, so each pass
    fails. The loop logs each failure and goes on. Once the lock is let go, the timer
    fires, once."""
    caplog.set_level(logging.WARNING, logger="intention_kernel.timers")

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "intention_kernel.timers"]

    async with store_that_waits_little(kind, request, tmp_path) as (store, hold):
        kernel, _ = make_kernel(store, Clock())
        await kernel.schedule("t", "a", after=timedelta(0))
        release = hold()
        stop = asyncio.Event()
        loop = asyncio.create_task(kernel.run_timers(poll_interval=0.02, stop=stop))
        try:
            deadline = asyncio.get_running_loop().time() + 20
            while len(failures()) < 3:  # three passes failed, and the loop goes on
                assert not loop.done(), loop.exception()
                assert asyncio.get_running_loop().time() < deadline, "no pass failed"
                await asyncio.sleep(0.02)
            assert [t.status for t in await kernel.timers("t")] == ["pending"]
        finally:
            release()
        deadline = asyncio.get_running_loop().time() + 20
        while [t.status for t in await kernel.timers("t")] != ["fired"]:
            assert not loop.done(), loop.exception()
            assert asyncio.get_running_loop().time() < deadline, "the loop fired nothing"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # a few more passes: none fires it again
        stop.set()
        await asyncio.wait_for(loop, 10)
        assert len(await events_of(store, "timer.fired")) == 1
        assert len(await events_of(store, "turn.committed")) == 1
    records = failures()
    assert {r.levelno for r in records} == {logging.WARNING}
    assert all(r.getMessage().startswith("firing timers failed: ") for r in records)
    assert "StoreError" in records[0].getMessage()


async def test_a_timer_on_a_busy_thread_of_a_rejecting_agent_waits_for_the_lock(
    store: Durability,
) -> None:
    """``on_busy="reject"`` refuses a person's message while a turn runs, never a
    timer: its turn waits for the thread's lock, then fires."""
    held = Held()
    kernel = Kernel(dataclasses.replace(held.agent(), on_busy="reject"), store)
    await kernel.schedule("t", "soon", after=timedelta(0))
    running = asyncio.create_task(kernel.turn("t", "1", "go"))
    await asyncio.wait_for(held.entered.wait(), 10)
    firing = asyncio.create_task(kernel.fire_due_timers())
    with pytest.raises(ThreadBusyError):
        await kernel.turn("t", "2", "more")  # a person is refused at once
    await asyncio.sleep(0.05)
    assert not firing.done()  # the timer waits
    held.release.set()
    await running
    (fired,) = await asyncio.wait_for(firing, 10)
    assert fired.outcome == "fired" and fired.result is not None
    assert fired.result.checkpoint_version == 2


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (lambda k: k.fire_due_timers(limit=0), "limit must be a positive integer"),
        (lambda k: k.fire_due_timers(claim_for=0), "claim_for must be a positive number"),
        (lambda k: k.run_timers(poll_interval=0), "poll_interval must be positive"),
        (lambda k: k.timers(limit=0), "limit must be a positive integer"),
        (lambda k: k.timers(status="due"), "status must be pending, fired or void"),
    ],
)
async def test_bad_arguments_to_fire_or_list_timers_are_refused(
    store: Durability, call: Any, problem: str
) -> None:
    kernel, _ = make_kernel(store, Clock())
    await kernel.schedule("t", "k", after=timedelta(0))
    with pytest.raises(InvalidRequestError, match=problem):
        await call(kernel)
    (timer,) = await kernel.timers("t")
    assert (timer.status, timer.claimed_until) == ("pending", None)  # nothing claimed


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"remind_before": timedelta(0)}, "remind_before must be positive"),
        ({"remind_before": 600}, "remind_before must be a datetime.timedelta"),
        (
            {"remind_before": timedelta(minutes=30)},
            "remind_before=0:30:00 must be shorter than confirm_within=0:30:00",
        ),
        (
            {"remind_before": timedelta(minutes=5), "confirmation": "none", "effect": "read"},
            "remind_before needs a confirmation to remind of",
        ),
    ],
)
def test_a_reminder_that_could_never_be_sent_is_refused_at_compilation(
    options: dict[str, Any], problem: str
) -> None:
    within = None if options.get("confirmation") == "none" else timedelta(minutes=30)

    @capability(
        "orders.ship",
        **{"effect": "write", "confirm_within": within, **options},
        description="Ship an order",
    )
    async def ship(input: dict[str, Any], ctx: CapabilityContext) -> str:
        return "shipped"

    agent = Agent(name="o", version="1", capabilities=[ship], interpreter=Interpreter())
    with pytest.raises(CompilationError, match=re.escape(problem)):
        Kernel(agent, InMemoryDurability())
