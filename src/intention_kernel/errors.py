"""The exception tree of intention-kernel.

Every error the library raises derives from :class:`KernelError` and carries
structured fields (``thread_id``, ``turn_id``, ``key``, ``receipt``) beside its
message, so that hosts can react without parsing text::

    KernelError
    ├── CompilationError              Kernel(...) refused the agent definition
    ├── CapabilityError               a step could not run (becomes a ``failed`` step)
    │   ├── UnknownCapabilityError    the interpreter named a capability the agent lacks
    │   └── InvalidInputError         capability input failed validation
    ├── EffectError
    │   ├── EffectUncertainError      the write may have happened; fail closed
    │   │   └── EffectValueError      the provider value cannot be stored as JSON
    │   ├── EffectNotAppliedError     raised by host code: the write provably did not happen
    │   └── EffectUsageError          run_effect or emit misused (read capability, empty key,
    │                                 an event type in a kernel namespace)
    ├── CheckpointError
    │   ├── CheckpointCompatibilityError  newer schema revision or foreign fingerprint
    │   └── CorruptRecordError        a stored row cannot be decoded
    │       └── CorruptStoreError     the store's file is damaged (a garbage page, truncated)
    ├── InterpretationError           the interpreter raised or returned garbage; nothing committed
    ├── InvalidRequestError           a request is malformed (turn IDs, message, answer; a
    │   │                             receipt filter or resolution; a TurnResult document)
    │   └── ReservedTurnIdError       a client's turn ID uses a prefix of the kernel's turns
    ├── JournalError                  tx.recorded given a key or value the journal cannot store
    ├── TurnConflictError             a committed (or journaled) turn ID with another request
    ├── TurnExpiredError              a committed turn whose stored result was pruned (retention)
    ├── TurnCancelledError            a queued turn cancelled before it ran (``Kernel.cancel``)
    ├── ShuttingDownError             the kernel drains for shutdown: nothing committed (HTTP 503)
    ├── ThreadBusyError               another turn holds the thread: refused at once
    │   │                             (``Agent(on_busy="reject")``, HTTP 409)
    │   └── ThreadLockTimeoutError    the thread's lock was not obtained within the
    │                                 store's lock timeout (HTTP 503)
    ├── FencedCommitError             the thread moved on while the turn ran; nothing committed
    │   └── LeaseLostError            the turn's thread lease lapsed or was taken over
    ├── TenantMismatchError           the thread belongs to another tenant
    ├── SyncKernelError               SyncKernel cannot serve the call (also a RuntimeError)
    │   ├── EventLoopRunningError     called on a thread that runs an event loop: use Kernel
    │   ├── KernelClosedError         called after close()
    │   └── ForkedKernelError         used before a fork, over a store it cannot open anew
    ├── ReceiptError
    │   ├── ReceiptNotFoundError      no receipt for that (thread, key)
    │   └── ReceiptStateError         the receipt is not in a state the operation accepts
    └── StoreError                    the storage driver failed (translated at the adapter edge)

Only :class:`EffectNotAppliedError` is meant to be raised by application code
(from inside an effect callback); the rest are raised by the kernel and its
adapters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from intention_kernel.effects import Receipt

__all__ = [
    "CapabilityError",
    "CheckpointCompatibilityError",
    "CheckpointError",
    "CompilationError",
    "CorruptRecordError",
    "CorruptStoreError",
    "EffectError",
    "EffectNotAppliedError",
    "EffectUncertainError",
    "EffectUsageError",
    "EffectValueError",
    "EventLoopRunningError",
    "FencedCommitError",
    "ForkedKernelError",
    "InterpretationError",
    "InvalidInputError",
    "InvalidRequestError",
    "JournalError",
    "KernelClosedError",
    "KernelError",
    "LeaseLostError",
    "ReceiptError",
    "ReceiptNotFoundError",
    "ReceiptStateError",
    "ReservedTurnIdError",
    "StoreError",
    "SyncKernelError",
    "TenantMismatchError",
    "ThreadBusyError",
    "ThreadLockTimeoutError",
    "TurnCancelledError",
    "ShuttingDownError",
    "TurnConflictError",
    "TurnExpiredError",
    "UnknownCapabilityError",
]


class KernelError(Exception):
    """Root of every error raised by intention-kernel."""

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        turn_id: str | None = None,
        key: str | None = None,
        receipt: Receipt | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.thread_id = thread_id
        self.turn_id = turn_id
        self.key = key
        self.receipt = receipt

    def __str__(self) -> str:
        return self.message


class CompilationError(KernelError):
    """The agent definition is invalid; raised by ``Kernel(...)``.

    ``problems`` lists every problem found, not only the first.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("agent does not compile: " + "; ".join(problems))
        self.problems = list(problems)


