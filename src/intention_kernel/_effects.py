"""Effect receipts and the rules of ``run_effect``, as pure code.

A write capability reaches the outside world only through ``run_effect(key, fn)``.
For each ``(thread_id, key)`` there is exactly one receipt, which moves through
explicit states::

                 fn returns                 operator: applied
    prepared ──────────────▶ completed ◀───────────────────────┐
       │  │                                                    │
       │  │ EffectNotAppliedError        any other exception,  │
       │  └──────────────▶ failed        cancellation, or the  │
       │                     │           attempt died          │
       │                     │ retry     ──────────────▶ uncertain
       │◀────────────────────┘                                 │
                                                 operator: not applied → failed

This module decides what a stored receipt means for a new call (:func:`plan_effect`)
and builds every transition (:func:`settle`, :func:`resolve`). It does no I/O:
every adapter persists what these functions return, so the rules hold for every
store by construction.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar

from intention_kernel._ids import new_id
from intention_kernel.errors import ReceiptStateError, TenantMismatchError

__all__ = [
    "EffectAuthority",
    "EffectFn",
    "EffectOrigin",
    "EffectPlan",
    "EffectResult",
    "Receipt",
    "ReceiptStatus",
    "Resolution",
    "new_receipt_id",
    "not_applied_error",
    "plan_effect",
    "resolve",
    "settle",
]

T = TypeVar("T")


class ReceiptStatus(StrEnum):
    """The state of an effect receipt. Compares equal to its string value."""

    PREPARED = "prepared"
    COMPLETED = "completed"
    FAILED = "failed"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True, slots=True)
class Resolution:
    """An operator's reconciliation of an uncertain receipt."""

    applied: bool
    note: str | None
    actor: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class Receipt:
    """The durable record of one logical external write.

    ``key`` is the stored key (``"<capability_id>:<key>"``); ``turn_id`` and
    ``step_id`` name the latest attempt and are metadata, not part of the
    deduplication key.

    ``announced`` is true once a committed event announced the completed write. That
    event is ``effect.completed`` in the commit of the turn that first used the
    completed receipt. For an operator's resolution it is ``receipt.resolved``. So
    each applied write is announced exactly once.

    ``tenant_id`` is the tenant of the turn that first prepared it (``None``: no
    tenant). It never changes. No turn of another tenant is shown the receipt (see
    :func:`plan_effect`).

    ``actor`` is who approved the write of the latest attempt: the ``Answer.actor`` of
    the accept that ran it. For a quorum, that is the accept that completed it. The
    whole list is in ``interaction.resolved``. ``None`` when no named approver ran it, and for a
    receipt stored before the field existed. An operator's reconciliation is recorded
    apart, in ``resolution``.

    ``capability_id``, ``input`` and ``approved_by`` say what the write of the latest
    attempt was:

    - ``capability_id``: the capability that ran it.
    - ``input``: the input that ran, after approval and edits, mapped by the
      capability's ``redact``.
    - ``approved_by``: the names of everyone who approved it (empty when it needed no
      confirmation).

    A receipt stored before these fields existed reads ``None``, ``None`` and ``()``.
    """

    id: str
    thread_id: str
    key: str
    status: ReceiptStatus
    turn_id: str
    step_id: str
    attempt: int
    value: Any = None
    error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    resolution: Resolution | None = None
    announced: bool = False
    tenant_id: str | None = None
    actor: str | None = None
    capability_id: str | None = None
    input: Any = None
    approved_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EffectOrigin:
    """What a write is for, recorded on its receipt with the prepare.

    - ``capability_id``: the capability.
    - ``input``: the input that runs, already redacted.
    - ``approved_by``: the names of its approvers, empty without a confirmation.
    """

    capability_id: str
    input: Any = None
    approved_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EffectAuthority:
    """What an effect callback receives: the coordinated key and the prepared receipt.

    ``idempotency_key`` equals ``key``. Pass it to the provider; thread and
    tenant IDs are not part of it, so namespace it yourself if your provider's
    idempotency keys are global.
    """

    key: str
    idempotency_key: str
    receipt_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class EffectResult(Generic[T]):
    """The provider's value and the receipt that records it.

    ``replayed`` is true when the value came from an existing completed receipt
    and the provider was not called.
    """

    value: T
    receipt: Receipt
    replayed: bool = False


EffectFn = Callable[[EffectAuthority], "Awaitable[Any] | Any"]


