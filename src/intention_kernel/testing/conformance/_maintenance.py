"""The maintenance part of the storage contract: the deploy check over stored
checkpoints, checkpoint migrations (with an injected migration list: no older revision
exists yet), and retention."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from intention_kernel._checkpoint import SCHEMA_REVISION, ReceiptRef, decode_checkpoint
from intention_kernel._effects import utcnow
from intention_kernel._kernel import Kernel
from intention_kernel.durability import Durability
from intention_kernel.durability._layout.codec import assemble_checkpoint
from intention_kernel.durability.abc import Operable
from intention_kernel.errors import TurnConflictError, TurnExpiredError
from intention_kernel.operations import check_checkpoints, migrate_checkpoints, prune
from intention_kernel.outbox import OutboxRelay
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing.conformance._support import (
    ConformanceCase,
    Inspector,
    Tamper,
    as_operable,
    read_all_events,
)

__all__ = ["MaintenanceConformance"]


class MaintenanceConformance(ConformanceCase):
    """Subclass and provide ``make_durability``; see :mod:`intention_kernel.testing.conformance`."""

    # =========================================================================================
    # The deploy check
    # =========================================================================================

    async def test_the_check_counts_checkpoints_and_names_every_thread_the_agent_refuses(
        self,
        durability: Durability,
        make_durability: Callable[[], Durability],
        tamper: Tamper | None,
        operable: bool,
    ) -> None:
        if tamper is None:
            pytest.skip("this adapter provides no tamper fixture")
        maintained = maintainable(durability, operable)
        old, new = billing_agent(FakeProvider()), billing_agent(FakeProvider(), version="2")
        for thread in ("ok-1", "ok-2", "newer", "corrupt"):
            await converse(Kernel(old, maintained), thread)
        await converse(Kernel(new, maintained), "foreign")
        old_print, new_print = (
            Kernel(old, maintained).fingerprint,
            Kernel(new, maintained).fingerprint,
        )
        recorder = await maintained.recorder()
        [head] = [
            t.checkpoint for i, t in await recorder.scan_threads(None, 100, None) if i == "newer"
        ]
        assert head is not None
        stamp = f'"schema_revision":{SCHEMA_REVISION},'
        assert stamp in head
        newer = head.replace(stamp, f'"schema_revision":{SCHEMA_REVISION + 1},')
        await tamper.write_checkpoint_text("newer", newer)
        await tamper.write_checkpoint_text("corrupt", "{oops")

        async with make_durability() as reopened:
            report = await check_checkpoints(
                maintainable(reopened, operable), old, batch=2
            )  # batches
            compatible = billing_agent(
                FakeProvider(), version="2", compatible_fingerprints=[old_print]
            )
            later = await check_checkpoints(maintainable(reopened, operable), compatible)
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

    # =========================================================================================
    # Migrations
    # =========================================================================================

    async def test_migrate_rewrites_older_revisions_in_place_in_batches_and_resumably(
        self,
        make_durability_with_lock_timeout: Callable[[float], Durability] | None,
        inspector: Inspector | None,
        operable: bool,
    ) -> None:
        if make_durability_with_lock_timeout is None:
            pytest.skip("this adapter provides no make_durability_with_lock_timeout fixture")
        threads = [f"t-{n}" for n in range(5)]
        async with make_durability_with_lock_timeout(0.2) as opened:
            durability = maintainable(opened, operable)
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
                revision, contents, receipts = await stored(durability, thread)
                old = before[thread]
                assert old is not None
                assert revision == SCHEMA_REVISION + 1
                assert contents == [m.content + " [v2]" for m in old.messages]  # migrated once
                assert receipts == list(old.receipts) and receipts  # the index, rewritten too
            if inspector is not None:
                assert await inspector.schema_revisions() == {SCHEMA_REVISION + 1}

    async def test_migrate_with_nothing_older_changes_nothing(
        self, make_durability: Callable[[], Durability], inspector: Inspector | None, operable: bool
    ) -> None:
        async with make_durability() as opened:
            durability = maintainable(opened, operable)
            await converse(Kernel(billing_agent(FakeProvider()), durability), "t")
            snapshot = await inspector.snapshot() if inspector is not None else None
            report = await migrate_checkpoints(durability)
            assert (report.revision, report.migrated, report.failed) == (SCHEMA_REVISION, 0, ())
        if inspector is not None:
            assert await inspector.snapshot() == snapshot

    # =========================================================================================
    # Retention
    # =========================================================================================

    async def test_prune_drops_old_results_and_published_events_and_refuses_late_retries(
        self, durability: Durability, operable: bool
    ) -> None:
        maintained = maintainable(durability, operable)
        provider = FakeProvider()
        kernel = Kernel(billing_agent(provider), maintained)
        for thread in ("t-a", "t-b"):
            await converse(kernel, thread)
        events = await read_all_events(maintained)
        refused = {e.id for e in events if e.thread_id == "t-b" and e.seq >= 3}

        async def sink(event: Any) -> None:
            if event.id in refused:
                raise ConnectionError("down")

        await OutboxRelay(maintained, sink).run_once()
        unpublished = [e for e in events if e.thread_id == "t-b" and e.seq >= 3]

        nothing = await prune(maintained, older_than=timedelta(days=30))
        assert (nothing.events, nothing.turns) == (0, 0)
        report = await prune(maintained, older_than=timedelta(0), now=utcnow(), batch=2)
        assert (report.events, report.turns) == (len(events) - len(unpublished), 6)
        assert await read_all_events(maintained) == unpublished  # the relay still owes them
        assert (await prune(maintained, older_than=timedelta(0))).turns == 0

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
        self, durability: Durability, monkeypatch: pytest.MonkeyPatch, operable: bool
    ) -> None:
        """Each run reads only the turns that still hold a result: the second of two runs
        makes one store call for the turns however many are stored (it used to walk every
        turn key again, a batch per call)."""
        maintained = maintainable(durability, operable)
        kernel = Kernel(billing_agent(FakeProvider()), maintained)
        for thread in ("t-a", "t-b", "t-c"):
            await converse(kernel, thread)
        recorder = await maintained.recorder()
        calls: list[tuple[int, tuple[str, str] | None]] = []
        original = recorder.prune_turns

        async def counted(before: Any, after: Any, limit: int) -> Any:
            outcome = await original(before, after, limit)
            calls.append(outcome)
            return outcome

        monkeypatch.setattr(recorder, "prune_turns", counted)
        first = await prune(maintained, older_than=timedelta(0), batch=2)
        assert first.turns == 9 and [n for n, _ in calls] == [2, 2, 2, 2, 1]
        calls.clear()
        again = await prune(maintained, older_than=timedelta(0), batch=2)
        assert again.turns == 0 and calls == [(0, None)]
        calls.clear()
        await kernel.turn("t-b", "4", "balance 1")
        later = await prune(maintained, older_than=timedelta(0), batch=2)
        assert later.turns == 1 and calls == [(1, None)]
        with pytest.raises(TurnExpiredError):
            await kernel.turn("t-b", "4", "balance 1")


def maintainable(durability: Durability, operable: bool) -> Operable:
    """``durability`` as the operations take it (they drive the recorder), or a skip
    when the adapter does not declare it (the ``operable`` fixture)."""
    return as_operable(durability, operable)


async def converse(kernel: Kernel, thread: str) -> None:
    """A question, a proposed charge, its acceptance."""
    await kernel.turn(thread, "1", "balance 100")
    await kernel.turn(thread, "2", "charge pi_1 500")
    await kernel.turn(thread, "3", "yes")


def tag_messages(document: dict[str, Any]) -> dict[str, Any]:
    """An injected migration from the current revision to the next: it rewrites messages."""
    document["messages"] = [dict(m, content=m["content"] + " [v2]") for m in document["messages"]]
    return document


#: As if the library's migration list were ``[..., tag_messages]``.
MIGRATIONS = [*([lambda d: d] * (SCHEMA_REVISION - 1)), tag_messages]


async def stored(durability: Operable, thread_id: str) -> tuple[int, list[str], list[ReceiptRef]]:
    """The stored checkpoint's revision (as the rows say), its messages' contents and its
    receipt index."""
    recorder = await durability.recorder()
    [(_, thread)] = [t for t in await recorder.scan_threads(None, 100, None) if t[0] == thread_id]
    assert thread.checkpoint is not None
    text, _ = assemble_checkpoint(
        thread.checkpoint, thread.messages, thread.facts, thread.receipt_index
    )
    checkpoint = decode_checkpoint(text, migrations=MIGRATIONS)
    revision = int(thread.checkpoint.split(",", 1)[0].split(":")[1])
    return revision, [m.content for m in checkpoint.messages], list(checkpoint.receipts)
