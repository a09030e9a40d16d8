"""A ``module:callable`` sink for the CLI tests: ``--to cli_outbox_sink:collect``."""

from __future__ import annotations

from intention_kernel import OutboxEvent

received: list[OutboxEvent] = []
refused_types: set[str] = set()


def collect(event: OutboxEvent) -> None:
    if event.type in refused_types:
        raise ConnectionError(f"{event.type} refused")
    received.append(event)
