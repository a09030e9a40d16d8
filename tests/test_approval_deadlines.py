"""Deadlines of confirmations (issue 21): ``confirm_within``, ``expires_in``, expiry by
the next turn and by the operator's sweep, on every store.

Time comes from a clock the tests move (``Kernel(..., clock=...)``); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import (
    Agent,
    Answer,
    CapabilityContext,
    CapabilityResult,
    CompilationError,
    Interaction,
    Kernel,
    KernelCheckpoint,
    KernelError,
    TurnResult,
    capability,
)
from intention_kernel._checkpoint import decode_checkpoint, encode_checkpoint
from intention_kernel._interpretation import Intent, Interpretation
from intention_kernel._replies import Replies
from intention_kernel.durability import Durability, open_durability
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.operations import expire_interactions
from intention_kernel.testing import ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import new_database, process_env, read_all_events

START = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
WITHIN = timedelta(minutes=15)
EXPIRED = Replies().expired(Interaction("ix", "confirmation", "a.b", {}, "?"))


class MovingClock:
    """A clock that stands still until a test moves it."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta) -> None:
        self.now += by


def kernel_of(store: Durability, clock: MovingClock, provider: FakeProvider) -> Kernel:
    return Kernel(billing_agent(provider, confirm_within=WITHIN), store, clock=clock)


async def events_of(store: Durability, thread_id: str, type: str) -> list[dict[str, Any]]:
    return [e.payload for e in await read_all_events(store, thread_id=thread_id) if e.type == type]


# -- the deadline an interaction carries -----------------------------------------------------------


async def test_a_confirmation_carries_its_deadline_in_utc(store: Durability) -> None:
    clock = MovingClock(datetime(2026, 12, 2, 10, 0, tzinfo=UTC).astimezone())
    kernel = kernel_of(store, clock, FakeProvider())
    result = await kernel.turn("t", "1", "charge pi_1 500")
    assert result.interaction is not None
    assert result.interaction.expires_at == START + timedelta(hours=1) + WITHIN
    assert result.to_dict()["interaction"]["expires_at"] == "2026-12-02T10:15:00Z"
    assert TurnResult.from_dict(result.to_dict()) == result
    stored = await kernel.checkpoint("t")
    assert stored is not None and stored.interaction == result.interaction
    [opened] = await events_of(store, "t", "interaction.opened")
    assert opened["expires_at"] == "2026-12-02T10:15:00+00:00"


async def test_a_confirmation_without_a_deadline_never_expires(store: Durability) -> None:
    clock, provider = MovingClock(), FakeProvider()
    kernel = Kernel(billing_agent(provider), store, clock=clock)
    result = await kernel.turn("t", "1", "charge pi_1 500")
    assert result.interaction is not None and result.interaction.expires_at is None
    [opened] = await events_of(store, "t", "interaction.opened")
    assert "expires_at" not in opened
    clock.advance(timedelta(days=3650))
    assert (await expire_interactions(_recorded(store), clock=clock)).expired == 0
    accepted = await kernel.turn("t", "2", "yes")
    assert provider.calls() == 1 and accepted.steps[0].status == "completed"


# -- an answer after the deadline ------------------------------------------------------------------


async def test_an_accept_after_the_deadline_runs_nothing_and_emits_interaction_expired(
    store: Durability,
) -> None:
    clock, provider = MovingClock(), FakeProvider()
    kernel = kernel_of(store, clock, provider)
    proposed = await kernel.turn("t", "1", "charge pi_1 500")
    assert proposed.interaction is not None
    clock.advance(WITHIN)  # the deadline itself is too late
    late = await kernel.turn("t", "2", answer=Answer(proposed.interaction.id, "accept"))
    assert provider.calls() == 0
    assert late.reply == EXPIRED
    assert late.interaction is None
    [step] = late.steps
    assert (step.step_id, step.status) == (proposed.steps[0].step_id, "rejected")
    assert step.error is not None and "expired" in step.error
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.interaction is None and checkpoint.agenda == ()
    [expired] = await events_of(store, "t", "interaction.expired")
    assert expired == {
        "interaction_id": proposed.interaction.id,
        "kind": "confirmation",
        "capability_id": "payments.charge",
        "step_id": proposed.steps[0].step_id,
        "resolution": "expired",
        "expires_at": "2026-12-02T09:15:00+00:00",
    }
    assert await events_of(store, "t", "interaction.resolved") == []
    # Accepting again finds nothing pending: nothing ever runs.
    again = await kernel.turn("t", "3", "yes")
    assert provider.calls() == 0 and again.steps == ()


