"""The exception tree of intention-kernel.

Every error the library raises derives from :class:`KernelError`.
Beside its message, it carries structured fields: ``thread_id``, ``turn_id``, ``key``, ``receipt``.
So hosts can react without parsing text::

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
    │   ├── ThreadLockTimeoutError    the thread's lock was not obtained within the
    │   │                             store's lock timeout (HTTP 503)
    │   └── SteerOrphanedError        a steer's taker died uncommitted and only a direct
    │                                 delivery of the taker can finish it (HTTP 409)
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

Only :class:`EffectNotAppliedError` is meant to be raised by application code.
It is raised from inside an effect callback.
The kernel and its adapters raise the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from intention_kernel._effects import Receipt

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
    "SteerOrphanedError",
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

    The adapter fails closed.
    Later calls with the same key raise this error too, without calling the provider.
    That lasts until an operator resolves the receipt (``resolve_receipt``).
    """


class EffectNotAppliedError(EffectError):
    """Raised by host code when it can prove that no write occurred.

    The receipt is recorded as ``failed``.
    A later call with the same key may retry the write.
    """

    def __init__(self, message: str = "the effect was not applied") -> None:
        super().__init__(message)


class EffectValueError(EffectUncertainError):
    """The provider returned a value that cannot be stored as JSON.

    The write may have happened, so the receipt is ``uncertain``, and the step too.
    This is an ``EffectUncertainError``.
    Later calls with the same key raise that.
    """


class EffectUsageError(EffectError):
    """``run_effect`` or ``emit`` was called where it is not allowed.

    - ``run_effect`` by a read capability, or with an empty key.
    - ``emit`` with an event type in one of the kernel's namespaces.
      Those are ``turn.``, ``interaction.``, ``fact.``, ``effect.`` and ``receipt.``.
    """


class CheckpointError(KernelError):
    """Base of errors about stored checkpoints."""


