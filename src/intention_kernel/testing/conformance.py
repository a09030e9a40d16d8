"""The adapter conformance suite: one test per rule of "Durability and effects".

Every durability adapter, bundled or third-party, proves itself by running this
suite. Subclass :class:`DurabilityConformance` in a pytest module and provide
the ``make_durability`` fixture (a factory returning a *new, unopened* adapter
on the same store each time it is called)::

    from intention_kernel.testing.conformance import DurabilityConformance

    class TestMyAdapter(DurabilityConformance):
        @pytest.fixture
        def make_durability(self, tmp_path):
            return lambda: MyAdapter(tmp_path / "store")

Optionally provide ``tamper`` (see :class:`Tamper`) so the bad-row tests can
write raw bytes into the store. Set ``persistent = False`` for adapters whose
state does not outlive the instance (the restart tests then skip). The suite
needs pytest-asyncio with ``asyncio_mode = "auto"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import math
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Protocol

import pytest

from intention_kernel import checkpoint as checkpoint_codec
from intention_kernel._json import MAX_INT_DIGITS
from intention_kernel.agent import Agent
from intention_kernel.capabilities import CapabilityContext, CapabilityResult, capability
from intention_kernel.checkpoint import (
    CHECKPOINT_MIGRATIONS,
    SCHEMA_REVISION,
    KernelCheckpoint,
    Message,
    encode_checkpoint,
)
from intention_kernel.durability import Durability, TurnOperation, TurnTransaction
from intention_kernel.durability.engine import RecordedDurability
from intention_kernel.durability.records import ThreadOwner
from intention_kernel.effects import EffectAuthority, ReceiptStatus
from intention_kernel.errors import (
    CheckpointCompatibilityError,
    CorruptRecordError,
    EffectNotAppliedError,
    EffectUncertainError,
    EffectUsageError,
    EffectValueError,
    InvalidRequestError,
    KernelError,
    ReceiptNotFoundError,
    ReceiptStateError,
    TenantMismatchError,
    TurnConflictError,
)
from intention_kernel.facts import Fact, FactRecord
from intention_kernel.interpretation import Answer, Intent, Interpretation
from intention_kernel.kernel import Kernel
from intention_kernel.testing import faults
from intention_kernel.testing.agents import FakeProvider, billing_agent
from intention_kernel.testing.scripted import ScriptedInterpreter
from intention_kernel.turns import EventDraft, StepStatus, TurnCommit, TurnResult, TurnScope

__all__ = ["DurabilityConformance", "Tamper", "commit_for"]


class Tamper(Protocol):
    """Raw access to an adapter's store, for tests of corrupted and foreign rows."""

    async def write_checkpoint_text(self, thread_id: str, text: str) -> None:
        """Overwrite the stored checkpoint document of an existing thread.

        The suite then reads it through a new adapter from ``make_durability``: an
        adapter may trust the checkpoint it committed itself while the stored version
        is unchanged, so a same-version rewrite behind its back is seen on reopening.
        (An adapter whose ``make_durability`` returns one shared instance must forget
        such cached state here.)
        """
        ...

    async def write_receipt_status(self, thread_id: str, key: str, status: str) -> None:
        """Overwrite the stored status of an existing receipt, bypassing any check."""
        ...


