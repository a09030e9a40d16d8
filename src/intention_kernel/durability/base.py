"""Shared turn and effect coordination over a small I/O-only ``Recorder``.

:class:`RecordedDurability` implements the whole :class:`~intention_kernel.durability.Durability`
contract once: locking order, replay, request digests, checkpoint decoding,
the receipt state machine (from :mod:`intention_kernel.effects`), fencing and
validation of what is committed. An adapter only provides a :class:`Recorder`
that moves rows in and out of its store, each method one short transaction.

Transactions per turn, by construction: one read (prior result + thread row),
one write per effect state change (``prepared`` before the provider call, the
outcome after it), and one commit (result + checkpoint + events). A turn with
one write effect therefore costs three commits and no more.

A checkpoint is stored in pieces, so that a turn's cost does not grow with its
thread: the thread row holds the small *core* (everything but messages and facts,
see :func:`~intention_kernel.checkpoint.encode_checkpoint_core`), and each message
and each fact has a row of its own. A commit writes the core, the messages the turn
appended and the facts it changed (:class:`TurnRecord`); reading assembles the
whole document again (:func:`~intention_kernel.checkpoint.assemble_checkpoint`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, Self

from intention_kernel import _faults, _tracing
from intention_kernel._calls import is_async_callable
from intention_kernel._ids import MAX_ID_BYTES, MAX_ID_LENGTH, check_id
from intention_kernel._json import dump_value, load_value, normalize, storable_text, text_problem
from intention_kernel.checkpoint import (
    CoreEncoder,
    Interaction,
    KernelCheckpoint,
    assemble_checkpoint,
    continuation,
    current_revision,
    decode_checkpoint,
    encode_fact,
    encode_message,
)
from intention_kernel.durability import TurnOperation
from intention_kernel.effects import (
    EffectAuthority,
    EffectFn,
    EffectPlan,
    EffectResult,
    Receipt,
    ReceiptStatus,
    plan_effect,
    resolve,
    settle,
    utcnow,
)
from intention_kernel.errors import (
    CorruptRecordError,
    EffectNotAppliedError,
    EffectUncertainError,
    EffectUsageError,
    EffectValueError,
    InvalidRequestError,
    KernelError,
    ReceiptNotFoundError,
    TenantMismatchError,
    TurnConflictError,
    TurnExpiredError,
)
from intention_kernel.facts import DerivedFacts
from intention_kernel.turns import (
    EventDraft,
    OutboxEvent,
    TurnCommit,
    TurnResult,
    TurnScope,
    decode_result,
    encode_result,
)

__all__ = [
    "INTERACTION_MARKER",
    "MAX_ID_BYTES",
    "MAX_ID_LENGTH",
    "CheckpointRewrite",
    "OutboxBacklog",
    "OutboxDelivery",
    "PendingInteraction",
    "RecordedDurability",
    "Recorder",
    "RecorderOptions",
    "StoredThread",
    "StoredTurn",
    "ThreadOwner",
    "TurnRecord",
    "TurnStart",
    "check_id",
    "dump_value",
    "load_value",
    "missing_receipt_message",
    "owner_of",
    "owns",
    "suggest_keys",
]

#: Text that every stored checkpoint core with an active interaction contains: the
#: compact JSON the codec writes puts ``"interaction":{`` at its top level, and JSON
#: escapes every quote inside a string, so it can appear nowhere else but as an object
#: under an ``interaction`` key nested deeper (a capability's input, say). A recorder
#: selects threads by it without parsing each core (``read_interactions``), and
#: :meth:`RecordedDurability.pending_interactions` decodes the few it selects.
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
    Both are empty when ``checkpoint`` is not shipped.
    """

    version: int
    tenant_id: str | None
    checkpoint: str | None
    messages: Sequence[str] = ()
    facts: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True, slots=True)
class ThreadOwner:
    """Whom a thread belongs to (``tenant_id`` ``None``: no tenant): the tenant of the
    first durable write on it, which is its first committed turn or, before that, the
    first effect receipt a turn prepared on it.

    ``with_turn`` refuses a turn of any other tenant with ``TenantMismatchError``;
    hosts apply the same rule to reads (see :meth:`RecordedDurability.thread_owner`).

    Why a receipt claims the thread, and not only a commit: a first turn that prepared
    (or completed) an effect and crashed before its commit leaves receipts on a thread
    that has no committed turn. If the thread stayed unowned, a turn of another tenant
    on the same thread ID could commit and take the thread (locking the first tenant
    out of its own retry), and a ``run_effect`` with the same key would be shown the
    first tenant's provider value. Each receipt records its tenant, and the thread's
    earliest receipt is read in the same round trip as the rest of a turn's start, so
    the claim costs no write and no round trip (see :attr:`TurnStart.claimed_by`).

    Once something durable is written on a thread its owner never changes, so a caller
    that decides on the same snapshot (or under the same lock) as its read or its
    write cannot be fooled by a first turn of another tenant still running: see
    :func:`owns`, which every use of this rule goes through.
    """

    tenant_id: str | None


def owner_of(thread: StoredThread | None, claimed_by: ThreadOwner | None) -> ThreadOwner | None:
    """The owner of a thread (see :class:`ThreadOwner`) from what one snapshot shows: the
    tenant of its committed turns if it has one, else ``claimed_by`` (the tenant of its
    earliest receipt, or ``None`` if it has none)."""
    if thread is not None and thread.version:
        return ThreadOwner(thread.tenant_id)
    return claimed_by


def owns(owner: ThreadOwner | None, tenant_id: str | None) -> bool:
    """The tenant-ownership rule: whether a caller of ``tenant_id`` (``None``: no tenant)
    may act on a thread whose owner is ``owner``. A thread is its owner's alone. A thread
    nobody owns yet is free for any tenant's first durable write; it has no checkpoint
    and no receipt, so a read of it shows nothing whoever asks."""
    return owner is None or owner.tenant_id == tenant_id


