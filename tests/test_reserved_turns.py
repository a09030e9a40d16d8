"""Turn IDs the kernel reserves for its own turns (issue 31, N2), on every store.

The expiry sweep closes an overdue interaction in a turn of its own, ``expire:<id>``.
A client turn with that ID would take it first: the sweep's delivery then conflicts.
So a client turn ID with a reserved prefix is refused before anything is read, and a
sweep that meets such a thread anyway (one written before the refusal existed)
reports it and goes on to the next thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from intention_kernel import (
    Interaction,
    InvalidRequestError,
    Kernel,
    KernelCheckpoint,
    ReservedTurnIdError,
    TurnCommit,
    TurnResult,
    TurnScope,
)
from intention_kernel._checkpoint import CheckpointDelta
from intention_kernel._deadlines import expiry_turn_id
from intention_kernel._turns import RESERVED_TURN_PREFIXES, committed_event, request_digest
from intention_kernel.durability import Durability, TurnTransaction, open_durability
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.operations import expire_interactions
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import new_database, process_env, read_all_events

START = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
WITHIN = timedelta(minutes=15)


class MovingClock:
    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def recorded(store: Durability) -> RecordedDurability:
    assert isinstance(store, RecordedDurability)
    return store


async def take_turn_id(store: Durability, thread_id: str, turn_id: str) -> None:
    """Commit a client's turn under ``turn_id``, as a release without the refusal let
    a client do: a chat turn that leaves the thread's interaction open."""

    async def operation(tx: TurnTransaction) -> TurnCommit:
        checkpoint = tx.checkpoint
        assert isinstance(checkpoint, KernelCheckpoint)
        following = dataclasses.replace(checkpoint, version=checkpoint.version + 1)
        result = TurnResult(
            thread_id=thread_id,
            turn_id=turn_id,
            replayed=False,
            reply="hello",
            interaction=checkpoint.interaction,
            steps=(),
            checkpoint_version=following.version,
        )
        events = (committed_event(following.version, ()),)
        return TurnCommit(result, following, events, delta=CheckpointDelta(checkpoint.version))

    scope = TurnScope(thread_id, turn_id, None, request_digest("hello", None))
    await store.with_turn(scope, operation)


# -- the refusal ----------------------------------------------------------------------------------


def test_the_expiry_sweep_turn_id_uses_a_reserved_prefix() -> None:
    kernel_turn = expiry_turn_id(_interaction("ix_1"))
    assert any(kernel_turn.startswith(prefix) for prefix in RESERVED_TURN_PREFIXES)


@pytest.mark.parametrize("turn_id", ["expire:ix_0123", "expire:", "expire:anything at all"])
async def test_a_client_turn_id_with_a_reserved_prefix_is_refused_and_changes_nothing(
    store: Durability, turn_id: str
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider, confirm_within=WITHIN), store, clock=MovingClock())
    with pytest.raises(ReservedTurnIdError) as caught:
        await kernel.turn("t", turn_id, "charge pi_1 500")
    assert isinstance(caught.value, InvalidRequestError)
    assert caught.value.turn_id == turn_id
    assert "expire:" in str(caught.value) and "reserved" in str(caught.value)
    with pytest.raises(ReservedTurnIdError):
        async for _ in kernel.stream_turn("t", turn_id, "charge pi_1 500"):
            pass
    assert await store.load_checkpoint("t") is None
    assert await read_all_events(store) == []
    assert provider.calls() == 0


async def test_turn_ids_that_only_resemble_a_reserved_prefix_are_served(store: Durability) -> None:
    kernel = Kernel(billing_agent(FakeProvider()), store)
    for turn_id in ("expire", "Expire:1", "re-expire:1", "expire-1"):
        result = await kernel.turn("t", turn_id, "what is my balance?")
        assert not result.replayed


