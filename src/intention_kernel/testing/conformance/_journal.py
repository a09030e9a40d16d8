"""The journal part of the storage contract.

A turn records values before it commits (``tx.recorded``).
A delivery of the same turn ID finds them again after a crash.
Each model round of an interpreter that works in rounds is among them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from intention_kernel._agent import Agent
from intention_kernel._effects import utcnow
from intention_kernel._interpretation import Intent, Interpretation, InterpretationRequest
from intention_kernel._kernel import Kernel
from intention_kernel._turns import TurnCommit, TurnScope
from intention_kernel.durability import Durability, TurnTransaction
from intention_kernel.durability.abc import JournalEntry, Operable
from intention_kernel.errors import (
    FencedCommitError,
    InterpretationError,
    JournalError,
    TenantMismatchError,
    TurnConflictError,
)
from intention_kernel.operations import prune
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing._scripted import ScriptedInterpreter
from intention_kernel.testing.conformance._support import (
    ConformanceCase,
    Crash,
    HeldTurn,
    as_operable,
    commit_for,
)

__all__ = ["JournalConformance"]


class Computations:
    """A ``compute`` for ``tx.recorded`` that counts its calls and returns ``value``."""

    def __init__(self, value: Any) -> None:
        self.value, self.calls = value, 0

    async def __call__(self) -> Any:
        self.calls += 1
        return self.value


async def record_then_die(
    durability: Durability, scope: TurnScope, key: str, compute: Computations
) -> Any:
    """A delivery that records ``key`` and dies before its commit; what it recorded."""
    seen: list[Any] = []

    async def operation(tx: TurnTransaction) -> TurnCommit:
        seen.append(await tx.recorded(key, compute))
        raise Crash

    with pytest.raises(Crash):
        await durability.with_turn(scope, operation)
    return seen[0]


async def recorded_in(durability: Durability, scope: TurnScope, key: str, compute: Any) -> Any:
    """A delivery that reads ``key`` (computing it if missing) and commits."""
    seen: list[Any] = []

    async def operation(tx: TurnTransaction) -> TurnCommit:
        seen.append(await tx.recorded(key, compute))
        return commit_for(tx)

    await durability.with_turn(scope, operation)
    return seen[0]


def journal_of(durability: Durability, operable: bool) -> Operable:
    """``durability`` with its recorder, whose journal rows the test reads.

    It skips when the adapter does not declare it (the ``operable`` fixture).
    """
    return as_operable(durability, operable)


def rounds_agent(provider: FakeProvider, script: Callable[[InterpretationRequest], Any]) -> Agent:
    """The billing agent with an interpreter that works in rounds."""
    return billing_agent(provider, interpreter=ScriptedInterpreter(script, multi_round=True))


class JournalConformance(ConformanceCase):
    """Subclass and provide ``make_durability``; see :mod:`intention_kernel.testing.conformance`."""

    # =========================================================================================
    # tx.recorded
    # =========================================================================================

    async def test_a_value_recorded_by_a_turn_that_died_is_returned_to_its_redelivery(
        self, durability: Durability, make_durability: Callable[[], Durability]
    ) -> None:
        scope = TurnScope("t", "turn-1", request_digest="d1")
        first = Computations({"text": "round one", "n": 1})
        assert await record_then_die(durability, scope, "k", first) == first.value
        again = Computations({"text": "a different answer"})
        assert await recorded_in(durability, scope, "k", again) == first.value
        assert (first.calls, again.calls) == (1, 0)
        if self.persistent:  # and through a new instance: it is on the store
            scope2 = TurnScope("t", "turn-2", request_digest="d2")
            await record_then_die(durability, scope2, "k", Computations([1, 2]))
            async with make_durability() as reopened:
                later = Computations("never")
                assert await recorded_in(reopened, scope2, "k", later) == [1, 2]
                assert later.calls == 0

    async def test_the_value_comes_back_as_the_store_reads_it_in_both_deliveries(
        self, durability: Durability
    ) -> None:
        scope = TurnScope("t", "turn-1")
        first = await record_then_die(durability, scope, "k", Computations({"a": (1, 2.5)}))
        again = await recorded_in(durability, scope, "k", Computations(None))
        assert first == again == {"a": [1, 2.5]}

    async def test_several_keys_of_a_turn_are_each_recorded_once(
        self, durability: Durability
    ) -> None:
        scope = TurnScope("t", "turn-1")
        values = {"kernel.round.1": {"r": 1}, "kernel.round.2": {"r": 2}, "bridge:1": "x"}
        computed = {key: Computations(value) for key, value in values.items()}

        async def dies_after_all(tx: TurnTransaction) -> TurnCommit:
            for key, compute in computed.items():
                assert await tx.recorded(key, compute) == values[key]
                assert await tx.recorded(key, compute) == values[key]  # the same delivery
            raise Crash

        with pytest.raises(Crash):
            await durability.with_turn(scope, dies_after_all)
        assert [c.calls for c in computed.values()] == [1, 1, 1]
        for key, value in values.items():
            assert await _peek(durability, scope, key) == value
        assert [c.calls for c in computed.values()] == [1, 1, 1]

    async def test_a_value_not_kept_is_returned_and_not_recorded(
        self, durability: Durability
    ) -> None:
        scope = TurnScope("t", "turn-1")
        compute = Computations({"final": True})

        async def operation(tx: TurnTransaction) -> TurnCommit:
            assert await tx.recorded("k", compute, keep=lambda v: not v["final"]) == {"final": True}
            raise Crash

        with pytest.raises(Crash):
            await durability.with_turn(scope, operation)
        again = Computations("computed again")
        assert await recorded_in(durability, scope, "k", again) == "computed again"
        assert again.calls == 1

    async def test_the_journal_is_the_turn_ids_own(self, durability: Durability) -> None:
        await record_then_die(durability, TurnScope("t", "turn-1"), "k", Computations("one"))
        for scope in (TurnScope("t", "turn-2"), TurnScope("other", "turn-1")):
            fresh = Computations("fresh")
            assert await recorded_in(durability, scope, "k", fresh) == "fresh"
            assert fresh.calls == 1

    async def test_a_redelivery_for_another_request_is_a_conflict_and_computes_nothing(
        self, durability: Durability
    ) -> None:
        await record_then_die(
            durability, TurnScope("t", "turn-1", request_digest="d1"), "k", Computations(1)
        )
        other = Computations(2)
        with pytest.raises(TurnConflictError) as refused:
            await recorded_in(durability, TurnScope("t", "turn-1", request_digest="d2"), "k", other)
        assert (refused.value.thread_id, refused.value.turn_id) == ("t", "turn-1")
        assert other.calls == 0

    async def test_a_committed_turn_deletes_its_journal_and_replays_without_it(
        self, durability: Durability, operable: bool
    ) -> None:
        scope = TurnScope("t", "turn-1", request_digest="d")
        await record_then_die(durability, scope, "k", Computations("one"))
        assert await recorded_in(durability, scope, "k", Computations("two")) == "one"
        replayed = await durability.with_turn(scope, _never_runs)
        assert replayed.replayed
        recorder = await journal_of(durability, operable).recorder()
        assert await recorder.read_journal("t", "turn-1") == []

    async def test_a_key_or_value_the_journal_cannot_store_is_refused_and_nothing_is_recorded(
        self, durability: Durability
    ) -> None:
        scope = TurnScope("t", "turn-1")
        for key in ("", "nul\x00key", "lone\ud800"):
            with pytest.raises(JournalError):
                await recorded_in(durability, scope, key, Computations(1))
        for value in (math.nan, object(), {"a": math.inf}, "lone\udc00"):
            with pytest.raises(JournalError) as refused:
                await recorded_in(durability, scope, "k", Computations(value))
            assert refused.value.turn_id == "turn-1"
        fine = Computations("fine")
        assert await recorded_in(durability, scope, "k", fine) == "fine"
        assert fine.calls == 1

    async def test_a_journal_entry_written_twice_is_a_conflict_and_the_first_stays(
        self, durability: Durability, operable: bool
    ) -> None:
        recorder = await journal_of(durability, operable).recorder()
        entry = JournalEntry("t", "turn-1", "k", "d", '{"a":1}', utcnow())
        async with recorder.lock("t"):
            await recorder.write_journal(entry)
            with pytest.raises(FencedCommitError):
                await recorder.write_journal(JournalEntry("t", "turn-1", "k", "d", "2", utcnow()))
            [stored] = await recorder.read_journal("t", "turn-1")
        assert (stored.key, stored.request_digest, stored.value) == ("k", "d", '{"a":1}')

    async def test_entries_are_read_in_the_order_they_were_written(
        self, durability: Durability, operable: bool
    ) -> None:
        recorder = await journal_of(durability, operable).recorder()
        keys = ["kernel.round.2", "kernel.round.10", "a", "kernel.round.1"]
        async with recorder.lock("t"):
            for key in keys:
                await recorder.write_journal(JournalEntry("t", "x", key, None, "1", utcnow()))
            assert [e.key for e in await recorder.read_journal("t", "x")] == keys

    async def test_prune_deletes_the_journal_of_turns_that_never_committed(
        self, durability: Durability, operable: bool
    ) -> None:
        maintained = journal_of(durability, operable)
        scope = TurnScope("t", "abandoned")
        await record_then_die(durability, scope, "k", Computations("old"))
        kept = TurnScope("t", "in-flight")
        await record_then_die(durability, kept, "k", Computations("kept"))
        report = await prune(maintained, older_than=timedelta(hours=1))
        assert report.journal == 0  # both are younger than the cutoff
        report = await prune(maintained, older_than=timedelta(0), now=utcnow())
        assert report.journal == 2
        again = Computations("asked again")
        assert await recorded_in(durability, scope, "k", again) == "asked again"
        assert again.calls == 1

    async def test_prune_deletes_a_turns_journal_whole_or_not_at_all(
        self, durability: Durability, operable: bool
    ) -> None:
        """Retention takes a turn's journal whole, once every entry is past the cutoff.

        It takes all of it then, in batches of any size.
        The recorder deletes none of a turn's entries if one is newer.
        Such an entry was written since the scan.
        """
        maintained = journal_of(durability, operable)
        recorder = await maintained.recorder()
        base = utcnow() - timedelta(days=1)

        def entry(thread_id: str, turn_id: str, key: str, minutes: int) -> JournalEntry:
            return JournalEntry(
                thread_id, turn_id, key, None, "1", base + timedelta(minutes=minutes)
            )

        old_and_new = [entry("t", "split", "a", 0), entry("t", "split", "b", 10)]
        stale = [entry(f"s{n}", "old", key, n) for n in range(3) for key in ("a", "b")]
        for written in (*old_and_new, *stale):
            async with recorder.lock(written.thread_id):
                await recorder.write_journal(written)
        cutoff = base + timedelta(minutes=5)
        assert await recorder.stale_journals(cutoff, None, 10) == [
            ("s0", "old"),
            ("s1", "old"),
            ("s2", "old"),
        ]
        async with recorder.lock("t"):
            assert await recorder.prune_journal("t", "split", cutoff) == 0
        report = await prune(maintained, older_than=timedelta(0), now=cutoff, batch=1)
        assert report.journal == 6
        assert [e.key for e in await recorder.read_journal("t", "split")] == ["a", "b"]
        for n in range(3):
            assert await recorder.read_journal(f"s{n}", "old") == []
        report = await prune(maintained, older_than=timedelta(0), now=base + timedelta(hours=1))
        assert report.journal == 2
        assert await recorder.read_journal("t", "split") == []

    async def test_prune_leaves_the_journal_of_a_busy_thread_for_a_later_run(
        self, durability: Durability, operable: bool
    ) -> None:
        """Retention skips a thread whose lock a turn holds; a later run deletes it.

        That turn may be a redelivery of the very turn whose journal is stale.
        """
        maintained = journal_of(durability, operable)
        scope = TurnScope("t", "abandoned")
        await record_then_die(durability, scope, "k", Computations("old"))
        held = HeldTurn()

        running = asyncio.create_task(durability.with_turn(TurnScope("t", "holder"), held))
        later = utcnow() + timedelta(hours=1)
        try:
            await asyncio.wait_for(held.entered.wait(), 10)
            report = await prune(maintained, older_than=timedelta(0), now=later)
            assert report.journal == 0
        finally:
            held.release.set()
            await running
        assert await _peek(durability, scope, "k") == "old"
        report = await prune(maintained, older_than=timedelta(0), now=later)
        assert report.journal == 1

    # =========================================================================================
    # The runtime's rounds
    # =========================================================================================

    async def test_a_round_answered_before_the_turn_died_is_not_asked_again(
        self, durability: Durability, provider: FakeProvider, operable: bool
    ) -> None:
        """The redelivery takes round 1 from the journal and asks for round 2 only.

        Round 1 asks for a read, and round 2 fails, so the turn commits nothing.
        The redelivery runs the read again.
        """
        asked: list[int] = []
        fail_round_2 = [True]

        def script(request: InterpretationRequest) -> Interpretation:
            asked.append(len(request.rounds) + 1)
            if not request.rounds:
                return Interpretation([Intent("billing.balance", {"due": 70})], reply="looking")
            if fail_round_2.pop() if fail_round_2 else False:
                raise RuntimeError("the model's connection dropped")
            [step] = request.rounds[0].steps
            return Interpretation(reply=f"you owe {step.value['due']}")

        kernel = Kernel(rounds_agent(provider, script), durability)
        with pytest.raises(InterpretationError):
            await kernel.turn("t", "turn-1", "what do I owe?")
        assert asked == [1, 2]
        result = await kernel.turn("t", "turn-1", "what do I owe?")
        assert asked == [1, 2, 2]
        assert result.reply == "you owe 70" and not result.replayed
        assert [s.capability_id for s in result.steps] == ["billing.balance"]
        replayed = await kernel.turn("t", "turn-1", "what do I owe?")
        assert replayed.replayed and asked == [1, 2, 2]
        if operable:
            recorder = await as_operable(durability, operable).recorder()
            assert await recorder.read_journal("t", "turn-1") == []

    @pytest.mark.parametrize(
        ("first", "other"),
        [("acme", "globex"), (None, "acme"), ("acme", None)],
        ids=["tenant-vs-tenant", "none-vs-tenant", "tenant-vs-none"],
    )
    async def test_a_failed_turns_recorded_rounds_are_its_tenants_alone(
        self,
        durability: Durability,
        provider: FakeProvider,
        first: str | None,
        other: str | None,
    ) -> None:
        """A journal entry claims its thread for its tenant.

        The first tenant's turn records round 1, which read its data.
        It fails in round 2, on a thread with no committed turn.
        Another tenant then delivers the same thread ID, turn ID and message.
        It is refused before anything runs.
        So is any other turn of that tenant on the thread.
        The first tenant's redelivery still takes round 1 from the journal and completes.
        """
        asked: list[tuple[str | None, int]] = []
        fail_round_2 = [True]
        tenant: list[str | None] = [first]

        def script(request: InterpretationRequest) -> Interpretation:
            asked.append((tenant[0], len(request.rounds) + 1))
            if not request.rounds:
                return Interpretation([Intent("billing.balance", {"due": 70})], reply="looking")
            if fail_round_2.pop() if fail_round_2 else False:
                raise RuntimeError("the model's connection dropped")
            [step] = request.rounds[0].steps
            return Interpretation(reply=f"you owe {step.value['due']}")

        kernel = Kernel(rounds_agent(provider, script), durability)
        with pytest.raises(InterpretationError):
            await kernel.turn("t", "turn-1", "what do I owe?", tenant_id=first)
        assert asked == [(first, 1), (first, 2)]

        tenant[0] = other
        for turn_id in ("turn-1", "turn-2"):
            with pytest.raises(TenantMismatchError) as refused:
                await kernel.turn("t", turn_id, "what do I owe?", tenant_id=other)
            assert (refused.value.thread_id, refused.value.turn_id) == ("t", turn_id)
        assert asked == [(first, 1), (first, 2)]  # the other tenant's turns ran nothing
        assert await durability.load_checkpoint("t") is None  # and committed nothing

        tenant[0] = first
        result = await kernel.turn("t", "turn-1", "what do I owe?", tenant_id=first)
        assert result.reply == "you owe 70" and not result.replayed
        assert asked == [(first, 1), (first, 2), (first, 2)]
        tenant[0] = other
        with pytest.raises(TenantMismatchError):  # the thread is the first tenant's now
            await kernel.turn("t", "turn-1", "what do I owe?", tenant_id=other)
        assert asked == [(first, 1), (first, 2), (first, 2)]

    async def test_a_journal_entry_of_another_tenant_is_never_read(
        self, durability: Durability, operable: bool
    ) -> None:
        """A turn refuses a journal entry of its ID recorded by another tenant.

        Such a row may predate entries keeping their tenant, say.
        The refusal comes when the turn reads its journal.
        Nothing is computed from the entry, and nothing is committed.
        That holds even when the operation catches the error.
        """
        await durability.with_turn(TurnScope("t", "turn-0", tenant_id="acme"), _commits)
        recorder = await journal_of(durability, operable).recorder()
        async with recorder.lock("t"):
            await recorder.write_journal(
                JournalEntry("t", "turn-1", "k", None, '"globex data"', utcnow(), "globex")
            )
        seen: list[Any] = []

        async def swallows(tx: TurnTransaction) -> TurnCommit:
            try:
                seen.append(await tx.recorded("k", Computations("acme data")))
            except TenantMismatchError as exc:
                seen.append(exc)
            return commit_for(tx)

        with pytest.raises(TenantMismatchError) as refused:
            await durability.with_turn(TurnScope("t", "turn-1", tenant_id="acme"), swallows)
        assert (refused.value.thread_id, refused.value.turn_id) == ("t", "turn-1")
        [error] = seen
        assert isinstance(error, TenantMismatchError)
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.version == 1
        [entry] = await recorder.read_journal("t", "turn-1")
        assert (entry.value, entry.tenant_id) == ('"globex data"', "globex")

    async def test_a_redelivery_after_prune_asks_every_round_again(
        self, durability: Durability, provider: FakeProvider, operable: bool
    ) -> None:
        """Retention keeps or deletes a turn's rounds together.

        A turn recorded rounds 1 and 2 and failed in round 3.
        Retention with a cutoff between the two rounds' entries keeps both.
        Once both are older, it deletes both.
        The redelivery then asks every round again, from the first.
        It never asks round 1 anew while taking round 2 from the journal.
        No delivery produced such a transcript.
        """
        maintained = journal_of(durability, operable)
        recorder = await maintained.recorder()
        asked: list[int] = []
        fail_round_3 = [True]

        def script(request: InterpretationRequest) -> Interpretation:
            number = len(request.rounds) + 1
            asked.append(number)
            if number == 1:
                return Interpretation([Intent("billing.balance", {"due": 70})], reply="one")
            if number == 2:
                time.sleep(0.002)  # round 2's entry is written after round 1's
                return Interpretation([Intent("billing.balance", {"due": 80})], reply="two")
            if fail_round_3.pop() if fail_round_3 else False:
                raise RuntimeError("the model's connection dropped")
            return Interpretation(reply=f"asked {len(asked)} times")

        kernel = Kernel(rounds_agent(provider, script), durability)
        with pytest.raises(InterpretationError):
            await kernel.turn("t", "turn-1", "what do I owe?")
        first, second = await recorder.read_journal("t", "turn-1")
        assert (first.key, second.key) == ("kernel.round.1", "kernel.round.2")
        assert first.created_at < second.created_at
        between = first.created_at + (second.created_at - first.created_at) / 2
        report = await prune(maintained, older_than=timedelta(0), now=between)
        assert report.journal == 0
        report = await prune(maintained, older_than=timedelta(0), now=utcnow())
        assert report.journal == 2
        result = await kernel.turn("t", "turn-1", "what do I owe?")
        assert asked == [1, 2, 3, 1, 2, 3]
        assert result.reply == "asked 6 times" and not result.replayed

    async def test_a_write_of_a_recorded_round_is_settled_by_its_receipt(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        """The person accepts a refund that confirms on its own.

        The accepting turn's round 1 asks for a read too.
        The turn dies in round 2, after the refund ran.
        The redelivery does not ask round 1 again.
        The refund's receipt returns its stored value, so the provider is called once.
        """
        asked: list[tuple[str, int]] = []
        dies = [True]

        def script(request: InterpretationRequest) -> Interpretation:
            asked.append((request.message, len(request.rounds) + 1))
            if request.rounds and request.message == "yes" and dies:
                dies.pop()
                raise RuntimeError("the model's connection dropped")
            if request.rounds:
                return Interpretation(reply=f"done: {request.message}")
            if request.message == "yes":
                return Interpretation([Intent("billing.balance", {"due": 0})])
            refund = {"payment_intent_id": "pi_1", "amount": 5}
            return Interpretation([Intent("payments.refund", refund)])

        kernel = Kernel(rounds_agent(provider, script), durability)
        first = await kernel.turn("t", "propose", "refund pi_1 5")
        assert first.interaction is not None and provider.calls() == 0
        asked.clear()
        with pytest.raises(InterpretationError):
            await kernel.turn("t", "accept", "yes", answer="accept")
        assert provider.calls() == 1 and asked == [("yes", 1), ("yes", 2)]
        result = await kernel.turn("t", "accept", "yes", answer="accept")
        assert asked == [("yes", 1), ("yes", 2), ("yes", 2)]
        assert provider.calls() == 1
        assert result.reply == "done: yes"
        assert [s.status for s in result.steps] == ["completed", "completed"]

    async def test_a_one_round_turn_never_touches_the_journal(
        self, durability: Durability, kernel: Kernel, operable: bool
    ) -> None:
        recorded = journal_of(durability, operable)
        recorder = await recorded.recorder()
        calls: list[str] = []
        original_read, original_write = recorder.read_journal, recorder.write_journal

        async def read(thread_id: str, turn_id: str) -> list[JournalEntry]:
            calls.append("read")
            return await original_read(thread_id, turn_id)

        async def write(entry: JournalEntry) -> None:
            calls.append("write")
            await original_write(entry)

        recorder.read_journal = read  # type: ignore[method-assign]
        recorder.write_journal = write  # type: ignore[method-assign]
        try:
            await kernel.turn("t", "1", "balance")
            await kernel.turn("t", "2", "charge pi_1 500")
            await kernel.turn("t", "3", "yes")
        finally:
            del recorder.read_journal, recorder.write_journal
        assert calls == []


async def _commits(tx: TurnTransaction) -> TurnCommit:
    return commit_for(tx)


async def _never_runs(tx: TurnTransaction) -> TurnCommit:
    raise AssertionError("a committed turn's operation ran again")


async def _peek(durability: Durability, scope: TurnScope, key: str) -> Any:
    """What ``key`` holds for ``scope``'s turn, read in a delivery that then dies."""
    unexpected = Computations("computed: nothing was recorded")
    return await record_then_die(durability, scope, key, unexpected)
