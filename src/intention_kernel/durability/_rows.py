"""Row codecs shared by the SQL adapters: receipts, resolutions and outbox events.

Adapters differ in column order and driver types, not in what a stored value
means; decoding lives here once, and every decoding failure becomes
``CorruptRecordError`` naming the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from intention_kernel._json import dump_value, load_value
from intention_kernel.effects import Receipt, ReceiptStatus, Resolution
from intention_kernel.errors import CorruptRecordError
from intention_kernel.turns import OutboxEvent

__all__ = [
    "decode_event",
    "decode_receipt",
    "dump_optional",
    "dump_resolution",
    "select_receipts",
]


def select_receipts(columns: str) -> str:
    """The SELECT of receipts as read, for both SQL adapters: ``columns`` of the receipt
    row (``r``), then what the turn named by its ``turn_id`` announced (``NULL`` if that
    turn did not commit), found by the turns' primary key. Filters and order name ``r.``."""
    selected = ", ".join(f"r.{c.strip()}" for c in columns.split(","))
    return (
        f"SELECT {selected}, t.announced FROM ik_receipts r"
        " LEFT JOIN ik_turns t ON t.thread_id = r.thread_id AND t.turn_id = r.turn_id"
    )


def dump_optional(value: Any) -> str | None:
    """JSON text for a nullable value column (``None`` stays SQL NULL)."""
    return None if value is None else dump_value(value)


def dump_resolution(resolution: Resolution | None) -> str | None:
    if resolution is None:
        return None
    return dump_value(
        {
            "applied": resolution.applied,
            "note": resolution.note,
            "actor": resolution.actor,
            "at": resolution.at.isoformat(),
        }
    )


def decode_receipt(
    *,
    id: str,
    thread_id: str,
    key: str,
    status: str,
    turn_id: str,
    step_id: str,
    attempt: int,
    value: str | None,
    error: str | None,
    resolution: str | None,
    created_at: datetime,
    updated_at: datetime,
    announced: bool = False,
    tenant_id: str | None = None,
    announced_by_turn: str | Sequence[str] | None = None,
) -> Receipt:
    """A receipt from its stored columns (JSON as text, timestamps already parsed).

    ``announced_by_turn`` is what the committed turn named by the receipt's
    ``turn_id`` announced (keys; a JSON array as text where the store has no arrays),
    ``None`` if that turn never committed: a receipt that turn completed and announced
    is announced without a mark in its own row (see ``TurnRecord.mark_announced``).
    """
    try:
        resolved = load_value(resolution)
        if not announced and announced_by_turn is not None and status == "completed":
            keys = announced_by_turn
            if isinstance(keys, str):
                keys = load_value(keys)
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise ValueError("the announcing turn's keys are not a list of strings")
            announced = key in keys
        return Receipt(
            id=id,
            thread_id=thread_id,
            key=key,
            status=ReceiptStatus(status),
            turn_id=turn_id,
            step_id=step_id,
            attempt=int(attempt),
            value=load_value(value),
            error=error,
            created_at=created_at,
            updated_at=updated_at,
            resolution=None
            if resolved is None
            else Resolution(
                resolved["applied"],
                resolved["note"],
                resolved["actor"],
                datetime.fromisoformat(resolved["at"]),
            ),
            announced=bool(announced),
            tenant_id=tenant_id,
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptRecordError(
            f"receipt row for key {key!r} on thread {thread_id!r} cannot be decoded: {exc}",
            thread_id=thread_id,
            key=key,
        ) from exc


def decode_event(
    *,
    id: str,
    position: int,
    thread_id: str,
    turn_id: str | None,
    seq: int,
    type: str,
    payload: str | None,
    created_at: datetime,
) -> OutboxEvent:
    try:
        data = load_value(payload)
    except ValueError as exc:
        raise CorruptRecordError(
            f"outbox event {id!r} of thread {thread_id!r} has a payload that is not JSON: {exc}",
            thread_id=thread_id,
        ) from exc
    return OutboxEvent(id, position, thread_id, turn_id, seq, type, data, created_at)
