"""Problem details (RFC 9457): the host's only error format.

Every error response is ``application/problem+json``.
It has a stable ``type`` URI from :data:`PROBLEM_TYPES`, served at ``/problems/<slug>``.
It has its ``title`` and ``status``, and a ``detail`` for people.
It has ``thread_id``, ``turn_id`` and ``key`` where known.
Kernel errors are mapped by class (:func:`problem_for`), never by their message text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from intention_kernel.durability._engine.resolution import missing_receipt_message
from intention_kernel.errors import (
    CheckpointCompatibilityError,
    CorruptRecordError,
    FencedCommitError,
    InterpretationError,
    InvalidRequestError,
    KernelError,
    ReceiptNotFoundError,
    ReceiptStateError,
    ShuttingDownError,
    SteerOrphanedError,
    StoreError,
    TenantMismatchError,
    ThreadBusyError,
    ThreadLockTimeoutError,
    TurnCancelledError,
    TurnConflictError,
    TurnExpiredError,
)

__all__ = [
    "PROBLEM_MEDIA_TYPE",
    "PROBLEM_TYPES",
    "HostProblem",
    "ProblemType",
    "problem_body",
    "problem_for",
    "problem_response",
    "receipt_not_found",
    "thread_not_found",
]

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_BASE = "/problems/"


@dataclass(frozen=True, slots=True)
class ProblemType:
    """One kind of error the host answers with; ``retry_after`` adds that header."""

    slug: str
    status: int
    title: str
    description: str
    retry_after: int | None = None

    @property
    def uri(self) -> str:
        return PROBLEM_BASE + self.slug


def _types(*types: ProblemType) -> dict[str, ProblemType]:
    return {t.slug: t for t in types}


#: Every problem type the host answers with, by its slug.
PROBLEM_TYPES: Mapping[str, ProblemType] = _types(
    ProblemType(
        "malformed-request",
        400,
        "Malformed request",
        "The body is not a JSON document, or the turn ID in the body differs from the "
        "Idempotency-Key header.",
    ),
    ProblemType(
        "host-not-allowed",
        400,
        "Host not allowed",
        "The Host header names a host this server was not told it serves (a DNS rebinding "
        "attack sends the attacker's name). It answers the loopback names and those given "
        "with --allowed-host.",
    ),
    ProblemType(
        "unauthorized",
        401,
        "Unauthorized",
        "A valid bearer token is required (Authorization: Bearer <token>).",
    ),
    ProblemType(
        "forbidden",
        403,
        "Forbidden",
        "This token's role may not do this: listing and resolving receipts needs an "
        "operator token. Nothing was read or written.",
    ),
    ProblemType(
        "cross-origin",
        403,
        "Cross-origin request refused",
        "A page of another origin (Origin, or Sec-Fetch-Site cross-site or same-site) sent "
        "this request without a bearer token. Nothing was read or written.",
    ),
    ProblemType(
        "not-found",
        404,
        "Not found",
        "No such thread, receipt or route for this caller. A thread of another tenant is "
        "reported exactly like one that does not exist.",
    ),
    ProblemType("method-not-allowed", 405, "Method not allowed", "See the Allow header."),
    ProblemType(
        "turn-conflict",
        409,
        "Turn ID already used",
        "This turn ID was committed for a different request (message or answer). Use a new "
        "turn ID for a new request; resend the same request to get the stored result.",
    ),
    ProblemType(
        "turn-expired",
        409,
        "Turn result expired",
        "This turn ID was committed long ago and its result has since been pruned by "
        "retention. It is not run again; use a new turn ID for a new request.",
    ),
    ProblemType(
        "turn-cancelled",
        409,
        "Turn cancelled",
        "The turn waited in its thread's inbox and was cancelled before it ran. Nothing "
        "of it was committed, and it will not run from the inbox.",
    ),
    ProblemType(
        "incompatible-checkpoint",
        409,
        "Thread state is incompatible with this agent",
        "The thread was written by an agent fingerprint this agent does not declare "
        "compatible, or by a newer schema revision. Deploy a compatible agent; retrying "
        "against this one cannot succeed.",
    ),
    ProblemType(
        "thread-busy",
        409,
        "Thread busy",
        "Another turn on this thread is running and this agent does not queue turns "
        '(on_busy="reject"). Nothing was read or written: tell the person to wait, and '
        "send the same turn ID again once that turn has answered.",
        retry_after=1,
    ),
    ProblemType(
        "steer-orphaned",
        409,
        "Steer waits for its taker",
        'The message (on_busy="steer") was handed to a running turn, named in taken_by. '
        "That turn recorded it, then stopped before its commit, and it was not queued: "
        "only its client can deliver it again. Deliver the taker's turn ID again with its "
        "own request; the message is part of it, and this turn ID then answers with its "
        "result. Nothing was written.",
    ),
    ProblemType(
        "receipt-state",
        409,
        "Receipt cannot be resolved",
        "Only uncertain receipts (or ones prepared by a dead attempt) can be resolved.",
    ),
    ProblemType("payload-too-large", 413, "Payload too large", "The request body is too large."),
    ProblemType(
        "unsupported-media-type",
        415,
        "Unsupported media type",
        "A request body must be sent as Content-Type: application/json. Nothing was read "
        "or written.",
    ),
    ProblemType(
        "invalid-request",
        422,
        "Invalid request",
        "The request is well-formed JSON but does not match the schema or the kernel's "
        "rules (IDs, message length, answer). Nothing was read or written.",
    ),
    ProblemType(
        "corrupt-record",
        500,
        "Stored record cannot be decoded",
        "A stored checkpoint, result or receipt is corrupt, or the store's file itself is "
        "damaged. Retrying cannot help. Nothing was written; an operator must repair the store.",
    ),
    ProblemType(
        "internal-error",
        500,
        "Internal error",
        "An unexpected error; the server log has the details.",
    ),
    ProblemType(
        "interpretation-failed",
        502,
        "Interpretation failed",
        "The interpreter (the model) failed or returned garbage. Nothing ran and nothing was "
        "committed: retry with the same turn ID.",
    ),
    ProblemType(
        "lock-timeout",
        503,
        "Thread lock timeout",
        "The turn waited for the thread's lock for the store's whole lock timeout while "
        "another turn held it. Nothing was read or written: retry with the same turn ID "
        "after Retry-After.",
        retry_after=1,
    ),
    ProblemType(
        "turn-fenced",
        503,
        "Thread moved during the turn",
        "The turn lost its claim on the thread and nothing was committed. Retry with the "
        "same turn ID.",
        retry_after=1,
    ),
    ProblemType(
        "shutting-down",
        503,
        "Shutting down",
        "This process drains for shutdown: the turn was not taken, or stopped at a safe "
        "point before its commit. Nothing was committed. Retry with the same turn ID after "
        "Retry-After: another process goes on from the rounds it ran.",
        retry_after=1,
    ),
    ProblemType(
        "store-unavailable",
        503,
        "Store unavailable",
        "The durable store failed. Retry with the same turn ID after Retry-After.",
        retry_after=5,
    ),
)

#: Kernel errors by class; the most specific class in an error's MRO wins.
_BY_ERROR: Mapping[type[KernelError], str] = {
    InvalidRequestError: "invalid-request",
    TurnConflictError: "turn-conflict",
    TurnExpiredError: "turn-expired",
    TurnCancelledError: "turn-cancelled",
    TenantMismatchError: "not-found",
    ReceiptNotFoundError: "not-found",
    CheckpointCompatibilityError: "incompatible-checkpoint",
    ReceiptStateError: "receipt-state",
    CorruptRecordError: "corrupt-record",
    InterpretationError: "interpretation-failed",
    ThreadBusyError: "thread-busy",
    ThreadLockTimeoutError: "lock-timeout",
    SteerOrphanedError: "steer-orphaned",
    FencedCommitError: "turn-fenced",
    StoreError: "store-unavailable",
    ShuttingDownError: "shutting-down",
}


class HostProblem(Exception):
    """Raised inside an endpoint to answer with a problem response."""

    def __init__(
        self,
        slug: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(detail)
        self.type = PROBLEM_TYPES[slug]
        self.detail = detail
        self.headers = dict(headers or {})
        self.fields = {name: value for name, value in fields.items() if value is not None}


def thread_not_found(thread_id: str, turn_id: str | None = None) -> HostProblem:
    """The one answer for an unknown thread and for another tenant's thread."""
    return HostProblem(
        "not-found", f"no thread {thread_id!r}", thread_id=thread_id, turn_id=turn_id
    )


