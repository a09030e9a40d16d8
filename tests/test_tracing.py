"""Observability: OpenTelemetry spans for the turn, its interpretation, each step, each
effect and the commit, recorded only once an SDK is installed; stdlib logging with the
same fields."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from intention_kernel import Kernel, _tracing
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing.agents import FakeProvider, billing_agent

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
