"""Observability: OpenTelemetry spans for the turn, its interpretation, each step, each
effect and the commit, recorded only once an SDK is installed; stdlib logging with the
same fields."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from intention_kernel import Kernel, OutboxEvent, _tracing
from intention_kernel.outbox import OutboxRelay
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent

P = _tracing.ATTRIBUTE_PREFIX


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK provider installed as the global one for this test only. (The API lets an
    application set it once per process; the test swaps the global back afterwards.)"""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exported
    provider.shutdown()


def test_without_an_sdk_a_span_is_the_shared_no_op() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    first = _tracing.span("intention_kernel.turn", thread_id="t")
    assert isinstance(first, contextlib.nullcontext)
    assert _tracing.span("intention_kernel.step") is first  # nothing allocated per span


async def test_a_turn_records_nested_spans_with_thread_turn_capability_and_receipt(
    exporter: InMemorySpanExporter,
) -> None:
    async with InMemoryDurability() as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        await kernel.turn("t1", "propose", "charge pi_1 500")
        exporter.clear()
        await kernel.turn("t1", "accept", "yes")
        [receipt] = await durability.list_receipts("t1")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "intention_kernel.turn",
        "intention_kernel.interpret",
        "intention_kernel.step",
        "intention_kernel.effect",
        "intention_kernel.commit",
    }
    turn, step, effect = (spans[f"intention_kernel.{n}"] for n in ("turn", "step", "effect"))

    def parent(span: ReadableSpan) -> str | None:
        found = [
            s.name
            for s in spans.values()
            if span.parent and s.context.span_id == span.parent.span_id
        ]
        return found[0] if found else None

    assert parent(turn) is None
    assert parent(spans["intention_kernel.interpret"]) == "intention_kernel.turn"
    assert parent(step) == "intention_kernel.turn"
    assert parent(effect) == "intention_kernel.step"
    assert parent(spans["intention_kernel.commit"]) == "intention_kernel.turn"
    assert len({s.context.trace_id for s in spans.values()}) == 1
    assert turn.attributes is not None and effect.attributes is not None
    assert step.attributes is not None
    assert {k: turn.attributes[P + k] for k in ("thread_id", "turn_id", "replayed")} == {
        "thread_id": "t1",
        "turn_id": "accept",
        "replayed": False,
    }
    assert step.attributes[P + "capability_id"] == "payments.charge"
    assert step.attributes[P + "step_status"] == "completed"
    assert effect.attributes[P + "receipt_id"] == receipt.id
    assert effect.attributes[P + "receipt_status"] == "completed"
    assert effect.attributes[P + "key"] == receipt.key
    assert effect.attributes[P + "turn_id"] == "accept"