@dataclass(frozen=True, slots=True)
class EffectPlan:
    """What a ``run_effect`` call must do, decided from the stored receipt.

    ``write`` is the receipt to persist (in the same transaction that read
    ``existing``) before acting on ``outcome``:

    - ``replay``: a completed receipt exists; return it, do not call ``fn``.
    - ``fail_closed``: the effect may have been applied; raise
      ``EffectUncertainError`` without calling ``fn`` (``write`` turns an
      abandoned ``prepared`` receipt into ``uncertain``).
    - ``execute``: ``write`` is the new ``prepared`` receipt; call ``fn``.
    """

    outcome: Literal["replay", "fail_closed", "execute"]
    existing: Receipt | None
    write: Receipt | None


#: The current time in UTC. A partial, not a function: three calls a turn, each a
#: frame of Python less.
utcnow: Callable[[], datetime] = functools.partial(datetime.now, UTC)


#: A new receipt ID: ``rcpt_`` and 32 hex digits, time-ordered (see :func:`._ids.new_id`).
#: A partial, as :data:`utcnow` is: no frame of Python of its own.
new_receipt_id: Callable[[], str] = functools.partial(new_id, "rcpt_")


def plan_effect(
    existing: Receipt | None,
    *,
    thread_id: str,
    key: str,
    turn_id: str,
    step_id: str,
    now: datetime,
    receipt_id: str | None = None,
    tenant_id: str | None = None,
    actor: str | None = None,
    origin: EffectOrigin | None = None,
) -> EffectPlan:
    """Decide what a call to ``run_effect`` means given the stored receipt.

    Must be evaluated while holding the thread's lock. A ``prepared`` receipt seen
    here then belongs to an attempt that did not finish. Its process died, or its
    turn was abandoned. So it is treated as possibly applied.

    A receipt of another tenant raises ``TenantMismatchError``, whatever its state.
    (``tenant_id`` is the calling turn's.) Its value is that tenant's provider's
    answer. Even its state would tell what that tenant did.

    ``actor`` (who approved this call's write) goes on the receipt of a new attempt.
    A completed or uncertain receipt keeps the approver of the attempt that wrote it.
    ``origin`` (what the write is for) goes on a new attempt's receipt the same way.
    """
    if existing is not None and existing.tenant_id != tenant_id:
        raise TenantMismatchError(
            f"effect {key!r} on thread {thread_id!r} was recorded for another tenant",
            thread_id=thread_id,
            turn_id=turn_id,
            key=key,
        )
    if existing is None:
        prepared = Receipt(
            id=receipt_id or new_receipt_id(),
            thread_id=thread_id,
            key=key,
            status=ReceiptStatus.PREPARED,
            turn_id=turn_id,
            step_id=step_id,
            attempt=1,
            created_at=now,
            updated_at=now,
            tenant_id=tenant_id,
            actor=actor,
            capability_id=origin.capability_id if origin is not None else None,
            input=origin.input if origin is not None else None,
            approved_by=origin.approved_by if origin is not None else (),
        )
        return EffectPlan("execute", None, prepared)
    status = existing.status
    if status is ReceiptStatus.COMPLETED:
        return EffectPlan("replay", existing, None)
    if status is ReceiptStatus.UNCERTAIN:
        return EffectPlan("fail_closed", existing, None)
    if status is ReceiptStatus.PREPARED:
        abandoned = replace(
            existing,
            status=ReceiptStatus.UNCERTAIN,
            error="the attempt that prepared this effect did not finish; it may have been applied",
            updated_at=now,
        )
        return EffectPlan("fail_closed", existing, abandoned)
    # FAILED: the host proved the previous attempt was not applied; retry on the same receipt.
    retry = replace(
        existing,
        status=ReceiptStatus.PREPARED,
        turn_id=turn_id,
        step_id=step_id,
        attempt=existing.attempt + 1,
        value=None,
        error=None,
        updated_at=now,
        announced=False,
        actor=actor,
        capability_id=origin.capability_id if origin is not None else None,
        input=origin.input if origin is not None else None,
        approved_by=origin.approved_by if origin is not None else (),
    )
    return EffectPlan("execute", existing, retry)


