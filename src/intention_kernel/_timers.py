"""Timers: the rules of a turn the kernel runs later, pure and shared by every store.

A timer is a future turn of its thread. ``ctx.schedule`` stages one in a running
turn; it commits with that turn, or not at all. ``Kernel.schedule`` sets one from
application code, under the thread's lock. The key is the timer's identity in its
thread: setting the key again moves it. When due, a worker runs it as a turn
(:mod:`intention_kernel._timer_runner`). Its turn ID is :func:`timer_turn_id`, made of
the key and the due time. That ID keeps an occurrence from running twice: a turn
commits once per ``(thread_id, turn_id)``.

Everything here decides; nothing reads or writes a store.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from intention_kernel._checkpoint import Interaction
from intention_kernel._ids import check_id
from intention_kernel._interpretation import FiredTimer
from intention_kernel._json import normalize, text_problem
from intention_kernel._turns import TIMER_TURN_PREFIX, EventDraft, request_digest
from intention_kernel.durability._contract.records import Timer, TimerWrite
from intention_kernel.errors import InvalidRequestError

__all__ = [
    "EXPIRY_TIMER_PREFIX",
    "KERNEL_TIMER_PREFIX",
    "MAX_KEY_LENGTH",
    "REMINDER_TIMER_PREFIX",
    "interaction_timers",
    "MAX_TIMER_MESSAGE",
    "cancelled_event",
    "cancelled_keys",
    "check_key",
    "fired_event",
    "fired_timer",
    "founded_cancels",
    "merge_writes",
    "next_cron",
    "next_due",
    "plan_timer",
    "set_event",
    "set_keys",
    "settled",
    "skipped",
    "timer_digest",
    "timer_turn_id",
]

#: The longest key: its turn ID adds the prefix and the due time, within 512 characters.
MAX_KEY_LENGTH = 256
#: The longest message a timer carries, as a turn's message is bounded by default.
MAX_TIMER_MESSAGE = 32_000
#: The shortest period of a recurring timer.
MIN_EVERY = timedelta(seconds=1)


#: The prefix of the keys of the kernel's own timers: a confirmation's expiry and its
#: reminder. They emit no ``timer.*`` events, and applications may not use the prefix.
KERNEL_TIMER_PREFIX = "kernel:"
#: The timer that expires interaction ``<id>`` at its ``expires_at``.
EXPIRY_TIMER_PREFIX = KERNEL_TIMER_PREFIX + "expire:"
#: The timer that reminds the person of interaction ``<id>`` before it expires.
REMINDER_TIMER_PREFIX = KERNEL_TIMER_PREFIX + "remind:"


def check_key(key: object) -> str:
    """``key`` if an application can name a timer so; ``InvalidRequestError`` if not."""
    if isinstance(key, str) and len(key) > MAX_KEY_LENGTH:
        raise InvalidRequestError(
            f"a timer key is at most {MAX_KEY_LENGTH} characters long, got {len(key)}"
        )
    if isinstance(key, str) and key.startswith(KERNEL_TIMER_PREFIX):
        raise InvalidRequestError(
            f"timer key {key!r} begins with {KERNEL_TIMER_PREFIX!r}, which the kernel keeps "
            "for its own timers"
        )
    return check_id("timer key", key)


def interaction_timers(
    thread_id: str,
    tenant_id: str | None,
    before: Interaction | None,
    after: Interaction | None,
    remind_before: timedelta | None,
    now: datetime,
) -> list[TimerWrite]:
    """The kernel's timers a turn sets or deletes as its active interaction changes.

    The interaction changes from ``before`` to ``after``. One timer expires an
    interaction with a deadline on time. Another reminds the person ``remind_before``
    ahead of it. An interaction closed or replaced takes its timers with it."""
    writes: list[TimerWrite] = []
    if before is not None and before.expires_at is not None:
        if after is not None and after.id == before.id:
            return writes  # the same question still waits: its timers stand
        for prefix in (EXPIRY_TIMER_PREFIX, REMINDER_TIMER_PREFIX):
            writes.append(TimerWrite(thread_id, prefix + before.id, None))
    if after is None or after.expires_at is None:
        return writes
    data = {"interaction_id": after.id}

    def timer(prefix: str, due: datetime) -> TimerWrite:
        row = Timer(thread_id, prefix + after.id, due, None, data, tenant_id, set_at=now)
        return TimerWrite(thread_id, row.key, row)

    writes.append(timer(EXPIRY_TIMER_PREFIX, after.expires_at))
    if remind_before is not None and after.expires_at - remind_before > now:
        writes.append(timer(REMINDER_TIMER_PREFIX, after.expires_at - remind_before))
    return writes


def _instant(name: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidRequestError(f"{name} must be a datetime, got {value!r}")
    if value.utcoffset() is None:
        raise InvalidRequestError(
            f"{name} must be timezone-aware (a naive datetime names no instant), got {value!r}"
        )
    return value.astimezone(UTC)


def plan_timer(
    thread_id: str,
    key: object,
    *,
    now: datetime,
    at: object = None,
    after: object = None,
    message: object = None,
    data: object = None,
    unless_version_after: object = None,
    every: object = None,
    cron: object = None,
    tenant_id: str | None = None,
) -> Timer:
    """The timer that ``schedule`` sets, or ``InvalidRequestError`` naming what is wrong.

    Exactly one of ``at`` and ``after`` says when, or ``cron`` alone.

    - ``at``: a timezone-aware ``datetime``.
    - ``after``: a ``timedelta`` of zero or more, from ``now``.
    - ``cron``: a cron expression, in UTC. The first occurrence is its next time after
      ``now``.

    A time already past fires at once."""
    check_id("thread_id", thread_id)
    key = check_key(key)
    if cron is not None:
        if at is not None or after is not None or every is not None:
            raise InvalidRequestError("cron= says when on its own: give no at=, after= or every=")
        due = next_cron(cron, now)
    elif (at is None) == (after is None):
        raise InvalidRequestError("a timer needs exactly one of at= and after= (or cron=)")
    elif at is not None:
        due = _instant("at", at)
    else:
        if not isinstance(after, timedelta):
            raise InvalidRequestError(f"after must be a datetime.timedelta, got {after!r}")
        if after < timedelta(0):
            raise InvalidRequestError(f"after must not be negative, got {after}")
        try:
            due = now + after
        except OverflowError:
            raise InvalidRequestError(f"after={after} reaches past year 9999") from None
    if message is not None:
        if not isinstance(message, str):
            raise InvalidRequestError(f"a timer's message must be a string, got {message!r}")
        if len(message) > MAX_TIMER_MESSAGE:
            raise InvalidRequestError(
                f"a timer's message is at most {MAX_TIMER_MESSAGE} characters, got {len(message)}"
            )
        problem = text_problem(message)
        if problem is not None:  # stored in a text column of its own
            raise InvalidRequestError(f"a timer's message cannot be stored: {problem}")
    try:
        stored = normalize(data)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"a timer's data must be JSON: {exc}") from exc
    if unless_version_after is not None and (
        isinstance(unless_version_after, bool)
        or not isinstance(unless_version_after, int)
        or unless_version_after < 0
    ):
        raise InvalidRequestError(
            f"unless_version_after must be a version (an integer of 0 or more), "
            f"got {unless_version_after!r}"
        )
    if every is not None:
        if not isinstance(every, timedelta):
            raise InvalidRequestError(f"every must be a datetime.timedelta, got {every!r}")
        if every < MIN_EVERY:
            raise InvalidRequestError(f"every must be at least {MIN_EVERY}, got {every}")
    return Timer(
        thread_id=thread_id,
        key=key,
        due_at=due,
        message=message,
        data=stored,
        tenant_id=tenant_id,
        unless_version_after=unless_version_after,
        every=every,
        set_at=now,
        cron=cron if isinstance(cron, str) else None,  # checked by ``next_cron``
    )


def next_cron(expression: object, after: datetime) -> datetime:
    """The first time of cron ``expression`` (in UTC) after ``after``. Needs the
    ``cron`` extra (croniter); ``InvalidRequestError`` for a bad expression."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidRequestError(f"cron must be a cron expression, got {expression!r}")
    try:
        croniter: Any = importlib.import_module("croniter").croniter
    except ImportError:
        raise InvalidRequestError(
            "cron= needs croniter: pip install 'intention-kernel[cron]'"
        ) from None
    if not croniter.is_valid(expression):
        raise InvalidRequestError(f"{expression!r} is not a cron expression")
    following: datetime = croniter(expression, after.astimezone(UTC)).get_next(datetime)
    return following.astimezone(UTC)


