"""Operations on a store: the deploy check, checkpoint migrations (with an injected
migration list: no older revision exists yet), and retention."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import Kernel, TurnConflictError, TurnExpiredError
from intention_kernel.checkpoint import SCHEMA_REVISION, assemble_checkpoint, decode_checkpoint
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.effects import utcnow
from intention_kernel.operations import check_checkpoints, migrate_checkpoints, prune
from intention_kernel.outbox import OutboxRelay
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing.agents import FakeProvider, billing_agent
from proving_support import (
    Store,
    make_sql_store,
    make_store,
    read_all_events,
)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store | None]:
    """``None`` for the in-memory adapter."""
    yield from make_store(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


def adapter(store: Store | None, **options: Any) -> RecordedDurability:
    durability = InMemoryDurability(**options) if store is None else store.durability(**options)
    assert isinstance(durability, RecordedDurability)
    return durability


def sql(store: Store, text: str) -> str:
    return text.replace("?", "%s") if store.kind == "postgres" else text


async def converse(kernel: Kernel, thread: str) -> None:
    await kernel.turn(thread, "1", "balance 100")
    await kernel.turn(thread, "2", "charge pi_1 500")
    await kernel.turn(thread, "3", "yes")


# -- the deploy check --------------------------------------------------------------------------


async def test_the_check_counts_checkpoints_and_names_every_thread_the_agent_refuses(
    sql_store: Store,
) -> None:
    old, new = billing_agent(FakeProvider()), billing_agent(FakeProvider(), version="2")
    async with adapter(sql_store) as durability:
        for thread in ("ok-1", "ok-2", "newer", "corrupt"):
            await converse(Kernel(old, durability), thread)
        await converse(Kernel(new, durability), "foreign")
        old_print, new_print = (
            Kernel(old, durability).fingerprint,
            Kernel(new, durability).fingerprint,
        )
    sql_store.query(
        sql(
            sql_store,
            "UPDATE ik_threads SET checkpoint = replace(checkpoint, ?, ?) WHERE thread_id = ?",
        ),
        f'"schema_revision":{SCHEMA_REVISION},',
        f'"schema_revision":{SCHEMA_REVISION + 1},',
        "newer",
    )
    sql_store.query(
        sql(sql_store, "UPDATE ik_threads SET checkpoint = ? WHERE thread_id = ?"),
        "{oops",
        "corrupt",
    )

    async with adapter(sql_store) as durability:
        report = await check_checkpoints(durability, old, batch=2)  # several batches
        compatible = billing_agent(FakeProvider(), version="2", compatible_fingerprints=[old_print])
        later = await check_checkpoints(durability, compatible)
    assert report.threads == 5 and report.fingerprint == old_print
    assert report.revisions == {SCHEMA_REVISION: 3, SCHEMA_REVISION + 1: 1, None: 1}
    assert report.fingerprints == {old_print: 3, new_print: 1, None: 1}
    assert sorted((r.thread_id, r.reason) for r in report.refused) == [
        ("corrupt", "corrupt"),
        ("foreign", "foreign_fingerprint"),
        ("newer", "newer_revision"),
    ]
    assert not report.ok
    # The new agent, declaring the old fingerprint, accepts both agents' threads.
    assert sorted((r.thread_id, r.reason) for r in later.refused) == [
        ("corrupt", "corrupt"),
        ("newer", "newer_revision"),
    ]


# -- migrations --------------------------------------------------------------------------------


def tag_messages(document: dict[str, Any]) -> dict[str, Any]:
    """An injected migration from the current revision to the next: it rewrites messages."""
    document["messages"] = [dict(m, content=m["content"] + " [v2]") for m in document["messages"]]
    return document


#: As if the library's migration list were ``[..., tag_messages]``.
MIGRATIONS = [*([lambda d: d] * (SCHEMA_REVISION - 1)), tag_messages]


async def stored(durability: RecordedDurability, thread_id: str) -> tuple[int, list[str]]:
    """The stored checkpoint's revision (as the rows say) and its messages' contents."""
    recorder = await durability.recorder()
    [(_, thread)] = [t for t in await recorder.scan_threads(None, 100, None) if t[0] == thread_id]
    assert thread.checkpoint is not None
    text, _ = assemble_checkpoint(thread.checkpoint, thread.messages, thread.facts)
    checkpoint = decode_checkpoint(text, migrations=MIGRATIONS)
    revision = int(thread.checkpoint.split(",", 1)[0].split(":")[1])
    return revision, [m.content for m in checkpoint.messages]


async def test_migrate_rewrites_older_revisions_in_place_in_batches_and_resumably(
    store: Store | None,
) -> None:
    threads = [f"t-{n}" for n in range(5)]
    async with adapter(store, lock_timeout=0.2) as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        for thread in threads:
            await converse(kernel, thread)
        before = {t: await durability.load_checkpoint(t) for t in threads}
        recorder = await durability.recorder()
        busy, release = asyncio.Event(), asyncio.Event()

        async def live_turn_holding(thread_id: str) -> None:
            async with recorder.lock(thread_id):
                busy.set()
                await release.wait()

        holder = asyncio.create_task(live_turn_holding("t-3"))
        await busy.wait()
        first = await migrate_checkpoints(durability, batch=2, migrations=MIGRATIONS)
        release.set()
        await holder
        assert (first.revision, first.migrated) == (SCHEMA_REVISION + 1, 4)
        assert [(f.thread_id, f.reason) for f in first.failed] == [("t-3", "busy")]
        second = await migrate_checkpoints(durability, batch=2, migrations=MIGRATIONS)
        assert (second.migrated, second.failed) == (1, ())  # resumed: only what was left
        assert (await migrate_checkpoints(durability, migrations=MIGRATIONS)).migrated == 0
        for thread in threads:
            revision, contents = await stored(durability, thread)
            old = before[thread]
            assert old is not None
            assert revision == SCHEMA_REVISION + 1
            assert contents == [m.content + " [v2]" for m in old.messages]  # migrated once
        if store is not None:
            column = store.query("SELECT DISTINCT schema_revision FROM ik_threads")
            assert column == [(SCHEMA_REVISION + 1,)]


async def test_migrate_with_nothing_older_changes_nothing(store: Store | None) -> None:
    async with adapter(store) as durability:
        await converse(Kernel(billing_agent(FakeProvider()), durability), "t")
        snapshot = store.snapshot() if store is not None else None
        report = await migrate_checkpoints(durability)
        assert (report.revision, report.migrated, report.failed) == (SCHEMA_REVISION, 0, ())
    if store is not None:
        assert store.snapshot() == snapshot


# -- retention ---------------------------------------------------------------------------------


async def test_prune_drops_old_results_and_published_events_and_refuses_late_retries(
    store: Store | None,
) -> None:
    provider = FakeProvider()
    async with adapter(store) as durability:
        kernel = Kernel(billing_agent(provider), durability)
        for thread in ("t-a", "t-b"):
            await converse(kernel, thread)
        events = await read_all_events(durability)
        refused = {e.id for e in events if e.thread_id == "t-b" and e.seq >= 3}

        async def sink(event: Any) -> None:
            if event.id in refused:
                raise ConnectionError("down")

        await OutboxRelay(durability, sink).run_once()
        unpublished = [e for e in events if e.thread_id == "t-b" and e.seq >= 3]

        nothing = await prune(durability, older_than=timedelta(days=30))
        assert (nothing.events, nothing.turns) == (0, 0)
        report = await prune(durability, older_than=timedelta(0), now=utcnow(), batch=2)
        assert (report.events, report.turns) == (len(events) - len(unpublished), 6)
        assert await read_all_events(durability) == unpublished  # the relay still owes them
        assert (await prune(durability, older_than=timedelta(0))).turns == 0

        with pytest.raises(TurnExpiredError) as expired:
            await kernel.turn("t-a", "3", "yes")  # a very late retry: refused, not re-run
        assert (expired.value.thread_id, expired.value.turn_id) == ("t-a", "3")
        with pytest.raises(TurnConflictError):
            await kernel.turn("t-a", "3", "charge pi_9 100")  # another request: a conflict
        assert provider.calls() == 2
        # The threads go on: checkpoints are untouched, new turns commit and replay.
        result = await kernel.turn("t-a", "4", "balance 5")
        assert result.checkpoint_version == 4
        assert (await kernel.turn("t-a", "4", "balance 5")).replayed


async def test_prune_does_not_read_again_the_turns_it_pruned_before(
    store: Store | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run reads only the turns that still hold a result: the second of two runs
    makes one store call for the turns however many are stored (it used to walk every
    turn key again, a batch per call)."""
    async with adapter(store) as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        for thread in ("t-a", "t-b", "t-c"):
            await converse(kernel, thread)
        recorder = await durability.recorder()
        calls: list[tuple[int, tuple[str, str] | None]] = []
        original = recorder.prune_turns

        async def counted(before: Any, after: Any, limit: int) -> Any:
            outcome = await original(before, after, limit)
            calls.append(outcome)
            return outcome

        monkeypatch.setattr(recorder, "prune_turns", counted)
        first = await prune(durability, older_than=timedelta(0), batch=2)
        assert first.turns == 9 and [n for n, _ in calls] == [2, 2, 2, 2, 1]
        calls.clear()
        again = await prune(durability, older_than=timedelta(0), batch=2)
        assert again.turns == 0 and calls == [(0, None)]
        calls.clear()
        await kernel.turn("t-b", "4", "balance 1")
        later = await prune(durability, older_than=timedelta(0), batch=2)
        assert later.turns == 1 and calls == [(1, None)]
        with pytest.raises(TurnExpiredError):
            await kernel.turn("t-b", "4", "balance 1")
