"""Resolving a receipt.

- what an operator's request may hold, checked before anything is read or written.
- what the resolution writes.
- how a missing receipt is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from intention_kernel._effects import Receipt, ReceiptStatus, resolve, utcnow
from intention_kernel._json import describe_error, normalize, text_problem
from intention_kernel._turns import EventDraft
from intention_kernel.durability._contract.ownership import owns
from intention_kernel.durability._contract.recorders import ResolutionFn
from intention_kernel.durability._contract.records import ThreadOwner
from intention_kernel.errors import InvalidRequestError, ReceiptNotFoundError

__all__ = [
    "check_resolution",
    "missing_receipt",
    "missing_receipt_message",
    "receipt_status",
    "resolution_of",
    "suggest_keys",
]


def suggest_keys(key: str, stored: Sequence[str]) -> tuple[str, ...]:
    """The stored keys ``key`` may have meant: the same key with its capability prefix.

    A receipt is stored as ``capability_id:key``, and an operator may copy the key a
    capability passed to ``run_effect``."""
    return tuple(k for k in stored if k != key and k.partition(":")[2] == key)


def missing_receipt_message(thread_id: str, key: str, suggestions: Sequence[str] = ()) -> str:
    """How a missing receipt is reported, with the keys that were perhaps meant."""
    text = f"no receipt for key {key!r} on thread {thread_id!r}"
    if suggestions:
        text += "; did you mean " + " or ".join(repr(k) for k in suggestions) + "?"
    return text


def receipt_status(status: ReceiptStatus | str) -> ReceiptStatus:
    """``status`` as a :class:`ReceiptStatus`; ``InvalidRequestError`` for an unknown one."""
    try:
        return ReceiptStatus(status)
    except ValueError:
        known = ", ".join(s.value for s in ReceiptStatus)
        raise InvalidRequestError(
            f"unknown receipt status {status!r}; expected one of {known}"
        ) from None


def check_resolution(key: object, applied: object, value: Any, note: object, actor: object) -> Any:
    """Check what ``resolve_receipt`` was asked to store; the value as it will be stored."""
    if not isinstance(key, str) or not key:
        raise InvalidRequestError(f"key must be a non-empty string, got {key!r}")
    problem = text_problem(key)
    if problem is not None:  # no receipt can have it, and PostgreSQL cannot even look it up
        raise InvalidRequestError(f"key {key!r} cannot name a receipt: {problem}", key=key)
    if not isinstance(applied, bool):
        raise InvalidRequestError(f"applied must be True or False, got {applied!r}")
    for name, text in (("note", note), ("actor", actor)):
        if text is not None and not isinstance(text, str):
            raise InvalidRequestError(f"{name} must be a string, got {type(text).__name__}")
    try:
        normalize([key, note, actor])  # no store can hold a lone surrogate
        return normalize(value) if applied else None
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(
            f"cannot resolve receipt {key!r}: its value, key, note and actor must be JSON "
            f"(no NaN, infinity, sets or objects): {describe_error(exc)}",
            key=key,
        ) from exc


def missing_receipt(
    thread_id: str, key: str, suggestions: tuple[str, ...] = ()
) -> ReceiptNotFoundError:
    """The error for a receipt that is not there, or not the caller's to see."""
    return ReceiptNotFoundError(
        missing_receipt_message(thread_id, key, suggestions),
        thread_id=thread_id,
        key=key,
        suggestions=suggestions,
    )


def resolution_of(
    thread_id: str,
    key: str,
    *,
    applied: bool,
    value: Any,
    note: str | None,
    actor: str | None,
    owner: ThreadOwner | None,
    attempt_may_run: bool,
) -> ResolutionFn:
    """What ``Recorder.resolve_receipt`` applies to the stored receipt in its transaction:
    the resolved receipt and its ``receipt.resolved`` event. ``value`` is as checked by
    :func:`check_resolution`. A receipt that is missing, or of a tenant ``owner`` may not
    act for (``owns``), raises :func:`missing_receipt`."""

    def resolution(existing: Receipt | None) -> tuple[Receipt, EventDraft]:
        if existing is None:
            raise missing_receipt(thread_id, key)
        if owner is not None and not owns(ThreadOwner(existing.tenant_id), owner.tenant_id):
            raise missing_receipt(thread_id, key)
        resolved = resolve(
            existing,
            applied=applied,
            value=value,
            note=note,
            actor=actor,
            now=utcnow(),
            attempt_may_run=attempt_may_run,
        )
        event = EventDraft(
            "receipt.resolved",
            {
                "key": key,
                "receipt_id": resolved.id,
                "applied": applied,
                "status": str(resolved.status),
                "previous_status": str(existing.status),
                "note": note,
                "actor": actor,
            },
        )
        return resolved, event

    return resolution
