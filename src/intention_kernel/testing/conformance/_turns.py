"""The turn part of the storage contract, from begin to atomic commit.

It covers one turn at a time per thread, begin, and atomic commit.
It also covers replay, conflicts, checkpoints, IDs and tenants.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from intention_kernel import _checkpoint as checkpoint_codec
from intention_kernel._checkpoint import (
    CHECKPOINT_MIGRATIONS,
    SCHEMA_REVISION,
    KernelCheckpoint,
    Message,
    encode_checkpoint,
)
from intention_kernel._effects import EffectAuthority, ReceiptStatus
from intention_kernel._kernel import Kernel
from intention_kernel._turns import StepStatus, TurnCommit, TurnResult, TurnScope
from intention_kernel.durability import Durability, TurnOperation, TurnTransaction
from intention_kernel.durability.abc import TenantStore, ThreadOwner
from intention_kernel.errors import (
    CheckpointCompatibilityError,
    CorruptRecordError,
    EffectUncertainError,
    InvalidRequestError,
    KernelError,
    ReceiptNotFoundError,
    TenantMismatchError,
    ThreadBusyError,
    ThreadLockTimeoutError,
    TurnConflictError,
)
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing.conformance._support import (
    Capturing,
    ConformanceCase,
    Crash,
    HeldTurn,
    Tamper,
    commit_for,
    die_in_the_provider_call,
)

__all__ = ["TurnConformance"]


class TurnConformance(ConformanceCase):
    """Subclass and provide ``make_durability``; see :mod:`intention_kernel.testing.conformance`."""

    # =========================================================================================
    # Turn boundary: serialize, load, replay, effects, atomic commit
    # =========================================================================================

    async def test_concurrent_turns_on_one_thread_are_serialized(
        self, durability: Durability
    ) -> None:
        inside = 0
        overlaps = 0

        async def operation(tx: TurnTransaction) -> TurnCommit:
            nonlocal inside, overlaps
            inside += 1
            overlaps += inside > 1
            await asyncio.sleep(0.005)
            inside -= 1
            return commit_for(tx)

        scopes = [TurnScope("t", f"turn-{i}") for i in range(8)]
        results = await asyncio.gather(*(durability.with_turn(s, operation) for s in scopes))
        assert overlaps == 0
        assert sorted(r.checkpoint_version for r in results) == list(range(1, 9))

    async def test_a_turn_that_will_not_wait_is_refused_at_once_while_another_runs(
        self, durability: Durability
    ) -> None:
        """``with_turn(..., wait=False)`` makes one attempt at the lock.

        ``Agent(on_busy="reject")`` uses it for turns that must not wait.
        While another turn holds the lock, it raises ``ThreadBusyError`` and nothing changes.
        """
        held = HeldTurn()
        refused_ran: list[str] = []

        async def refused(tx: TurnTransaction) -> TurnCommit:
            refused_ran.append(tx.scope.turn_id)
            return commit_for(tx)

        running = asyncio.create_task(durability.with_turn(TurnScope("t", "1"), held))
        try:
            await asyncio.wait_for(held.entered.wait(), 10)
            with pytest.raises(ThreadBusyError) as busy:
                # Well below any lock timeout: a refusal after a wait would miss it.
                await asyncio.wait_for(
                    durability.with_turn(TurnScope("t", "2"), refused, wait=False), 2
                )
            assert busy.value.thread_id == "t" and refused_ran == [] and not running.done()
            assert not isinstance(busy.value, ThreadLockTimeoutError)  # it never waited
            # Another thread is free.
            other = await durability.with_turn(TurnScope("u", "1"), refused, wait=False)
            assert other.checkpoint_version == 1
        finally:
            held.release.set()
            first = await running
        assert first.checkpoint_version == 1
        # Free again: the refused delivery committed nothing and now runs.
        again = await durability.with_turn(TurnScope("t", "2"), refused, wait=False)
        assert (again.replayed, again.checkpoint_version) == (False, 2)

    async def test_a_committed_turn_is_replayed_at_once_while_another_turn_holds_the_thread(
        self, durability: Durability
    ) -> None:
        """A redelivery of a committed turn writes nothing.

        So it neither waits for the thread's lock nor is refused as busy.
        It is answered while another turn of the thread runs.
        That holds with ``wait=False`` (``on_busy="reject"``) or without.
        A new turn is still refused, and a redelivery for another request is still a conflict.
        """
        scope = TurnScope("t", "1", request_digest="d1")
        first = await durability.with_turn(scope, _commits)
        held = HeldTurn()

        running = asyncio.create_task(durability.with_turn(TurnScope("t", "2"), held))
        try:
            await asyncio.wait_for(held.entered.wait(), 10)
            for wait in (False, True):
                # Well below any lock timeout: a replay after a wait would miss it.
                again = await asyncio.wait_for(
                    durability.with_turn(scope, _never_runs, wait=wait), 2
                )
                assert again == replace(first, replayed=True)
                with pytest.raises(TurnConflictError):
                    await asyncio.wait_for(
                        durability.with_turn(replace(scope, request_digest="d2"), _never_runs),
                        2,
                    )
            with pytest.raises(ThreadBusyError) as busy:
                await asyncio.wait_for(
                    durability.with_turn(TurnScope("t", "3"), _never_runs, wait=False), 2
                )
            assert not isinstance(busy.value, ThreadLockTimeoutError)
            assert not running.done()
        finally:
            held.release.set()
            second = await running
        assert (second.replayed, second.checkpoint_version) == (False, 2)

    async def test_a_delivery_that_waits_while_its_turn_commits_replays_it(
        self, durability: Durability
    ) -> None:
        """A second delivery of a turn that is still running waits for the lock.

        Once the first commits, the second finds the committed turn under the lock.
        It replays it, so the operation runs once.
        """
        held = HeldTurn()

        running = asyncio.create_task(durability.with_turn(TurnScope("t", "1"), held))
        await asyncio.wait_for(held.entered.wait(), 10)
        waiting = asyncio.create_task(durability.with_turn(TurnScope("t", "1"), held))
        for _ in range(20):  # let it find no committed turn and start waiting
            await asyncio.sleep(0.005)
        assert not waiting.done()
        held.release.set()
        first, second = await asyncio.wait_for(asyncio.gather(running, waiting), 10)
        assert (first.replayed, second.replayed) == (False, True)
        assert second == replace(first, replayed=True) and held.ran == ["1"]

    async def test_a_turn_that_waits_past_the_lock_timeout_is_refused_as_a_lock_timeout(
        self, make_durability_with_lock_timeout: Callable[[float], Durability] | None
    ) -> None:
        """A waiting turn raises ``ThreadLockTimeoutError`` after the lock timeout.

        Turns wait by default, and this one does not get the lock within the timeout.
        The error is a ``ThreadBusyError`` that the host answers with 503.
        A turn refused at once gets 409 instead.
        """
        if make_durability_with_lock_timeout is None:
            pytest.skip("this adapter provides no make_durability_with_lock_timeout fixture")
        held = HeldTurn()
        waited_ran: list[str] = []

        async def waited(tx: TurnTransaction) -> TurnCommit:
            waited_ran.append(tx.scope.turn_id)
            return commit_for(tx)

        async with make_durability_with_lock_timeout(0.2) as durability:
            running = asyncio.create_task(durability.with_turn(TurnScope("t", "1"), held))
            try:
                await asyncio.wait_for(held.entered.wait(), 10)
                loop = asyncio.get_running_loop()
                started = loop.time()
                with pytest.raises(ThreadLockTimeoutError) as timed_out:
                    await asyncio.wait_for(durability.with_turn(TurnScope("t", "2"), waited), 10)
                assert loop.time() - started >= 0.15  # it waited for the lock first
                assert timed_out.value.thread_id == "t" and waited_ran == []
                assert not running.done()
            finally:
                held.release.set()
                first = await running
            assert first.checkpoint_version == 1
            again = await durability.with_turn(TurnScope("t", "2"), waited)
            assert (again.replayed, again.checkpoint_version) == (False, 2)

    async def test_each_turn_loads_the_latest_checkpoint(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        await kernel.turn("t", "1", "balance 10")
        await kernel.turn("t", "2", "balance 20")
        result = await kernel.turn("t", "3", "balance 30")
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None
        assert result.checkpoint_version == checkpoint.version == 3
        assert checkpoint.facts["balance"].version == 3
        assert checkpoint.facts["balance"].value == 30

    async def test_committed_turn_replays_its_result_without_running_anything(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        first = await kernel.turn("t", "2", "yes")
        interpreter = kernel.agent.interpreter
        calls_before = len(interpreter.calls)  # type: ignore[attr-defined]
        again = await kernel.turn("t", "2", "yes")
        assert again.replayed is True and first.replayed is False
        assert again.to_dict() | {"replayed": False} == first.to_dict()
        assert len(interpreter.calls) == calls_before  # type: ignore[attr-defined]
        assert provider.calls() == 1

    async def test_replay_does_not_load_the_checkpoint_even_after_the_agent_changed(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        old = Kernel(billing_agent(provider, version="1"), durability)
        first = await old.turn("t", "1", "balance")
        new = Kernel(billing_agent(provider, version="2"), durability)
        replayed = await new.turn("t", "1", "balance")
        assert replayed.replayed and replayed.reply == first.reply
        with pytest.raises(CheckpointCompatibilityError):
            await new.turn("t", "2", "balance")

    async def test_same_turn_id_with_a_different_request_is_refused(self, kernel: Kernel) -> None:
        await kernel.turn("t", "1", "balance")
        with pytest.raises(TurnConflictError) as caught:
            await kernel.turn("t", "1", "charge pi_1 500")
        assert caught.value.turn_id == "1"
        with pytest.raises(TurnConflictError):
            await kernel.turn("t", "1", answer="accept")

    async def test_new_turn_id_for_the_same_message_is_a_new_turn(self, kernel: Kernel) -> None:
        first = await kernel.turn("t", "delivery-1", "balance")
        second = await kernel.turn("t", "delivery-1-retry-with-new-id", "balance")
        assert not second.replayed
        assert second.checkpoint_version == first.checkpoint_version + 1

    async def test_concurrent_deliveries_of_one_turn_commit_once(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        results = await asyncio.gather(*(kernel.turn("t", "same", "balance") for _ in range(5)))
        assert sorted(r.replayed for r in results) == [False, True, True, True, True]
        assert len({json.dumps(r.to_dict() | {"replayed": 0}) for r in results}) == 1
        committed = [e for e in await durability.read_outbox() if e.type == "turn.committed"]
        assert len(committed) == 1

    async def test_a_turn_that_fails_before_commit_leaves_nothing(
        self, durability: Durability
    ) -> None:
        class Boom(Exception):
            pass

        async def failing(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect("k", lambda a: {"ok": True}, step_id="s1")
            raise Boom

        with pytest.raises(Boom):
            await durability.with_turn(TurnScope("t", "1"), failing)
        assert await durability.load_checkpoint("t") is None
        assert await durability.read_outbox() == []
        # The same turn runs again, and the completed effect is not repeated.
        calls: list[str] = []

        def provider_call(authority: EffectAuthority) -> Any:
            calls.append(authority.key)
            return {"ok": 2}

        async def succeeding(tx: TurnTransaction) -> TurnCommit:
            effect = await tx.run_effect("k", provider_call, step_id="s1")
            assert effect.value == {"ok": True}
            return commit_for(tx)

        result = await durability.with_turn(TurnScope("t", "1"), succeeding)
        assert result.checkpoint_version == 1 and calls == []

    async def test_result_checkpoint_and_events_commit_together(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        result = await kernel.turn("t", "1", "balance 7")
        checkpoint = await durability.load_checkpoint("t")
        events = await durability.read_outbox(thread_id="t")
        assert checkpoint is not None and checkpoint.version == result.checkpoint_version
        assert [e.type for e in events] == ["fact.recorded", "turn.committed"]
        assert {e.turn_id for e in events} == {"1"}
        assert events[-1].payload["version"] == 1

    async def test_result_round_trips_through_json(self, kernel: Kernel) -> None:
        await kernel.turn("t", "1", "balance")
        result = await kernel.turn("t", "2", "charge pi_1 500")
        encoded = json.loads(json.dumps(result.to_dict()))
        assert TurnResult.from_dict(encoded) == result
        assert encoded["steps"][0]["status"] == "awaiting_confirmation"

    # =========================================================================================
    # Checkpoint contents and compatibility
    # =========================================================================================

    async def test_checkpoint_holds_bounded_messages_facts_with_lineage_and_receipts(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        kernel = Kernel(billing_agent(provider, max_messages=4), durability)
        await kernel.turn("t", "1", "balance 500")
        proposed = await kernel.turn("t", "2", "charge pi_1 500")
        accepted = await kernel.turn("t", "3", "yes")
        checkpoint = await durability.load_checkpoint("t")
        assert isinstance(checkpoint, KernelCheckpoint)
        assert checkpoint.schema_revision == SCHEMA_REVISION
        assert checkpoint.agent_fingerprint == kernel.fingerprint
        assert [m.turn_id for m in checkpoint.messages] == ["2", "2", "3", "3"]
        charge = checkpoint.facts["charge.pi_1"]
        assert charge.version == 1
        evidence = charge.evidence
        assert evidence.capability_id == "payments.charge"
        assert (evidence.turn_id, evidence.step_id) == ("3", proposed.steps[0].step_id)
        assert evidence.receipt_ids == accepted.steps[0].receipt_ids != ()
        assert [(r.key, r.version) for r in evidence.derived_from] == [("balance", 1)]
        assert [r.key for r in checkpoint.receipts] == ["payments.charge:charge:pi_1"]
        assert accepted.facts == (charge,)

    async def test_a_checkpoint_of_a_foreign_agent_is_refused_unless_declared_compatible(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        v1 = Kernel(billing_agent(provider, version="1"), durability)
        await v1.turn("t", "1", "balance")
        v2 = Kernel(billing_agent(provider, version="2"), durability)
        assert v2.fingerprint != v1.fingerprint
        with pytest.raises(CheckpointCompatibilityError) as caught:
            await v2.turn("t", "2", "balance")
        assert caught.value.fingerprint == v1.fingerprint
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.version == 1
        v2_ok = Kernel(
            billing_agent(provider, version="2", compatible_fingerprints=[v1.fingerprint]),
            durability,
        )
        upgraded = await v2_ok.turn("t", "2", "balance")
        assert upgraded.checkpoint_version == 2
        stored = await durability.load_checkpoint("t")
        assert stored is not None and stored.agent_fingerprint == v2_ok.fingerprint

    async def test_a_checkpoint_of_a_newer_schema_revision_is_refused(
        self,
        kernel: Kernel,
        durability: Durability,
        tamper: Tamper | None,
        make_durability: Callable[[], Durability],
        provider: FakeProvider,
    ) -> None:
        if tamper is None:
            pytest.skip("this adapter provides no tamper fixture")
        await kernel.turn("t", "1", "balance")
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None
        document = json.loads(encode_checkpoint(checkpoint))
        document["schema_revision"] = SCHEMA_REVISION + 1
        await tamper.write_checkpoint_text("t", json.dumps(document))
        events = await durability.read_outbox()
        async with make_durability() as reopened:
            kernel = Kernel(billing_agent(provider), reopened)
            with pytest.raises(CheckpointCompatibilityError) as caught:
                await kernel.turn("t", "2", "balance")
            assert caught.value.schema_revision == SCHEMA_REVISION + 1
            assert await reopened.read_outbox() == events
            assert (await kernel.turn("t", "1", "balance")).replayed  # needs no checkpoint

    async def test_a_checkpoint_of_an_older_schema_revision_is_migrated_when_a_turn_loads_it(
        self,
        make_durability: Callable[[], Durability],
        provider: FakeProvider,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        if not self.persistent:
            pytest.skip("this adapter keeps no state across instances")
        async with make_durability() as before:
            await Kernel(billing_agent(provider), before).turn("t", "1", "balance 10")

        def tag_messages(document: dict[str, Any]) -> dict[str, Any]:
            """The next revision: messages of older revisions carry a marker."""
            for message in document["messages"]:
                message["content"] = "[old] " + message["content"]
            return document

        # This library, upgraded: one more revision, so the stored checkpoint is older.
        monkeypatch.setattr(
            checkpoint_codec, "CHECKPOINT_MIGRATIONS", (*CHECKPOINT_MIGRATIONS, tag_messages)
        )
        agent = billing_agent(provider)
        old = ["[old] balance 10", "[old] You owe 10."]
        async with make_durability() as after:
            result = await Kernel(agent, after).turn("t", "2", "balance 20")
            assert result.checkpoint_version == 2
            [request] = agent.interpreter.calls  # type: ignore[attr-defined]
            assert [m.content for m in request.messages] == old  # the turn saw it migrated
            checkpoint = await after.load_checkpoint("t")
            assert checkpoint is not None
            assert checkpoint.schema_revision == SCHEMA_REVISION + 1
            assert [m.content for m in checkpoint.messages] == [*old, "balance 20", "You owe 20."]
        async with make_durability() as reopened:  # stored in the new revision: not again
            stored = await reopened.load_checkpoint("t")
            assert stored == checkpoint

    async def test_a_corrupted_checkpoint_row_is_a_typed_error_and_changes_nothing(
        self,
        kernel: Kernel,
        durability: Durability,
        tamper: Tamper | None,
        make_durability: Callable[[], Durability],
        provider: FakeProvider,
    ) -> None:
        if tamper is None:
            pytest.skip("this adapter provides no tamper fixture")
        await kernel.turn("t", "1", "charge pi_1 500")
        for garbage in ('{"schema_revision": 1, "version": "x"', "[]", '{"schema_revision": 1}'):
            await tamper.write_checkpoint_text("t", garbage)
            events = await durability.read_outbox()
            async with make_durability() as reopened:
                with pytest.raises(CorruptRecordError) as caught:
                    await Kernel(billing_agent(provider), reopened).turn("t", "2", "yes")
                assert caught.value.thread_id == "t"
                assert await reopened.read_outbox() == events
        assert provider.calls() == 0 and await durability.list_receipts() == []

    # =========================================================================================
    # Bad input from the model or the caller
    # =========================================================================================

    async def test_invalid_capability_input_is_a_failed_step_and_writes_nothing(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        result = await kernel.turn("t", "1", "charge nope -5")
        [step] = result.steps
        assert step.status == StepStatus.FAILED
        assert "payment_intent_id" in (step.error or "") and "amount" in (step.error or "")
        assert result.interaction is None and provider.calls() == 0
        assert await durability.list_receipts() == []

    async def test_an_unknown_capability_is_a_failed_step_and_runs_nothing(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        result = await kernel.turn("t", "1", "ghost and balance")
        assert [s.status for s in result.steps] == [StepStatus.FAILED, StepStatus.COMPLETED]
        assert "unknown capability 'billing.ghost'" in (result.steps[0].error or "")
        assert provider.calls() == 0

    async def test_ids_are_stored_verbatim_and_bad_ids_refused(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        odd = "thread/ü 'quoted\"; DROP TABLE x;--\n" + "x" * 400
        result = await kernel.turn(odd, "turn\t✓", "balance")
        assert (result.thread_id, result.turn_id) == (odd, "turn\t✓")
        assert (await kernel.turn(odd, "turn\t✓", "balance")).replayed
        assert await durability.load_checkpoint(odd) is not None
        for bad in ("", "x" * 5000, "nul\x00byte"):
            with pytest.raises(KernelError):
                await kernel.turn(bad, "1", "balance")

    async def test_with_turn_called_directly_refuses_bad_ids_before_reading(
        self, durability: Durability
    ) -> None:
        """A host may call ``with_turn`` without the kernel: the adapter checks the IDs."""
        ran: list[TurnScope] = []

        async def operation(tx: TurnTransaction) -> TurnCommit:
            ran.append(tx.scope)
            return commit_for(tx)

        for bad in ("", "x" * 5000, "nul\x00byte", "lone\udc80"):
            for scope in (
                TurnScope(bad, "1"),
                TurnScope("t", bad),
                TurnScope("t", "1", tenant_id=bad),
            ):
                with pytest.raises(InvalidRequestError):
                    await durability.with_turn(scope, operation)
        assert ran == []
        assert await durability.list_receipts() == []
        assert await durability.read_outbox() == []
        assert await durability.load_checkpoint("t") is None

    async def test_a_thread_of_one_tenant_is_refused_to_another(self, kernel: Kernel) -> None:
        await kernel.turn("t", "1", "balance", tenant_id="acme")
        with pytest.raises(TenantMismatchError):
            await kernel.turn("t", "2", "balance", tenant_id="globex")
        with pytest.raises(TenantMismatchError):
            await kernel.turn("t", "1", "balance", tenant_id="globex")
        assert (await kernel.turn("t", "2", "balance", tenant_id="acme")).checkpoint_version == 2

    async def test_a_crashed_first_turns_receipts_are_never_shown_to_another_tenant(
        self, durability: Durability, tenant_store: TenantStore | None
    ) -> None:
        """A receipt claims a thread that has no committed turn.

        A first turn completed a write and crashed before its commit.
        That leaves the receipt on a thread with no committed turn.
        """
        key = "payments.charge:charge:card"

        async def acme_crashes(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect(key, lambda a: {"card": "acme's secret"}, step_id="s1")
            raise Crash

        with pytest.raises(Crash):
            await durability.with_turn(TurnScope("t", "a1", tenant_id="acme"), acme_crashes)
        seen: list[Any] = []

        async def other_tenant(tx: TurnTransaction) -> TurnCommit:
            effect = await tx.run_effect(key, lambda a: seen.append("called"), step_id="s1")
            seen.append(effect.value)
            return commit_for(tx)

        async def touches_nothing(tx: TurnTransaction) -> TurnCommit:
            return commit_for(tx)

        for tenant in ("globex", None):
            for operation in (other_tenant, touches_nothing):
                with pytest.raises(TenantMismatchError):
                    await durability.with_turn(TurnScope("t", "g1", tenant_id=tenant), operation)
        assert seen == []
        assert await durability.load_checkpoint("t") is None
        if tenant_store is not None:
            owner = await tenant_store.thread_owner("t")
            assert owner is not None and owner.tenant_id == "acme"

        async def acme_retries(tx: TurnTransaction) -> TurnCommit:
            effect = await tx.run_effect(key, lambda a: seen.append("again"), step_id="s1")
            assert (effect.replayed, effect.value) == (True, {"card": "acme's secret"})
            return commit_for(tx)

        result = await durability.with_turn(TurnScope("t", "a1", tenant_id="acme"), acme_retries)
        assert (result.replayed, result.checkpoint_version) == (False, 1)
        assert seen == []
        [receipt] = await durability.list_receipts(thread_id="t")
        assert (receipt.status, receipt.tenant_id) == ("completed", "acme")
        with pytest.raises(TenantMismatchError):
            await durability.with_turn(TurnScope("t", "g2", tenant_id="globex"), other_tenant)

    async def test_a_dead_first_attempt_stays_its_tenants_to_reconcile(
        self, durability: Durability
    ) -> None:
        """Another tenant's turn leaves an abandoned ``prepared`` receipt alone.

        It neither runs the effect nor marks the receipt uncertain.
        It only learns that the thread is not its own.
        """

        await die_in_the_provider_call(durability, TurnScope("t", "a1", tenant_id="acme"))
        called: list[str] = []

        async def globex(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect("k", lambda a: called.append("globex"), step_id="s1")
            return commit_for(tx)

        with pytest.raises(TenantMismatchError):
            await durability.with_turn(TurnScope("t", "g1", tenant_id="globex"), globex)
        [receipt] = await durability.list_receipts(thread_id="t")
        assert (receipt.status, receipt.tenant_id) == ("prepared", "acme")

        async def acme_retries(tx: TurnTransaction) -> TurnCommit:
            with pytest.raises(EffectUncertainError):
                await tx.run_effect("k", lambda a: called.append("acme"), step_id="s1")
            return commit_for(tx)

        await durability.with_turn(TurnScope("t", "a1", tenant_id="acme"), acme_retries)
        assert called == []
        [after] = await durability.list_receipts(thread_id="t")
        assert (after.status, after.tenant_id) == ("uncertain", "acme")

    async def test_list_receipts_filters_by_tenant(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        for thread, tenant, pi in (
            ("a", "acme", "pi_1"),
            ("b", "globex", "pi_2"),
            ("c", None, "pi_3"),
        ):
            await kernel.turn(thread, "1", f"charge {pi} 500", tenant_id=tenant)
            await kernel.turn(thread, "2", "yes", tenant_id=tenant)
        everyone = await durability.list_receipts()  # operator-level: every tenant
        assert [(r.thread_id, r.tenant_id) for r in everyone] == [
            ("a", "acme"),
            ("b", "globex"),
            ("c", None),
        ]
        assert [r.thread_id for r in await durability.list_receipts(tenant_id="acme")] == ["a"]
        assert [
            r.thread_id
            for r in await durability.list_receipts(status="completed", tenant_id="globex")
        ] == ["b"]
        assert await durability.list_receipts(thread_id="a", tenant_id="globex") == []

    async def test_a_read_or_a_resolution_for_a_tenant_shows_only_that_tenants_thread(
        self,
        kernel: Kernel,
        durability: Durability,
        provider: FakeProvider,
        tenant_store: TenantStore | None,
    ) -> None:
        if tenant_store is None:
            pytest.skip("this adapter declares no owner= (the tenant_store fixture)")
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500", tenant_id="acme")
        await kernel.turn("t", "2", "yes", tenant_id="acme")
        key = "payments.charge:charge:pi_1"
        for other in ("globex", None):
            assert await tenant_store.load_checkpoint("t", owner=ThreadOwner(other)) is None
            with pytest.raises(ReceiptNotFoundError):
                await tenant_store.resolve_receipt(
                    "t", key, applied=False, note="n", owner=ThreadOwner(other)
                )
        [untouched] = await durability.list_receipts(thread_id="t")
        assert (untouched.status, untouched.resolution) == (ReceiptStatus.UNCERTAIN, None)
        mine = await tenant_store.load_checkpoint("t", owner=ThreadOwner("acme"))
        assert mine is not None and mine.version == 2
        resolved = await tenant_store.resolve_receipt(
            "t", key, applied=False, note="n", actor="ops", owner=ThreadOwner("acme")
        )
        assert resolved.status == ReceiptStatus.FAILED
        await kernel.turn("u", "1", "balance")
        assert await tenant_store.load_checkpoint("u", owner=ThreadOwner("acme")) is None
        assert await tenant_store.load_checkpoint("u", owner=ThreadOwner(None)) is not None

    async def test_a_resolution_for_another_tenant_racing_a_first_turn_is_refused(
        self, durability: Durability, tenant_store: TenantStore | None
    ) -> None:
        """While acme's first turn runs, its thread has no owner.

        A tenant-less caller's resolution may be sent meanwhile.
        It is still refused once the turn made the receipt.
        """
        if tenant_store is None:
            pytest.skip("this adapter declares no owner= (the tenant_store fixture)")
        entered, released = asyncio.Event(), asyncio.Event()

        async def lost(authority: EffectAuthority) -> None:
            raise TimeoutError("the provider's answer was lost")

        async def first_turn(tx: TurnTransaction) -> TurnCommit:
            entered.set()
            await released.wait()
            with pytest.raises(EffectUncertainError):
                await tx.run_effect("k", lost, step_id="s1")
            return commit_for(tx)

        turn = asyncio.create_task(
            durability.with_turn(TurnScope("t", "a1", tenant_id="acme"), first_turn)
        )
        await entered.wait()
        resolving = asyncio.create_task(
            tenant_store.resolve_receipt("t", "k", applied=False, note="n", owner=ThreadOwner(None))
        )
        await asyncio.sleep(0)
        released.set()
        await turn
        with pytest.raises(ReceiptNotFoundError):
            await resolving
        [receipt] = await durability.list_receipts(thread_id="t")
        assert (receipt.status, receipt.tenant_id) == (ReceiptStatus.UNCERTAIN, "acme")

    # =========================================================================================
    # Checkpoints stored by difference load back whole
    # =========================================================================================

    async def test_every_committed_checkpoint_loads_back_exactly(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        """``load_checkpoint`` returns exactly what was committed, stored whole or as a delta.

        Adapters may store a checkpoint as a difference with the previous one.
        The load must match whatever the operation changed.
        Messages may be appended, trimmed or replaced; facts may be added, replaced or removed.
        The runtime may change them, or code may change them by hand.
        """
        committed: list[KernelCheckpoint] = []
        kernel = Kernel(billing_agent(provider, max_messages=4), Capturing(durability, committed))
        for turn, text in enumerate(["balance 5", "charge pi_1 5", "yes", "balance 7", "no"]):
            await kernel.turn("t", f"k{turn}", text)
            assert await durability.load_checkpoint("t") == committed[-1]

        def edit(change: Callable[[KernelCheckpoint], dict[str, Any]]) -> TurnOperation:
            async def operation(tx: TurnTransaction) -> TurnCommit:
                previous = tx.checkpoint
                assert previous is not None
                checkpoint = replace(previous, version=previous.version + 1, **change(previous))
                committed.append(checkpoint)
                result = TurnResult(
                    "t", tx.scope.turn_id, False, "ok", checkpoint_version=checkpoint.version
                )
                return TurnCommit(result, checkpoint, ())

            return operation

        by_hand = Message("user", "by hand", "h")
        edits: list[Callable[[KernelCheckpoint], dict[str, Any]]] = [
            lambda c: {"messages": (*c.messages[2:], by_hand)},  # trimmed and appended
            lambda c: {"messages": (by_hand, *c.messages)},  # not a continuation
            lambda c: {"messages": ()},
            lambda c: {"facts": {**c.facts, "balance": replace(c.facts["balance"], value=1)}},
            lambda c: {"facts": {k: v for k, v in c.facts.items() if k != "balance"}},
            lambda c: {"messages": (by_hand,), "facts": {}},
        ]
        for i, change in enumerate(edits):
            await durability.with_turn(TurnScope("t", f"h{i}"), edit(change))
            assert await durability.load_checkpoint("t") == committed[-1]
        await kernel.turn("t", "after", "balance 9")  # the runtime continues from them
        assert await durability.load_checkpoint("t") == committed[-1]
        assert [m.content for m in committed[-1].messages][:1] == ["by hand"]


async def _commits(tx: TurnTransaction) -> TurnCommit:
    return commit_for(tx)


async def _never_runs(tx: TurnTransaction) -> TurnCommit:
    raise AssertionError("a committed turn's operation ran again")
