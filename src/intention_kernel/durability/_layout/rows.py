"""Row codecs shared by the SQL adapters: receipts, resolutions, outbox events, threads.

Adapters differ in placeholders and driver types, not in what a stored value means.
So encoding and decoding live here once. Every decoding failure becomes
``CorruptRecordError`` naming the row. Time is the one driver-specific type. SQLite
stores it as text, PostgreSQL as ``timestamptz``. So each adapter passes its own
``stamp`` (to the stored form) and ``parse_time`` (back to an aware ``datetime``).
The errors that refuse a write whose fence moved are built here too. So both
adapters say the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from intention_kernel._effects import Receipt, ReceiptStatus, Resolution, is_settlement, utcnow
from intention_kernel._json import dump_value, load_value
from intention_kernel._turns import OutboxEvent
from intention_kernel.durability.abc import (
    InboxEntry,
    JournalEntry,
    OutboxDelivery,
    StoredThread,
    TurnRecord,
)
from intention_kernel.errors import CorruptRecordError, FencedCommitError, TurnConflictError

__all__ = [
    "OUTBOX_COLUMNS",
    "RECEIPT_COLUMNS",
    "ReceiptWrite",
    "decode_delivery_row",
    "decode_event",
    "decode_event_row",
    "decode_inbox_rows",
    "decode_receipt",
    "decode_receipt_row",
    "dump_resolution",
    "fenced",
    "inbox_conflict",
    "journal_conflict",
    "receipt_moved",
    "receipt_params",
    "receipt_write",
    "select_receipts",
    "stored_thread",
]

#: The receipt columns both adapters write and read, in ``Receipt`` field order, so that
#: a row maps onto the dataclass positionally (``decode_receipt_row``).
RECEIPT_COLUMNS = (
    "id, thread_id, key, status, turn_id, step_id, attempt, value, error, "
    "created_at, updated_at, resolution, announced, tenant_id, actor, capability_id, input, "
    "approved_by"
)
#: An outbox event's columns as ``decode_event_row`` reads them; a delivery adds
#: ``attempts, last_error, retry_at``.
OUTBOX_COLUMNS = "id, position, thread_id, turn_id, seq, type, payload, created_at"


def select_receipts(columns: str) -> str:
    """The SELECT of receipts as read, for both SQL adapters.

    It selects ``columns`` of the receipt row (``r``). Then it selects what the turn
    named by its ``turn_id`` announced, found by the turns' primary key. That is
    ``NULL`` if the turn did not commit. Filters and order name ``r.``."""
    selected = ", ".join(f"r.{c.strip()}" for c in columns.split(","))
    return (
        f"SELECT {selected}, t.announced FROM ik_receipts r"
        " LEFT JOIN ik_turns t ON t.thread_id = r.thread_id AND t.turn_id = r.turn_id"
    )


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
    actor: str | None = None,
    capability_id: str | None = None,
    input: str | None = None,
    approved_by: str | None = None,
    announced_by_turn: str | Sequence[str] | None = None,
) -> Receipt:
    """A receipt from its stored columns (JSON as text, timestamps already parsed).

    ``announced_by_turn`` is what the committed turn named by the receipt's
    ``turn_id`` announced. It holds keys: a JSON array as text where the store has no
    arrays. It is ``None`` if that turn never committed. A receipt that turn completed
    and announced is announced without a mark in its own row (see
    ``TurnRecord.mark_announced``).
    ``input`` and ``approved_by`` are JSON as text; all three of the write's origin
    columns are NULL in a row stored before they existed.
    """
    try:
        resolved = load_value(resolution)
        names = () if approved_by is None else load_value(approved_by)
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise ValueError("its approvers are not a list of names")
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
            actor=actor,  # NULL in a row stored before the column existed: no actor
            capability_id=capability_id,
            input=load_value(input),
            approved_by=tuple(names),
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


def receipt_params(r: Receipt, stamp: Callable[[datetime], Any]) -> dict[str, Any]:
    """A receipt's stored column values by column name; ``stamp`` turns a time into
    what the driver stores. A receipt not yet stamped is stamped now."""
    created = r.created_at or utcnow()
    created_at = stamp(created)
    # A new receipt was created and updated at one moment, one object: stamped once.
    updated = r.updated_at
    updated_at = created_at if updated is created else stamp(updated or utcnow())
    return {
        "id": r.id,
        "thread_id": r.thread_id,
        "key": r.key,
        "status": str(r.status),
        "turn_id": r.turn_id,
        "step_id": r.step_id,
        "attempt": r.attempt,
        "value": None if r.value is None else dump_value(r.value),
        "error": r.error,
        "created_at": created_at,
        "updated_at": updated_at,
        "resolution": None if r.resolution is None else dump_resolution(r.resolution),
        "announced": r.announced,
        "tenant_id": r.tenant_id,
        "actor": r.actor,
        "capability_id": r.capability_id,
        "input": None if r.input is None else dump_value(r.input),
        # NULL, not "[]", for none: an unconfirmed write stores nothing more than before.
        "approved_by": dump_value(list(r.approved_by)) if r.approved_by else None,
    }


@dataclass(frozen=True, slots=True)
class ReceiptWrite:
    """A compare-and-set of a stored receipt: ``new`` replaces ``expected`` only if the
    row still holds ``expected``'s status and attempt.

    ``settles``: the write settles a ``prepared`` receipt, with the adapter's settle
    statement. That statement names fewer columns. Else the write rewrites every
    column. ``params`` holds what the chosen statement names, the expected status and
    attempt included. For a settlement it holds nothing more. Stamping and encoding
    the columns it does not write would cost about as much as those it does.
    """

    new: Receipt
    settles: bool
    params: dict[str, Any]

    def check(self, rowcount: int) -> None:
        """Refuse the write unless it changed exactly the one row: another writer moved
        the receipt (or removed it) while its effect ran."""
        if rowcount != 1:
            raise receipt_moved(self.new)


def receipt_write(
    new: Receipt, expected: Receipt, stamp: Callable[[datetime], Any]
) -> ReceiptWrite:
    """The compare-and-set that writes ``new`` over ``expected``; ``stamp`` as for
    :func:`receipt_params`."""
    settles = is_settlement(new, expected)
    if settles:
        # What both adapters' settle statement names, and no more. The outcome of every
        # write effect comes here. The columns it leaves alone are not encoded.
        params: dict[str, Any] = {
            "thread_id": new.thread_id,
            "key": new.key,
            "status": str(new.status),
            "value": None if new.value is None else dump_value(new.value),
            "error": new.error,
            "updated_at": stamp(new.updated_at or utcnow()),
        }
    else:
        params = receipt_params(new, stamp)
    params["expected_status"] = str(expected.status)  # ``.value`` runs two frames of Python
    params["expected_attempt"] = expected.attempt
    return ReceiptWrite(new, settles, params)


def decode_receipt_row(
    row: Sequence[Any] | None, parse_time: Callable[[Any], datetime]
) -> Receipt | None:
    """A receipt from a row of ``select_receipts(RECEIPT_COLUMNS)`` (``None`` for none)."""
    if row is None:
        return None
    try:
        created_at, updated_at = parse_time(row[9]), parse_time(row[10])
    except (TypeError, ValueError) as exc:
        raise CorruptRecordError(
            f"receipt row for key {row[2]!r} on thread {row[1]!r} has a bad timestamp: {exc}",
            thread_id=row[1],
            key=row[2],
        ) from exc
    return decode_receipt(
        id=row[0],
        thread_id=row[1],
        key=row[2],
        status=row[3],
        turn_id=row[4],
        step_id=row[5],
        attempt=row[6],
        value=row[7],
        error=row[8],
        created_at=created_at,
        updated_at=updated_at,
        resolution=row[11],
        announced=row[12],
        tenant_id=row[13],
        actor=row[14],
        capability_id=row[15],
        input=row[16],
        approved_by=row[17],
        announced_by_turn=row[18],
    )


def decode_event_row(row: Sequence[Any], parse_time: Callable[[Any], datetime]) -> OutboxEvent:
    """An event from its ``OUTBOX_COLUMNS``."""
    return decode_event(
        id=row[0],
        position=row[1],
        thread_id=row[2],
        turn_id=row[3],
        seq=row[4],
        type=row[5],
        payload=row[6],
        created_at=parse_time(row[7]),
    )


def decode_delivery_row(
    row: Sequence[Any], parse_time: Callable[[Any], datetime]
) -> OutboxDelivery:
    """An unpublished event from its ``OUTBOX_COLUMNS`` and its publication state."""
    retry_at = None if row[10] is None else parse_time(row[10])
    return OutboxDelivery(decode_event_row(row, parse_time), row[8], row[9], retry_at)


def decode_inbox_rows(
    thread_id: str, rows: Sequence[Sequence[Any]], parse_time: Callable[[Any], datetime]
) -> list[InboxEntry]:
    """Inbox entries from rows of both adapters' ``SELECT_INBOX`` columns.

    ``steer`` is an integer in SQLite and a boolean in PostgreSQL: both read as ``bool``."""
    return [
        InboxEntry(thread_id, r[0], r[1], r[2], r[3], parse_time(r[4]), r[5], bool(r[6]), r[7])
        for r in rows
    ]


def stored_thread(
    version: int,
    tenant_id: str | None,
    checkpoint: str | None,
    messages: Sequence[str] | None = None,
    facts: Sequence[Sequence[str]] | None = None,
    receipt_index: Sequence[str] | None = None,
) -> StoredThread:
    """A thread row and its checkpoint's rows (``facts`` as key, body pairs)."""
    pairs = [(key, body) for key, body in facts or ()]
    return StoredThread(version, tenant_id, checkpoint, messages or (), pairs, receipt_index)