class DurabilityConformance:
    """Subclass and provide ``make_durability``; see the module docstring."""

    #: State outlives the adapter instance (reopening the store sees it).
    persistent: ClassVar[bool] = True

    # -- fixtures the subclass provides -------------------------------------------------------

    @pytest.fixture
    def make_durability(self) -> Callable[[], Durability]:
        pytest.fail("subclass DurabilityConformance and provide a make_durability fixture")

    @pytest.fixture
    def tamper(self, durability: Durability) -> Tamper | None:
        return None

    # -- fixtures of the suite ----------------------------------------------------------------

    @pytest.fixture
    async def durability(
        self, make_durability: Callable[[], Durability]
    ) -> AsyncIterator[Durability]:
        async with make_durability() as durability:
            yield durability

    @pytest.fixture
    def provider(self) -> FakeProvider:
        return FakeProvider()

    @pytest.fixture
    def kernel(self, durability: Durability, provider: FakeProvider) -> Kernel:
        return Kernel(billing_agent(provider), durability)

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
    # Durable external effects
    # =========================================================================================

    async def test_effect_key_is_prefixed_with_the_capability_id(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        [authority] = provider.authorities
        assert authority.key == authority.idempotency_key == "payments.charge:charge:pi_1"
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.key == authority.key and receipt.id == authority.receipt_id
        assert receipt.status == "completed"  # statuses are str enums

    async def test_same_effect_key_in_a_later_turn_returns_the_original_without_calling(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        first = await kernel.turn("t", "2", "yes")
        await kernel.turn("t", "3", "charge pi_1 500")
        second = await kernel.turn("t", "4", "yes")
        assert provider.calls() == 1
        assert second.steps[0].value == first.steps[0].value
        assert second.steps[0].receipt_ids == first.steps[0].receipt_ids

    async def test_effect_completed_is_announced_once_per_applied_write(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        # A tiny receipt index in the checkpoint must not make a deduplicated call look new.
        kernel = Kernel(billing_agent(provider, max_receipts=1), durability)
        for turn, pi in enumerate(["pi_1", "pi_1", "pi_2", "pi_1"]):
            await kernel.turn("t", f"propose-{turn}", f"charge {pi} 500")
            result = await kernel.turn("t", f"accept-{turn}", "yes")
            assert result.steps[0].status == StepStatus.COMPLETED
        completed = [
            e.payload["key"]
            for e in await durability.read_outbox(limit=1000)
            if e.type == "effect.completed"
        ]
        assert completed == ["payments.charge:charge:pi_1", "payments.charge:charge:pi_2"]
        assert provider.calls() == 2

    async def test_a_write_applied_by_a_turn_that_never_committed_is_announced_by_the_next(
        self, durability: Durability, kernel: Kernel, provider: FakeProvider
    ) -> None:
        if not isinstance(durability, RecordedDurability):
            pytest.skip("the fault points are those of RecordedDurability")
        await kernel.turn("t", "propose", "charge pi_1 500")
        with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
            await kernel.turn("t", "accept", "yes")  # the charge completed, the turn died
        [receipt] = await durability.list_receipts("t")
        assert (receipt.status, receipt.announced) == (ReceiptStatus.COMPLETED, False)
        await kernel.turn("t", "accept-under-a-new-id", "yes")
        [receipt] = await durability.list_receipts("t")
        assert receipt.announced  # marked by the commit that carries its effect.completed
        await kernel.turn("t", "accept", "yes")  # the dead delivery at last: nothing to announce
        completed = [
            e.turn_id
            for e in await durability.read_outbox(limit=1000)
            if e.type == "effect.completed"
        ]
        assert completed == ["accept-under-a-new-id"] and provider.calls() == 1

    async def test_a_turn_id_delivered_again_announces_only_the_receipts_it_reached(
        self, durability: Durability
    ) -> None:
        """A receipt completed under a turn ID is announced by that turn's commit only if
        the commit says so: a second delivery of the ID that does not reach the receipt
        (the model planned another write) leaves it to the next turn that does, and one
        that reaches it announces it (an adapter may record that in the turn row alone)."""

        class Died(Exception):
            pass

        async def completes_then_dies(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect("k", lambda a: {"ok": 1}, step_id="s1")
            raise Died

        async def reaches_another(tx: TurnTransaction) -> TurnCommit:
            other = await tx.run_effect("other", lambda a: {"ok": 3}, step_id="s2")
            key = other.receipt.key
            return commit_for(tx, [EventDraft("effect.completed", {"key": key})], announced=[key])

        seen: list[bool] = []

        async def reaches(tx: TurnTransaction) -> TurnCommit:
            effect = await tx.run_effect("k", lambda a: {"ok": 2}, step_id="s1")
            assert effect.replayed and effect.value == {"ok": 1}
            seen.append(effect.receipt.announced)
            if effect.receipt.announced:
                return commit_for(tx)
            key = effect.receipt.key
            return commit_for(tx, [EventDraft("effect.completed", {"key": key})], announced=[key])

        async def announced(thread_id: str) -> bool:
            receipts = {r.key: r for r in await durability.list_receipts(thread_id)}
            receipt = receipts["k"]
            assert receipt.status == ReceiptStatus.COMPLETED and receipt.turn_id == "1"
            return receipt.announced

        for thread_id, second_delivery in (("missed", reaches_another), ("reached", reaches)):
            with pytest.raises(Died):
                await durability.with_turn(TurnScope(thread_id, "1"), completes_then_dies)
            await durability.with_turn(TurnScope(thread_id, "1"), second_delivery)
            assert await announced(thread_id) is (second_delivery is reaches)
            await durability.with_turn(TurnScope(thread_id, "2"), reaches)
            assert await announced(thread_id)
            await durability.with_turn(TurnScope(thread_id, "3"), reaches)
        # Missed: turn 2 announced it, turn 3 saw it announced. Reached: turn 1 did.
        assert seen == [False, True, False, True, True]
        completed = [
            (e.thread_id, e.turn_id)
            for e in await durability.read_outbox(limit=1000)
            if e.type == "effect.completed"
        ]
        assert completed == [("missed", "1"), ("missed", "2"), ("reached", "1")]

    async def test_a_distinct_business_operation_uses_a_distinct_key(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        for turn, pi in (("1", "pi_1"), ("3", "pi_2")):
            await kernel.turn("t", turn, f"charge {pi} 500")
            await kernel.turn("t", str(int(turn) + 1), "yes")
        assert provider.ledger == ["payments.charge:charge:pi_1", "payments.charge:charge:pi_2"]

    async def test_effect_keys_are_deduplicated_per_thread(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        for thread in ("a", "b"):
            await kernel.turn(thread, "1", "charge pi_1 500")
            await kernel.turn(thread, "2", "yes")
        assert provider.calls("payments.charge:charge:pi_1") == 2

    async def test_turn_and_step_ids_are_receipt_metadata_not_part_of_the_key(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        await kernel.turn("t", "propose", "charge pi_1 500")
        result = await kernel.turn("t", "accept", "yes")
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.turn_id == "accept"
        assert receipt.step_id == result.steps[0].step_id
        assert "accept" not in receipt.key and receipt.step_id not in receipt.key

    async def test_preparation_is_durable_before_the_provider_is_called(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "block"
        await kernel.turn("t", "1", "charge pi_1 500")
        running = asyncio.create_task(kernel.turn("t", "2", "yes"))
        await asyncio.wait_for(provider.entered.wait(), 5)
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "prepared" and receipt.attempt == 1
        provider.released.set()
        result = await running
        assert result.steps[0].status == StepStatus.COMPLETED

    async def test_an_exception_after_the_write_makes_the_receipt_uncertain(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500")
        result = await kernel.turn("t", "2", "yes")
        [step] = result.steps
        assert step.status == "uncertain"
        assert "EffectUncertainError" in (step.error or "")
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == ReceiptStatus.UNCERTAIN
        assert "TimeoutError" in (receipt.error or "")
        types = [e.type for e in await durability.read_outbox(thread_id="t")]
        assert "effect.uncertain" in types and "effect.completed" not in types
        assert provider.calls() == 1

    async def test_an_uncertain_receipt_is_not_retried(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        provider.behaviour["pi_1"] = "ok"
        await kernel.turn("t", "3", "charge pi_1 500")
        retry = await kernel.turn("t", "4", "yes")
        assert retry.steps[0].status == StepStatus.UNCERTAIN
        assert provider.calls() == 1
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "uncertain" and receipt.attempt == 1

    async def test_not_applied_records_failed_and_permits_a_retry(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "not_applied"
        await kernel.turn("t", "1", "charge pi_1 500")
        failed = await kernel.turn("t", "2", "yes")
        assert failed.steps[0].status == StepStatus.FAILED
        assert "EffectNotAppliedError" in (failed.steps[0].error or "")
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "failed"
        provider.behaviour["pi_1"] = "ok"
        await kernel.turn("t", "3", "charge pi_1 500")
        retried = await kernel.turn("t", "4", "yes")
        assert retried.steps[0].status == StepStatus.COMPLETED
        [again] = await durability.list_receipts(thread_id="t")
        assert again.status == "completed" and again.attempt == 2 and again.id == receipt.id
        assert provider.calls() == 1
        types = [e.type for e in await durability.read_outbox(thread_id="t")]
        assert types.count("effect.failed") == 1 and types.count("effect.completed") == 1

    async def test_a_prepared_receipt_of_an_attempt_that_died_becomes_uncertain(
        self, durability: Durability
    ) -> None:
        await _die_in_the_provider_call(durability, TurnScope("t", "1"))
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "prepared"
        called: list[str] = []

        async def retry(tx: TurnTransaction) -> TurnCommit:
            with pytest.raises(EffectUncertainError) as caught:
                await tx.run_effect("k", lambda a: called.append("x"), step_id="s1")
            assert caught.value.receipt is not None
            assert caught.value.receipt.status == "uncertain"
            return commit_for(tx)

        await durability.with_turn(TurnScope("t", "1"), retry)
        assert called == []
        [after] = await durability.list_receipts(thread_id="t")
        assert after.status == "uncertain"

    async def test_cancellation_during_the_provider_call_makes_the_receipt_uncertain(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "block"
        await kernel.turn("t", "1", "charge pi_1 500")
        running = asyncio.create_task(kernel.turn("t", "2", "yes"))
        await asyncio.wait_for(provider.entered.wait(), 5)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "uncertain" and "CancelledError" in (receipt.error or "")
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.version == 1  # the turn did not commit
        retry = await kernel.turn("t", "2", "yes")
        assert retry.steps[0].status == StepStatus.UNCERTAIN
        assert provider.calls() == 0

    async def test_a_cancellation_while_the_outcome_is_written_still_records_it(
        self, durability: Durability
    ) -> None:
        """The provider answered; the turn is cancelled as its outcome is being written.
        The write still ends (``completed``, never left ``prepared``, which would fail
        closed for an operator), whether or not the turn got to commit."""
        loop = asyncio.get_running_loop()
        running: list[asyncio.Task[TurnResult]] = []
        calls: list[str] = []

        def provider(authority: EffectAuthority) -> dict[str, str]:
            calls.append(authority.key)
            loop.call_soon(running[0].cancel)  # lands at the write's first suspension
            return {"charged": authority.key}

        async def charge(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect("charge", provider, step_id="s")
            return commit_for(tx)

        running.append(asyncio.create_task(durability.with_turn(TurnScope("t", "1"), charge)))
        with contextlib.suppress(asyncio.CancelledError):
            await running[0]
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "completed" and receipt.value == {"charged": "charge"}
        again = await durability.with_turn(TurnScope("t", "1"), charge)
        assert again.turn_id == "1" and calls == ["charge"]  # never run twice

    async def test_a_value_that_cannot_be_stored_fails_closed(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "unstorable"
        await kernel.turn("t", "1", "charge pi_1 500")
        result = await kernel.turn("t", "2", "yes")
        assert result.steps[0].status == StepStatus.UNCERTAIN
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "uncertain" and "JSON" in (receipt.error or "")

    async def test_a_provider_value_no_store_can_hold_raises_effect_value_error(
        self, durability: Durability
    ) -> None:
        """The error names the cause and is still an ``EffectUncertainError`` (so the step
        is ``uncertain``); a later call with the key fails closed without the provider."""
        calls: list[str] = []

        def provider(authority: EffectAuthority) -> float:
            calls.append(authority.key)
            return math.nan

        async def operation(tx: TurnTransaction) -> TurnCommit:
            with pytest.raises(EffectValueError) as caught:
                await tx.run_effect("pay", provider, step_id="s1")
            assert isinstance(caught.value, EffectUncertainError)
            assert caught.value.receipt is not None
            assert caught.value.receipt.status == ReceiptStatus.UNCERTAIN
            with pytest.raises(EffectUncertainError) as again:
                await tx.run_effect("pay", provider, step_id="s1")
            assert not isinstance(again.value, EffectValueError)
            return commit_for(tx)

        await durability.with_turn(TurnScope("t", "1"), operation)
        assert calls == ["pay"]
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "uncertain" and "JSON" in (receipt.error or "")

    async def test_a_read_capability_cannot_run_effects(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        result = await kernel.turn("t", "1", "peek")
        assert result.steps[0].status == StepStatus.FAILED
        assert "read capability" in (result.steps[0].error or "")
        assert provider.ledger == [] and await durability.list_receipts() == []

    async def test_resolving_an_uncertain_receipt_as_applied_returns_its_value_later(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        key = "payments.charge:charge:pi_1"
        resolved = await durability.resolve_receipt(
            "t",
            key,
            applied=True,
            value={"charge_id": "ch_found"},
            note="seen in dashboard",
            actor="ops@example.com",
        )
        assert resolved.status == "completed" and resolved.value == {"charge_id": "ch_found"}
        assert resolved.resolution is not None and resolved.resolution.actor == "ops@example.com"
        events = await durability.read_outbox(thread_id="t")
        assert events[-1].type == "receipt.resolved" and events[-1].turn_id is None
        await kernel.turn("t", "3", "charge pi_1 500")
        later = await kernel.turn("t", "4", "yes")
        assert later.steps[0].status == StepStatus.COMPLETED
        assert later.steps[0].value == {"charge_id": "ch_found"}
        assert provider.calls() == 1

    async def test_the_checkpoint_receipt_index_shows_what_its_turn_saw_until_used_again(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        """The adapter's receipt is the authority; a checkpoint's receipt index records
        each receipt as the turn that last used it saw it (see ``ReceiptRef``)."""
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        key = "payments.charge:charge:pi_1"
        before = await durability.load_checkpoint("t")
        assert before is not None
        [entry] = before.receipts
        assert (entry.key, entry.status) == (key, "uncertain")
        resolved = await durability.resolve_receipt("t", key, applied=True, value={"id": "ch"})
        assert [r.status for r in await durability.list_receipts(thread_id="t")] == ["completed"]
        assert await durability.load_checkpoint("t") == before  # committed state is kept
        await kernel.turn("t", "3", "charge pi_1 500")
        await kernel.turn("t", "4", "yes")
        after = await durability.load_checkpoint("t")
        assert after is not None
        assert [(r.key, r.id, r.status) for r in after.receipts] == [
            (key, resolved.id, "completed")
        ]
        assert provider.calls() == 1

    async def test_resolving_an_uncertain_receipt_as_not_applied_permits_a_retry(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        await durability.resolve_receipt("t", "payments.charge:charge:pi_1", applied=False)
        provider.behaviour["pi_1"] = "ok"
        await kernel.turn("t", "3", "charge pi_1 500")
        later = await kernel.turn("t", "4", "yes")
        assert later.steps[0].status == StepStatus.COMPLETED
        assert provider.calls() == 2

    async def test_a_key_without_its_capability_prefix_is_refused_with_the_stored_key(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        events_before = await durability.read_outbox()
        with pytest.raises(ReceiptNotFoundError) as refused:
            await durability.resolve_receipt("t", "charge:pi_1", applied=False, note="n")
        assert refused.value.suggestions == ("payments.charge:charge:pi_1",)
        assert str(refused.value) == (
            "no receipt for key 'charge:pi_1' on thread 't'; "
            "did you mean 'payments.charge:charge:pi_1'?"
        )
        with pytest.raises(ReceiptNotFoundError) as unknown:
            await durability.resolve_receipt("t", "charge:pi_2", applied=False, note="n")
        assert unknown.value.suggestions == ()
        [receipt] = await durability.list_receipts()
        assert (receipt.status, receipt.resolution) == ("uncertain", None)
        assert await durability.read_outbox() == events_before
        if isinstance(durability, RecordedDurability):
            for other in ("acme", None):
                await kernel.turn("g", "1", "charge pi_1 500", tenant_id="globex")
                await kernel.turn("g", "2", "yes", tenant_id="globex")
                with pytest.raises(ReceiptNotFoundError) as hidden:
                    await durability.resolve_receipt(
                        "g", "charge:pi_1", applied=False, note="n", owner=ThreadOwner(other)
                    )
                assert hidden.value.suggestions == ()
                assert "did you mean" not in str(hidden.value)

    async def test_only_uncertain_receipts_can_be_resolved(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        events_before = await durability.read_outbox()
        with pytest.raises(ReceiptStateError):
            await durability.resolve_receipt("t", "payments.charge:charge:pi_1", applied=False)
        with pytest.raises(ReceiptNotFoundError):
            await durability.resolve_receipt("t", "payments.charge:charge:nope", applied=True)
        [receipt] = await durability.list_receipts()
        assert receipt.status == "completed"
        assert await durability.read_outbox() == events_before

    async def test_malformed_receipt_requests_are_typed_errors_and_change_nothing(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        key = "payments.charge:charge:pi_1"
        events = await durability.read_outbox()
        with pytest.raises(InvalidRequestError, match="bogus"):
            await durability.list_receipts(status="bogus")
        for value in (math.inf, -math.inf, math.nan, {"amount": math.nan}, {1, 2}, object()):
            with pytest.raises(InvalidRequestError, match="JSON"):
                await durability.resolve_receipt("t", key, applied=True, value=value)
        with pytest.raises(InvalidRequestError):
            await durability.resolve_receipt("t", key, applied=True, note="\ud800")
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "uncertain" and receipt.resolution is None
        assert await durability.read_outbox() == events
        resolved = await durability.resolve_receipt("t", key, applied=True, value={"ok": 1})
        assert resolved.status == "completed"  # the refusals held no lock and left no trace

    async def test_list_receipts_filters_by_thread_and_status(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        provider.behaviour["pi_2"] = "lost_response"
        for thread, pi in (("a", "pi_1"), ("b", "pi_2")):
            await kernel.turn(thread, "1", f"charge {pi} 500")
            await kernel.turn(thread, "2", "yes")
        assert [r.thread_id for r in await durability.list_receipts()] == ["a", "b"]
        assert [r.thread_id for r in await durability.list_receipts(status="uncertain")] == ["b"]
        assert [
            r.key for r in await durability.list_receipts(thread_id="a", status="completed")
        ] == ["payments.charge:charge:pi_1"]

    # =========================================================================================
    # Confirmation
    # =========================================================================================

    async def test_a_required_write_is_not_executed_in_the_proposing_turn(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        result = await kernel.turn("t", "1", "charge pi_1 500")
        assert provider.calls() == 0
        assert result.steps[0].status == StepStatus.AWAITING_CONFIRMATION
        interaction = result.interaction
        assert interaction is not None and interaction.kind == "confirmation"
        assert interaction.capability_id == "payments.charge"
        assert interaction.input == {"payment_intent_id": "pi_1", "amount": 500}
        assert interaction.prompt == "Charge 500 to pi_1?" and interaction.prompt in result.reply
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.interaction == interaction
        [item] = checkpoint.agenda
        assert item.interaction_id == interaction.id and item.input == interaction.input
        assert await durability.list_receipts() == []

    async def test_an_accepted_answer_runs_exactly_the_stored_operation(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        assert proposed.interaction is not None
        accepted = await kernel.turn("t", "2", answer=Answer(proposed.interaction.id, "accept"))
        [step] = accepted.steps
        assert step.status == StepStatus.COMPLETED
        assert step.step_id == proposed.steps[0].step_id
        assert step.value["amount"] == 500
        assert accepted.interaction is None and provider.calls() == 1

    async def test_a_rejected_answer_cancels_the_operation(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        rejected = await kernel.turn("t", "2", "no")
        assert rejected.steps[0].status == "rejected"
        assert rejected.interaction is None and provider.calls() == 0
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.agenda == () and checkpoint.interaction is None
        again = await kernel.turn("t", "3", "yes")
        assert again.steps == () and provider.calls() == 0

    async def test_an_unrelated_question_is_answered_while_confirmation_is_pending(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        question = await kernel.turn("t", "2", "balance 99")
        assert question.steps[0].status == StepStatus.COMPLETED
        assert question.interaction == proposed.interaction
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None
        assert checkpoint.interaction == proposed.interaction and len(checkpoint.agenda) == 1
        assert checkpoint.facts["balance"].value == 99
        accepted = await kernel.turn("t", "3", "yes")
        assert accepted.steps[0].status == StepStatus.COMPLETED and provider.calls() == 1

    async def test_an_answer_naming_another_interaction_runs_nothing(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "charge pi_1 500")
        refused = await kernel.turn("t", "2", answer=Answer("ix_other", "accept"))
        assert refused.steps == () and provider.calls() == 0
        # The person is shown the question still waiting, not interaction IDs.
        assert "nothing was done" in refused.reply and "ix_other" not in refused.reply
        assert proposed.interaction is not None
        assert proposed.interaction.prompt in refused.reply
        assert refused.interaction == proposed.interaction

    async def test_an_answer_with_nothing_pending_runs_nothing(
        self, kernel: Kernel, provider: FakeProvider
    ) -> None:
        result = await kernel.turn("t", "1", "yes and balance")
        assert result.steps == () and "nothing" in result.reply.lower()
        assert provider.calls() == 0

    async def test_a_new_required_write_supersedes_the_pending_one(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        first = await kernel.turn("t", "1", "charge pi_1 500")
        second = await kernel.turn("t", "2", "charge pi_2 700")
        assert first.interaction is not None and second.interaction is not None
        assert second.interaction.id != first.interaction.id
        resolved = await _payloads(durability, "t", "interaction.resolved")
        assert resolved == [
            {
                "interaction_id": first.interaction.id,
                "capability_id": "payments.charge",
                "step_id": first.steps[0].step_id,
                "resolution": "superseded",
            }
        ]
        await kernel.turn("t", "3", "yes")
        assert provider.ledger == ["payments.charge:charge:pi_2"]

    async def test_a_rejection_records_its_reason_and_actor_and_runs_nothing(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        first = await kernel.turn("t", "1", "charge pi_1 500")
        assert first.interaction is not None
        answer = Answer(None, "reject", reason="the amount is wrong", actor="ana")
        result = await kernel.turn("t", "2", answer=answer)
        assert provider.calls() == 0
        assert [(s.status, s.error) for s in result.steps] == [
            (StepStatus.REJECTED, "rejected by the person: the amount is wrong")
        ]
        resolved = await _payloads(durability, "t", "interaction.resolved")
        assert resolved == [
            {
                "interaction_id": first.interaction.id,
                "capability_id": "payments.charge",
                "step_id": first.steps[0].step_id,
                "resolution": "rejected",
                "actor": "ana",
                "reason": "the amount is wrong",
            }
        ]

    async def test_an_accepting_actor_is_on_the_resolution_and_the_effect_events(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", answer=Answer(None, "accept", actor="ana"))
        await kernel.turn("t", "3", "charge pi_2 300")
        await kernel.turn("t", "4", "yes")
        assert provider.ledger == ["payments.charge:charge:pi_1", "payments.charge:charge:pi_2"]
        events = await durability.read_outbox(thread_id="t")
        resolved = [e.payload.get("actor") for e in events if e.type == "interaction.resolved"]
        effects = [
            (e.payload["key"], e.payload.get("actor"))
            for e in events
            if e.type.startswith("effect.")
        ]
        assert resolved == ["ana", None]
        assert effects == [
            ("payments.charge:charge:pi_1", "ana"),
            ("payments.charge:charge:pi_2", None),
        ]

    async def test_an_answer_with_another_operations_digest_runs_nothing(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        from intention_kernel.checkpoint import operation_digest

        first = await kernel.turn("t", "1", "charge pi_1 500")
        shown = first.interaction
        assert shown is not None
        assert shown.digest == operation_digest("confirmation", "payments.charge", shown.input)
        other = operation_digest("confirmation", "payments.charge", {**shown.input, "amount": 9})
        refused = await kernel.turn("t", "2", answer=Answer(shown.id, "accept", digest=other))
        assert provider.calls() == 0 and refused.steps == ()
        assert "changed since it was shown" in refused.reply
        assert refused.interaction == shown
        stored = await durability.load_checkpoint("t")
        assert stored is not None and stored.interaction == shown
        accepted = await kernel.turn(
            "t", "3", answer=Answer(shown.id, "accept", digest=shown.digest)
        )
        assert [s.status for s in accepted.steps] == [StepStatus.COMPLETED]
        assert provider.ledger == ["payments.charge:charge:pi_1"]
        replayed = await kernel.turn(
            "t", "3", answer=Answer(shown.id, "accept", digest=shown.digest)
        )
        assert replayed.replayed and provider.ledger == ["payments.charge:charge:pi_1"]

    async def test_replaying_the_accepting_turn_runs_nothing_again(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        events = await durability.read_outbox()
        for _ in range(3):
            assert (await kernel.turn("t", "2", "yes")).replayed
        assert provider.calls() == 1 and await durability.read_outbox() == events

    async def test_a_pending_confirmation_survives_a_restart(
        self, make_durability: Callable[[], Durability], provider: FakeProvider
    ) -> None:
        if not self.persistent:
            pytest.skip("this adapter keeps no state across instances")
        async with make_durability() as before:
            proposed = await Kernel(billing_agent(provider), before).turn(
                "t", "1", "charge pi_1 500"
            )
        async with make_durability() as after:
            kernel = Kernel(billing_agent(provider), after)
            accepted = await kernel.turn("t", "2", "yes")
            assert accepted.steps[0].step_id == proposed.steps[0].step_id
            assert accepted.steps[0].status == StepStatus.COMPLETED
            assert (await kernel.turn("t", "2", "yes")).replayed
        assert provider.calls() == 1

    async def test_a_capability_mode_confirmation_survives_a_restart(
        self, make_durability: Callable[[], Durability], provider: FakeProvider
    ) -> None:
        """The interaction and its agenda item outlive the adapter: the answering turn,
        on a new instance, calls the capability again with ``ctx.answer`` set."""
        if not self.persistent:
            pytest.skip("this adapter keeps no state across instances")
        answers: list[Answer | None] = []

        @capability("payments.refund", effect="write", confirmation="capability")
        async def refund(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            answers.append(ctx.answer)
            if ctx.answer is None:
                return CapabilityResult.needs_confirmation("Refund 100?", {"amount": 100})
            if ctx.answer.decision != "accept" or ctx.answer.value != {"quote": "q1"}:
                return CapabilityResult(reply="Refund cancelled.")
            effect = await ctx.run_effect(
                "refund:pi_1", lambda authority: provider.charge("pi_1", -100, authority)
            )
            return CapabilityResult(value=effect.value, reply="Refunded 100.")

        def agent() -> Agent:
            script = {"refund": Interpretation(intents=[Intent("payments.refund", {})])}
            return Agent("refunds", "1", [refund], ScriptedInterpreter(script))

        async with make_durability() as before:
            proposed = await Kernel(agent(), before).turn("t", "1", "refund")
        assert proposed.interaction is not None and proposed.interaction.kind == "capability"
        async with make_durability() as after:
            kernel = Kernel(agent(), after)
            answer = Answer(proposed.interaction.id, "accept", {"quote": "q1"})
            accepted = await kernel.turn("t", "2", answer=answer)
            assert [(s.step_id, s.status) for s in accepted.steps] == [
                (proposed.steps[0].step_id, StepStatus.COMPLETED)
            ]
            assert accepted.reply == "Refunded 100." and accepted.interaction is None
            assert (await kernel.turn("t", "2", answer=answer)).replayed
        assert answers == [None, answer]
        assert provider.ledger == ["payments.refund:refund:pi_1"]

    async def test_capability_mode_runs_then_validates_the_answer_before_writing(
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        proposed = await kernel.turn("t", "1", "refund pi_1 100")
        assert proposed.steps[0].status == StepStatus.AWAITING_CONFIRMATION
        assert proposed.interaction is not None and proposed.interaction.kind == "capability"
        assert proposed.interaction.details == {"amount": 100}
        assert provider.calls() == 0
        accepted = await kernel.turn("t", "2", "yes")
        assert accepted.steps[0].status == StepStatus.COMPLETED
        assert accepted.reply == "Refunded 100."
        assert provider.ledger == ["payments.refund:refund:pi_1"]
        await kernel.turn("t", "3", "refund pi_2 50")
        declined = await kernel.turn("t", "4", "no")
        assert declined.steps[0].status == StepStatus.COMPLETED
        assert declined.reply == "Refund cancelled." and provider.calls() == 1

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

    async def test_a_receipt_row_in_an_unknown_state_is_a_typed_error(
        self,
        kernel: Kernel,
        durability: Durability,
        tamper: Tamper | None,
        provider: FakeProvider,
    ) -> None:
        if tamper is None:
            pytest.skip("this adapter provides no tamper fixture")
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500")
        await kernel.turn("t", "2", "yes")
        await tamper.write_receipt_status("t", "payments.charge:charge:pi_1", "exploded")
        with pytest.raises(CorruptRecordError):
            await durability.list_receipts()
        await kernel.turn("t", "3", "charge pi_1 500")
        with pytest.raises(CorruptRecordError):
            await kernel.turn("t", "4", "yes")
        assert provider.calls() == 1

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
        self, durability: Durability
    ) -> None:
        """A first turn that completed a write and crashed before its commit leaves a
        receipt on a thread with no committed turn: the receipt claims the thread."""
        key = "payments.charge:charge:card"

        async def acme_crashes(tx: TurnTransaction) -> TurnCommit:
            await tx.run_effect(key, lambda a: {"card": "acme's secret"}, step_id="s1")
            raise _Crash

        with pytest.raises(_Crash):
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
        if isinstance(durability, RecordedDurability):
            owner = await durability.thread_owner("t")
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
        """Another tenant's turn neither runs the effect nor marks the abandoned
        ``prepared`` receipt uncertain: it only learns that the thread is not its own."""

        await _die_in_the_provider_call(durability, TurnScope("t", "a1", tenant_id="acme"))
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
        self, kernel: Kernel, durability: Durability, provider: FakeProvider
    ) -> None:
        if not isinstance(durability, RecordedDurability):
            pytest.skip("owner= is RecordedDurability's")
        provider.behaviour["pi_1"] = "lost_response"
        await kernel.turn("t", "1", "charge pi_1 500", tenant_id="acme")
        await kernel.turn("t", "2", "yes", tenant_id="acme")
        key = "payments.charge:charge:pi_1"
        for other in ("globex", None):
            assert await durability.load_checkpoint("t", owner=ThreadOwner(other)) is None
            with pytest.raises(ReceiptNotFoundError):
                await durability.resolve_receipt(
                    "t", key, applied=False, note="n", owner=ThreadOwner(other)
                )
        [untouched] = await durability.list_receipts(thread_id="t")
        assert (untouched.status, untouched.resolution) == (ReceiptStatus.UNCERTAIN, None)
        mine = await durability.load_checkpoint("t", owner=ThreadOwner("acme"))
        assert mine is not None and mine.version == 2
        resolved = await durability.resolve_receipt(
            "t", key, applied=False, note="n", actor="ops", owner=ThreadOwner("acme")
        )
        assert resolved.status == ReceiptStatus.FAILED
        await kernel.turn("u", "1", "balance")
        assert await durability.load_checkpoint("u", owner=ThreadOwner("acme")) is None
        assert await durability.load_checkpoint("u", owner=ThreadOwner(None)) is not None

    async def test_a_resolution_for_another_tenant_racing_a_first_turn_is_refused(
        self, durability: Durability
    ) -> None:
        """While acme's first turn runs its thread has no owner; a tenant-less caller's
        resolution, sent meanwhile, is still refused once the turn made the receipt."""
        if not isinstance(durability, RecordedDurability):
            pytest.skip("owner= is RecordedDurability's")
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
            durability.resolve_receipt("t", "k", applied=False, note="n", owner=ThreadOwner(None))
        )
        await asyncio.sleep(0)
        released.set()
        await turn
        with pytest.raises(ReceiptNotFoundError):
            await resolving
        [receipt] = await durability.list_receipts(thread_id="t")
        assert (receipt.status, receipt.tenant_id) == (ReceiptStatus.UNCERTAIN, "acme")

    async def test_pending_interactions_lists_open_confirmations_across_threads_by_owner(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        if not isinstance(durability, RecordedDurability):
            pytest.skip("pending_interactions is RecordedDurability's")
        for thread, tenant, pi in (
            ("a", "acme", "pi_1"),
            ("b", "globex", "pi_2"),
            ("c", None, "pi_3"),
            ("d", "acme", "pi_4"),
            ("f", "acme", "pi_6"),
        ):
            await kernel.turn(thread, "1", f"charge {pi} 500", tenant_id=tenant)
        await kernel.turn("d", "2", "yes", tenant_id="acme")  # answered: nothing pending
        await kernel.turn("e", "1", "balance", tenant_id="acme")  # never asked

        async def decoy(tx: TurnTransaction) -> TurnCommit:
            # A core holding an "interaction" object deeper down, and no interaction.
            commit = commit_for(tx)
            held = checkpoint_codec.AgendaItem("s1", "x.y", {"interaction": {"id": "i"}}, "1")
            return replace(commit, checkpoint=replace(commit.checkpoint, agenda=(held,)))

        for thread in ("a0", "b0", "c0"):
            await durability.with_turn(TurnScope(thread, "1", tenant_id="acme"), decoy)

        every = await durability.pending_interactions()
        assert [(p.thread_id, p.tenant_id, p.version) for p in every] == [
            ("a", "acme", 1),
            ("b", "globex", 1),
            ("c", None, 1),
            ("f", "acme", 1),
        ]
        [first, *_] = every
        checkpoint = await durability.load_checkpoint("a")
        assert checkpoint is not None and first.interaction == checkpoint.interaction
        assert first.interaction.kind == "confirmation"
        assert first.interaction.capability_id == "payments.charge"

        acme = await durability.pending_interactions(owner=ThreadOwner("acme"))
        assert [p.thread_id for p in acme] == ["a", "f"]
        untenanted = await durability.pending_interactions(owner=ThreadOwner(None))
        assert [p.thread_id for p in untenanted] == ["c"]
        # Bounded, and paged on by thread ID; the decoys never take a place in a page.
        assert [p.thread_id for p in await durability.pending_interactions(limit=1)] == ["a"]
        page = await durability.pending_interactions(owner=ThreadOwner("acme"), limit=1)
        assert [p.thread_id for p in page] == ["a"]
        rest = await durability.pending_interactions(
            owner=ThreadOwner("acme"), after=page[-1].thread_id, limit=1
        )
        assert [p.thread_id for p in rest] == ["f"]
        assert await durability.pending_interactions(after="f") == []
        for bad in (0, -1, True):
            with pytest.raises(InvalidRequestError):
                await durability.pending_interactions(limit=bad)
        with pytest.raises(InvalidRequestError):
            await durability.pending_interactions(after="")

    async def test_pending_interactions_names_a_corrupt_candidate(
        self,
        kernel: Kernel,
        tamper: Tamper | None,
        make_durability: Callable[[], Durability],
    ) -> None:
        if tamper is None:
            pytest.skip("this adapter provides no tamper fixture")
        await kernel.turn("t", "1", "charge pi_1 500")
        await tamper.write_checkpoint_text("t", '{"interaction":{"id": 1')
        async with make_durability() as reopened:
            assert isinstance(reopened, RecordedDurability)
            with pytest.raises(CorruptRecordError) as caught:
                await reopened.pending_interactions()
        assert caught.value.thread_id == "t"

    # =========================================================================================
    # Effect calls that outlive their step, and sync provider calls
    # =========================================================================================

    async def test_writes_gathered_in_one_step_are_each_announced_even_when_one_fails(
        self, durability: Durability
    ) -> None:
        """One call of a gathered pair fails while the other is still in its provider
        call: the step waits for it, so the write it applied is announced with the step
        (the step's events were flushed before it ended, and it never was)."""
        other_running, handler_ended = asyncio.Event(), asyncio.Event()

        async def applied(authority: EffectAuthority) -> dict[str, str]:
            other_running.set()
            await handler_ended.wait()  # still running when the handler gives up
            return {"charged": authority.key}

        async def declined(authority: EffectAuthority) -> None:
            await other_running.wait()
            raise EffectNotAppliedError("declined")

        @capability("edges.pair", effect="write", confirmation="capability")
        async def pair(input: dict[str, Any], ctx: CapabilityContext) -> None:
            try:
                await asyncio.gather(ctx.run_effect("a", applied), ctx.run_effect("b", declined))
            finally:
                handler_ended.set()

        result = await _edges_kernel(durability, pair).turn("t", "1", "edges.pair")
        [step] = result.steps
        assert step.status == StepStatus.FAILED and "declined" in (step.error or "")
        receipts = {r.key: r for r in await durability.list_receipts(thread_id="t")}
        applied_receipt = receipts["edges.pair:a"]
        assert (applied_receipt.status, applied_receipt.announced) == ("completed", True)
        assert receipts["edges.pair:b"].status == "failed"
        effects = [
            (e.type, e.payload["key"])
            for e in await durability.read_outbox(thread_id="t")
            if e.type.startswith("effect.")
        ]
        assert sorted(effects) == [
            ("effect.completed", "edges.pair:a"),
            ("effect.failed", "edges.pair:b"),
        ]
        assert applied_receipt.id in step.receipt_ids

    async def test_an_effect_left_behind_by_its_step_is_refused_before_the_provider_is_called(
        self, durability: Durability
    ) -> None:
        """A call from a task the capability did not await would be applied with nothing
        left to announce it: it is refused before its receipt is prepared, and so is an
        event emitted after the step ended."""
        calls: list[str] = []
        left_behind: list[asyncio.Task[Any]] = []

        async def provider(authority: EffectAuthority) -> str:
            calls.append(authority.key)
            return "applied"

        async def late(ctx: CapabilityContext) -> None:
            await asyncio.sleep(0)
            with pytest.raises(EffectUsageError, match="after step"):
                ctx.emit("edges.late", {})
            await ctx.run_effect("late", provider)

        @capability("edges.background", effect="write", confirmation="capability")
        async def background(input: dict[str, Any], ctx: CapabilityContext) -> str:
            left_behind.append(asyncio.create_task(late(ctx)))
            return "returned at once"

        result = await _edges_kernel(durability, background).turn("t", "1", "edges.background")
        assert result.steps[0].status == StepStatus.COMPLETED
        with pytest.raises(EffectUsageError, match="after step"):
            await left_behind[0]
        assert calls == [] and await durability.list_receipts(thread_id="t") == []
        types = [e.type for e in await durability.read_outbox(thread_id="t")]
        assert not any(t.startswith("effect.") or t == "edges.late" for t in types)

    async def test_a_turn_keeps_its_lock_until_every_effect_it_started_has_ended(
        self, durability: Durability
    ) -> None:
        """An operation that fails while an effect it started still runs (in a task of
        its own) does not leave that receipt ``prepared`` under a free lock, where the
        next holder would take it for a dead attempt's: the call is cancelled, and its
        receipt is ``uncertain`` by the time ``with_turn`` raises."""
        entered = asyncio.Event()
        left_behind: list[asyncio.Task[Any]] = []

        async def provider(authority: EffectAuthority) -> str:
            entered.set()
            await asyncio.Event().wait()  # a provider call that has not answered
            raise AssertionError("unreachable")

        async def operation(tx: TurnTransaction) -> TurnCommit:
            left_behind.append(asyncio.create_task(tx.run_effect("k", provider, step_id="s")))
            await entered.wait()
            raise _Crash

        with pytest.raises(_Crash):
            await durability.with_turn(TurnScope("t", "1"), operation)
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "uncertain" and "CancelledError" in (receipt.error or "")
        with pytest.raises(EffectUncertainError):
            await left_behind[0]

    async def test_a_sync_effect_function_runs_off_the_event_loop(
        self, durability: Durability
    ) -> None:
        """A sync provider SDK blocks its own turn only: while one turn's sync call waits,
        a turn on another thread completes. The call sees the caller's context."""
        request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
        entered, release = threading.Event(), threading.Event()
        seen: list[tuple[str, bool]] = []

        def blocking(authority: EffectAuthority) -> dict[str, str]:
            entered.set()
            released = release.wait(30)  # a bound, so that a blocked loop fails, not hangs
            seen.append((request_id.get("unset"), released))
            return {"charged": authority.key}

        @capability("edges.sync", effect="write", confirmation="capability")
        async def sync_write(input: dict[str, Any], ctx: CapabilityContext) -> Any:
            request_id.set(f"req-{ctx.turn_id}")
            return (await ctx.run_effect("k", blocking)).value

        @capability("edges.read")
        async def read(input: dict[str, Any], ctx: CapabilityContext) -> str:
            return "read"

        kernel = _edges_kernel(durability, sync_write, read)
        blocked = asyncio.create_task(kernel.turn("a", "1", "edges.sync"))
        assert await asyncio.to_thread(entered.wait, 30)
        other = await kernel.turn("b", "1", "edges.read")
        finished_meanwhile = not release.is_set() and not blocked.done()
        release.set()
        result = await blocked
        assert other.steps[0].status == StepStatus.COMPLETED and finished_meanwhile
        assert result.steps[0].status == StepStatus.COMPLETED
        assert result.steps[0].value == {"charged": "edges.sync:k"}
        assert seen == [("req-1", True)]

    async def test_a_cancelled_turn_whose_sync_provider_call_still_runs_records_uncertain(
        self, durability: Durability
    ) -> None:
        """The turn is cancelled while its sync provider call runs in its thread: the
        receipt is ``uncertain`` at once, and stays so whatever the call does later
        (here it proves nothing was applied, too late to be believed)."""
        entered, release, ended = threading.Event(), threading.Event(), threading.Event()

        def blocking(authority: EffectAuthority) -> None:
            entered.set()
            try:
                release.wait(30)
                raise EffectNotAppliedError("declined, after the turn was cancelled")
            finally:
                ended.set()

        @capability("edges.sync", effect="write", confirmation="capability")
        async def sync_write(input: dict[str, Any], ctx: CapabilityContext) -> None:
            await ctx.run_effect("k", blocking)

        kernel = _edges_kernel(durability, sync_write)
        running = asyncio.create_task(kernel.turn("t", "1", "edges.sync"))
        assert await asyncio.to_thread(entered.wait, 30)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "uncertain" and not ended.is_set()
        release.set()
        assert await asyncio.to_thread(ended.wait, 30)
        await asyncio.sleep(0.01)  # let anything the finished thread scheduled run
        [after] = await durability.list_receipts(thread_id="t")
        assert after.status == "uncertain"
        assert await durability.load_checkpoint("t") is None

    # =========================================================================================
    # Values and names no store can hold or read back
    # =========================================================================================

    async def test_an_integer_no_store_can_read_back_is_refused_where_it_enters(
        self, durability: Durability, make_durability: Callable[[], Durability]
    ) -> None:
        """An integer longer than Python (and pydantic) parse from JSON would commit and
        then make its thread unreadable: it is refused where any unstorable value is, a
        failed step (an uncertain one for a provider's value, which was applied), the
        same on every store. The longest integer allowed reads back after a reopen."""
        too_long: int = 10**MAX_INT_DIGITS
        longest: int = 1 - too_long  # MAX_INT_DIGITS nines, negative
        provider_calls: list[str] = []

        @capability("edges.fact")
        async def fact(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            return CapabilityResult(facts=[Fact("n", too_long)])

        @capability("edges.value")
        async def value(input: dict[str, Any], ctx: CapabilityContext) -> int:
            return too_long

        @capability("edges.emit")
        async def emit(input: dict[str, Any], ctx: CapabilityContext) -> None:
            ctx.emit("edges.big", {"n": [too_long]})

        @capability("edges.charge", effect="write", confirmation="capability")
        async def charge(input: dict[str, Any], ctx: CapabilityContext) -> None:
            def provider(authority: EffectAuthority) -> dict[str, int]:
                provider_calls.append(authority.key)
                return {"n": too_long}

            await ctx.run_effect("k", provider)

        @capability("edges.longest")
        async def keep(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            return CapabilityResult(value=longest, facts=[Fact("n", {"n": (longest,)})])

        kernel = _edges_kernel(durability, fact, value, emit, charge, keep)
        for name in ("edges.fact", "edges.value", "edges.emit"):
            [step] = (await kernel.turn(name, "1", name)).steps
            assert step.status == StepStatus.FAILED and "digits" in (step.error or ""), name
        [step] = (await kernel.turn("edges.charge", "1", "edges.charge")).steps
        assert step.status == StepStatus.UNCERTAIN and "digits" in (step.error or "")
        [receipt] = await durability.list_receipts(thread_id="edges.charge")
        assert receipt.status == "uncertain" and "digits" in (receipt.error or "")
        assert provider_calls == ["edges.charge:k"]  # applied, and never called again
        with pytest.raises(InvalidRequestError):
            await kernel.turn("edges.value", "2", answer=Answer(value=too_long))
        with pytest.raises(InvalidRequestError, match="digits"):
            await durability.resolve_receipt(
                "edges.charge", "edges.charge:k", applied=True, value=too_long
            )
        kept = await kernel.turn("edges.longest", "1", "edges.longest")
        assert kept.steps[0].value == longest
        async with make_durability() as reopened:
            again = _edges_kernel(reopened, fact, value, emit, charge, keep)
            for name in ("edges.fact", "edges.value", "edges.emit", "edges.charge"):
                assert (await again.turn(name, "1", name)).replayed
                assert (await again.turn(name, "later", "nothing")).checkpoint_version == 2
            assert (await again.turn("edges.longest", "1", "edges.longest")).replayed
            checkpoint = await reopened.load_checkpoint("edges.longest")
            assert checkpoint is not None
            assert checkpoint.facts["n"].value == {"n": [longest]}
        assert provider_calls == ["edges.charge:k"]

    async def test_nul_in_a_key_or_an_event_type_is_refused_and_in_error_text_escaped(
        self, durability: Durability, make_durability: Callable[[], Durability]
    ) -> None:
        """PostgreSQL text cannot hold NUL: keys and event types holding one are refused
        before anything is written (a failed step, not a store error answered "retry"
        forever), and a provider's error text is stored with NUL escaped, on every
        store alike."""
        calls: list[str] = []

        def provider(authority: EffectAuthority) -> None:
            calls.append(authority.key)
            raise TimeoutError("lost\x00reply")

        @capability("edges.key", effect="write", confirmation="capability")
        async def bad_key(input: dict[str, Any], ctx: CapabilityContext) -> None:
            await ctx.run_effect("a\x00b", provider)

        @capability("edges.type")
        async def bad_type(input: dict[str, Any], ctx: CapabilityContext) -> None:
            ctx.emit("edges.\x00", {"ok": "a\x00b in a payload is JSON, and fine"})

        @capability("edges.fact")
        async def bad_fact(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            return CapabilityResult(facts=[Fact("k\x00", 1)])

        @capability("edges.error", effect="write", confirmation="capability")
        async def error_text(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            await ctx.run_effect("k", provider)
            raise AssertionError("unreachable")

        @capability("edges.payload")
        async def payload(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            ctx.emit("edges.nul", {"text": "a\x00b"})
            return CapabilityResult(value="a\x00b", facts=[Fact("text", "a\x00b")])

        kernel = _edges_kernel(durability, bad_key, bad_type, bad_fact, error_text, payload)
        for name, error in (
            ("edges.key", "EffectUsageError"),
            ("edges.type", "EffectUsageError"),
            ("edges.fact", "NUL"),
        ):
            [step] = (await kernel.turn(name, "1", name)).steps
            assert step.status == StepStatus.FAILED, name
            assert error in (step.error or "") and "NUL" in (step.error or ""), name
            assert await durability.list_receipts(thread_id=name) == []
        assert calls == []
        [step] = (await kernel.turn("edges.error", "1", "edges.error")).steps
        assert step.status == StepStatus.UNCERTAIN
        [receipt] = await durability.list_receipts(thread_id="edges.error")
        assert receipt.error == "TimeoutError: lost\\x00reply"
        result = await kernel.turn("edges.payload", "1", "edges.payload")
        assert result.steps[0].value == "a\x00b"  # inside JSON values, NUL is kept
        with pytest.raises(InvalidRequestError, match="NUL"):
            await durability.resolve_receipt("edges.error", "edges.error:\x00", applied=False)
        async with make_durability() as reopened:
            [again] = await reopened.list_receipts(thread_id="edges.error")
            assert again.error == receipt.error
            checkpoint = await reopened.load_checkpoint("edges.payload")
            assert checkpoint is not None and checkpoint.facts["text"].value == "a\x00b"
        [nul] = [
            e
            for e in await durability.read_outbox(thread_id="edges.payload")
            if e.type == "edges.nul"
        ]
        assert nul.payload == {"text": "a\x00b"}

    # =========================================================================================
    # Outbox
    # =========================================================================================

    async def test_outbox_events_exist_only_for_committed_turns_in_order(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        await kernel.turn("a", "1", "charge pi_1 500")
        await kernel.turn("b", "1", "balance")
        await kernel.turn("a", "2", "yes")
        await kernel.turn("a", "2", "yes")  # a replay adds nothing
        events = await durability.read_outbox()
        positions = [e.position for e in events]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert len({e.id for e in events}) == len(events)
        for thread in ("a", "b"):
            seqs = [e.seq for e in events if e.thread_id == thread]
            assert seqs == list(range(1, len(seqs) + 1))
        committed = [(e.thread_id, e.turn_id) for e in events if e.type == "turn.committed"]
        assert committed == [("a", "1"), ("b", "1"), ("a", "2")]
        accepted = [e.type for e in events if (e.thread_id, e.turn_id) == ("a", "2")]
        assert accepted == [
            "interaction.resolved",
            "effect.completed",
            "fact.recorded",
            "billing.charged",
            "turn.committed",
        ]

    async def test_read_outbox_pages_by_position_and_filters_by_thread(
        self, kernel: Kernel, durability: Durability
    ) -> None:
        for i in range(3):
            await kernel.turn("a", str(i), "balance")
            await kernel.turn("b", str(i), "balance")
        everything = await durability.read_outbox(limit=1000)
        first = await durability.read_outbox(limit=4)
        rest = await durability.read_outbox(after=first[-1].position, limit=1000)
        assert first + rest == everything
        only_b = await durability.read_outbox(thread_id="b", limit=1000)
        assert only_b == [e for e in everything if e.thread_id == "b"]

    # =========================================================================================
    # Checkpoints stored by difference load back whole
    # =========================================================================================

    async def test_every_committed_checkpoint_loads_back_exactly(
        self, durability: Durability, provider: FakeProvider
    ) -> None:
        """Adapters may store a checkpoint as a difference with the previous one; what
        ``load_checkpoint`` returns must still be exactly what was committed, whatever
        the operation changed: messages appended, trimmed or replaced, facts added,
        replaced or removed, by the runtime or by hand."""
        committed: list[KernelCheckpoint] = []
        kernel = Kernel(billing_agent(provider, max_messages=4), _Capturing(durability, committed))
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


async def _payloads(durability: Durability, thread_id: str, type: str) -> list[Any]:
    """The payloads of the thread's committed events of ``type``, in order."""
    return [e.payload for e in await durability.read_outbox(thread_id=thread_id) if e.type == type]


def _edges_kernel(durability: Durability, *capabilities: Any) -> Kernel:
    """A kernel whose interpreter runs the capability a message names (with no input),
    and nothing for any other message."""
    ids = {c.id for c in capabilities}

    def interpret(request: Any) -> Interpretation:
        if request.message in ids:
            return Interpretation([Intent(request.message, {})])
        return Interpretation([])

    agent = Agent(
        name="edges",
        version="1",
        capabilities=list(capabilities),
        interpreter=ScriptedInterpreter(interpret),
    )
    return Kernel(agent, durability)


class _Crash(Exception):
    """A turn's operation failing before its commit."""


class _ProcessDied(BaseException):
    """Stands in for the process dying while the provider call runs."""


async def _die_in_the_provider_call(durability: Durability, scope: TurnScope) -> None:
    """A turn whose process dies inside the provider call of effect ``k``: it leaves
    that receipt ``prepared`` and commits nothing."""

    def dies(authority: EffectAuthority) -> Any:
        raise _ProcessDied

    async def operation(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("k", dies, step_id="s1")
        raise AssertionError("unreachable")

    with pytest.raises(_ProcessDied):
        await durability.with_turn(scope, operation)


class _Capturing:
    """Passes turns through to ``inner`` and keeps every checkpoint they commit."""

    def __init__(self, inner: Durability, committed: list[KernelCheckpoint]) -> None:
        self._inner, self._committed = inner, committed

    async def with_turn(self, scope: TurnScope, operation: TurnOperation) -> TurnResult:
        async def capturing(tx: TurnTransaction) -> TurnCommit:
            commit = await operation(tx)
            self._committed.append(commit.checkpoint)
            return commit

        return await self._inner.with_turn(scope, capturing)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def commit_for(
    tx: TurnTransaction,
    events: Sequence[EventDraft] = (),
    *,
    facts: Mapping[str, FactRecord] | None = None,
    announced: Sequence[str] = (),
) -> TurnCommit:
    """A minimal valid commit for raw ``with_turn`` operations: the next version of the
    thread, with ``events``, ``facts`` (none by default) and ``announced`` keys. For
    adapter authors' own tests, beside the suite."""
    previous = tx.checkpoint
    version = (previous.version if previous else 0) + 1
    checkpoint = KernelCheckpoint(
        schema_revision=SCHEMA_REVISION,
        agent_fingerprint="sha256:raw",
        version=version,
        facts=dict(facts or {}),
    )
    result = TurnResult(
        tx.scope.thread_id, tx.scope.turn_id, False, "ok", checkpoint_version=version
    )
    return TurnCommit(result, checkpoint, tuple(events), tuple(announced))