class CapabilityError(KernelError):
    """A step could not run. The kernel records it as a ``failed`` step."""

    def __init__(
        self,
        message: str,
        *,
        capability_id: str | None = None,
        thread_id: str | None = None,
        turn_id: str | None = None,
    ) -> None:
        super().__init__(message, thread_id=thread_id, turn_id=turn_id)
        self.capability_id = capability_id


class UnknownCapabilityError(CapabilityError):
    """The interpreter asked for a capability the agent does not have."""


class InvalidInputError(CapabilityError):
    """Capability input failed validation against its schema.

    ``errors`` holds the validator's structured error list.
    """

    def __init__(
        self,
        message: str,
        *,
        capability_id: str | None = None,
        errors: list[dict[str, object]] | None = None,
        thread_id: str | None = None,
        turn_id: str | None = None,
    ) -> None:
        super().__init__(message, capability_id=capability_id, thread_id=thread_id, turn_id=turn_id)
        self.errors = errors or []


class EffectError(KernelError):
    """Base of errors about durable external effects."""


class EffectUncertainError(EffectError):
    """The effect may have been applied; the receipt is ``uncertain``.

    The adapter fails closed: later calls with the same key raise this error
    too, without calling the provider, until an operator resolves the receipt
    (``resolve_receipt``).
    """


class EffectNotAppliedError(EffectError):
    """Raised by host code when it can prove that no write occurred.

    The receipt is recorded as ``failed`` and a later call with the same key
    may retry the write.
    """

    def __init__(self, message: str = "the effect was not applied") -> None:
        super().__init__(message)


class EffectValueError(EffectUncertainError):
    """The provider returned a value that cannot be stored as JSON.

    The write may have happened, so the receipt is ``uncertain`` and the step too: this
    is an ``EffectUncertainError``, and later calls with the same key raise that.
    """


class EffectUsageError(EffectError):
    """``run_effect`` or ``emit`` was called where it is not allowed: ``run_effect`` by a
    read capability or with an empty key, ``emit`` with an event type in one of the
    kernel's namespaces (``turn.``, ``interaction.``, ``fact.``, ``effect.``, ``receipt.``)."""


class CheckpointError(KernelError):
    """Base of errors about stored checkpoints."""


class CheckpointCompatibilityError(CheckpointError):
    """The stored checkpoint cannot be used by this agent.

    Either its schema revision is newer than this library understands, or it was
    written by an agent whose fingerprint this agent does not declare compatible.
    """

    def __init__(
        self,
        message: str,
        *,
        schema_revision: int | None = None,
        fingerprint: str | None = None,
        thread_id: str | None = None,
    ) -> None:
        super().__init__(message, thread_id=thread_id)
        self.schema_revision = schema_revision
        self.fingerprint = fingerprint


class CorruptRecordError(CheckpointError):
    """A stored row (checkpoint, result, receipt) cannot be decoded.

    Not transient: retrying reads the same bytes. ``thread_id`` names the thread when
    the read was of one thread."""


class CorruptStoreError(CorruptRecordError):
    """The store itself cannot be read: SQLite found a damaged page, a truncated file, or
    a file that is not a database. Nothing was written; restore the store from a backup
    (``sqlite3 app.db ".recover"`` may save what is left)."""


class InterpretationError(KernelError):
    """The interpreter raised or returned an invalid interpretation.

    Nothing ran and nothing was committed; the same delivery may be retried.
    """


class InvalidRequestError(KernelError, ValueError):
    """A request is malformed: a turn with an empty or oversized ID, no message and no
    answer, or an answer of the wrong type; ``list_receipts`` with an unknown status;
    ``resolve_receipt`` with a value that is not JSON (NaN, infinity); a document
    ``TurnResult.from_dict`` cannot read. Nothing was read or written."""


class ReservedTurnIdError(InvalidRequestError):
    """A client's turn ID begins with a prefix the kernel keeps for its own turns.

    The expiry sweep closes an interaction in turn ``expire:<interaction id>``. A
    client turn under that ID would commit first, and the sweep's turn would then
    conflict on every run. ``turn_id`` names the refused ID; nothing was read or written.
    """


class JournalError(KernelError, ValueError):
    """``tx.recorded`` was given a key or a value the journal cannot store: a key that
    is empty or not storable text, a value that is not JSON. Nothing was recorded."""


