"""The records a recorder reads and writes: what is stored of turns, threads, the
outbox and their owners, as plain frozen values.

A checkpoint is stored in pieces, so that a turn's cost does not grow with its
thread: the thread row holds the small *core* (everything but messages and facts,
:func:`~intention_kernel.checkpoint.encode_checkpoint_core`), and each message and each
fact has a row of its own. A commit writes the core, the messages the turn appended and
the facts it changed (:class:`TurnRecord`); reading assembles the whole document again
(:func:`~intention_kernel.checkpoint.assemble_checkpoint`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from intention_kernel.checkpoint import Interaction
from intention_kernel.turns import EventDraft, OutboxEvent

__all__ = [
    "INTERACTION_MARKER",
    "CheckpointRewrite",
    "InboxEntry",
    "JournalEntry",
    "OutboxBacklog",
    "OutboxDelivery",
    "PendingInteraction",
    "StoredThread",
    "StoredTurn",
    "ThreadOwner",
    "TurnRecord",
    "TurnStart",
]

#: Text that every stored checkpoint core with an active interaction contains: the
#: compact JSON the codec writes puts ``"interaction":{`` at its top level, and JSON
#: escapes every quote inside a string, so it can appear nowhere else but as an object
#: under an ``interaction`` key nested deeper (a capability's input, say). A recorder
#: selects threads by it without parsing each core (``read_interactions``), and the
#: engine's ``pending_interactions`` decodes the few it selects.
INTERACTION_MARKER = '"interaction":{'


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """A committed turn as stored: the request digest and the result JSON.

    ``expired``: retention dropped the result (``result`` is then empty); the turn is
    still committed, so a late delivery is refused with ``TurnExpiredError``.
    """

    request_digest: str | None
    result: str
    expired: bool = False


@dataclass(frozen=True, slots=True)
class StoredThread:
    """A thread row and its checkpoint's rows.

    ``checkpoint`` is the stored core document, ``None`` while ``version`` is 0 (no
    committed turn). ``messages`` are the message rows, oldest first; ``facts`` the
    fact rows as ``(key, record JSON)``, in the order their keys were first stored.
    Both are empty when ``checkpoint`` is not shipped. ``receipt_index``: the receipt
    index rows (each entry's JSON, oldest first) of a store that keeps them
    (``RecorderOptions.receipt_index_rows``), else ``None``: the core holds the index.
    """

    version: int
    tenant_id: str | None
    checkpoint: str | None
    messages: Sequence[str] = ()
    facts: Sequence[tuple[str, str]] = ()
    receipt_index: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class ThreadOwner:
    """Whom a thread belongs to (``tenant_id`` ``None``: no tenant): the tenant of the
    first durable write on it, which is its first committed turn or, before that, the
    first effect receipt or journal entry a turn wrote on it. The rule that decides with it is
    :func:`~intention_kernel.durability.ownership.owns`."""

    tenant_id: str | None


@dataclass(frozen=True, slots=True)
class TurnStart:
    """What a turn reads before it runs: the prior result, or else the thread row.

    ``claimed_by``: only when there is no committed turn of this ID and the thread has
    no committed turn (no row, or version 0), the tenant of the thread's earliest
    receipt or, if it has none, of its earliest journal entry; ``None`` if it has
    neither. A recorder that cannot tell leaves it ``None``. The receipts' own tenant
    check (:func:`~intention_kernel.effects.plan_effect`) then still keeps their values
    from another tenant, and the journal's (``tx.recorded``) its entries.
    """

    turn: StoredTurn | None
    thread: StoredThread | None
    thread_tenant_id: str | None = None
    claimed_by: ThreadOwner | None = None


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """Everything one turn commits, in one transaction.

    The checkpoint comes as a difference with the stored one: ``checkpoint`` is the new
    core document; ``messages`` are appended after the stored message rows (numbered
    on from the thread's last message number), after which only the newest
    ``keep_messages`` rows are kept: the ``trim_messages`` rows just older than those
    are deleted (a bounded range, so that a store need not look at older ones);
    ``facts`` are inserted or replace the row of their key (a replaced row keeps its
    place in the order), ``removed_facts`` are deleted. With ``rewrite``, every message
    and fact row of the thread is deleted first, and ``messages``/``facts`` are all of
    them (the stored rows were not the base this difference was computed from).
    For a store that keeps the receipt index in rows (``RecorderOptions.receipt_index_rows``)
    the core leaves the index out: the rows of the ``moved_index_keys`` are deleted, then
    ``receipt_index`` rows (``(key, entry JSON)``) appended after the rest, then the
    ``trim_index`` oldest rows deleted; with ``rewrite``, every index row is deleted
    first and ``receipt_index`` is the whole index. Other stores get them empty.
    ``announced`` names completed receipts (by key) whose ``effect.completed`` event
    is among ``events``. A receipt that this turn ID completed is announced by the turn
    row itself: an adapter may store the keys with it and read a receipt as announced
    when the turn named by its ``turn_id`` committed and lists its key (one write fewer
    per effect). Those in ``mark_announced``, completed under another turn ID (one that
    never committed), must be marked announced in their own row by the commit.
    ``journaled``: the turn wrote or read journal entries (:class:`JournalEntry`); the
    commit deletes every entry of ``(thread_id, turn_id)`` in its transaction. It is
    ``False`` for a turn that never used the journal, whose commit has nothing to delete.
    """

    thread_id: str
    turn_id: str
    tenant_id: str | None
    request_digest: str | None
    expected_version: int
    version: int
    result: str
    checkpoint: str
    schema_revision: int
    fingerprint: str
    events: Sequence[EventDraft]
    created_at: datetime
    messages: Sequence[str] = ()
    keep_messages: int = 0
    trim_messages: int = 0
    facts: Sequence[tuple[str, str]] = ()
    removed_facts: Sequence[str] = ()
    rewrite: bool = False
    announced: Sequence[str] = ()
    mark_announced: Sequence[str] = ()
    journaled: bool = False
    receipt_index: Sequence[tuple[str, str]] = ()
    moved_index_keys: Sequence[str] = ()
    trim_index: int = 0


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A value a turn recorded before it committed (``tx.recorded``): a model round's
    response, say, so that a redelivery of the same turn is not asked it again.

    One per ``(thread_id, turn_id, key)``; ``value`` is its JSON text, ``request_digest``
    the digest of the request the turn was running for (``TurnScope.request_digest``).
    ``tenant_id`` is the tenant of that turn (``None``: no tenant). An entry claims a
    thread with no committed turn for its tenant, as a receipt does (``ThreadOwner``).
    Only a turn of that tenant may read it.
    """

    thread_id: str
    turn_id: str
    key: str
    request_digest: str | None
    value: str
    created_at: datetime
    tenant_id: str | None = None


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A message accepted into a thread's inbox while a turn ran on the thread.

    One per ``(thread_id, turn_id)``; ``request`` is the JSON text of what the turn
    will run (message, answer, principal), ``request_digest`` its digest. ``seq``
    orders a store's entries by acceptance (0 until the store numbers it).

    ``steer``: the message is for the running turn (``on_busy="steer"``), handed to
    it at its next round boundary. ``taken_by`` is the turn that took it there; the
    entry's turn ID then replays that turn's result. Untaken, it runs as its own
    turn, as a queued one does.
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
    """A thread's checkpoint written anew in place, at the same ``version`` (a schema
    migration): the core, and every message and fact row, encoded as in a :class:`TurnRecord`;
    and every receipt index row, for a store that keeps them (else empty)."""

    thread_id: str
    version: int
    checkpoint: str
    schema_revision: int
    fingerprint: str
    messages: Sequence[str]
    facts: Sequence[tuple[str, str]]
    receipt_index: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True, slots=True)
class OutboxDelivery:
    """An outbox event not yet published, and what the relay recorded about it: failed
    ``attempts``, the ``last_error``, and the earliest time to try again (``retry_at``)."""

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
    """A thread's active interaction (a confirmation waiting for a person), as of its
    latest committed checkpoint (``version``); ``tenant_id`` is the thread's owner."""

    thread_id: str
    tenant_id: str | None
    version: int
    interaction: Interaction
