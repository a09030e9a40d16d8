"""The effect part of the storage contract.

Receipts are claimed before the provider call and settled after it.
It also covers the calls that outlive their step.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import threading
from typing import Any

import pytest

from intention_kernel._capabilities import CapabilityContext, capability
from intention_kernel._effects import EffectAuthority, ReceiptStatus
from intention_kernel._kernel import Kernel
from intention_kernel._turns import EventDraft, StepStatus, TurnCommit, TurnResult, TurnScope
from intention_kernel.durability import Durability, TurnTransaction
from intention_kernel.errors import (
    EffectNotAppliedError,
    EffectUncertainError,
    EffectUsageError,
    EffectValueError,
)
from intention_kernel.testing import faults
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing.conformance._receipts import ReceiptConformance
from intention_kernel.testing.conformance._support import (
    Crash,
    commit_for,
    die_in_the_provider_call,
    edges_kernel,
)

__all__ = ["EffectConformance"]


class EffectConformance(ReceiptConformance):
    """Subclass and provide ``make_durability``; see :mod:`intention_kernel.testing.conformance`."""

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
        # A tiny receipt index in the checkpoint must not make a deduped call look new.
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
        self, durability: Durability, kernel: Kernel, provider: FakeProvider, fault_points: bool
    ) -> None:
        if not fault_points:
            pytest.skip("this adapter declares no fault points (the fault_points fixture)")
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
        """A turn's commit announces a receipt completed under its ID only if it says so.

        A second delivery of the ID may not reach the receipt.
        The model planned another write, say.
        It then leaves the receipt to the next turn that does reach it.
        A delivery that reaches it announces it.
        An adapter may record that in the turn row alone.
        """

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
        await die_in_the_provider_call(durability, TurnScope("t", "1"))
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

        The write still ends as ``completed``, whether or not the turn got to commit.
        It is never left ``prepared``, which would fail closed for an operator.
        """
        loop = asyncio.get_running_loop()
        running: list[asyncio.Task[TurnResult]] = []
        calls: list[str] = []

        # A coroutine, run on the loop: a sync one runs in a thread. From there the
        # cancel could land before the thread's return, a call still in flight.
        async def provider(authority: EffectAuthority) -> dict[str, str]:
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
        """The error names the cause and is still an ``EffectUncertainError``.

        So the step is ``uncertain``.
        A later call with the key fails closed without the provider.
        """
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

    @pytest.mark.parametrize(
        "point",
        [faults.IN_PROVIDER_AFTER_WRITE, faults.AFTER_RECEIPT_COMPLETED, faults.BEFORE_COMMIT],
    )
    async def test_a_crashed_delivery_arriving_after_other_turns_keeps_one_index_entry_per_receipt(
        self, durability: Durability, point: str, fault_points: bool
    ) -> None:
        """A crashed accepting delivery arriving late still indexes its receipt once.

        The accepting turn dies after its receipt was written.
        The answer arrives under a new delivery ID.
        That delivery reuses the receipt and indexes it.
        The charge is proposed again.
        Then the crashed delivery arrives at last, and its turn reuses the receipt too.
        The checkpoint still indexes that receipt once.
        """
        if not fault_points:
            pytest.skip("this adapter declares no fault points (the fault_points fixture)")
        provider = MarksItsWrite()
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn("t", "propose", "charge pi_1 500")
        with faults.injected(point, "raise"), pytest.raises(faults.InjectedFault):
            await kernel.turn("t", "accept", "yes")
        await kernel.turn("t", "accept-under-a-new-id", "yes")
        await kernel.turn("t", "propose-again", "charge pi_1 500")
        late = await kernel.turn("t", "accept", "yes")
        assert not late.replayed and late.steps[0].receipt_ids
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None
        assert [r.key for r in checkpoint.receipts] == ["payments.charge:charge:pi_1"]
        [receipt] = await durability.list_receipts("t")
        assert checkpoint.receipts[0].status == receipt.status
        assert provider.calls() == 1

    # =========================================================================================
    # Effect calls that outlive their step, and sync provider calls
    # =========================================================================================

    async def test_writes_gathered_in_one_step_are_each_announced_even_when_one_fails(
        self, durability: Durability
    ) -> None:
        """One call of a gathered pair fails while the other is still in its provider call.

        The step waits for the other call.
        So the write it applied is announced with the step.
        Otherwise the step's events would be flushed before the write ended.
        The write would then never be announced.
        """
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

        result = await edges_kernel(durability, pair).turn("t", "1", "edges.pair")
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
        """A call from a task the capability did not await is refused.

        It would be applied with nothing left to announce it.
        It is refused before its receipt is prepared.
        So is an event emitted after the step ended.
        """
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

        result = await edges_kernel(durability, background).turn("t", "1", "edges.background")
        assert result.steps[0].status == StepStatus.COMPLETED
        with pytest.raises(EffectUsageError, match="after step"):
            await left_behind[0]
        assert calls == [] and await durability.list_receipts(thread_id="t") == []
        types = [e.type for e in await durability.read_outbox(thread_id="t")]
        assert not any(t.startswith("effect.") or t == "edges.late" for t in types)

    async def test_a_turn_keeps_its_lock_until_every_effect_it_started_has_ended(
        self, durability: Durability
    ) -> None:
        """A failing operation leaves no ``prepared`` receipt of a running effect.

        The effect runs in a task of its own when the operation fails.
        Its receipt must not stay ``prepared`` under a free lock.
        The next holder would take it for a dead attempt's.
        So the call is cancelled.
        Its receipt is ``uncertain`` by the time ``with_turn`` raises.
        """
        entered = asyncio.Event()
        left_behind: list[asyncio.Task[Any]] = []

        async def provider(authority: EffectAuthority) -> str:
            entered.set()
            await asyncio.Event().wait()  # a provider call that has not answered
            raise AssertionError("unreachable")

        async def operation(tx: TurnTransaction) -> TurnCommit:
            left_behind.append(asyncio.create_task(tx.run_effect("k", provider, step_id="s")))
            await entered.wait()
            raise Crash

        with pytest.raises(Crash):
            await durability.with_turn(TurnScope("t", "1"), operation)
        [receipt] = await durability.list_receipts(thread_id="t")
        assert receipt.status == "uncertain" and "CancelledError" in (receipt.error or "")
        with pytest.raises(EffectUncertainError):
            await left_behind[0]

    async def test_a_sync_effect_function_runs_off_the_event_loop(
        self, durability: Durability
    ) -> None:
        """A sync provider SDK blocks its own turn only.

        While one turn's sync call waits, a turn on another thread completes.
        The call sees the caller's context.
        """
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

        kernel = edges_kernel(durability, sync_write, read)
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
        """The turn is cancelled while its sync provider call runs in its thread.

        The receipt is ``uncertain`` at once.
        It stays so whatever the call does later.
        Here the call proves nothing was applied, too late to be believed.
        """
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

        kernel = edges_kernel(durability, sync_write)
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


class MarksItsWrite(FakeProvider):
    """A :class:`FakeProvider` that reaches ``IN_PROVIDER_AFTER_WRITE`` once a charge
    is applied, before it answers."""

    async def charge(self, payment_intent_id: str, amount: int, authority: EffectAuthority) -> Any:
        value = await super().charge(payment_intent_id, amount, authority)
        faults.reach(faults.IN_PROVIDER_AFTER_WRITE)  # applied; the answer is on its way
        return value