def fenced(record: TurnRecord, why: str) -> FencedCommitError:
    """The refusal of a turn commit whose fence moved while the turn ran."""
    return FencedCommitError(
        f"turn {record.turn_id!r} of thread {record.thread_id!r} was not committed: {why} "
        "while it ran",
        thread_id=record.thread_id,
        turn_id=record.turn_id,
    )


def receipt_moved(receipt: Receipt) -> FencedCommitError:
    """The refusal of a receipt write whose compare-and-set found another state."""
    return FencedCommitError(
        f"receipt {receipt.key!r} on thread {receipt.thread_id!r} changed while its effect ran",
        thread_id=receipt.thread_id,
        key=receipt.key,
    )


def inbox_conflict(entry: InboxEntry) -> TurnConflictError:
    """The refusal of an inbox entry whose turn ID holds another request already."""
    return TurnConflictError(
        f"turn {entry.turn_id!r} of thread {entry.thread_id!r} is already queued for a "
        "different request; use a new turn ID for a new request",
        thread_id=entry.thread_id,
        turn_id=entry.turn_id,
    )


def journal_conflict(entry: JournalEntry) -> FencedCommitError:
    """The refusal of a journal write whose key the turn already recorded.

    Under the thread's lock only the turn writes its entries. So the lock was lost."""
    return FencedCommitError(
        f"journal entry {entry.key!r} of turn {entry.turn_id!r} on thread "
        f"{entry.thread_id!r} was already recorded by another worker",
        thread_id=entry.thread_id,
        turn_id=entry.turn_id,
        key=entry.key,
    )
