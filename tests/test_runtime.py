"""The turn runtime: interpretation, steps and their failures, replies."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from intention_kernel import (
    Agent,
    Answer,
    CancellationSignal,
    CapabilityContext,
    CapabilityResult,
    CompilationError,
    EffectUsageError,
    Fact,
    Intent,
    Interpretation,
    InterpretationError,
    InvalidRequestError,
    Kernel,
    Replies,
    Rule,
    RuleInterpreter,
    StepResult,
    StepStatus,
    capability,
)
from intention_kernel._capabilities import Capability
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel._turns import request_digest
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent, billing_interpreter


def _kernel(*caps: Any, script: Any) -> tuple[Kernel, InMemoryDurability]:
    durability = InMemoryDurability()
    agent = Agent("t", "1", list(caps), ScriptedInterpreter(script))
    return Kernel(agent, durability), durability


async def test_an_interpreter_that_raises_commits_nothing_and_can_be_retried() -> None:
    attempts = 0

    def flaky(request: InterpretationRequest) -> Interpretation:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("model unavailable")
        return Interpretation(reply="hello")

    kernel, durability = _kernel(script=flaky)
    with pytest.raises(InterpretationError, match="model unavailable"):
        await kernel.turn("t", "1", "hi")
    assert await durability.load_checkpoint("t") is None
    assert await durability.read_outbox() == []
    assert (await kernel.turn("t", "1", "hi")).reply == "hello"


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        "accept",
        {"intents": []},
        Interpretation(intents="billing.balance"),  # type: ignore[arg-type]
        Interpretation(intents=[{"capability_id": "x"}]),  # type: ignore[list-item]
        Interpretation(answer="maybe"),  # type: ignore[arg-type]
    ],
)
async def test_an_interpreter_returning_garbage_is_a_typed_error(garbage: Any) -> None:
    kernel, durability = _kernel(script=lambda request: garbage)
    with pytest.raises(InterpretationError):
        await kernel.turn("t", "1", "hi")
    assert await durability.load_checkpoint("t") is None


async def test_malformed_requests_are_refused_before_anything_runs() -> None:
    kernel, durability = _kernel(script={})
    with pytest.raises(InvalidRequestError):
        await kernel.turn("t", "1")
    with pytest.raises(InvalidRequestError):
        await kernel.turn("t", "1", answer="maybe")
    with pytest.raises(InvalidRequestError, match="limit"):
        await kernel.turn("t", "1", "x" * 40_000)
    assert await durability.load_checkpoint("t") is None


async def test_capability_exceptions_become_failed_steps_and_the_turn_commits() -> None:
    @capability("x.boom")
    async def boom(input: dict[str, Any], ctx: CapabilityContext) -> None:
        ctx.emit("x.should_not_appear", {})
        raise RuntimeError("kaput")

    @capability("x.ok")
    async def ok(input: dict[str, Any], ctx: CapabilityContext) -> int:
        return 7

    script = {"go": Interpretation(intents=[Intent("x.boom"), Intent("x.ok")])}
    kernel, durability = _kernel(boom, ok, script=script)
    result = await kernel.turn("t", "1", "go")
    assert [(s.status, s.error) for s in result.steps] == [
        (StepStatus.FAILED, "RuntimeError: kaput"),
        (StepStatus.COMPLETED, None),
    ]
    assert result.steps[1].value == 7
    types = [e.type for e in await durability.read_outbox()]
    assert types == ["turn.committed"]


async def test_unstorable_values_and_bad_lineage_fail_the_step_and_record_nothing() -> None:
    @capability("x.weird")
    async def weird(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult(value={1, 2})

    @capability("x.orphan")
    async def orphan(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult(facts=[Fact("a", 1), Fact("b", 2, derived_from=("missing",))])

    script = {"go": Interpretation(intents=[Intent("x.weird"), Intent("x.orphan")])}
    kernel, durability = _kernel(weird, orphan, script=script)
    result = await kernel.turn("t", "1", "go")
    assert [s.status for s in result.steps] == [StepStatus.FAILED, StepStatus.FAILED]
    assert "JSON" in (result.steps[0].error or "")
    assert "unknown fact 'missing'" in (result.steps[1].error or "")
    checkpoint = await durability.load_checkpoint("t")
    assert checkpoint is not None and checkpoint.facts == {} and result.facts == ()


async def test_needs_confirmation_outside_capability_mode_is_a_failed_step() -> None:
    @capability("x.ask")
    async def ask(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult.needs_confirmation("sure?")

    kernel, _ = _kernel(ask, script={"go": Interpretation(intents=[Intent("x.ask")])})
    result = await kernel.turn("t", "1", "go")
    assert result.steps[0].status == StepStatus.FAILED and result.interaction is None


async def test_the_context_describes_the_step() -> None:
    seen: dict[str, Any] = {}

    @capability("x.look")
    async def look(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        seen.update(
            thread=ctx.thread_id,
            turn=ctx.turn_id,
            step=ctx.step_id,
            tenant=ctx.tenant_id,
            cap=ctx.capability_id,
            facts=dict(ctx.facts),
            answer=ctx.answer,
        )
        with pytest.raises(TypeError):
            ctx.facts["x"] = 1  # type: ignore[index]
        return CapabilityResult(facts=[Fact("seen", True)])

    kernel, _ = _kernel(look, script={"go": Interpretation(intents=[Intent("x.look")])})
    await kernel.turn("th", "tu", "go", tenant_id="acme")
    await kernel.turn("th", "tu2", "go", tenant_id="acme")
    assert seen["thread"] == "th" and seen["turn"] == "tu2" and seen["step"] == "tu2#1"
    assert seen["tenant"] == "acme" and seen["cap"] == "x.look" and seen["answer"] is None
    assert seen["facts"]["seen"].value is True


async def test_the_same_effect_key_cannot_run_twice_at_once_in_one_turn() -> None:
    @capability("x.twice", effect="write", confirmation="capability")
    async def twice(input: dict[str, Any], ctx: CapabilityContext) -> Any:
        async def slow(authority: Any) -> int:
            await asyncio.sleep(0.01)
            return 1

        results = await asyncio.gather(
            ctx.run_effect("k", slow), ctx.run_effect("k", slow), return_exceptions=True
        )
        return [type(r).__name__ for r in results]

    kernel, durability = _kernel(twice, script={"go": Interpretation(intents=[Intent("x.twice")])})
    result = await kernel.turn("t", "1", "go")
    assert sorted(result.steps[0].value) == ["EffectResult", "EffectUsageError"]
    [receipt] = await durability.list_receipts()
    assert receipt.status == "completed"


async def test_an_answer_is_handled_before_the_intents_of_the_same_message() -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), InMemoryDurability())
    await kernel.turn("t", "1", "charge pi_1 500")
    result = await kernel.turn("t", "2", "yes and charge pi_2 300")
    assert [s.capability_id for s in result.steps] == ["payments.charge", "payments.charge"]
    assert [s.status for s in result.steps] == [
        StepStatus.COMPLETED,
        StepStatus.AWAITING_CONFIRMATION,
    ]
    assert provider.ledger == ["payments.charge:charge:pi_1"]
    assert (
        result.interaction is not None and result.interaction.input["payment_intent_id"] == "pi_2"
    )


async def test_an_explicit_answer_needs_no_interpretation() -> None:
    provider = FakeProvider()
    agent = billing_agent(provider)
    kernel = Kernel(agent, InMemoryDurability())
    proposed = await kernel.turn("t", "1", "charge pi_1 500")
    assert proposed.interaction is not None
    calls = len(agent.interpreter.calls)  # type: ignore[attr-defined]
    result = await kernel.turn("t", "2", answer=Answer(proposed.interaction.id))
    assert result.steps[0].status == StepStatus.COMPLETED
    assert len(agent.interpreter.calls) == calls  # type: ignore[attr-defined]


async def test_rule_interpreter_maps_patterns_to_intents_and_answers() -> None:
    interpreter = RuleInterpreter(
        [
            Rule(r"^(yes|confirm)\b", answer="accept"),
            Rule(r"pay invoice (?P<invoice>\d+)", capability_id="billing.pay"),
            Rule(r"balance", capability_id="billing.balance", input={"currency": "EUR"}),
            Rule(
                r"refund (?P<n>\d+)",
                capability_id="billing.refund",
                input=lambda m: {"amount": int(m["n"])},
            ),
        ],
        fallback_reply="I only do billing.",
    )

    async def ask(message: str) -> Interpretation:
        request = InterpretationRequest("t", "1", message, (), {}, None, ())
        return await interpreter.interpret(request)

    assert (await ask("Please pay invoice 42")).intents == [
        Intent("billing.pay", {"invoice": "42"})
    ]
    assert (await ask("BALANCE?")).intents == [Intent("billing.balance", {"currency": "EUR"})]
    assert (await ask("refund 5")).intents == [Intent("billing.refund", {"amount": 5})]
    assert (await ask("yes please")).answer == "accept"
    assert (await ask("weather?")) == Interpretation(reply="I only do billing.")
    with pytest.raises(ValueError, match="exactly one"):
        Rule("x")


async def test_an_intent_the_interpreter_could_not_build_is_a_failed_step() -> None:
    provider = FakeProvider()
    script = {
        "go": Interpretation(
            intents=[
                Intent("payments.charge", error="arguments are not valid JSON"),
                Intent("billing.nope", error="whatever"),
            ]
        )
    }
    kernel = Kernel(
        billing_agent(provider, interpreter=ScriptedInterpreter(script)), InMemoryDurability()
    )
    result = await kernel.turn("t", "1", "go")
    assert [s.status for s in result.steps] == [StepStatus.FAILED, StepStatus.FAILED]
    assert result.steps[0].error == (
        "invalid input for payments.charge: arguments are not valid JSON"
    )
    assert "unknown capability 'billing.nope'" in (result.steps[1].error or "")
    assert result.interaction is None
    assert provider.calls() == 0


async def test_a_capability_asking_for_consent_can_record_facts_in_the_asking_turn() -> None:
    @capability("x.quote", effect="write", confirmation="capability")
    async def quote(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        if ctx.answer is None:
            return CapabilityResult.needs_confirmation(
                "Book at 120?", details={"price": 120}, facts=[Fact("quote", 120)]
            )
        return CapabilityResult(value=ctx.facts["quote"].value)

    kernel, _ = _kernel(quote, script={"go": Interpretation(intents=[Intent("x.quote")])})
    asked = await kernel.turn("t", "1", "go")
    assert asked.steps[0].status == StepStatus.AWAITING_CONFIRMATION
    assert [(f.key, f.value) for f in asked.facts] == [("quote", 120)]
    answered = await kernel.turn("t", "2", answer="accept")
    assert answered.steps[0].value == 120


async def test_a_capability_cannot_emit_events_in_the_kernels_namespaces() -> None:
    @capability("x.forge")
    async def forge(input: dict[str, Any], ctx: CapabilityContext) -> None:
        ctx.emit("x.before_forging", {})
        ctx.emit(input["type"], {"forged": True})

    @capability("x.careful")
    async def careful(input: dict[str, Any], ctx: CapabilityContext) -> str:
        with pytest.raises(EffectUsageError):
            ctx.emit("effect.completed", {"key": "forged"})
        ctx.emit("x.turned", {"ok": True})  # "turn" inside a type of its own is fine
        return "done"

    reserved = [
        "turn.committed",
        "interaction.opened",
        "fact.recorded",
        "effect.completed",
        "receipt.resolved",
        "turn",
    ]
    script = {
        "go": Interpretation(
            intents=[*(Intent("x.forge", {"type": t}) for t in reserved), Intent("x.careful")]
        )
    }
    kernel, durability = _kernel(forge, careful, script=script)
    result = await kernel.turn("t", "1", "go")
    *forged, allowed = result.steps
    assert [s.status for s in forged] == [StepStatus.FAILED] * len(reserved)
    for step, type in zip(forged, reserved, strict=True):
        assert (step.error or "").startswith("EffectUsageError:"), step.error
        assert repr(type) in (step.error or "") and "reserved namespace" in (step.error or "")
    assert allowed.status == StepStatus.COMPLETED
    events = await durability.read_outbox()
    assert [e.type for e in events] == ["x.turned", "turn.committed"]
    assert events[-1].payload["version"] == 1  # the kernel's own, not a forgery


async def test_a_read_declared_required_waits_for_confirmation_like_a_write() -> None:
    disclosed: list[str] = []

    @capability("x.disclose", confirmation="required", prompt="Show the SSN of {person}?")
    async def disclose(input: dict[str, Any], ctx: CapabilityContext) -> dict[str, str]:
        disclosed.append(input["person"])
        return {"ssn": "123-45-6789"}

    script = {
        "ssn ann": Interpretation(intents=[Intent("x.disclose", {"person": "ann"})]),
        "ssn bob": Interpretation(intents=[Intent("x.disclose", {"person": "bob"})]),
    }
    kernel, durability = _kernel(disclose, script=script)
    asked = await kernel.turn("t", "1", "ssn ann")
    assert [s.status for s in asked.steps] == [StepStatus.AWAITING_CONFIRMATION]
    assert asked.interaction is not None and asked.interaction.kind == "confirmation"
    assert asked.reply == "Show the SSN of ann?" and disclosed == []
    checkpoint = await durability.load_checkpoint("t")
    assert checkpoint is not None and [a.input for a in checkpoint.agenda] == [{"person": "ann"}]
    accepted = await kernel.turn("t", "2", answer="accept")
    assert [(s.status, s.value) for s in accepted.steps] == [
        (StepStatus.COMPLETED, {"ssn": "123-45-6789"})
    ]
    assert accepted.steps[0].step_id == asked.steps[0].step_id and disclosed == ["ann"]
    await kernel.turn("t", "3", "ssn bob")
    rejected = await kernel.turn("t", "4", answer="reject")
    assert [s.status for s in rejected.steps] == [StepStatus.REJECTED]
    assert disclosed == ["ann"] and rejected.interaction is None


async def test_a_write_superseded_in_its_own_turn_is_reported_rejected_not_awaiting() -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), durability := InMemoryDurability())
    result = await kernel.turn("t", "1", "charge pi_1 500 and charge pi_2 700")
    first, second = result.steps
    assert (first.status, second.status) == (
        StepStatus.REJECTED,
        StepStatus.AWAITING_CONFIRMATION,
    )
    assert first.error is not None and f"superseded by step {second.step_id}" in first.error
    assert result.interaction is not None and result.interaction.step_id == second.step_id
    assert result.reply.splitlines() == [
        "Not asked, superseded by a later request: Charge 500 to pi_1?",
        "Charge 700 to pi_2?",
    ]
    checkpoint = await durability.load_checkpoint("t")
    assert checkpoint is not None and [a.step_id for a in checkpoint.agenda] == [second.step_id]
    events = [(e.type, e.payload) for e in await durability.read_outbox()]
    opened = [p for t, p in events if t == "interaction.opened"]
    assert [p["step_id"] for p in opened] == [first.step_id, second.step_id]
    assert [p for t, p in events if t == "interaction.resolved"] == [
        {
            "interaction_id": opened[0]["interaction_id"],
            "capability_id": "payments.charge",
            "step_id": first.step_id,
            "resolution": "superseded",
        }
    ]
    [(_, committed)] = [(t, p) for t, p in events if t == "turn.committed"]
    assert [s["status"] for s in committed["steps"]] == ["rejected", "awaiting_confirmation"]
    accepted = await kernel.turn("t", "2", "yes")
    assert [s.step_id for s in accepted.steps] == [second.step_id]
    assert provider.ledger == ["payments.charge:charge:pi_2"]


@pytest.mark.parametrize("effect", ["read", "write"])
async def test_the_signal_is_set_when_the_turn_is_cancelled(effect: Any) -> None:
    """A provider call in a worker thread outlives the cancelled await; ``ctx.signal`` is
    how it learns to stop (also when ``run_effect`` turned the cancellation into an
    uncertain receipt)."""
    started = asyncio.Event()
    stopped = threading.Event()
    loop = asyncio.get_running_loop()

    def provider(signal: CancellationSignal) -> str:
        loop.call_soon_threadsafe(started.set)
        if signal.event.wait(timeout=10):
            stopped.set()
        return "done"

    mode: Any = "capability" if effect == "write" else "none"

    @capability("x.slow", effect=effect, confirmation=mode)
    async def slow(input: dict[str, Any], ctx: CapabilityContext) -> Any:
        if effect == "read":
            return await asyncio.to_thread(provider, ctx.signal)
        done = await ctx.run_effect("k", lambda _: asyncio.to_thread(provider, ctx.signal))
        return done.value

    kernel, durability = _kernel(slow, script={"go": Interpretation(intents=[Intent("x.slow")])})
    turn = asyncio.create_task(kernel.turn("t", "1", "go"))
    await started.wait()
    assert not stopped.is_set()
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert await asyncio.to_thread(stopped.wait, 5), "the worker thread was never told"
    assert await durability.load_checkpoint("t") is None  # nothing committed
    if effect == "write":
        [receipt] = await durability.list_receipts()
        assert receipt.status == "uncertain"


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"x": value}
    return value


@pytest.mark.parametrize("levels", [65, 5000])
async def test_input_nested_too_deep_is_a_failed_step_and_nothing_is_asked(levels: int) -> None:
    """Far deeper than any schema, from any interpreter: a clear failed step, never a
    RecursionError from the encoders that would store it with the checkpoint."""
    from pydantic import BaseModel

    class Payload(BaseModel):
        data: dict[str, Any]

    @capability("a.loose", effect="write")
    async def loose(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        raise AssertionError("never called")

    @capability("a.typed", effect="write")
    async def typed(input: Payload, ctx: CapabilityContext) -> CapabilityResult:
        raise AssertionError("never called")

    deep = _nested(levels)
    kernel, durability = _kernel(
        loose,
        typed,
        script=lambda request: Interpretation(
            intents=[Intent("a.loose", deep), Intent("a.typed", {"data": deep})]
        ),
    )
    result = await kernel.turn("t", "1", "go")
    assert [(s.status, s.error) for s in result.steps] == [
        (
            StepStatus.FAILED,
            "input for a.loose is not JSON-serializable: value is nested more than 64 levels deep",
        ),
        (StepStatus.FAILED, "input for a.typed is nested more than 64 levels deep"),
    ]
    assert result.interaction is None
    checkpoint = await durability.load_checkpoint("t")
    assert checkpoint is not None and checkpoint.agenda == ()


async def test_input_at_the_nesting_limit_is_accepted() -> None:
    seen: list[Any] = []

    @capability("a.read")
    async def read(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        seen.append(input)
        return CapabilityResult(value=1)

    kernel, _ = _kernel(
        read, script=lambda r: Interpretation(intents=[Intent("a.read", _nested(64))])
    )
    result = await kernel.turn("t", "1", "go")
    assert result.steps[0].status == StepStatus.COMPLETED
    assert seen == [_nested(64)]


async def test_outbox_events_carry_the_payloads_consumers_rely_on() -> None:
    """Each kernel event's payload, field by field: what a consumer of the outbox reads to
    follow facts (key and version), effects (key, receipt, attempt, status) and turns."""
    provider = FakeProvider(behaviour={"pi_2": "lost_response", "pi_3": "not_applied"})
    durability = InMemoryDurability()
    kernel = Kernel(billing_agent(provider), durability)
    await kernel.turn("t", "1", "balance 10")
    await kernel.turn("t", "2", "balance 20")
    proposed = await kernel.turn("t", "3", "charge pi_1 500")
    accepted = await kernel.turn("t", "4", "yes")
    await kernel.turn("t", "5", "charge pi_2 300")
    lost = await kernel.turn("t", "6", "yes")
    await kernel.turn("t", "7", "charge pi_3 200")
    declined = await kernel.turn("t", "8", "yes")
    await durability.resolve_receipt("t", "payments.charge:charge:pi_2", applied=False, actor="ops")
    receipts = {r.key.rsplit(":", 1)[1]: r for r in await durability.list_receipts("t")}
    events = await durability.read_outbox("t", limit=1000)
    by_turn: dict[str | None, list[tuple[str, Any]]] = {}
    for event in events:
        by_turn.setdefault(event.turn_id, []).append((event.type, event.payload))

    def committed(version: int, *steps: tuple[str, str, str]) -> tuple[str, Any]:
        return (
            "turn.committed",
            {
                "version": version,
                "steps": [{"step_id": s, "capability_id": c, "status": st} for s, c, st in steps],
            },
        )

    assert by_turn["1"] == [
        ("fact.recorded", {"key": "balance", "version": 1, "step_id": "1#1"}),
        committed(1, ("1#1", "billing.balance", "completed")),
    ]
    assert by_turn["2"][0] == ("fact.recorded", {"key": "balance", "version": 2, "step_id": "2#1"})
    interaction = proposed.interaction
    assert interaction is not None
    assert by_turn["3"] == [
        (
            "interaction.opened",
            {
                "interaction_id": interaction.id,
                "kind": "confirmation",
                "capability_id": "payments.charge",
                "step_id": "3#1",
                "prompt": "Charge 500 to pi_1?",
            },
        ),
        committed(3, ("3#1", "payments.charge", "awaiting_confirmation")),
    ]
    charge = receipts["pi_1"]
    assert accepted.steps[0].receipt_ids == (charge.id,)
    assert by_turn["4"] == [
        (
            "interaction.resolved",
            {
                "interaction_id": interaction.id,
                "capability_id": "payments.charge",
                "step_id": "3#1",
                "resolution": "accepted",
            },
        ),
        (
            "effect.completed",
            {
                "key": "payments.charge:charge:pi_1",
                "receipt_id": charge.id,
                "capability_id": "payments.charge",
                "step_id": "3#1",
                "attempt": 1,
                "status": "completed",
            },
        ),
        ("fact.recorded", {"key": "charge.pi_1", "version": 1, "step_id": "3#1"}),
        ("billing.charged", {"payment_intent_id": "pi_1"}),
        committed(4, ("3#1", "payments.charge", "completed")),
    ]
    uncertain = next(p for t, p in by_turn["6"] if t == "effect.uncertain")
    assert lost.steps[0].receipt_ids == (receipts["pi_2"].id,)
    assert uncertain == {
        "key": "payments.charge:charge:pi_2",
        "receipt_id": receipts["pi_2"].id,
        "capability_id": "payments.charge",
        "step_id": "5#1",
        "attempt": 1,
        "status": "uncertain",
        "error": "TimeoutError: the provider did not answer in time",
        "attempted": True,
    }
    failed = next(p for t, p in by_turn["8"] if t == "effect.failed")
    assert declined.steps[0].status == StepStatus.FAILED
    assert failed == {
        "key": "payments.charge:charge:pi_3",
        "receipt_id": receipts["pi_3"].id,
        "capability_id": "payments.charge",
        "step_id": "7#1",
        "attempt": 1,
        "status": "failed",
        "error": "EffectNotAppliedError: card declined for pi_3",
        "attempted": True,
    }
    [(kind, resolved)] = by_turn[None]
    assert kind == "receipt.resolved"
    assert resolved == {
        "key": "payments.charge:charge:pi_2",
        "receipt_id": receipts["pi_2"].id,
        "applied": False,
        "status": "failed",
        "previous_status": "uncertain",
        "note": None,
        "actor": "ops",
    }
    assert [e.type for e in events].count("turn.committed") == 8


# -- the request digest ----------------------------------------------------------------------


@given(message=st.none() | st.text())
def test_the_request_digest_of_a_turn_without_an_answer_is_the_canonical_one(
    message: str | None,
) -> None:
    """Stored turns carry the digest of ``{"answer": ..., "message": ...}`` as canonical
    JSON; the shortcut for a turn without an answer must produce the same text, or a
    retried delivery of an older turn would be refused as a different request."""
    canonical = json.dumps(
        {"message": message, "answer": None}, sort_keys=True, separators=(",", ":")
    )
    assert request_digest(message, None) == hashlib.sha256(canonical.encode()).hexdigest()
    answered = {"interaction_id": "i", "value": message}
    assert request_digest(message, answered) != request_digest(message, None)


# -- replies a person reads ---------------------------------------------------------------------

#: What a person must never read in a reply: exception classes, parser positions, IDs.
TECHNICAL = ("Error", "line 1 column", "ix_", "rcpt_", "payments.charge")


def _assert_for_a_person(reply: str) -> None:
    for fragment in TECHNICAL:
        assert fragment not in reply, (fragment, reply)


async def test_replies_say_what_happened_without_exception_names_or_parser_positions() -> None:
    provider = FakeProvider(behaviour={"pi_lost": "lost_response", "pi_no": "not_applied"})
    json_error = "arguments are not JSON: Expecting value: line 1 column 1 (char 0)"
    base = billing_interpreter()

    class Garbling:
        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            if request.message == "garbled":
                return Interpretation([Intent("payments.charge", {}, error=json_error)])
            return await base.interpret(request)

    agent = dataclasses.replace(billing_agent(provider), interpreter=Garbling())
    kernel = Kernel(agent, InMemoryDurability())

    await kernel.turn("t", "1", "charge pi_lost 500")
    lost = await kernel.turn("t", "2", "yes")
    assert lost.reply == (
        "Charge a payment intent: I could not tell whether this went through, so it will "
        "not be tried again until someone has checked it."
    )
    assert lost.steps[0].error is not None and "TimeoutError" in lost.steps[0].error

    await kernel.turn("t", "3", "charge pi_no 500")
    declined = await kernel.turn("t", "4", "yes")
    assert declined.reply == "Charge a payment intent: this did not go through. You can ask again."
    assert declined.steps[0].error == "EffectNotAppliedError: card declined for pi_no"

    asked = await kernel.turn("t", "5", "charge pi_1 500")
    assert asked.interaction is not None
    cancelled = await kernel.turn("t", "6", "no")
    assert cancelled.reply == "Cancelled: nothing was done."

    garbled = await kernel.turn("t", "7", "garbled")
    assert garbled.reply == (
        "Charge a payment intent: I could not make out the details of the request, so "
        "nothing was done."
    )
    assert garbled.steps[0].error is not None and "line 1 column 1" in garbled.steps[0].error

    unknown = await kernel.turn("t", "8", "ghost")
    assert unknown.reply == "Sorry, I could not work out what to do for that, so nothing was done."

    asked = await kernel.turn("t", "9", "charge pi_2 500")
    assert asked.interaction is not None
    other = await kernel.turn("t", "10", answer=Answer("ix_someone_else"))
    assert other.reply == (
        "That answer is for an earlier question, so nothing was done. The question waiting "
        "for an answer is: Charge 500 to pi_2?"
    )
    for result in (lost, declined, cancelled, garbled, unknown, other):
        _assert_for_a_person(result.reply)


async def test_a_capability_that_raises_is_reported_without_its_exception() -> None:
    @capability("things.break", description="Open a support ticket")
    async def broken(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        raise KeyError("customer_id")

    kernel, _ = _kernel(broken, script={"go": Interpretation([Intent("things.break")])})
    result = await kernel.turn("t", "1", "go")
    assert result.reply == "Open a support ticket: something went wrong, so this was not completed."
    assert result.steps[0].error == "KeyError: 'customer_id'"


class _Terse(Replies):
    def uncertain(self, capability: Capability, step: StepResult) -> str:
        return f"unknown outcome of {capability.id} in {step.step_id}"

    def cancelled(self, interaction: Any) -> str:
        return f"dropped: {interaction.prompt}"

    def failed(self, capability: Capability, step: StepResult, error: BaseException) -> str:
        return f"failed ({type(error).__name__})"

    def nothing_to_do(self) -> str:
        return "?"


async def test_an_agent_words_the_kernels_replies_with_its_own_replies_object() -> None:
    provider = FakeProvider(behaviour={"pi_lost": "lost_response", "pi_no": "not_applied"})
    agent = dataclasses.replace(billing_agent(provider), replies=_Terse())
    kernel = Kernel(agent, InMemoryDurability())
    assert kernel.fingerprint == Kernel(billing_agent(provider), InMemoryDurability()).fingerprint
    await kernel.turn("t", "1", "charge pi_lost 500")
    lost = await kernel.turn("t", "2", "yes")
    assert lost.reply == f"unknown outcome of payments.charge in {lost.steps[0].step_id}"
    await kernel.turn("t", "3", "charge pi_no 500")
    assert (await kernel.turn("t", "4", "yes")).reply == "failed (EffectNotAppliedError)"
    await kernel.turn("t", "5", "charge pi_1 500")
    assert (await kernel.turn("t", "6", "no")).reply == "dropped: Charge 500 to pi_1?"
    assert (await kernel.turn("t", "7", "hello there")).reply == "?"
    # The methods not overridden keep the default wording.
    assert (await kernel.turn("t", "8", "no")).reply == Replies().nothing_pending()


def test_replies_that_are_not_a_replies_object_are_refused_at_compilation() -> None:
    agent = dataclasses.replace(billing_agent(FakeProvider()), replies=object())  # type: ignore[arg-type]
    with pytest.raises(CompilationError, match="replies must be a Replies"):
        Kernel(agent, InMemoryDurability())


async def test_the_default_confirmation_prompt_is_a_question_without_python_reprs() -> None:
    @capability("orders.refund", effect="write", description="Refund an order in full")
    async def refund(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult()

    script = {
        "refund": Interpretation([Intent("orders.refund", {"order_id": "o_1", "lines": [1, 2]})]),
        "bare": Interpretation([Intent("orders.refund", {})]),
    }
    kernel, _ = _kernel(refund, script=script)
    asked = await kernel.turn("t", "1", "refund")
    assert asked.reply == "Refund an order in full (order_id: o_1, lines: [1,2])? Reply yes or no."
    bare = await kernel.turn("t", "2", "bare")
    assert bare.reply == "Refund an order in full? Reply yes or no."


def test_a_step_moved_to_a_later_round_keeps_every_other_field() -> None:
    """``in_round`` builds the step field by field (each step of a later round makes
    one, where ``dataclasses.replace`` costs a dozen calls): a field added to the step
    and forgotten there would be dropped from every later round's steps."""
    from intention_kernel._runtime.state import in_round
    from intention_kernel._turns import StepResult

    values = {f.name: object() for f in dataclasses.fields(StepResult)}
    step = StepResult(**values)  # type: ignore[arg-type]
    moved = in_round(step, 3)
    assert {n: getattr(moved, n) for n in values} == {**values, "round": 3}


def test_a_request_given_its_stop_keeps_every_other_field() -> None:
    """``TurnRequest.with_stop`` builds the request field by field (it runs every
    turn, where ``dataclasses.replace`` costs a dozen calls): a field added to the
    request and forgotten there would be dropped from every turn."""
    from intention_kernel._runtime.state import TurnRequest

    values = {f.name: object() for f in dataclasses.fields(TurnRequest)}
    request = TurnRequest(**values)  # type: ignore[arg-type]

    async def stop(base: int, at_once: bool) -> str | None:
        return None

    async def steers() -> list[dict[str, str]]:
        return []

    kept = request.with_stop(stop)
    assert {n: getattr(kept, n) for n in values} == {**values, "stop": stop}
    both = request.with_stop(stop, steers)
    assert {n: getattr(both, n) for n in values} == {**values, "stop": stop, "steers": steers}