@dataclass(frozen=True, slots=True)
class TurnStart:
    """What a turn reads before it runs: the prior result, or else the thread row.

    ``claimed_by``: only when there is no committed turn of this ID and the thread has
    no committed turn (no row, or version 0), the tenant of the thread's earliest
    receipt, or ``None`` if it has none. A recorder that cannot tell leaves it ``None``;
    the receipts' own tenant check (:func:`~intention_kernel.effects.plan_effect`) then
    still keeps their values from another tenant.
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
    ``announced`` names completed receipts (by key) whose ``effect.completed`` event
    is among ``events``. A receipt that this turn ID completed is announced by the turn
    row itself: an adapter may store the keys with it and read a receipt as announced
    when the turn named by its ``turn_id`` committed and lists its key (one write fewer
    per effect). Those in ``mark_announced``, completed under another turn ID (one that
    never committed), must be marked announced in their own row by the commit.
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


@dataclass(frozen=True, slots=True)
class CheckpointRewrite:
    """A thread's checkpoint written anew in place, at the same ``version`` (a schema
    migration): the core, and every message and fact row (see :class:`TurnRecord`)."""

    thread_id: str
    version: int
    checkpoint: str
    schema_revision: int
    fingerprint: str
    messages: Sequence[str]
    facts: Sequence[tuple[str, str]]


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


ResolutionFn = Callable[[Receipt | None], tuple[Receipt, EventDraft]]
PlanFn = Callable[[Receipt | None], EffectPlan]


@asynccontextmanager
async def lock_and_begin(
    recorder: Recorder, thread_id: str, turn_id: str, known_version: int | None
) -> AsyncIterator[TurnStart]:
    """A turn's start as ``Recorder.start_turn`` does it by default: the lock, then
    ``begin_turn``, and the lock held for the block."""
    async with recorder.lock(thread_id):
        yield await recorder.begin_turn(thread_id, turn_id, known_version)


@dataclass(frozen=True, slots=True)
class RecorderOptions:
    """What a :class:`Recorder` declares about itself, in its ``options`` attribute.

    ``finishes_writes_when_cancelled``: ``write_receipt`` always runs to its end, even
    when the calling task is cancelled (it never suspends, or waits for its own hop
    before letting the cancellation through). Without it, each outcome write runs in a
    task of its own, so that a cancelled turn cannot leave a receipt ``prepared``.

    ``attempts_outlive_lock``: the thread lock can be lost while the process that took
    it lives on (a database session that dies while the turn's provider call still
    runs). A ``prepared`` receipt found under the lock may then belong to a live
    attempt, and is not resolvable as not applied
    (:func:`~intention_kernel.effects.resolve`). A recorder for which this is true and
    that does not say so lets an operator mark a running write as not applied.
    """

    finishes_writes_when_cancelled: bool = False
    attempts_outlive_lock: bool = False


class Recorder(Protocol):
    """The I/O an adapter provides to :class:`RecordedDurability`.

    Every method is one short transaction (or none). Conflicts are errors:
    ``write_receipt`` and ``commit_turn`` compare-and-set and raise rather than
    silently skipping.

    Two members have defaults, inherited by a recorder that subclasses this Protocol
    (``class MyRecorder(Recorder): ...``), and declared by one that does not:

    - ``options``, a :class:`RecorderOptions` (the default declares nothing);
    - ``start_turn``, which by default takes ``lock`` and then calls ``begin_turn``. A
      recorder may override it to do both in fewer round trips, and may then leave the
      lock untaken when it found the committed turn (a replay writes nothing).
    """

    #: The recorder's declared options; see :class:`RecorderOptions`.
    options: RecorderOptions = RecorderOptions()

    def start_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> AbstractAsyncContextManager[TurnStart]:
        """Hold the thread's lock for the block and yield what ``begin_turn`` reads."""
        return lock_and_begin(self, thread_id, turn_id, known_version)

    async def open(self) -> None:
        """Connect and create or migrate the schema. Called once, before anything else."""

    async def close(self) -> None: ...

    async def exists(self) -> bool:
        """Whether the store already holds this recorder's schema, without creating
        anything; callable before ``open``. Raises ``StoreError`` when the store cannot
        be reached."""
        ...

    def lock(self, thread_id: str) -> AbstractAsyncContextManager[object]:
        """Hold the thread's exclusive lock for the duration of the block.

        Must exclude every other holder in every process sharing the store,
        must be released if the holder dies, and must not hold a database
        write transaction open while held. Raises ``ThreadBusyError`` after the
        adapter's configured wait.
        """
        ...

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        """Read the committed turn ``(thread_id, turn_id)``; only if absent, the thread row
        with its message and fact rows (one consistent snapshot).

        When the thread's version equals ``known_version`` the caller already holds
        that checkpoint: the recorder should leave ``StoredThread.checkpoint`` as
        ``None`` and read no message or fact rows.
        """
        ...

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        """In one transaction: read the receipt, ``plan`` it, persist ``plan.write`` if any.

        ``plan`` is pure: a recorder may first try ``plan(None).write`` as an insert
        that does nothing if a receipt exists, and read and plan only then.
        """
        ...

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        """Replace ``expected`` by ``receipt`` if the stored one is still ``expected``
        (same status and attempt); otherwise raise ``FencedCommitError``."""
        ...

    async def commit_turn(self, record: TurnRecord) -> None:
        """Insert the turn, compare-and-set the thread version, apply the checkpoint's
        difference (see :class:`TurnRecord`) and append the events, atomically. Raise
        ``FencedCommitError`` if the version moved."""
        ...

    async def read_thread(self, thread_id: str) -> StoredThread | None:
        """The thread row with its message and fact rows, from one consistent snapshot."""
        ...

    async def read_receipts(
        self, thread_id: str | None, status: ReceiptStatus | None, tenant_id: str | None = None
    ) -> list[Receipt]:
        """The current receipts, oldest first, filtered by each argument that is not
        ``None`` (``tenant_id`` on the receipt's own tenant column)."""
        ...

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        """In one transaction: read the receipt, apply ``resolution`` (which raises for
        a bad state), write the receipt and append the returned event."""
        ...

    async def read_outbox(
        self, thread_id: str | None, after: int | None, limit: int
    ) -> list[OutboxEvent]: ...

    # -- the outbox relay (intention_kernel.outbox) ------------------------------------------
    # Publication state lives on each event row: ``published_at``, ``attempts``,
    # ``last_error``, ``retry_at``. A thread's events are published in ``seq`` order by
    # one relay at a time; a thread's first unpublished event blocks the ones after it.

    def claim_outbox(self, thread_id: str) -> AbstractAsyncContextManager[bool]:
        """Try, without waiting, to become the only relay publishing ``thread_id``; the
        block receives whether it did. Excludes relays in every process sharing the
        store (never turns), and is released if the holder dies."""
        ...

    async def pending_threads(self, now: datetime, limit: int) -> list[str]:
        """Up to ``limit`` threads whose first unpublished event is due (its ``retry_at``
        unset or not after ``now``), the oldest such event first."""
        ...

    async def read_unpublished(self, thread_id: str, limit: int) -> list[OutboxDelivery]:
        """The thread's first ``limit`` unpublished events, in ``seq`` order: a prefix of
        what is left to publish (an event is listed only after every earlier one)."""
        ...

    async def mark_published(self, thread_id: str, seqs: Sequence[int], at: datetime) -> None:
        """Record that the sink acknowledged these events of the thread."""
        ...

    async def mark_failed(
        self, thread_id: str, seq: int, attempts: int, error: str, retry_at: datetime
    ) -> None:
        """Record a failed attempt: set ``attempts`` (an absolute count, so that a repeated
        write is harmless), ``last_error`` and ``retry_at``."""
        ...

    async def outbox_backlog(self, failing_limit: int) -> OutboxBacklog: ...

    # -- deploy check, migration, retention (intention_kernel.operations) -------------------

    async def scan_threads(
        self, after: str | None, limit: int, below_revision: int | None
    ) -> list[tuple[str, StoredThread]]:
        """Up to ``limit`` threads with a checkpoint, in ``thread_id`` order after
        ``after``, with their rows; only those whose stored schema revision is below
        ``below_revision`` if given. Each thread is one consistent snapshot."""
        ...

    async def read_interactions(
        self, after: str | None, limit: int, owner: ThreadOwner | None
    ) -> list[tuple[str, StoredThread]]:
        """Up to ``limit`` threads with a committed checkpoint whose stored core contains
        :data:`INTERACTION_MARKER`, in ``thread_id`` order after ``after``, owned by
        ``owner`` if given (``ThreadOwner(None)``: threads without a tenant). Each with
        its core only, no message or fact rows. Every thread with an active interaction
        is among them; a few without may be too (the caller decodes each)."""
        ...

    async def rewrite_checkpoint(self, rewrite: CheckpointRewrite) -> None:
        """Replace the thread's checkpoint and all its rows if its version is still
        ``rewrite.version``; otherwise raise ``FencedCommitError``. Called under the
        thread's lock, in one short transaction."""
        ...

    async def prune_events(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` published events created before ``before`` (on a store
        that numbers positions late, only numbered ones); return how many."""
        ...

    async def prune_turns(
        self, before: datetime, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        """Drop the result of the first ``limit`` turns after ``after`` in key order that
        were created before ``before`` and still hold one, keeping each turn's key and
        request digest. Return how many were dropped and the last key dropped (``None``
        when fewer than ``limit`` were left). Turns pruned before are not read again."""
        ...


class _Transaction:
    """The ``tx`` handed to an operation: scope, checkpoint and effect coordination."""

    __slots__ = (
        "_checkpoint",
        "_closed",
        "_idle",
        "_inflight",
        "_owner",
        "_receipt_turns",
        "_refused",
        "_scope",
    )

    def __init__(
        self, owner: RecordedDurability, scope: TurnScope, checkpoint: KernelCheckpoint | None
    ) -> None:
        self._owner = owner
        self._scope = scope
        self._checkpoint = checkpoint
        # The effect calls still running, by key, with the task running each.
        self._inflight: dict[str, asyncio.Task[Any] | None] = {}
        self._idle: asyncio.Event | None = None  # made by ``settle`` only when it must wait
        self._closed = False
        # A receipt of another tenant was found: the turn must not commit, even if the
        # operation caught the error (a capability's ``except Exception``, or the runtime
        # turning it into a failed step), or it would take a thread that is not its own.
        self._refused: TenantMismatchError | None = None
        # The turn ID each receipt this turn met was completed under (see TurnRecord).
        self._receipt_turns: dict[str, str] = {}

    @property
    def scope(self) -> TurnScope:
        return self._scope

    @property
    def checkpoint(self) -> KernelCheckpoint | None:
        return self._checkpoint

    async def run_effect(self, key: str, fn: EffectFn, *, step_id: str) -> EffectResult[Any]:
        if self._closed:
            raise EffectUsageError(
                "run_effect called after the turn ended", key=key, thread_id=self._scope.thread_id
            )
        if not isinstance(key, str) or not key:
            raise EffectUsageError("an effect key must be a non-empty string", key=str(key))
        problem = text_problem(key) or (
            "it is not a non-empty string"
            if not isinstance(step_id, str) or not step_id
            else text_problem(step_id)
        )
        if problem is not None:  # both are stored in text columns of their own
            raise EffectUsageError(
                f"effect {key!r} (step {step_id!r}) cannot be recorded: {problem}",
                key=key,
                thread_id=self._scope.thread_id,
                turn_id=self._scope.turn_id,
            )
        if key in self._inflight:
            # A second concurrent call would read the first one's live `prepared`
            # receipt and mark it uncertain; refuse it instead.
            raise EffectUsageError(
                f"effect {key!r} is already running in this turn",
                key=key,
                thread_id=self._scope.thread_id,
                turn_id=self._scope.turn_id,
            )
        self._inflight[key] = asyncio.current_task()
        try:
            result = await self._owner._run_effect(self._scope, key, fn, step_id)
            self._receipt_turns[result.receipt.key] = result.receipt.turn_id
            return result
        except TenantMismatchError as exc:
            self._refused = exc
            raise
        finally:
            del self._inflight[key]
            if not self._inflight and self._idle is not None:
                self._idle.set()

    async def settle(self, *, cancel: bool) -> None:
        """Close the transaction to new effect calls and wait until every call still
        running (in a task the operation left behind) has recorded its outcome; with
        ``cancel``, cancel them first (each then records ``uncertain``).

        Called before the turn leaves the thread's lock. Without it, a call that outlived
        its operation would leave its receipt ``prepared`` under a free lock while its
        provider call still runs: the next holder (a turn, or an operator resolving it as
        not applied) would take a live attempt for a dead one.
        """
        self._closed = True
        if not self._inflight:
            return
        if cancel:
            self._cancel_inflight()
        idle = self._idle = asyncio.Event()
        interrupted = False
        while self._inflight:
            try:
                await idle.wait()
            except asyncio.CancelledError:
                # The receipts first, then the cancellation: the calls are cancelled too,
                # so that the wait ends as soon as each has recorded ``uncertain``.
                if not interrupted and not cancel:
                    self._cancel_inflight()
                interrupted = True
        if interrupted:
            raise asyncio.CancelledError

    def _cancel_inflight(self) -> None:
        current = asyncio.current_task()
        for task in self._inflight.values():
            if task is not None and task is not current:
                task.cancel()


class RecordedDurability:
    """A complete durability adapter over a :class:`Recorder`. Subclassed by each adapter."""

    #: How many threads' latest checkpoints each adapter keeps decoded in memory.
    CHECKPOINT_CACHE_SIZE = 1024

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        # A receipt's outcome is written even if the turn is cancelled meanwhile: by a
        # task of its own, unless the recorder's writes run to their end anyway (then
        # the task, a round of the event loop, would only cost time per effect).
        finishes = recorder.options.finishes_writes_when_cancelled
        self._settle: Callable[[Any], Awaitable[None]] = _awaited if finishes else _shielded
        self._opened = False
        self._open_lock = asyncio.Lock()
        # The checkpoint this adapter last committed or decoded, per thread. A turn whose
        # stored version still matches reuses it instead of reading and decoding the
        # whole document again; any other writer bumps the version, so a stale entry is
        # never used. Entries are shared and read as they were built: the runtime copies
        # what it changes (the facts, a ``DerivedFacts`` that shares their storage).
        # Each entry's rows are stored exactly, so the next commit may write a difference.
        self._checkpoints: OrderedDict[str, KernelCheckpoint] = OrderedDict()
        # Per cached thread, the JSON of its core's receipt index entries, for the next core.
        self._encoders: dict[str, CoreEncoder] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def _ready(self) -> Recorder:
        if not self._opened:
            async with self._open_lock:
                if not self._opened:
                    await self._recorder.open()
                    self._opened = True
        return self._recorder

    async def recorder(self) -> Recorder:
        """The opened recorder, for operations that work below the ``Durability`` contract
        (the outbox relay, the deploy check, migrations, retention)."""
        return await self._ready()

    def forget_checkpoint(self, thread_id: str) -> None:
        """Drop this adapter's decoded copy of the thread's checkpoint: an operation
        rewrote it in place at the same version, so the version no longer tells."""
        self._checkpoints.pop(thread_id, None)
        self._encoders.pop(thread_id, None)

    async def __aenter__(self) -> Self:
        await self._ready()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def exists(self) -> bool:
        """Whether the store already holds this adapter's schema; creates nothing.

        Opening an adapter creates its schema, so a tool that must not create a store
        (the operations commands) asks this first, and a mistyped URL is refused
        instead of shown as an empty store. Raises ``StoreError`` when the store cannot
        be reached, ``CorruptStoreError`` when it is damaged."""
        if self._opened:
            return True
        return await self._recorder.exists()

    async def aclose(self) -> None:
        if self._opened:
            self._opened = False
            await self._recorder.close()

    # -- turns -------------------------------------------------------------------------------

    async def with_turn(self, scope: TurnScope, operation: TurnOperation) -> TurnResult:
        check_id("thread_id", scope.thread_id)
        check_id("turn_id", scope.turn_id)
        if scope.tenant_id is not None:
            check_id("tenant_id", scope.tenant_id)
        recorder = await self._ready()
        # The version of the checkpoint held here, read before the lock: if another turn
        # of this process commits meanwhile, the recorder ships the newer checkpoint.
        cached = self._checkpoints.get(scope.thread_id)
        known = cached.version if cached else None
        async with self._recorder.start_turn(scope.thread_id, scope.turn_id, known) as start:
            if _faults.armed:
                _faults.reach(_faults.AFTER_LOCK)
            # A thread belongs to the tenant of its first committed turn, or before that
            # to the tenant of its first receipt (see ThreadOwner). A version-0 row with
            # no receipt only carries operator events and has no owner yet.
            if start.turn is not None:
                owner: ThreadOwner | None = ThreadOwner(
                    start.thread.tenant_id if start.thread else start.thread_tenant_id
                )
            else:
                owner = owner_of(start.thread, start.claimed_by)
            if not owns(owner, scope.tenant_id):
                raise TenantMismatchError(
                    f"thread {scope.thread_id!r} does not belong to tenant {scope.tenant_id!r}",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                )
            if start.turn is not None:
                return self._replay(scope, start.turn)
            thread = start.thread
            checkpoint, stored_in_rows = self._checkpoint(scope.thread_id, thread, cached)
            if _faults.armed:
                _faults.reach(_faults.AFTER_CHECKPOINT_LOAD)
            expected = thread.version if thread is not None else 0
            tx = _Transaction(self, scope, checkpoint)
            try:
                commit = await operation(tx)
            except BaseException:
                await tx.settle(cancel=True)
                raise
            await tx.settle(cancel=False)
            if tx._refused is not None:
                raise TenantMismatchError(
                    f"turn {scope.turn_id!r} met a receipt of another tenant on thread "
                    f"{scope.thread_id!r}; nothing was committed",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                    key=tx._refused.key,
                ) from tx._refused
            try:
                record = self._record(scope, expected, commit, checkpoint, stored_in_rows, tx)
            except ValueError as exc:  # pydantic's serialization errors included
                raise KernelError(
                    f"refusing to commit turn {scope.turn_id!r}: its result or checkpoint "
                    f"cannot be stored: {_describe(exc)}",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                ) from exc
            if _faults.armed:
                _faults.reach(_faults.BEFORE_COMMIT)
            if not _tracing.enabled():
                await recorder.commit_turn(record)
            else:
                with _tracing.span(
                    "intention_kernel.commit",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                    version=record.version,
                    events=len(record.events),
                ):
                    await recorder.commit_turn(record)
            if _faults.armed:
                _faults.reach(_faults.AFTER_COMMIT)
            self._remember(scope.thread_id, commit.checkpoint)
            return commit.result

    def _checkpoint(
        self, thread_id: str, thread: StoredThread | None, cached: KernelCheckpoint | None
    ) -> tuple[KernelCheckpoint | None, bool]:
        """The thread's current checkpoint (the cached one if still current, else decoded),
        and whether its rows are stored exactly, so that a commit may write a difference."""
        if thread is None or not thread.version:
            return None, True
        if thread.checkpoint is None:
            if cached is None or cached.version != thread.version:
                raise CorruptRecordError(
                    f"thread {thread_id!r} is at version {thread.version} but has no checkpoint",
                    thread_id=thread_id,
                )
            return cached, True
        checkpoint, stored_in_rows = _decode(thread_id, thread)
        if checkpoint.version != thread.version:
            raise CorruptRecordError(
                f"thread {thread_id!r} is at version {thread.version} but its "
                f"checkpoint says {checkpoint.version}",
                thread_id=thread_id,
            )
        if stored_in_rows:
            self._remember(thread_id, checkpoint)
        return checkpoint, stored_in_rows

    def _remember(self, thread_id: str, checkpoint: KernelCheckpoint) -> None:
        cache = self._checkpoints
        cache[thread_id] = checkpoint
        cache.move_to_end(thread_id)
        if len(cache) > self.CHECKPOINT_CACHE_SIZE:
            forgotten, _ = cache.popitem(last=False)
            self._encoders.pop(forgotten, None)

    def _replay(self, scope: TurnScope, stored: StoredTurn) -> TurnResult:
        if (
            scope.request_digest is not None
            and stored.request_digest is not None
            and scope.request_digest != stored.request_digest
        ):
            raise TurnConflictError(
                f"turn {scope.turn_id!r} of thread {scope.thread_id!r} was already committed "
                "for a different request; use a new turn ID for a new request",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        if stored.expired:
            raise TurnExpiredError(
                f"turn {scope.turn_id!r} of thread {scope.thread_id!r} was committed, and its "
                "result has since been pruned; it is not run again",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        return decode_result(stored.result, replayed=True, thread_id=scope.thread_id)

    def _record(
        self,
        scope: TurnScope,
        expected: int,
        commit: TurnCommit,
        previous: KernelCheckpoint | None,
        stored_in_rows: bool,
        tx: _Transaction,
    ) -> TurnRecord:
        if not isinstance(commit, TurnCommit):
            raise KernelError(f"operation must return a TurnCommit, got {type(commit).__name__}")
        result, checkpoint = commit.result, commit.checkpoint
        problems = []
        if (result.thread_id, result.turn_id) != (scope.thread_id, scope.turn_id):
            problems.append("the result names another thread or turn")
        if checkpoint.version != expected + 1:
            problems.append(f"checkpoint version {checkpoint.version} is not {expected + 1}")
        if result.checkpoint_version != checkpoint.version:
            problems.append("result.checkpoint_version differs from the checkpoint's version")
        if result.replayed:
            problems.append("a new result cannot be marked replayed")
        if problems:
            raise KernelError(
                "refusing to commit an inconsistent turn: " + "; ".join(problems),
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        messages = checkpoint.messages
        appended = (
            continuation(previous.messages, messages) if stored_in_rows and previous else None
        )
        if not stored_in_rows or (previous is not None and appended is None):
            # No stored base to compute a difference from: write every row anew.
            return self._new_record(
                scope,
                expected,
                commit,
                tx,
                messages=[encode_message(m) for m in messages],
                keep_messages=len(messages),
                facts=[(key, encode_fact(r)) for key, r in checkpoint.facts.items()],
                rewrite=True,
            )
        kept = len(previous.messages) if previous else 0
        if appended is None:  # the thread's first checkpoint
            appended = messages
        trimmed = max(kept + len(appended) - len(messages), 0)
        changed, removed = _changed_facts(previous.facts if previous else {}, checkpoint.facts)
        return self._new_record(
            scope,
            expected,
            commit,
            tx,
            messages=[encode_message(m) for m in appended],
            keep_messages=len(messages),
            trim_messages=trimmed,
            facts=[(key, encode_fact(checkpoint.facts[key])) for key in changed],
            removed_facts=removed,
        )

    def _new_record(
        self, scope: TurnScope, expected: int, commit: TurnCommit, tx: _Transaction, **rows: Any
    ) -> TurnRecord:
        checkpoint = commit.checkpoint
        announced = tuple(commit.announced)
        # A key this transaction did not meet through run_effect is marked too: only a
        # receipt known to carry this turn ID may rely on the turn row.
        turns, turn_id = tx._receipt_turns, scope.turn_id
        marks = tuple(k for k in announced if turns.get(k) != turn_id) if announced else ()
        encoder = self._encoders.get(scope.thread_id)
        if encoder is None:
            if len(self._encoders) >= self.CHECKPOINT_CACHE_SIZE:
                self._encoders.clear()  # threads whose commits failed; rare
            encoder = self._encoders[scope.thread_id] = CoreEncoder()
        return TurnRecord(
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
            tenant_id=scope.tenant_id,
            request_digest=scope.request_digest,
            expected_version=expected,
            version=checkpoint.version,
            result=encode_result(commit.result),
            checkpoint=encoder.encode(checkpoint),
            schema_revision=checkpoint.schema_revision,
            fingerprint=checkpoint.agent_fingerprint,
            events=tuple(commit.events),
            created_at=utcnow(),
            announced=announced,
            mark_announced=marks,
            **rows,
        )

    # -- effects -----------------------------------------------------------------------------

    async def _run_effect(
        self, scope: TurnScope, key: str, fn: EffectFn, step_id: str
    ) -> EffectResult[Any]:
        recorder = self._recorder
        now = utcnow()

        def plan(existing: Receipt | None) -> EffectPlan:
            return plan_effect(
                existing,
                thread_id=scope.thread_id,
                key=key,
                turn_id=scope.turn_id,
                step_id=step_id,
                now=now,
                tenant_id=scope.tenant_id,
            )

        decided = await recorder.claim_effect(scope.thread_id, key, plan)
        if decided.outcome == "replay":
            assert decided.existing is not None
            return EffectResult(decided.existing.value, decided.existing, replayed=True)
        if decided.outcome == "fail_closed":
            receipt = decided.write or decided.existing
            assert receipt is not None
            raise EffectUncertainError(
                f"effect {key!r} on thread {scope.thread_id!r} may already have been applied "
                f"(receipt {receipt.id} is uncertain); it will not be retried until an operator "
                "resolves it",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
                key=key,
                receipt=receipt,
            )
        prepared = decided.write
        assert prepared is not None
        if _faults.armed:
            _faults.reach(_faults.AFTER_RECEIPT_PREPARED)
        authority = EffectAuthority(key, key, prepared.id, prepared.attempt)
        cancelled_after_return = False
        try:
            if is_async_callable(fn):
                value = await fn(authority)
            else:
                value, cancelled_after_return = await _call_in_thread(fn, authority)
                if inspect.isawaitable(value):  # a sync function (a lambda) wrapping a coroutine
                    value = await value
        except EffectNotAppliedError as exc:
            failed = settle(prepared, "failed", now=utcnow(), error=_describe(exc))
            await self._settle(recorder.write_receipt(failed, prepared))
            exc.thread_id, exc.turn_id, exc.key, exc.receipt = (
                scope.thread_id,
                scope.turn_id,
                key,
                failed,
            )
            raise
        except (Exception, asyncio.CancelledError) as exc:
            uncertain = settle(prepared, "uncertain", now=utcnow(), error=_describe(exc))
            await self._settle(recorder.write_receipt(uncertain, prepared))
            raise EffectUncertainError(
                f"effect {key!r} on thread {scope.thread_id!r} failed with {_describe(exc)}; "
                "it may have been applied, so it is recorded as uncertain",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
                key=key,
                receipt=uncertain,
            ) from exc
        try:
            stored = normalize(value)
        except (TypeError, ValueError) as exc:
            # The write happened but its value cannot be recorded; replaying it later
            # could not return the same value, so fail closed for an operator.
            uncertain = settle(
                prepared,
                "uncertain",
                now=utcnow(),
                error=f"the provider returned a value that is not JSON-serializable: {exc}",
            )
            await self._settle(recorder.write_receipt(uncertain, prepared))
            raise EffectValueError(
                f"effect {key!r} returned a value that cannot be stored ({exc}); recorded as "
                "uncertain",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
                key=key,
                receipt=uncertain,
            ) from exc
        completed = settle(prepared, "completed", now=utcnow(), value=stored)
        await self._settle(recorder.write_receipt(completed, prepared))
        if cancelled_after_return:
            raise asyncio.CancelledError  # delivered now that the outcome is recorded
        if _faults.armed:
            _faults.reach(_faults.AFTER_RECEIPT_COMPLETED)
        return EffectResult(stored, completed)

    # -- inspection and operations -----------------------------------------------------------

    async def load_checkpoint(
        self, thread_id: str, *, owner: ThreadOwner | None = None
    ) -> KernelCheckpoint | None:
        """The latest committed checkpoint of a thread, or ``None``.

        With ``owner``, only for a caller of that tenant (``ThreadOwner(None)``: a caller
        without one): a thread it may not see (:func:`owns`) reads as ``None``, exactly
        like a missing one. The owner is judged on the snapshot the checkpoint comes
        from; judged on an earlier read, a first turn of another tenant committing in
        between would be shown to the caller."""
        recorder = await self._ready()
        thread = await recorder.read_thread(check_id("thread_id", thread_id))
        if thread is None or thread.checkpoint is None:
            return None
        if owner is not None and not owns(owner_of(thread, None), owner.tenant_id):
            return None
        return _decode(thread_id, thread)[0]

    async def thread_owner(self, thread_id: str) -> ThreadOwner | None:
        """The owner of a thread (see :class:`ThreadOwner`), or ``None`` while nothing
        durable was written on it (the first turn of any tenant claims it).

        Two reads, so the answer may be older than the caller's next read: a caller
        that then reads or acts on the thread decides with ``owner=`` instead
        (:meth:`load_checkpoint`, :meth:`resolve_receipt`)."""
        recorder = await self._ready()
        return await self._owner(recorder, check_id("thread_id", thread_id))

    @staticmethod
    async def _owner(recorder: Recorder, thread_id: str) -> ThreadOwner | None:
        thread = await recorder.read_thread(thread_id)
        if thread is not None and thread.version:
            return owner_of(thread, None)
        # No committed turn: the thread's earliest receipt, if any, claimed it.
        receipts = await recorder.read_receipts(thread_id, None)
        return owner_of(thread, ThreadOwner(receipts[0].tenant_id) if receipts else None)

    async def pending_interactions(
        self, *, owner: ThreadOwner | None = None, after: str | None = None, limit: int = 100
    ) -> list[PendingInteraction]:
        """Up to ``limit`` threads whose latest checkpoint has an active interaction (a
        pending confirmation), in ``thread_id`` order after ``after`` (pass the last one
        to read on). Only the threads of ``owner`` if given: ``ThreadOwner("acme")``,
        or ``ThreadOwner(None)`` for threads without a tenant; ``None`` sees every
        tenant, like every operations method.

        The store selects candidates by text (:data:`INTERACTION_MARKER`) and each is
        decoded here, so the answer is exactly the decoded checkpoints' interactions; a
        candidate that is corrupt raises ``CorruptRecordError`` naming its thread. The
        cost grows with the number of threads (each core is searched, none parsed): an
        operator's query, not a turn's."""
        recorder = await self._ready()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRequestError(f"limit must be a positive integer, got {limit!r}")
        if after is not None:
            check_id("thread_id", after)
        if owner is not None and owner.tenant_id is not None:
            check_id("tenant_id", owner.tenant_id)
        found: list[PendingInteraction] = []
        cursor = after
        while len(found) < limit:
            wanted = limit - len(found)
            page = await recorder.read_interactions(cursor, wanted, owner)
            for thread_id, thread in page:
                checkpoint = _decode(thread_id, thread)[0]
                if checkpoint.interaction is not None:  # not a nested "interaction" key
                    found.append(
                        PendingInteraction(
                            thread_id, thread.tenant_id, checkpoint.version, checkpoint.interaction
                        )
                    )
            if len(page) < wanted:
                break
            cursor = page[-1][0]
        return found

    async def list_receipts(
        self,
        thread_id: str | None = None,
        status: ReceiptStatus | str | None = None,
        *,
        tenant_id: str | None = None,
    ) -> list[Receipt]:
        """The current receipt per ``(thread_id, key)``, oldest first.

        Like every inspection and operations method, this is operator-level: it sees
        every tenant's receipts unless ``tenant_id`` filters them (on the tenant stored
        with each receipt; ``None`` does not filter).
        """
        recorder = await self._ready()
        if thread_id is not None:
            check_id("thread_id", thread_id)
        wanted = _receipt_status(status) if status is not None else None
        if tenant_id is None:
            return await recorder.read_receipts(thread_id, wanted)
        return await recorder.read_receipts(thread_id, wanted, check_id("tenant_id", tenant_id))

    async def resolve_receipt(
        self,
        thread_id: str,
        key: str,
        *,
        applied: bool,
        value: Any = None,
        note: str | None = None,
        actor: str | None = None,
        owner: ThreadOwner | None = None,
    ) -> Receipt:
        """Reconcile an uncertain receipt: the write was ``applied`` (later calls return
        ``value``) or not (a later call may retry). Emits ``receipt.resolved``.

        With ``owner``, only for a caller of that tenant (``ThreadOwner(None)``: a caller
        without one): a receipt on a thread it may not act on (:func:`owns`) raises
        ``ReceiptNotFoundError``, exactly like a missing one. The thread's owner is
        judged under the thread's lock, which every turn holds from before its first
        write to its commit, and the receipt's own tenant in the transaction that
        resolves it; judged before the lock, a first turn of another tenant still
        running could make the receipt afterwards and have it resolved.

        A malformed request (a ``value`` that is not JSON, such as NaN or infinity) is
        refused with ``InvalidRequestError`` before anything is read or written."""
        recorder = await self._ready()
        check_id("thread_id", thread_id)
        stored_value = _resolution_request(key, applied, value, note, actor)
        if owner is not None and owner.tenant_id is not None:
            check_id("tenant_id", owner.tenant_id)

        def missing(suggestions: tuple[str, ...] = ()) -> ReceiptNotFoundError:
            return ReceiptNotFoundError(
                missing_receipt_message(thread_id, key, suggestions),
                thread_id=thread_id,
                key=key,
                suggestions=suggestions,
            )

        attempts_outlive_lock = recorder.options.attempts_outlive_lock

        def resolution(existing: Receipt | None) -> tuple[Receipt, EventDraft]:
            if existing is None:
                raise missing()
            if owner is not None and not owns(ThreadOwner(existing.tenant_id), owner.tenant_id):
                raise missing()
            resolved = resolve(
                existing,
                applied=applied,
                value=stored_value,
                note=note,
                actor=actor,
                now=utcnow(),
                attempt_may_run=attempts_outlive_lock,
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

        async with recorder.lock(thread_id):
            if owner is not None and not owns(
                await self._owner(recorder, thread_id), owner.tenant_id
            ):
                raise missing()
            try:
                return await recorder.resolve_receipt(thread_id, key, resolution)
            except ReceiptNotFoundError:
                # Still under the lock, on a thread the caller may act on: only receipts
                # it may see are offered (a receipt's own tenant is the thread's).
                receipts = await recorder.read_receipts(thread_id, None)
                visible = [
                    r.key
                    for r in receipts
                    if owner is None or owns(ThreadOwner(r.tenant_id), owner.tenant_id)
                ]
                raise missing(suggest_keys(key, visible)) from None

    async def read_outbox(
        self, thread_id: str | None = None, after: int | None = None, limit: int = 100
    ) -> list[OutboxEvent]:
        """Committed events in ``position`` order, after the given position."""
        recorder = await self._ready()
        if limit < 1:
            raise InvalidRequestError(f"limit must be at least 1, got {limit!r}")
        return await recorder.read_outbox(thread_id, after, limit)


def suggest_keys(key: str, stored: Sequence[str]) -> tuple[str, ...]:
    """The stored keys ``key`` may have meant: the same key with its capability prefix
    (a receipt is stored as ``capability_id:key``, and an operator may copy the key a
    capability passed to ``run_effect``)."""
    return tuple(k for k in stored if k != key and k.partition(":")[2] == key)


def missing_receipt_message(thread_id: str, key: str, suggestions: Sequence[str] = ()) -> str:
    """How a missing receipt is reported, with the keys that were perhaps meant."""
    text = f"no receipt for key {key!r} on thread {thread_id!r}"
    if suggestions:
        text += "; did you mean " + " or ".join(repr(k) for k in suggestions) + "?"
    return text


def _receipt_status(status: ReceiptStatus | str) -> ReceiptStatus:
    try:
        return ReceiptStatus(status)
    except ValueError:
        known = ", ".join(s.value for s in ReceiptStatus)
        raise InvalidRequestError(
            f"unknown receipt status {status!r}; expected one of {known}"
        ) from None


def _resolution_request(
    key: object, applied: object, value: Any, note: object, actor: object
) -> Any:
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
            f"(no NaN, infinity, sets or objects): {_describe(exc)}",
            key=key,
        ) from exc


def _decode(thread_id: str, thread: StoredThread) -> tuple[KernelCheckpoint, bool]:
    """The stored checkpoint, and whether its rows are exactly what a commit of it would
    store: stored in rows (not as one document) and of the current schema revision (a
    migrated checkpoint's rows are of an older shape, so its next commit rewrites them)."""
    assert thread.checkpoint is not None
    core = thread.checkpoint
    text, stored_in_rows = assemble_checkpoint(core, thread.messages, thread.facts)
    # The core is encoded with ``schema_revision`` first; anything else is just not
    # trusted as exact, which costs one full rewrite and is always safe.
    exact = stored_in_rows and core.startswith(f'{{"schema_revision":{current_revision()},')
    return decode_checkpoint(text, thread_id=thread_id), exact


def _changed_facts(
    previous: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[Sequence[str], Sequence[str]]:
    """Keys of ``current`` that are new or replaced since ``previous``, and removed keys."""
    if current is previous:
        return (), ()
    if isinstance(current, DerivedFacts) and current.base is previous:
        return current.changed, ()  # what the runtime recorded: no need to look at the rest
    changed = [key for key, record in current.items() if previous.get(key) is not record]
    return changed, [key for key in previous if key not in current]


def _describe(exc: BaseException) -> str:
    # A receipt's error is stored as text: NUL (which PostgreSQL text cannot hold) and
    # lone surrogates (which UTF-8 cannot encode) are escaped, the same on every store.
    text = storable_text(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _ThreadCall:
    """A sync effect function's call in a worker thread, and whether it returned."""

    __slots__ = ("returned", "value")

    def __init__(self) -> None:
        self.returned = False
        self.value: Any = None

    def __call__(self, fn: EffectFn, authority: EffectAuthority) -> Any:
        value = fn(authority)
        self.value, self.returned = value, True  # ``value`` first: a reader checks ``returned``
        return value


async def _call_in_thread(fn: EffectFn, authority: EffectAuthority) -> tuple[Any, bool]:
    """Call a sync effect function in the loop's default executor, in a copy of the
    caller's context (as ``asyncio.to_thread`` does), and return its value and whether
    the caller was cancelled after it returned.

    A blocking provider SDK would otherwise stall every turn of the process. A
    cancellation while the call runs raises at once and the thread runs on unheard:
    the receipt becomes ``uncertain`` (whatever the call does later, it is never
    recorded, so never ``failed``). One that lands after the call returned, before the
    loop took its value, must not throw a known outcome away: the value is returned, and
    the caller records it before it lets the cancellation through. A call still queued
    for a thread is cancelled with the future and never starts.
    """
    call = _ThreadCall()
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    try:
        return await loop.run_in_executor(None, context.run, call, fn, authority), False
    except asyncio.CancelledError:
        value = call.value
        if not call.returned or inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never started: nothing ran, and no "never awaited" warning
            raise
        return value, True


async def _awaited(write: Any) -> None:
    await write


async def _shielded(write: Any) -> None:
    """Persist a receipt transition even if the surrounding task is being cancelled.

    Losing this write would leave the receipt ``prepared``, which later fails
    closed anyway, so correctness never depends on it; it keeps the state precise.
    """
    task = asyncio.ensure_future(write)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        # Wait without propagating further cancels into the write itself.
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        task.result()
        raise