def receipt_not_found(thread_id: str, key: str, suggestions: Sequence[str] = ()) -> HostProblem:
    """The one answer for an unknown receipt and for another tenant's receipt.

    The store never suggests the keys of another tenant's thread.
    """
    return HostProblem(
        "not-found",
        missing_receipt_message(thread_id, key, suggestions),
        thread_id=thread_id,
        key=key,
    )


def problem_for(error: KernelError, **known: str | None) -> HostProblem:
    """The problem for a kernel error; ``known`` fills ``thread_id``/``turn_id`` it lacks."""
    slug = next(
        (_BY_ERROR[cls] for cls in type(error).__mro__ if cls in _BY_ERROR), "internal-error"
    )
    names = ("thread_id", "turn_id", "key", "taken_by")
    fields = {name: getattr(error, name, None) for name in names}
    for name, value in known.items():
        fields[name] = fields.get(name) or value
    # Word these exactly as the host words an unknown thread or receipt.
    # So another tenant learns nothing from the text either.
    if isinstance(error, TenantMismatchError):
        return thread_not_found(fields["thread_id"] or "", fields["turn_id"])
    if isinstance(error, ReceiptNotFoundError):
        return receipt_not_found(fields["thread_id"] or "", fields["key"] or "", error.suggestions)
    return HostProblem(slug, str(error), **fields)


def problem_body(problem: HostProblem) -> dict[str, Any]:
    """The problem details document of ``problem`` (RFC 9457)."""
    kind = problem.type
    return {
        "type": kind.uri,
        "title": kind.title,
        "status": kind.status,
        "detail": problem.detail,
        **problem.fields,
    }


def problem_response(problem: HostProblem) -> JSONResponse:
    kind = problem.type
    body = problem_body(problem)
    headers = dict(problem.headers)
    if kind.retry_after is not None:
        headers.setdefault("Retry-After", str(kind.retry_after))
    return JSONResponse(
        body, status_code=kind.status, headers=headers, media_type=PROBLEM_MEDIA_TYPE
    )
