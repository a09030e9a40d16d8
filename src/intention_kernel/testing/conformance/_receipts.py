"""The receipt half of the effect part.

It covers listing and resolving receipts, and bad receipt rows.
It covers the values and names no store can hold or read back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from intention_kernel._agent import Agent
from intention_kernel._capabilities import CapabilityContext, CapabilityResult, capability
from intention_kernel._effects import EffectAuthority
from intention_kernel._facts import Fact
from intention_kernel._interpretation import Answer, Intent, Interpretation
from intention_kernel._json import MAX_INT_DIGITS
from intention_kernel._kernel import Kernel
from intention_kernel._turns import StepStatus
from intention_kernel.durability import Durability
from intention_kernel.durability.abc import TenantStore, ThreadOwner
from intention_kernel.errors import (
    CorruptRecordError,
    InvalidRequestError,
    ReceiptNotFoundError,
    ReceiptStateError,
)
from intention_kernel.testing._agents import FakeProvider
from intention_kernel.testing._scripted import ScriptedInterpreter
from intention_kernel.testing.conformance._support import (
    ConformanceCase,
    Tamper,
    edges_kernel,
)

__all__ = ["ReceiptConformance"]


#: Half of a UTF-16 surrogate pair: a Python string may hold it, UTF-8 cannot.
LONE_SURROGATE = "\ud800"

#: Provider values no store can hold.
UNSTORABLE: dict[str, Callable[[], Any]] = {
    "an-object": lambda: object(),
    "not-a-number": lambda: {"amount": math.nan},
    "a-lone-surrogate": lambda: f"ch_{LONE_SURROGATE}",
    "a-nested-lone-surrogate": lambda: {"charge": [LONE_SURROGATE]},
}


class ReceiptConformance(ConformanceCase):
    """Subclass and provide ``make_durability``; see :mod:`intention_kernel.testing.conformance`."""

    # =========================================================================================
    # Listing and resolving receipts
    # =========================================================================================

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
        """The adapter's receipt is the authority.

        A checkpoint's receipt index records each receipt as its last user saw it.
        That user is the turn that last used it (see ``ReceiptRef``).
        """
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
        self,
        kernel: Kernel,
        durability: Durability,
        provider: FakeProvider,
        tenant_store: TenantStore | None,
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
        if tenant_store is not None:
            for other in ("acme", None):
                await kernel.turn("g", "1", "charge pi_1 500", tenant_id="globex")
                await kernel.turn("g", "2", "yes", tenant_id="globex")
                with pytest.raises(ReceiptNotFoundError) as hidden:
                    await tenant_store.resolve_receipt(
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
    # Values and names no store can hold or read back
    # =========================================================================================

    async def test_an_integer_no_store_can_read_back_is_refused_where_it_enters(
        self, durability: Durability, make_durability: Callable[[], Durability]
    ) -> None:
        """An integer too long for Python and pydantic to parse from JSON is refused.

        It would commit and then make its thread unreadable.
        It is refused where any unstorable value is, the same on every store.
        The step fails.
        For a provider's value, which was applied, the step is uncertain instead.
        The longest integer allowed reads back after a reopen.
        """
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

        kernel = edges_kernel(durability, fact, value, emit, charge, keep)
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
            again = edges_kernel(reopened, fact, value, emit, charge, keep)
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
        """PostgreSQL text cannot hold NUL, so every store treats NUL alike.

        Keys and event types holding one are refused before anything is written.
        The step fails; it is not a store error answered "retry" forever.
        A provider's error text is stored with NUL escaped.
        """
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

        kernel = edges_kernel(durability, bad_key, bad_type, bad_fact, error_text, payload)
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

    @pytest.mark.parametrize("case", UNSTORABLE)
    async def test_a_provider_value_that_cannot_be_stored_fails_closed_on_every_adapter(
        self, durability: Durability, case: str
    ) -> None:
        """The write happened, but its value cannot be recorded.

        So replaying it later could not return it.
        The receipt is ``uncertain``, and the step says so; it is never ``failed``.
        """
        agent, calls = writer(UNSTORABLE[case])
        kernel = Kernel(agent, durability)
        first = await kernel.turn("t", "1", "go")
        assert first.steps[0].status == StepStatus.UNCERTAIN
        [receipt] = await durability.list_receipts("t")
        assert (receipt.status, receipt.attempt) == ("uncertain", 1)
        again = await kernel.turn("t", "2", "go")
        assert again.steps[0].status == StepStatus.UNCERTAIN
        assert calls == ["x.write:op-1"]

    async def test_a_provider_error_whose_text_cannot_be_stored_still_records_uncertain(
        self, durability: Durability
    ) -> None:
        agent, calls = writer(lambda: None, TimeoutError(f"gateway said {LONE_SURROGATE}"))
        kernel = Kernel(agent, durability)
        first = await kernel.turn("t", "1", "go")
        assert first.steps[0].status == StepStatus.UNCERTAIN
        [receipt] = await durability.list_receipts("t")
        assert receipt.status == "uncertain" and "TimeoutError" in (receipt.error or "")
        assert (await kernel.turn("t", "2", "go")).steps[0].status == StepStatus.UNCERTAIN
        assert calls == ["x.write:op-1"]

    async def test_capability_output_that_cannot_be_stored_is_a_failed_step_on_every_adapter(
        self, durability: Durability
    ) -> None:
        @capability("x.value")
        async def value(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            return CapabilityResult(value={"text": LONE_SURROGATE})

        @capability("x.fact")
        async def fact(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            return CapabilityResult(facts=[Fact("note", LONE_SURROGATE)])

        @capability("x.raise")
        async def fail(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            raise ValueError(f"bad byte {LONE_SURROGATE}")

        @capability("x.emit")
        async def emit(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            ctx.emit("x.noted", {"text": LONE_SURROGATE})
            return CapabilityResult(value=1)

        @capability("x.emit_type")
        async def emit_type(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
            ctx.emit(f"x.{LONE_SURROGATE}", {})
            return CapabilityResult(value=1)

        script = {
            "go": Interpretation(
                [
                    Intent("x.value"),
                    Intent("x.fact"),
                    Intent("x.raise"),
                    Intent("x.emit"),
                    Intent("x.emit_type"),
                ]
            )
        }
        agent = Agent("o", "1", [value, fact, fail, emit, emit_type], ScriptedInterpreter(script))
        result = await Kernel(agent, durability).turn("t", "1", "go")
        assert [s.status for s in result.steps] == [StepStatus.FAILED] * 5
        checkpoint = await durability.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.facts == {}
        assert [e.type for e in await durability.read_outbox()] == ["turn.committed"]


def writer(value: Callable[[], Any], error: BaseException | None = None) -> tuple[Agent, list[str]]:
    """An agent, and the calls of its provider.

    Its one write capability gets ``value``, or ``error``, from its provider.
    """
    calls: list[str] = []

    def provider(authority: Any) -> Any:
        calls.append(authority.key)
        if error is not None:
            raise error
        return value()

    @capability("x.write", effect="write", confirmation="capability")
    async def write(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        effect = await ctx.run_effect("op-1", provider)
        return CapabilityResult(value=effect.value)

    script = {"go": Interpretation([Intent("x.write")])}
    return Agent("w", "1", [write], ScriptedInterpreter(script)), calls