class TurnConflictError(KernelError):
    """A turn ID was delivered again with a different request: one already committed,
    or one whose earlier delivery recorded model responses (the journal) for another
    request.

    The stored result (or the recorded responses) belongs to another request, so it is
    neither returned nor is the new request run under the same turn ID.
    """


class TurnExpiredError(KernelError):
    """A committed turn ID was delivered again after retention (``prune``) dropped its result.

    The turn stays committed, so it is never run again; its result can no longer be
    returned. A very late transport retry gets this error instead of a second run.
    """


class TurnCancelledError(KernelError):
    """A queued turn was cancelled (``Kernel.cancel``) before it ran: nothing of it was
    committed, and it will not run from the inbox."""


class ShuttingDownError(KernelError):
    """The kernel drains for shutdown (:meth:`Kernel.begin_shutdown
    <intention_kernel.Kernel.begin_shutdown>`). A new turn is refused before it reads
    anything; a running one stopped at a safe point before its commit. Nothing of it
    was committed: its journal keeps the rounds it ran, and its receipts settle its
    writes. Deliver the same turn ID again, to another process: it goes on from
    there. The HTTP host answers 503 ``shutting-down`` with ``Retry-After``."""


class ThreadBusyError(KernelError):
    """Another turn holds the thread's lock: a turn that does not wait
    (``Agent(on_busy="reject")``, ``with_turn(..., wait=False)``) is refused at once.
    ``thread_id`` names the thread; nothing was read or written, and the same delivery
    may be retried. The HTTP host answers 409 ``thread-busy``.

    A turn that waited and gave up is the subclass :class:`ThreadLockTimeoutError`, so
    ``except ThreadBusyError`` catches both."""


class ThreadLockTimeoutError(ThreadBusyError):
    """A turn waited for the thread's lock for the store's whole lock timeout and did
    not get it. Nothing was read or written; the same delivery may be retried. The HTTP
    host answers 503 ``lock-timeout`` with ``Retry-After``: the store, not the person,
    is what is slow."""


class FencedCommitError(KernelError):
    """The thread's version moved while the turn ran, so the commit was refused.

    This only happens when the turn lost its claim on the thread; nothing was
    committed and the turn may be retried with the same turn ID.
    """


class LeaseLostError(FencedCommitError):
    """The turn's lease on its thread lapsed or was taken over, so a write was refused.

    PostgreSQL serializes a thread's turns with leases that expire. A worker paused
    past its lease (a long GC pause, a frozen VM, a partition) finds every later write
    refused: its receipt prepare, its journal entry, its commit. Nothing it did after
    the lease was lost is stored or announced. The same delivery may be retried.
    """


class TenantMismatchError(KernelError):
    """The thread exists under another tenant; it is neither read nor written."""


class SyncKernelError(KernelError, RuntimeError):
    """:class:`~intention_kernel.SyncKernel` cannot serve this call; nothing ran.

    A misuse of the synchronous facade, not a failure of the turn: the call never
    reached the store, so the same delivery may be made again the right way."""


class EventLoopRunningError(SyncKernelError):
    """A ``SyncKernel`` method was called on a thread that runs an event loop.

    Blocking there would stall every task of that loop, or deadlock on the kernel's own
    loop. Async code awaits :class:`~intention_kernel.Kernel` over the same store."""


class KernelClosedError(SyncKernelError):
    """A ``SyncKernel`` was called after ``close()`` (or after its ``with`` block)."""


class ForkedKernelError(SyncKernelError):
    """A ``SyncKernel`` ran in a parent process, which then forked; the child called it.

    Its store object holds the parent's connections and files, which a child must not
    use. A kernel built from a URL opens the store anew in the child instead. Otherwise,
    build the kernel in the child (Celery's ``worker_process_init``, gunicorn's
    ``post_fork``), or before the parent first uses it."""


class ReceiptError(KernelError):
    """Base of errors about operator actions on receipts."""


class ReceiptNotFoundError(ReceiptError):
    """No receipt exists for that thread and key.

    ``suggestions``: stored keys of the thread that the caller may have meant (the key
    given without its capability prefix), already named in the message."""

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        key: str | None = None,
        suggestions: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, thread_id=thread_id, key=key)
        self.suggestions = suggestions


class ReceiptStateError(ReceiptError):
    """The receipt is not in a state that permits the requested operation."""


class StoreError(KernelError):
    """The storage driver failed; the original exception is chained as ``__cause__``."""
