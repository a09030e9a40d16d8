"""The records a recorder reads and writes, as plain frozen values.

They are what is stored of turns, threads, the outbox and their owners.

A checkpoint is stored in pieces, so a turn's cost does not grow with its thread.
A :class:`TurnRecord` carries the pieces a commit writes as one value, ``rows``.
What the pieces are, and how they are read back, is the stored layout's business
(:mod:`intention_kernel.durability._layout`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from intention_kernel._checkpoint import Interaction
from intention_kernel._turns import EventDraft, OutboxEvent

if TYPE_CHECKING:
    # The layout reads these records, so it is imported for the annotations only.
    from intention_kernel.durability._layout import CheckpointRows

__all__ = [
    "INTERACTION_MARKER",
    "CheckpointRewrite",
    "InboxEntry",
    "JournalEntry",
    "OutboxBacklog",
    "OutboxDelivery",
    "PendingInteraction",
    "StoredStream",
    "StoredThread",
    "StoredTurn",
    "ThreadOwner",
    "Timer",
    "TimerWrite",
    "TurnRecord",
    "TurnStart",
]

#: Text that every stored checkpoint core with an active interaction contains.
#: The codec's compact JSON puts ``"interaction":{`` at the core's top level.
#: JSON escapes every quote inside a string, so the text is never inside one.
#: Elsewhere it can only be an object under a nested ``interaction`` key.
#: A capability's input could hold one, say.
#: A recorder selects threads by it without parsing each core (``read_interactions``).
#: The engine's ``pending_interactions`` then decodes the few it selects.
INTERACTION_MARKER = '"interaction":{'


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """A committed turn as stored: the request digest and the result JSON.

    ``expired``: retention dropped the result, and ``result`` is then empty.
    The turn is still committed.
    So a late delivery is refused with ``TurnExpiredError``.
    """

    request_digest: str | None
    result: str
    expired: bool = False


@dataclass(frozen=True, slots=True)
class StoredThread:
    """A thread row and its checkpoint's rows.

    ``checkpoint`` is the stored core document.
    It is ``None`` while ``version`` is 0 (no committed turn).
    ``messages`` are the message rows, oldest first.
    ``facts`` are the fact rows as ``(key, record JSON)``.
    They come in the order their keys were first stored.
    Both are empty when ``checkpoint`` is not shipped.
    ``receipt_index`` holds the receipt index rows, each entry's JSON, oldest first.
    Only a store that keeps them has them (``RecorderOptions.receipt_index_rows``).
    Otherwise it is ``None``, and the core holds the index.
    """

    version: int
    tenant_id: str | None
    checkpoint: str | None
    messages: Sequence[str] = ()
    facts: Sequence[tuple[str, str]] = ()
    receipt_index: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class ThreadOwner:
    """Whom a thread belongs to (``tenant_id`` ``None``: no tenant).

    It is the tenant of the first durable write on the thread.
    That write is its first committed turn.
    Before one, it is the first effect receipt or journal entry a turn wrote there.
    The rule that decides with it is
    :func:`~intention_kernel.durability._contract.ownership.owns`.
    """

    tenant_id: str | None


@dataclass(frozen=True, slots=True)
class TurnStart:
    """What a turn reads before it runs: the prior result, or else the thread row.

    ``claimed_by`` is set only when no turn of this ID committed.
    The thread must also have no committed turn (no row, or version 0).
    It is then the tenant of the thread's earliest receipt.
    Without a receipt, it is the tenant of the earliest journal entry.
    It is ``None`` if the thread has neither.
    A recorder that cannot tell leaves it ``None``.
    The receipts' own tenant check still keeps their values from another tenant
    (:func:`~intention_kernel._effects.plan_effect`).
    The journal's check (``tx.recorded``) likewise keeps its entries.
    """

    turn: StoredTurn | None
    thread: StoredThread | None
    thread_tenant_id: str | None = None
    claimed_by: ThreadOwner | None = None


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """Everything one turn commits, in one transaction.

    ``rows`` is the checkpoint's rows, as a difference with the stored ones.
    :class:`~intention_kernel.durability._layout.CheckpointRows` says how to apply them.
    ``schema_revision`` and ``fingerprint`` are the checkpoint's, for columns of their own.

    ``announced`` names completed receipts (by key).
    Their ``effect.completed`` events are among ``events``.
    A receipt that this turn ID completed is announced by the turn row itself.
    An adapter may store the keys with the turn row.
    It then reads a receipt as announced when two things hold.
    The turn named by its ``turn_id`` committed, and that turn lists its key.
    This saves one write per effect.
    ``mark_announced`` names receipts completed under another turn ID.
    That turn never committed.
    The commit must mark each of them announced in its own row.

    ``journaled``: the turn wrote or read journal entries (:class:`JournalEntry`).
    The commit then deletes every entry of ``(thread_id, turn_id)`` in its transaction.
    It is ``False`` for a turn that never used the journal.
    That turn's commit has nothing to delete.

    ``timers``: the thread's timer rows this turn set, settled or deleted.
    There is at most one write per key (:class:`TimerWrite`).
    They are written only if the commit is.
    """

    thread_id: str
    turn_id: str
    tenant_id: str | None
    request_digest: str | None
    expected_version: int
    version: int
    result: str
    rows: CheckpointRows
    schema_revision: int
    fingerprint: str
    events: Sequence[EventDraft]
    created_at: datetime
    announced: Sequence[str] = ()
    mark_announced: Sequence[str] = ()
    journaled: bool = False
    timers: Sequence[TimerWrite] = ()


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A value a turn recorded before it committed (``tx.recorded``).

    A model round's response is one, say.
    A redelivery of the same turn then does not ask for it again.

    There is one per ``(thread_id, turn_id, key)``.
    ``value`` is its JSON text.
    ``request_digest`` is the digest of the request the turn was running for.
    That is ``TurnScope.request_digest``.
    ``tenant_id`` is the tenant of that turn (``None``: no tenant).
    An entry claims a thread with no committed turn for its tenant.
    A receipt does the same (``ThreadOwner``).
    Only a turn of that tenant may read it.
    """

    thread_id: str
    turn_id: str
    key: str
    request_digest: str | None
    value: str
    created_at: datetime
    tenant_id: str | None = None
    #: A streamed turn's events since its previous entry: ``(segment, JSON text)``.
    #: Kept with the entry, in the same transaction, and after the turn's commit.
    stream: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class StoredStream:
    """What a watcher reads of a turn (``StreamRecorder.read_stream``).

    ``turn`` is the committed turn, ``None`` while it is not committed. ``segments``
    are the recorded ``(segment, JSON text)`` pairs, in segment order.
    """

    turn: StoredTurn | None
    segments: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A message accepted into a thread's inbox while a turn ran on the thread.

    There is one per ``(thread_id, turn_id)``.
    ``request`` is the JSON text of what the turn will run.
    That is its message, answer and principal.
    ``request_digest`` is its digest.
    ``seq`` orders a store's entries by acceptance.
    It is 0 until the store numbers it.

    ``steer``: the message is for the running turn (``on_busy="steer"``).
    It is handed to that turn at its next round boundary.
    ``taken_by`` is the turn that took it there.
    The entry's turn ID then replays that turn's result.
    Untaken, it runs as its own turn, as a queued one does.
    """

    thread_id: str
    turn_id: str
    tenant_id: str | None
    request_digest: str | None
    request: str
    created_at: datetime
    seq: int = 0
    steer: bool = False
    taken_by: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointRewrite:
    """A thread's checkpoint written anew in place, at the same ``version``.

    A schema migration writes one.
    Its ``rows`` are every row of the checkpoint, a ``rewrite``.
    They are encoded as in a :class:`TurnRecord`.
    """

    thread_id: str
    version: int
    schema_revision: int
    fingerprint: str
    rows: CheckpointRows


@dataclass(frozen=True, slots=True)
class OutboxDelivery:
    """An outbox event not yet published, and what the relay recorded about it.

    That is its failed ``attempts`` and its ``last_error``.
    ``retry_at`` is the earliest time to try again.
    """

    event: OutboxEvent
    attempts: int = 0
    last_error: str | None = None
    retry_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class OutboxBacklog:
    """The relay's lag: how many events are unpublished, since when, and which fail."""

    unpublished: int
    oldest_unpublished_at: datetime | None
    failing: Sequence[OutboxDelivery]