async def test_an_accept_before_the_deadline_runs_the_operation_once(store: Durability) -> None:
    clock, provider = MovingClock(), FakeProvider()
    kernel = kernel_of(store, clock, provider)
    await kernel.turn("t", "1", "charge pi_1 500")
    clock.advance(WITHIN - timedelta(microseconds=1))
    accepted = await kernel.turn("t", "2", "yes")
    assert provider.calls() == 1
    assert [s.status for s in accepted.steps] == ["completed"]
    assert await kernel.turn("t", "2", "yes") == dataclasses.replace(accepted, replayed=True)
    assert provider.calls() == 1
    assert await events_of(store, "t", "interaction.expired") == []
    [resolved] = await events_of(store, "t", "interaction.resolved")
    assert resolved["resolution"] == "accepted"


async def test_the_next_turn_on_the_thread_closes_an_overdue_interaction(
    store: Durability,
) -> None:
    clock, provider = MovingClock(), FakeProvider()
    kernel = kernel_of(store, clock, provider)
    proposed = await kernel.turn("t", "1", "charge pi_1 500")
    clock.advance(timedelta(hours=1))
    asked = await kernel.turn("t", "2", "balance")
    assert asked.reply == f"{EXPIRED}\nYou owe 4200."
    assert [(s.capability_id, s.status) for s in asked.steps] == [
        ("payments.charge", "rejected"),
        ("billing.balance", "completed"),
    ]
    assert asked.interaction is None
    assert proposed.interaction is not None
    [expired] = await events_of(store, "t", "interaction.expired")
    assert expired["interaction_id"] == proposed.interaction.id
    assert provider.calls() == 0


async def test_an_overdue_interaction_is_not_shown_to_the_interpreter_as_pending(
    store: Durability,
) -> None:
    seen: list[Interaction | None] = []

    def interpret(request: Any) -> Interpretation:
        seen.append(request.interaction)
        if request.message == "charge":
            return Interpretation(
                [Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 5})]
            )
        return Interpretation(answer="accept")

    clock, provider = MovingClock(), FakeProvider()
    agent = billing_agent(
        provider, confirm_within=WITHIN, interpreter=ScriptedInterpreter(interpret)
    )
    kernel = Kernel(agent, store, clock=clock)
    await kernel.turn("t", "1", "charge")
    clock.advance(WITHIN)
    late = await kernel.turn("t", "2", "yes please")
    assert seen[1] is None
    assert late.reply == EXPIRED and provider.calls() == 0


async def test_a_new_proposal_after_expiry_gets_a_fresh_deadline(store: Durability) -> None:
    clock, provider = MovingClock(), FakeProvider()
    kernel = kernel_of(store, clock, provider)
    await kernel.turn("t", "1", "charge pi_1 500")
    clock.advance(timedelta(hours=2))
    again = await kernel.turn("t", "2", "charge pi_1 500")
    assert again.interaction is not None
    assert again.interaction.expires_at == START + timedelta(hours=2) + WITHIN
    assert len(await events_of(store, "t", "interaction.expired")) == 1
    assert await events_of(store, "t", "interaction.resolved") == []  # expired, not superseded
    await kernel.turn("t", "3", "yes")
    assert provider.calls() == 1


# -- capability mode -------------------------------------------------------------------------------


