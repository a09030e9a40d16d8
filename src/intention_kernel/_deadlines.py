"""Deadlines of confirmations: when an interaction expires, and what expiring records.

A capability declares how long a person has to answer.
It uses ``confirm_within``, or ``expires_in`` on its own ``needs_confirmation``.
The interaction it opens carries ``expires_at``, in UTC; ``None`` means no deadline.
An interaction is overdue once the clock reads ``expires_at`` or later.

Three things close an overdue interaction.
Each one works under the thread's lock, with the same rules from this module.

- The next turn on the thread closes it.
  It reads the clock once, when it holds the lock, before it interprets anything.
  An accept that arrives after the deadline runs nothing, and its reply says so.
- The kernel's expiry timer closes it.
  The timer is set when the interaction opened, and a timer worker fires it.
  The worker fires it at ``expires_at`` (:mod:`intention_kernel._timer_runner`).
- The operator's sweep closes it: :func:`~intention_kernel.operations.expire_interactions`.
  On the command line that is ``intention-kernel interactions expire``.
  The timer and the sweep share the turn ID :func:`expiry_turn_id`.
  So between them an interaction is expired once.

Either way the interaction and its held operation leave the checkpoint.
Its step is reported ``rejected``, and ``interaction.expired`` is emitted with the commit.
An expired interaction gets no ``interaction.resolved`` event.

Time comes from one injectable clock: :data:`Clock`, ``Kernel(..., clock=...)``.
So tests move the clock instead of sleeping, and everything here is pure.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from intention_kernel._checkpoint import Interaction
from intention_kernel._turns import (
    EXPIRY_TURN_PREFIX,
    EventDraft,
    StepResult,
    StepStatus,
)
from intention_kernel.errors import KernelError

__all__ = [
    "Clock",
    "deadline",
    "duration_problem",
    "expired_event",
    "expired_step",
    "expiry_turn_id",
    "expiry_turn_id_of",
    "overdue",
    "read_clock",
    "system_clock",
]

#: A source of the current time: a callable returning a timezone-aware ``datetime``.
Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """The current time in UTC: the default clock."""
    return datetime.now(UTC)


def read_clock(clock: Clock) -> datetime:
    """The clock's time in UTC.

    A naive ``datetime`` is refused with ``KernelError``, since it names no instant.
    Comparing it with a stored deadline would have to guess a zone.
    """
    now = clock()
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise KernelError(f"the clock must return a timezone-aware datetime, got {now!r}")
    return now.astimezone(UTC)


def duration_problem(name: str, value: object) -> str | None:
    """Why ``value`` cannot be a time to answer, or ``None`` if it can.

    It must be a positive ``timedelta``.
    Zero or less would open an interaction already expired.
    """
    if not isinstance(value, timedelta):
        return f"{name} must be a datetime.timedelta, not {value!r}"
    if value <= timedelta(0):
        return f"{name} must be positive, got {value}"
    return None


def deadline(now: datetime, within: timedelta | None) -> datetime | None:
    """``expires_at`` of an interaction opened at ``now`` with ``within`` to answer."""
    return None if within is None else now + within


def overdue(interaction: Interaction, now: datetime) -> bool:
    """Whether ``interaction`` has expired at ``now`` (never, without a deadline)."""
    return interaction.expires_at is not None and now >= interaction.expires_at


def expired_event(interaction: Interaction) -> EventDraft:
    """The ``interaction.expired`` event of ``interaction``."""
    assert interaction.expires_at is not None
    payload: dict[str, Any] = {
        "interaction_id": interaction.id,
        "kind": interaction.kind,
        "capability_id": interaction.capability_id,
        "step_id": interaction.step_id,
        "resolution": "expired",
        "expires_at": interaction.expires_at.isoformat(),
    }
    return EventDraft("interaction.expired", payload)


def expired_step(interaction: Interaction) -> StepResult:
    """The step of the expired interaction's operation: ``rejected``, never run."""
    assert interaction.expires_at is not None
    return StepResult(
        interaction.step_id,
        interaction.capability_id,
        StepStatus.REJECTED,
        None,
        f"not confirmed by {interaction.expires_at.isoformat()}, when the confirmation "
        "expired; nothing was done",
    )


def expiry_turn_id(interaction: Interaction) -> str:
    """The turn ID under which the sweep expires ``interaction``.

    There is one per interaction, so a sweep run twice, or two at once, commits it once.
    The second delivery of the turn ID is a replay.
    Its prefix is reserved, and the kernel refuses it to clients.
    """
    return expiry_turn_id_of(interaction.id)


def expiry_turn_id_of(interaction_id: str) -> str:
    """:func:`expiry_turn_id` of the interaction ``interaction_id``."""
    return f"{EXPIRY_TURN_PREFIX}{interaction_id}"