def timer_turn_id(key: str, due_at: datetime) -> str:
    """The turn ID of the occurrence of timer ``key`` due at ``due_at``.

    It is the same in every worker. So a second claim of it replays the first one's
    turn."""
    stamp = due_at.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{TIMER_TURN_PREFIX}{key}@{stamp}"


def timer_digest(timer: Timer) -> str:
    """The request digest of the timer's turn: what it was set to carry."""
    return request_digest(
        timer.message,
        {"timer": timer.key, "due_at": timer.due_at.isoformat(), "data": timer.data},
    )


def fired_timer(timer: Timer) -> FiredTimer:
    """What the timer's turn tells its interpreter (``InterpretationRequest.timer``)."""
    return FiredTimer(timer.key, timer.due_at, timer.message, timer.data)


def same_occurrence(stored: Timer | None, claimed: Timer) -> bool:
    """Whether ``stored`` is still the pending occurrence a worker claimed: not moved
    (set again), cancelled or settled since."""
    return (
        stored is not None
        and stored.status == "pending"
        and stored.due_at == claimed.due_at
        and stored.set_at == claimed.set_at
    )


def next_due(timer: Timer, now: datetime) -> datetime | None:
    """When a recurring timer fires next after its occurrence at ``due_at``, or ``None``
    for a one-shot timer. Missed occurrences are not caught up one by one. The one
    firing stands for all of them. The next is the first due after ``now``."""
    if timer.cron is not None:
        return next_cron(timer.cron, max(now, timer.due_at))
    if timer.every is None:
        return None
    due = timer.due_at + timer.every
    if due <= now:
        skipped = (now - due) // timer.every + 1
        due += timer.every * skipped
    return due