@dataclass(frozen=True, slots=True)
class PendingInteraction:
    """A thread's active interaction: a confirmation waiting for a person.

    It is as of the thread's latest committed checkpoint (``version``).
    ``tenant_id`` is the thread's owner.
    """

    thread_id: str
    tenant_id: str | None
    version: int
    interaction: Interaction


#: What became of a timer: ``pending`` (it will fire), ``fired`` (its turn committed)
#: or ``void`` (its guard found the thread moved on, or its turn could never run).
TimerStatus = Literal["pending", "fired", "void"]


@dataclass(frozen=True, slots=True)
class Timer:
    """A timer of a thread: a turn the kernel will run at ``due_at``.

    ``key`` is its identity in the thread: setting the key again moves it. ``message``
    and ``data`` are what its turn hands the interpreter
    (:attr:`~intention_kernel._interpretation.InterpretationRequest.timer`).
    ``unless_version_after``: the timer is void if the thread's version is above it
    when it is due. ``every``: it recurs, each occurrence ``every`` after the last due
    time; with ``cron`` (a cron expression, in UTC), at its next time after the
    last. ``turn_id`` is the turn that fired it (or voided it). ``claimed_until``: a
    worker claimed it and is firing it until then; after that another may.
    """

    thread_id: str
    key: str
    due_at: datetime
    message: str | None = None
    data: Any = None
    tenant_id: str | None = None
    unless_version_after: int | None = None
    every: timedelta | None = None
    status: TimerStatus = "pending"
    set_at: datetime | None = None
    settled_at: datetime | None = None
    turn_id: str | None = None
    claimed_until: datetime | None = None
    cron: str | None = None


@dataclass(frozen=True, slots=True)
class TimerWrite:
    """One write to a thread's timer rows: the row of ``key`` becomes ``timer`` (an
    insert or a replacement, its claim cleared), or is deleted when ``timer`` is
    ``None``."""

    thread_id: str
    key: str
    timer: Timer | None