async def test_a_capability_that_asks_on_its_own_is_not_called_again_after_its_deadline(
    store: Durability,
) -> None:
    calls: list[str | None] = []

    @capability("payments.refund", effect="write", confirmation="capability")
    async def refund(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        calls.append(None if ctx.answer is None else ctx.answer.decision)
        if ctx.answer is None:
            return CapabilityResult.needs_confirmation("Refund?", expires_in=timedelta(minutes=5))
        return CapabilityResult(reply="Refunded.")

    interpreter = ScriptedInterpreter(
        {
            "refund": Interpretation([Intent("payments.refund", {})]),
            "yes": Interpretation(answer="accept"),
        }
    )
    clock = MovingClock()
    kernel = Kernel(Agent("refunds", "1", [refund], interpreter), store, clock=clock)
    asked = await kernel.turn("t", "1", "refund")
    assert asked.interaction is not None
    assert asked.interaction.expires_at == START + timedelta(minutes=5)
    clock.advance(timedelta(minutes=5))
    late = await kernel.turn("t", "2", "yes")
    assert calls == [None]
    assert late.reply == EXPIRED
    [expired] = await events_of(store, "t", "interaction.expired")
    assert expired["kind"] == "capability"

    await kernel.turn("t", "3", "refund")
    clock.advance(timedelta(minutes=4))
    in_time = await kernel.turn("t", "4", "yes")
    assert calls == [None, None, "accept"] and in_time.reply == "Refunded."


async def test_confirm_within_is_the_default_expires_in_of_a_capability_that_asks(
    store: Durability,
) -> None:
    clock, provider = MovingClock(), FakeProvider()
    kernel = kernel_of(store, clock, provider)
    asked = await kernel.turn("t", "1", "refund pi_1 100")
    assert asked.interaction is not None and asked.interaction.kind == "capability"
    assert asked.interaction.expires_at == START + WITHIN
    clock.advance(WITHIN)
    await kernel.turn("t", "2", "yes")
    assert provider.calls() == 0


# -- the sweep -------------------------------------------------------------------------------------


def _recorded(store: Durability) -> RecordedDurability:
    assert isinstance(store, RecordedDurability)
    return store


async def test_the_sweep_closes_every_overdue_interaction_once(store: Durability) -> None:
    clock, provider = MovingClock(), FakeProvider()
    kernel = kernel_of(store, clock, provider)
    await kernel.turn("old-1", "1", "charge pi_1 500")
    await kernel.turn("old-2", "1", "refund pi_2 100", tenant_id="acme")
    clock.advance(timedelta(minutes=10))
    await kernel.turn("fresh", "1", "charge pi_3 500")
    await Kernel(billing_agent(provider), store, clock=clock).turn("forever", "1", "charge pi_4 5")
    clock.advance(timedelta(minutes=6))  # old-* overdue, fresh has 9 minutes left

    report = await expire_interactions(_recorded(store), clock=clock, batch=1)
    assert (report.expired, report.failed, report.now) == (2, (), clock.now)
    for thread in ("old-1", "old-2"):
        checkpoint = await store.load_checkpoint(thread)
        assert checkpoint is not None
        assert (checkpoint.interaction, checkpoint.agenda, checkpoint.version) == (None, (), 2)
        assert [m.turn_id for m in checkpoint.messages] == ["1", "1"]  # nobody spoke
        assert len(await events_of(store, thread, "interaction.expired")) == 1
    for thread in ("fresh", "forever"):
        checkpoint = await store.load_checkpoint(thread)
        assert checkpoint is not None and checkpoint.interaction is not None

    again = await expire_interactions(_recorded(store), clock=clock)
    assert again.expired == 0
    assert len(await events_of(store, "old-1", "interaction.expired")) == 1
    # The person's late "yes" finds nothing to run.
    late = await kernel.turn("old-1", "2", "yes")
    assert late.steps == () and provider.calls() == 0
    refused = await kernel.turn("old-2", "2", "yes", tenant_id="acme")
    assert refused.steps == () and provider.calls() == 0


async def test_the_sweeps_turn_commits_the_expiry_with_turn_committed(store: Durability) -> None:
    clock = MovingClock()
    kernel = kernel_of(store, clock, FakeProvider())
    proposed = await kernel.turn("t", "1", "charge pi_1 500")
    assert proposed.interaction is not None
    clock.advance(WITHIN)
    await expire_interactions(_recorded(store), clock=clock)
    events = [e for e in await read_all_events(store, thread_id="t") if e.turn_id != "1"]
    assert [(e.type, e.turn_id) for e in events] == [
        ("interaction.expired", f"expire:{proposed.interaction.id}"),
        ("turn.committed", f"expire:{proposed.interaction.id}"),
    ]
    assert events[1].payload == {
        "version": 2,
        "steps": [
            {
                "step_id": proposed.steps[0].step_id,
                "capability_id": "payments.charge",
                "status": "rejected",
            }
        ],
    }


async def test_two_sweeps_at_once_close_an_interaction_once(store: Durability) -> None:
    clock = MovingClock()
    kernel = kernel_of(store, clock, FakeProvider())
    for thread in ("a", "b", "c"):
        await kernel.turn(thread, "1", "charge pi_1 500")
    clock.advance(WITHIN)
    reports = await asyncio.gather(
        expire_interactions(_recorded(store), clock=clock),
        expire_interactions(_recorded(store), clock=clock),
    )
    assert sum(r.expired for r in reports) == 3
    for thread in ("a", "b", "c"):
        assert len(await events_of(store, thread, "interaction.expired")) == 1
        checkpoint = await store.load_checkpoint(thread)
        assert checkpoint is not None and checkpoint.version == 2


async def test_the_sweep_decides_again_under_the_lock(store: Durability) -> None:
    """An interaction overdue when the sweep selected it but not when it holds the
    thread's lock (the clock was read again there) is left alone, and nothing commits."""
    clock = MovingClock()
    kernel = kernel_of(store, clock, FakeProvider())
    await kernel.turn("t", "1", "charge pi_1 500")
    readings = iter([START + WITHIN, START])  # the selection's reading, then the lock's

    report = await expire_interactions(_recorded(store), clock=lambda: next(readings))
    assert report.expired == 0 and report.failed == ()
    checkpoint = await store.load_checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 1 and checkpoint.interaction is not None
    assert await events_of(store, "t", "interaction.expired") == []


# -- bad input and old checkpoints -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("within", "problem"),
    [
        (timedelta(0), "confirm_within must be positive"),
        (timedelta(minutes=-1), "confirm_within must be positive"),
        (900, "confirm_within must be a datetime.timedelta"),
    ],
)
def test_a_deadline_that_is_not_a_positive_timedelta_is_refused_at_compilation(
    within: Any, problem: str
) -> None:
    with pytest.raises(CompilationError, match=problem):
        Kernel(billing_agent(FakeProvider(), confirm_within=within), _unused_store())