def settled(timer: Timer, turn_id: str, now: datetime, *, void: bool = False) -> TimerWrite:
    """The write that settles the occurrence ``timer`` whose turn is ``turn_id``.

    The row becomes fired (or void), or a recurring timer's next occurrence."""
    following = None if void else next_due(timer, now)
    if following is not None:
        row = replace(timer, due_at=following, claimed_until=None, turn_id=turn_id, set_at=now)
        return TimerWrite(timer.thread_id, timer.key, row)
    row = replace(
        timer,
        status="void" if void else "fired",
        settled_at=now,
        turn_id=turn_id,
        claimed_until=None,
    )
    return TimerWrite(timer.thread_id, timer.key, row)


def skipped(timer: Timer, turn_id: str, now: datetime) -> tuple[TimerWrite, EventDraft]:
    """The write and event that settle an occurrence whose turn was cancelled before
    it started. A one-shot timer becomes void, with ``timer.cancelled``. A recurring
    timer moves to its next occurrence, with ``timer.set``: one cancelled turn does
    not end its schedule."""
    following = next_due(timer, now)
    if following is None:
        write = settled(timer, turn_id, now, void=True)
        return write, cancelled_event(timer.key, "its turn was cancelled")
    write = settled(timer, turn_id, now)
    assert write.timer is not None
    return write, set_event(write.timer)


def merge_writes(writes: Iterable[TimerWrite]) -> tuple[TimerWrite, ...]:
    """One write per key, the last one made, in the order keys were first written.

    A store then never writes one row twice in a commit."""
    merged: dict[str, TimerWrite] = {}
    for write in writes:
        merged[write.key] = write
    return tuple(merged.values())


def _payload(timer: Timer) -> dict[str, Any]:
    payload: dict[str, Any] = {"key": timer.key, "due_at": timer.due_at.isoformat()}
    if timer.every is not None:
        payload["every_seconds"] = timer.every.total_seconds()
    if timer.cron is not None:
        payload["cron"] = timer.cron
    if timer.unless_version_after is not None:
        payload["unless_version_after"] = timer.unless_version_after
    return payload


def set_event(timer: Timer) -> EventDraft:
    """The ``timer.set`` event of a timer set (or moved)."""
    return EventDraft("timer.set", _payload(timer))


def cancelled_event(key: str, reason: str = "cancelled") -> EventDraft:
    """The ``timer.cancelled`` event: cancelled, or void because the thread moved on."""
    return EventDraft("timer.cancelled", {"key": key, "reason": reason})


def cancelled_keys(events: Iterable[EventDraft]) -> set[str]:
    """The keys whose ``timer.cancelled`` ``events`` announce."""
    return {str(e.payload["key"]) for e in events if e.type == "timer.cancelled"}


def set_keys(events: Iterable[EventDraft]) -> set[str]:
    """The keys whose ``timer.set`` ``events`` announce."""
    return {str(e.payload["key"]) for e in events if e.type == "timer.set"}


def founded_cancels(events: Iterable[EventDraft], pending: set[str]) -> tuple[EventDraft, ...]:
    """A turn's ``events`` without the ``timer.cancelled`` of a key with no timer then.

    ``pending``: the keys pending before the turn. A ``timer.set`` of the turn sets
    its key; a ``timer.cancelled`` is kept only if its key has a timer at that point."""
    exists = set(pending)
    kept: list[EventDraft] = []
    for event in events:
        if event.type == "timer.set":
            exists.add(str(event.payload["key"]))
        elif event.type == "timer.cancelled":
            key = str(event.payload["key"])
            if key not in exists:
                continue  # nothing to cancel: the cancel is no event
            exists.discard(key)
        kept.append(event)
    return tuple(kept)


def fired_event(timer: Timer, turn_id: str) -> EventDraft:
    """The ``timer.fired`` event, committed with the timer's turn."""
    return EventDraft("timer.fired", {**_payload(timer), "turn_id": turn_id})
