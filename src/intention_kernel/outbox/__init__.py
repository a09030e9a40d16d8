"""The outbox relay: publish committed events to NATS JetStream, a webhook, or a function.

::

    from intention_kernel.outbox import NatsSink, OutboxRelay

    async with SQLiteDurability("app.db") as store, OutboxRelay(
        store, NatsSink("nats://127.0.0.1:4222", subject_prefix="billing")
    ) as relay:
        await relay.run()            # until cancelled; run_once() for one pass

Each thread's events are published in ``seq`` order.
Each is marked published only once the sink acknowledged it.
Delivery is at least once, and sinks dedupe on ``event.id``.
Several relays on one database share the threads.
See :mod:`intention_kernel.outbox._relay` for how.
See :mod:`intention_kernel.outbox._webhook` for verifying webhook signatures.
"""

from __future__ import annotations

from intention_kernel.durability._contract.records import OutboxBacklog, OutboxDelivery
from intention_kernel.outbox._nats import NatsError, NatsSink, subject_for
from intention_kernel.outbox._relay import OutboxRelay, RelayReport
from intention_kernel.outbox._sinks import CallableSink, Sink, event_body, event_document
from intention_kernel.outbox._webhook import (
    EVENT_ID_HEADER,
    EVENT_TYPE_HEADER,
    SIGNATURE_HEADER,
    WebhookError,
    WebhookSink,
    encode_event_type,
    sign,
    verify_signature,
)

__all__ = [
    "EVENT_ID_HEADER",
    "EVENT_TYPE_HEADER",
    "SIGNATURE_HEADER",
    "CallableSink",
    "NatsError",
    "NatsSink",
    "OutboxBacklog",
    "OutboxDelivery",
    "OutboxRelay",
    "RelayReport",
    "Sink",
    "WebhookError",
    "WebhookSink",
    "encode_event_type",
    "event_body",
    "event_document",
    "sign",
    "subject_for",
    "verify_signature",
]