def test_a_deadline_on_a_capability_that_never_asks_is_refused_at_compilation() -> None:
    @capability("billing.balance", confirm_within=WITHIN)
    async def balance(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult()

    with pytest.raises(CompilationError, match="confirm_within needs a confirmation"):
        Kernel(Agent("a", "1", [balance], ScriptedInterpreter({})), _unused_store())


@pytest.mark.parametrize("expires_in", [timedelta(0), timedelta(seconds=-5), 60])
def test_needs_confirmation_refuses_an_expires_in_that_is_not_positive(expires_in: Any) -> None:
    with pytest.raises(ValueError, match="expires_in must be"):
        CapabilityResult.needs_confirmation("Sure?", expires_in=expires_in)


async def test_a_clock_without_a_time_zone_is_refused_and_nothing_commits(
    store: Durability,
) -> None:
    kernel = Kernel(billing_agent(FakeProvider()), store, clock=lambda: datetime(2026, 1, 1))
    with pytest.raises(KernelError, match="timezone-aware"):
        await kernel.turn("t", "1", "balance")
    assert await store.load_checkpoint("t") is None


def test_a_checkpoint_stored_before_deadlines_reads_as_no_deadline() -> None:
    interaction = Interaction("ix_1", "confirmation", "payments.charge", {"a": 1}, "Charge?")
    document = json.loads(encode_checkpoint(KernelCheckpoint(1, "fp", 1, interaction=interaction)))
    del document["interaction"]["expires_at"]  # as a release without deadlines stored it
    loaded = decode_checkpoint(json.dumps(document))
    assert loaded.interaction is not None and loaded.interaction.expires_at is None
    assert loaded.interaction == interaction


def _unused_store() -> Durability:
    from intention_kernel.testing import InMemoryDurability

    return InMemoryDurability()


# -- the command, in a process of its own ----------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with new_database(request.getfixturevalue("postgres_dsn")) as url:
        yield url


def run_expire(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "intention_kernel", "interactions", "expire", "--db", url],
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_interactions_expire_closes_overdue_interactions_and_is_idempotent(store_url: str) -> None:
    provider = FakeProvider()
    now = datetime.now(UTC)

    async def seed() -> None:
        async with open_durability(store_url) as store:
            # Proposed two hours ago (the clock says so) with 15 minutes to answer.
            past = Kernel(
                billing_agent(provider, confirm_within=WITHIN),
                store,
                clock=lambda: now - timedelta(hours=2),
            )
            await past.turn("overdue", "1", "charge pi_1 500")
            await past.turn("overdue-2", "1", "refund pi_2 100", tenant_id="acme")
            fresh = Kernel(billing_agent(provider, confirm_within=timedelta(days=1)), store)
            await fresh.turn("fresh", "1", "charge pi_3 500")

    asyncio.run(seed())
    first = run_expire(store_url)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.startswith("expired 2 interaction(s) overdue at "), first.stdout
    second = run_expire(store_url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.startswith("expired 0 interaction(s)"), second.stdout

    async def check() -> None:
        async with open_durability(store_url) as store:
            for thread in ("overdue", "overdue-2"):
                checkpoint = await store.load_checkpoint(thread)
                assert checkpoint is not None and checkpoint.interaction is None
                assert len(await events_of(store, thread, "interaction.expired")) == 1
            fresh = await store.load_checkpoint("fresh")
            assert fresh is not None and fresh.interaction is not None
            late = await Kernel(billing_agent(provider), store).turn("overdue", "2", "yes")
            assert late.steps == ()
        assert provider.calls() == 0

    asyncio.run(check())


def test_interactions_expire_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    done = run_expire(f"sqlite:///{tmp_path / 'missing.db'}")
    assert done.returncode == 2 and "refused" in done.stderr
    assert not (tmp_path / "missing.db").exists()


# -- the HTTP host ---------------------------------------------------------------------------------


async def test_the_host_shows_the_deadline_in_its_json(store: Durability) -> None:
    from host_support import asgi_client
    from intention_kernel.host import Principal, create_app

    clock = MovingClock()
    kernel = kernel_of(store, clock, FakeProvider())
    app = create_app(kernel, tokens={"tok": Principal("ana", "acme", "operator")})
    auth = {"authorization": "Bearer tok"}
    async with asgi_client(app) as client:
        turn = await client.post(
            "/v1/threads/t/turns", json={"turn_id": "d1", "message": "charge pi_1 5"}, headers=auth
        )
        thread = await client.get("/v1/threads/t", headers=auth)
        queue = await client.get("/v1/interactions", headers=auth)
        schema = (await client.get("/openapi.json")).json()
    assert turn.json()["interaction"]["expires_at"] == "2026-12-02T09:15:00Z"
    assert thread.json()["interaction"]["expires_at"] == "2026-12-02T09:15:00Z"
    [pending] = queue.json()["interactions"]
    assert pending["interaction"]["expires_at"] == "2026-12-02T09:15:00Z"
    shape = schema["components"]["schemas"]["Interaction"]["properties"]["expires_at"]
    assert {"type": "string", "format": "date-time"} in shape["anyOf"]