async def test_a_replay_is_one_turn_span_and_an_uncertain_write_an_error_span(
    exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    async with InMemoryDurability() as durability:
        kernel = Kernel(
            billing_agent(FakeProvider(behaviour={"pi_1": "lost_response"})), durability
        )
        await kernel.turn("t1", "propose", "charge pi_1 500")
        exporter.clear()
        with caplog.at_level(logging.INFO, logger="intention_kernel"):
            await kernel.turn("t1", "accept", "yes")
        [effect] = [s for s in exporter.get_finished_spans() if s.name.endswith(".effect")]
        assert effect.status.status_code is StatusCode.ERROR
        assert effect.attributes is not None
        assert effect.attributes[P + "receipt_status"] == "uncertain"
        exporter.clear()
        assert (await kernel.turn("t1", "accept", "yes")).replayed
    [replay] = exporter.get_finished_spans()
    assert replay.name == "intention_kernel.turn"
    assert replay.attributes is not None and replay.attributes[P + "replayed"] is True
    [warning] = [r for r in caplog.records if r.name == "intention_kernel.effect"]
    assert warning.levelno == logging.WARNING and "uncertain" in warning.getMessage()
    assert (warning.thread_id, warning.turn_id, warning.capability_id) == (  # type: ignore[attr-defined]
        "t1",
        "accept",
        "payments.charge",
    )
    assert warning.receipt_id.startswith("rcpt_")  # type: ignore[attr-defined]
    assert warning.step_id == effect.attributes[P + "step_id"]  # type: ignore[attr-defined]


async def test_interpret_and_commit_spans_name_the_thread_and_turn_and_the_commit_its_version(
    exporter: InMemorySpanExporter,
) -> None:
    async with InMemoryDurability() as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        await kernel.turn("t1", "first", "balance 100")
        exporter.clear()
        result = await kernel.turn("t1", "second", "charge pi_1 500")
        committed = [e for e in await durability.read_outbox("t1") if e.turn_id == "second"]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    interpret, commit = spans["intention_kernel.interpret"], spans["intention_kernel.commit"]
    assert interpret.attributes is not None and commit.attributes is not None
    assert dict(interpret.attributes) == {P + "thread_id": "t1", P + "turn_id": "second"}
    assert dict(commit.attributes) == {
        P + "thread_id": "t1",
        P + "turn_id": "second",
        P + "version": result.checkpoint_version,
        P + "events": len(committed),
    }
    assert result.checkpoint_version == 2 and len(committed) >= 2  # turn.committed and more


async def test_a_timers_turn_records_a_turn_span_naming_the_timer(
    exporter: InMemorySpanExporter,
) -> None:
    async with InMemoryDurability() as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        await kernel.schedule("t1", "nudge", after=timedelta(0), tenant_id="acme")
        exporter.clear()
        (fired,) = await kernel.fire_due_timers()
        await kernel.schedule("t1", "nudge", at=fired.due_at, tenant_id="acme")
        (again,) = await kernel.fire_due_timers()  # the same occurrence: a replay
        assert again.outcome == "replayed"
    turns = [s for s in exporter.get_finished_spans() if s.name == "intention_kernel.turn"]
    assert len(turns) == 2
    first, second = (dict(s.attributes or {}) for s in turns)
    assert first == {
        P + "thread_id": "t1",
        P + "tenant_id": "acme",
        P + "turn_id": fired.turn_id,
        P + "timer_key": "nudge",
        P + "timer_due_at": fired.due_at.isoformat(),
        P + "timer_outcome": "fired",
        P + "replayed": False,
        P + "checkpoint_version": 1,
    }
    assert (second[P + "timer_outcome"], second[P + "replayed"]) == ("replayed", True)
    # The timer's interpretation and commit are children of its turn span.
    children = {
        s.name
        for s in exporter.get_finished_spans()
        if s.parent is not None and s.parent.span_id == turns[0].context.span_id
    }
    assert {"intention_kernel.interpret", "intention_kernel.commit"} <= children


async def test_the_relay_records_one_publish_span_per_event_and_logs_a_failure_with_its_fields(
    exporter: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    async with InMemoryDurability() as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        await kernel.turn("t1", "1", "balance 100")
        await kernel.turn("t2", "1", "balance 7")
        events = await durability.read_outbox()
        refused = next(e for e in events if e.thread_id == "t2")

        async def sink(event: OutboxEvent) -> None:
            if event.id == refused.id:
                raise ConnectionError("broker down")

        exporter.clear()
        with caplog.at_level(logging.WARNING, logger="intention_kernel.outbox"):
            report = await OutboxRelay(durability, sink, retry_base=1).run_once()
    published = [e for e in events if e.thread_id == "t1"]
    assert (report.published, report.failed) == (len(published), 1)
    finished = exporter.get_finished_spans()
    spans = [s for s in finished if s.name == "intention_kernel.outbox.publish"]
    assert len(spans) == len(published) + 1  # t2 stops at its first event
    by_event = {s.attributes[P + "event_id"]: s for s in spans if s.attributes is not None}
    for event in [*published, refused]:
        span = by_event[event.id]
        assert dict(span.attributes or {}) == {
            P + "thread_id": event.thread_id,
            P + "event_id": event.id,
            P + "event_type": event.type,
            P + "seq": event.seq,
        }
    failed = by_event[refused.id]
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert all(by_event[e.id].status.status_code is StatusCode.UNSET for e in published)
    [warning] = [r for r in caplog.records if r.name == "intention_kernel.outbox"]
    assert warning.levelno == logging.WARNING
    fields = {
        name: getattr(warning, name)
        for name in ("thread_id", "turn_id", "event_id", "event_type", "seq", "attempts", "error")
    }
    assert fields == {
        "thread_id": "t2",
        "turn_id": "1",
        "event_id": refused.id,
        "event_type": refused.type,
        "seq": 1,
        "attempts": 1,
        "error": "ConnectionError: broker down",
    }
    assert warning.retry_at.tzinfo is not None  # type: ignore[attr-defined]
    assert refused.id in warning.getMessage() and "broker down" in warning.getMessage()


async def test_an_applied_write_is_logged_at_info_with_its_capability_step_and_receipt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with InMemoryDurability() as durability:
        kernel = Kernel(billing_agent(FakeProvider()), durability)
        await kernel.turn("t1", "propose", "charge pi_1 500")
        with caplog.at_level(logging.DEBUG, logger="intention_kernel"):
            result = await kernel.turn("t1", "accept", "yes")
        [receipt] = await durability.list_receipts("t1")
    [applied] = [r for r in caplog.records if r.name == "intention_kernel.effect"]
    assert applied.levelno == logging.INFO and "applied" in applied.getMessage()
    [step] = result.steps
    assert {
        name: getattr(applied, name)
        for name in ("thread_id", "turn_id", "step_id", "capability_id", "receipt_id", "key")
    } == {
        "thread_id": "t1",
        "turn_id": "accept",
        "step_id": step.step_id,
        "capability_id": "payments.charge",
        "receipt_id": receipt.id,
        "key": receipt.key,
    }
    # A turn is logged at DEBUG only, once: one line per turn, not per step.
    [turn] = [r for r in caplog.records if r.name == "intention_kernel.turn"]
    assert turn.levelno == logging.DEBUG
    assert (turn.thread_id, turn.turn_id, turn.replayed) == ("t1", "accept", False)  # type: ignore[attr-defined]