class CheckpointCompatibilityError(CheckpointError):
    """The stored checkpoint cannot be used by this agent.

    Its schema revision may be newer than this library understands.
    Or an agent wrote it whose fingerprint this agent does not declare compatible.
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
    """The store itself cannot be read.

    SQLite found a damaged page, a truncated file, or a file that is not a database.
    Nothing was written.
    Restore the store from a backup.
    ``sqlite3 app.db ".recover"`` may save what is left.
    """


class InterpretationError(KernelError):
    """The interpreter raised or returned an invalid interpretation.

    Nothing ran and nothing was committed; the same delivery may be retried.
    """


class InvalidRequestError(KernelError, ValueError):
    """A request is malformed; nothing was read or written.

    - A turn has an empty or oversized ID.
    - A turn has no message and no answer, or an answer of the wrong type.
    - ``list_receipts`` gets an unknown status.
    - ``resolve_receipt`` gets a value that is not JSON, such as NaN or infinity.
    - ``TurnResult.from_dict`` gets a document it cannot read.
    """


class ReservedTurnIdError(InvalidRequestError):
    """A client's turn ID begins with a prefix the kernel keeps for its own turns.

    The expiry sweep closes an interaction in turn ``expire:<interaction id>``.
    A client turn under that ID would commit first.
    The sweep's turn would then conflict on every run.
    ``turn_id`` names the refused ID.
    Nothing was read or written.
    """


class JournalError(KernelError, ValueError):
    """``tx.recorded`` was given a key or a value the journal cannot store.

    The key was empty or not storable text, or the value was not JSON.
    Nothing was recorded.
    """


class TurnConflictError(KernelError):
    """A turn ID was delivered again with a different request.

    The turn ID may be committed already.
    Or an earlier delivery recorded model responses for another request, in the journal.
    The stored result, or the recorded responses, belong to another request.
    So they are not returned.
    Nor is the new request run under the same turn ID.
    """


class TurnExpiredError(KernelError):
    """A committed turn ID was delivered again after retention (``prune``) dropped its result.

    The turn stays committed, so it is never run again.
    Its result can no longer be returned.
    A very late transport retry gets this error instead of a second run.
    """


class TurnCancelledError(KernelError):
    """A queued turn was cancelled (``Kernel.cancel``) before it ran.

    Nothing of it was committed, and it will not run from the inbox.
    """


class ShuttingDownError(KernelError):
    """The kernel drains for shutdown.

    :meth:`Kernel.begin_shutdown <intention_kernel.Kernel.begin_shutdown>` starts it.
    A new turn is refused before it reads anything.
    A running one stopped at a safe point before its commit.
    Nothing of it was committed.
    Its journal keeps the rounds it ran, and its receipts settle its writes.
    Deliver the same turn ID again, to another process, and it goes on from there.
    The HTTP host answers 503 ``shutting-down`` with ``Retry-After``.
    """


class ThreadBusyError(KernelError):
    """Another turn holds the thread's lock, so a turn that does not wait is refused.

    Such a turn comes from ``Agent(on_busy="reject")`` or ``with_turn(..., wait=False)``.
    It is refused at once.
    ``thread_id`` names the thread.
    Nothing was read or written, and the same delivery may be retried.
    The HTTP host answers 409 ``thread-busy``.

    A turn that waited and gave up raises the subclass :class:`ThreadLockTimeoutError`.
    So ``except ThreadBusyError`` catches both.
    """


class ThreadLockTimeoutError(ThreadBusyError):
    """A turn waited the store's whole lock timeout for the thread's lock, in vain.

    Nothing was read or written, and the same delivery may be retried.
    The HTTP host answers 503 ``lock-timeout`` with ``Retry-After``.
    The store, not the person, is what is slow.
    """


class SteerOrphanedError(ThreadBusyError):
    """A steer's taker died before its commit, and no inbox entry can finish it.

    A message sent with ``Agent(on_busy="steer")`` was handed to a running turn.
    That turn's journal recorded it, so the taker's model saw it.
    The taker then failed or died, and it was a direct delivery, not a queued one.
    Only the taker's own client can deliver it again: the kernel keeps no copy.
    ``turn_id`` names the steer, ``taken_by`` the taker.
    Deliver turn ``taken_by`` again, with its own request; the steer is part of it.
    The steer's turn ID then answers with the taker's result.
    Nothing was written. The HTTP host answers 409 ``steer-orphaned``.
    It is a :class:`ThreadBusyError`: the steer waits for another turn to commit.
    """

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        turn_id: str | None = None,
        taken_by: str,
    ) -> None:
        super().__init__(message, thread_id=thread_id, turn_id=turn_id)
        self.taken_by = taken_by


class FencedCommitError(KernelError):
    """The thread's version moved while the turn ran, so the commit was refused.

    It happens when the turn lost its claim on the thread.
    On PostgreSQL a receipt may also move under the turn's lease.
    A worker stopped past its lease wakes and settles its own attempt.
    That write is not fenced, and it may land while this turn replaces the receipt.
    The turn then reads the receipt again and goes on from the settled outcome.
    Only a receipt that keeps moving, as no worker would move it, raises this.
    Nothing was committed.
    The turn may be retried with the same turn ID.
    """


class LeaseLostError(FencedCommitError):
    """The turn's lease on its thread lapsed or was taken over, so a write was refused.

    PostgreSQL serializes a thread's turns with leases that expire.
    A worker may pause past its lease: a long GC pause, a frozen VM, a partition.
    It then finds every later write refused.
    That covers its receipt prepare, its journal entry and its commit.
    Nothing it did after the lease was lost is stored or announced.
    The same delivery may be retried.
    """


class TenantMismatchError(KernelError):
    """The thread exists under another tenant; it is neither read nor written."""


class SyncKernelError(KernelError, RuntimeError):
    """:class:`~intention_kernel.SyncKernel` cannot serve this call; nothing ran.

    It is a misuse of the synchronous facade, not a failure of the turn.
    The call never reached the store.
    So the same delivery may be made again the right way.
    """


class EventLoopRunningError(SyncKernelError):
    """A ``SyncKernel`` method was called on a thread that runs an event loop.

    Blocking there would stall every task of that loop.
    Or it would deadlock on the kernel's own loop.
    Async code awaits :class:`~intention_kernel.Kernel` over the same store.
    """


class KernelClosedError(SyncKernelError):
    """A ``SyncKernel`` was called after ``close()`` (or after its ``with`` block)."""


class ForkedKernelError(SyncKernelError):
    """A ``SyncKernel`` ran in a parent process, which then forked; the child called it.

    Its store object holds the parent's connections and files.
    A child must not use them.
    A kernel built from a URL opens the store anew in the child instead.
    Otherwise, build the kernel in the child, or before the parent first uses it.
    Celery's ``worker_process_init`` and gunicorn's ``post_fork`` run in the child.
    """


class ReceiptError(KernelError):
    """Base of errors about operator actions on receipts."""


class ReceiptNotFoundError(ReceiptError):
    """No receipt exists for that thread and key.

    ``suggestions`` holds stored keys of the thread that the caller may have meant.
    The caller may have given the key without its capability prefix.
    The message names them already.
    """

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