async def test_the_host_answers_a_reserved_turn_id_with_problem_details(store: Durability) -> None:
    from host_support import asgi_client
    from intention_kernel.host import Principal, create_app

    kernel = Kernel(billing_agent(FakeProvider()), store)
    app = create_app(kernel, tokens={"tok": Principal("ana", None, "operator")})
    auth = {"authorization": "Bearer tok"}
    async with asgi_client(app) as client:
        in_body = await client.post(
            "/v1/threads/t/turns",
            json={"turn_id": "expire:ix_1", "message": "charge pi_1 5"},
            headers=auth,
        )
        in_header = await client.post(
            "/v1/threads/t/turns",
            json={"message": "charge pi_1 5"},
            headers={**auth, "idempotency-key": "expire:ix_1"},
        )
        streamed = await client.post(
            "/v1/threads/t/turns",
            json={"turn_id": "expire:ix_1", "message": "charge pi_1 5"},
            headers={**auth, "accept": "text/event-stream"},
        )
    for response in (in_body, in_header, streamed):
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        problem = response.json()
        assert problem["type"].endswith("invalid-request")
        assert problem["turn_id"] == "expire:ix_1" and "reserved" in problem["detail"]
    assert await store.load_checkpoint("t") is None


# -- the sweep goes on past a thread it cannot close ----------------------------------------------


async def test_the_sweep_reports_a_taken_turn_id_and_closes_every_other_thread(
    store: Durability,
) -> None:
    clock, provider = MovingClock(), FakeProvider()
    kernel = Kernel(billing_agent(provider, confirm_within=WITHIN), store, clock=clock)
    first = await kernel.turn("a-taken", "1", "charge pi_1 500")
    await kernel.turn("b-later", "1", "charge pi_2 500")
    await kernel.turn("c-later", "1", "refund pi_3 100")
    assert first.interaction is not None
    await take_turn_id(store, "a-taken", expiry_turn_id(first.interaction))
    clock.now += timedelta(hours=1)

    report = await expire_interactions(recorded(store), clock=clock, batch=1)
    assert report.expired == 2
    [failed] = report.failed
    assert failed.thread_id == "a-taken" and failed.reason == "conflict"
    assert expiry_turn_id(first.interaction) in failed.detail
    for thread in ("b-later", "c-later"):
        checkpoint = await store.load_checkpoint(thread)
        assert checkpoint is not None and checkpoint.interaction is None
    taken = await store.load_checkpoint("a-taken")
    assert taken is not None and taken.interaction == first.interaction
    again = await expire_interactions(recorded(store), clock=clock)
    assert again.expired == 0 and [f.thread_id for f in again.failed] == ["a-taken"]
    assert provider.calls() == 0


def _interaction(interaction_id: str) -> Interaction:
    return Interaction(interaction_id, "confirmation", "a.b", {}, "?")


# -- the command, in a process of its own ----------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with new_database(request.getfixturevalue("postgres_dsn")) as url:
        yield url


def test_interactions_expire_exits_1_only_after_every_other_thread_expired(
    store_url: str,
) -> None:
    now = datetime.now(UTC)

    async def seed() -> None:
        async with open_durability(store_url) as store:
            past = Kernel(
                billing_agent(FakeProvider(), confirm_within=WITHIN),
                store,
                clock=lambda: now - timedelta(hours=2),
            )
            taken = await past.turn("a-taken", "1", "charge pi_1 500")
            assert taken.interaction is not None
            await take_turn_id(store, "a-taken", expiry_turn_id(taken.interaction))
            await past.turn("b-later", "1", "charge pi_2 500", tenant_id="acme")

    asyncio.run(seed())
    done = subprocess.run(
        [sys.executable, "-m", "intention_kernel", "interactions", "expire", "--db", store_url],
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("expired 1 interaction(s)"), done.stdout
    assert "a-taken" in done.stdout and "Traceback" not in done.stderr

    async def check() -> None:
        async with open_durability(store_url) as store:
            later = await store.load_checkpoint("b-later")
            assert later is not None and later.interaction is None

    asyncio.run(check())
