"""A timer as a row of ``ik_timers``, the same columns in SQLite and PostgreSQL.

``data`` is JSON text, ``every`` whole microseconds. Times are what each store's
``stamp`` makes of a UTC ``datetime``: ISO text in SQLite, ``timestamptz`` in
PostgreSQL. A row never holds a claim when written: a write replaces the timer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from intention_kernel._json import dump_value, load_value
from intention_kernel.durability._contract.records import Timer, TimerWrite

__all__ = [
    "TIMER_COLUMNS",
    "decode_timer",
    "split_writes",
    "timer_filters",
    "timer_json",
    "timer_row",
]

#: The columns of ``ik_timers``, in the order of :func:`timer_row` and :func:`decode_timer`.
TIMER_COLUMNS = (
    "thread_id, key, tenant_id, due_at, message, data, unless_version_after, every_us, "
    "status, set_at, settled_at, turn_id, claimed_until, cron"
)

_MICROSECOND = timedelta(microseconds=1)


def timer_row(timer: Timer, stamp: Callable[[datetime], Any]) -> tuple[Any, ...]:
    """The row of ``timer``, its claim cleared, times made by ``stamp`` (in UTC)."""

    def at(moment: datetime | None) -> Any:
        return None if moment is None else stamp(moment.astimezone(UTC))

    return (
        timer.thread_id,
        timer.key,
        timer.tenant_id,
        at(timer.due_at),
        timer.message,
        None if timer.data is None else dump_value(timer.data),
        timer.unless_version_after,
        None if timer.every is None else timer.every // _MICROSECOND,
        timer.status,
        at(timer.set_at),
        at(timer.settled_at),
        timer.turn_id,
        None,
        timer.cron,
    )


def split_writes(
    writes: Sequence[TimerWrite], stamp: Callable[[datetime], Any]
) -> tuple[list[tuple[Any, ...]], list[tuple[str, str]]]:
    """``writes`` as the rows to insert or replace and the ``(thread_id, key)`` to delete."""
    upserts = [timer_row(w.timer, stamp) for w in writes if w.timer is not None]
    deletes = [(w.thread_id, w.key) for w in writes if w.timer is None]
    return upserts, deletes


def timer_json(writes: Sequence[TimerWrite]) -> str:
    """The rows ``writes`` set, as one JSON array of objects.

    PostgreSQL's commit reads it with ``jsonb_to_recordset``. Times are ISO text with
    their offset."""
    names = TIMER_COLUMNS.replace(" ", "").split(",")
    rows = [
        {
            name: value
            for name, value in zip(names, timer_row(w.timer, datetime.isoformat), strict=True)
            if name not in ("thread_id", "claimed_until")
        }
        for w in writes
        if w.timer is not None
    ]
    return dump_value(rows)


def timer_filters(
    thread_id: str | None, status: str | None, after: tuple[str, str] | None, limit: int
) -> dict[str, Any]:
    """The named parameters of both adapters' ``SELECT_TIMERS``."""
    return {
        "thread_id": thread_id,
        "status": status,
        "after_thread": after[0] if after else None,
        "after_key": after[1] if after else None,
        "limit": limit,
    }


def decode_timer(row: Sequence[Any], parse: Callable[[Any], datetime | None]) -> Timer:
    """The :class:`Timer` of a row read in ``TIMER_COLUMNS`` order."""

    def at(value: Any) -> datetime | None:
        moment = parse(value) if value is not None else None
        return None if moment is None else moment.astimezone(UTC)

    due = at(row[3])
    assert due is not None
    return Timer(
        thread_id=row[0],
        key=row[1],
        tenant_id=row[2],
        due_at=due,
        message=row[4],
        data=None if row[5] is None else load_value(row[5]),
        unless_version_after=row[6],
        every=None if row[7] is None else timedelta(microseconds=row[7]),
        status=row[8],
        set_at=at(row[9]),
        settled_at=at(row[10]),
        turn_id=row[11],
        claimed_until=at(row[12]),
        cron=row[13],
    )