def settle(
    prepared: Receipt,
    outcome: Literal["completed", "failed", "uncertain"],
    *,
    now: datetime,
    value: Any = None,
    error: str | None = None,
) -> Receipt:
    """The receipt after the provider call returned (``completed``) or raised."""
    if prepared.status is not ReceiptStatus.PREPARED:
        raise ReceiptStateError(
            f"receipt {prepared.id} is {prepared.status}, only a prepared receipt can settle",
            thread_id=prepared.thread_id,
            key=prepared.key,
            receipt=prepared,
        )
    # Built field by field rather than by ``dataclasses.replace``, which reads every
    # field by name (the receipt of every write effect passes here). Each field not
    # named below is carried over: ``tests/test_effects_rules.py`` checks that none is lost.
    return Receipt(
        id=prepared.id,
        thread_id=prepared.thread_id,
        key=prepared.key,
        status=_OUTCOMES.get(outcome) or ReceiptStatus(outcome),
        turn_id=prepared.turn_id,
        step_id=prepared.step_id,
        attempt=prepared.attempt,
        value=value if outcome == "completed" else None,
        error=error,
        created_at=prepared.created_at,
        updated_at=now,
        resolution=prepared.resolution,
        announced=prepared.announced,
        tenant_id=prepared.tenant_id,
        actor=prepared.actor,
        capability_id=prepared.capability_id,
        input=prepared.input,
        approved_by=prepared.approved_by,
    )


_OUTCOMES = {
    "completed": ReceiptStatus.COMPLETED,
    "failed": ReceiptStatus.FAILED,
    "uncertain": ReceiptStatus.UNCERTAIN,
}


def is_settlement(new: Receipt, expected: Receipt) -> bool:
    """Whether ``new`` is ``expected`` settled (see :func:`settle`): only its status,
    value, error and update time differ, so that a store may write just those."""
    return (
        new.turn_id == expected.turn_id
        and new.step_id == expected.step_id
        and new.attempt == expected.attempt
        and new.resolution is None
        and expected.resolution is None
        and new.announced == expected.announced
        and new.actor == expected.actor
    )


def not_applied_error(actor: str | None, note: str | None) -> str:
    """A receipt's ``error`` once an operator resolved it as not applied."""
    who = f"by {actor} " if actor else ""
    why = f": {note}" if note else ""
    return f"resolved {who}as not applied (the write did not happen){why}"


def resolve(
    existing: Receipt,
    *,
    applied: bool,
    value: Any,
    note: str | None,
    actor: str | None,
    now: datetime,
    attempt_may_run: bool = False,
) -> Receipt:
    """An operator's reconciliation of an uncertain (or abandoned prepared) receipt.

    The receipt becomes ``completed``: the write happened, and later calls return
    ``value``. Or it becomes ``failed``: it did not, and a later call may retry.

    Must be evaluated under the thread's lock. Take a lock held for as long as the
    attempt that took it runs. A ``prepared`` receipt seen under it belongs to an
    attempt that is no longer running. ``attempt_may_run``: the store cannot promise
    that. A PostgreSQL lock dies with its session, while the worker and its provider
    call may live on. Then a ``prepared`` receipt may not be resolved as not applied.
    The attempt could still apply the write. The retry the resolution permits would
    be a second provider call. As applied it may: the attempt's own outcome write is
    then refused, since it compares-and-sets the ``prepared`` state.
    """
    if attempt_may_run and not applied and existing.status is ReceiptStatus.PREPARED:
        raise ReceiptStateError(
            f"receipt for {existing.key!r} on thread {existing.thread_id!r} is prepared and "
            "the attempt that prepared it may still be running (this store cannot tell a "
            "worker that stopped from one that lost its connection), so it cannot be "
            "resolved as not applied: its attempt records the outcome when it ends, a later "
            "turn that reaches the key marks it uncertain, or resolve it as applied",
            thread_id=existing.thread_id,
            key=existing.key,
            receipt=existing,
        )
    if existing.status not in (ReceiptStatus.UNCERTAIN, ReceiptStatus.PREPARED):
        raise ReceiptStateError(
            f"receipt for {existing.key!r} on thread {existing.thread_id!r} is "
            f"{existing.status}; only an uncertain receipt, or a prepared one left by an "
            "attempt that did not finish, can be resolved",
            thread_id=existing.thread_id,
            key=existing.key,
            receipt=existing,
        )
    return replace(
        existing,
        status=ReceiptStatus.COMPLETED if applied else ReceiptStatus.FAILED,
        value=value if applied else None,
        # The resolution is what the receipt shows now: the attempt's own error said
        # the write "may have been applied", which the operator just ruled out.
        error=None if applied else not_applied_error(actor, note),
        updated_at=now,
        resolution=Resolution(applied=applied, note=note, actor=actor, at=now),
        announced=applied,  # the receipt.resolved event committed with it announces the write
    )
