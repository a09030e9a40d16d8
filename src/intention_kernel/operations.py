"""Operations on a store: the deploy check, checkpoint migrations and retention.

Each works below the ``Durability`` contract. It needs a durability that hands out
its recorder (:class:`~intention_kernel.durability.abc.Recorded`); every bundled
adapter does. Each works in batches of short transactions. So it runs safely beside
live turns:

- :func:`check_checkpoints` reads every stored checkpoint. It says which threads an
  agent would refuse: a newer schema revision, a fingerprint it does not declare
  compatible, a record that does not decode. Run it before a deploy.
- :func:`migrate_checkpoints` rewrites checkpoints of older schema revisions in place.
  It takes one thread at a time, under that thread's lock, fenced on the thread's
  version. The lock is held for one read and one short write. It is resumable: a
  thread is selected by its stored revision, so a second run continues where the
  first stopped.
- :func:`prune` deletes published outbox events and drops old turn results. It keeps
  each committed ``(thread_id, turn_id)``. So a very late delivery of a pruned turn is
  refused with :class:`~intention_kernel.errors.TurnExpiredError`, never run again.
  Receipts are never pruned: they are what keeps a write from running twice.
- :func:`expire_interactions` closes every overdue interaction (a confirmation not
  answered by its ``expires_at``), each in a turn of its own: see the function.

The decisions (what a stored checkpoint means for an agent) are the same pure
functions the turns use.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from intention_kernel._agent import Agent, compile_agent
from intention_kernel._checkpoint import (
    CheckpointDelta,
    Interaction,
    Migration,
    check_compatible,
    current_revision,
)
from intention_kernel._deadlines import (
    Clock,
    expired_event,
    expired_step,
    expiry_turn_id_of,
    overdue,
    read_clock,
    system_clock,
)
from intention_kernel._effects import utcnow
from intention_kernel._replies import Replies
from intention_kernel._timers import interaction_timers
from intention_kernel._turns import (
    EventDraft,
    TurnCommit,
    TurnResult,
    TurnScope,
    committed_event,
    request_digest,
)
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability._contract.recorders import (
    Expirable,
    MaintenanceRecorder,
    Migratable,
    MigrationRecorder,
    Recorded,
    TimerRecorder,
)
from intention_kernel.durability._layout import rewrite_of
from intention_kernel.durability._layout.codec import read_checkpoint, stamp
from intention_kernel.errors import (
    CheckpointCompatibilityError,
    CheckpointError,
    CorruptRecordError,
    FencedCommitError,
    KernelError,
    ThreadBusyError,
    TurnConflictError,
    TurnExpiredError,
)

__all__ = [
    "CheckReport",
    "ExpiryReport",
    "MigrationReport",
    "PruneReport",
    "RefusedThread",
    "check_checkpoints",
    "expire_interactions",
    "migrate_checkpoints",
    "prune",
]

RefusalReason = Literal[
    "newer_revision", "foreign_fingerprint", "corrupt", "busy", "moved", "conflict", "failed"
]


@dataclass(frozen=True, slots=True)
class RefusedThread:
    """A thread an agent would refuse (or a migration could not rewrite), and why."""

    thread_id: str
    reason: RefusalReason
    detail: str
    schema_revision: int | None = None
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What :func:`check_checkpoints` found: stored checkpoints counted by schema revision
    and agent fingerprint, and the threads the agent would refuse."""

    fingerprint: str
    threads: int
    revisions: dict[int | None, int]
    fingerprints: dict[str | None, int]
    refused: tuple[RefusedThread, ...]

    @property
    def ok(self) -> bool:
        return not self.refused


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What :func:`migrate_checkpoints` did: threads rewritten, and those left as they were."""

    revision: int
    migrated: int = 0
    failed: tuple[RefusedThread, ...] = ()


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What :func:`prune` removed.

    - events deleted.
    - turn results dropped.
    - journal entries (recorded model responses) of turns that never committed, deleted.
    - timers fired (or void) before the cutoff, deleted.
    """

    cutoff: datetime
    events: int = 0
    turns: int = 0
    journal: int = 0
    timers: int = 0


async def check_checkpoints(
    store: Recorded[MaintenanceRecorder],
    agent: Agent,
    *,
    batch: int = 500,
    migrations: Sequence[Migration] | None = None,
) -> CheckReport:
    """Read every stored checkpoint and say which threads ``agent`` would refuse.

    Counts are by the revision and fingerprint the stored document names (``None``
    when it names none it can be read for). Nothing is written.
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    compiled = compile_agent(agent)
    recorder = await store.recorder()
    revisions: Counter[int | None] = Counter()
    fingerprints: Counter[str | None] = Counter()
    refused: list[RefusedThread] = []
    after: str | None = None
    while True:
        rows = await recorder.scan_threads(after, batch, None)
        for thread_id, thread in rows:
            revision, fingerprint = stamp(thread)
            revisions[revision] += 1
            fingerprints[fingerprint] += 1
            try:
                checkpoint = read_checkpoint(thread_id, thread, migrations)
                check_compatible(
                    checkpoint,
                    fingerprint=compiled.fingerprint,
                    compatible=compiled.compatible,
                    thread_id=thread_id,
                )
            except CheckpointCompatibilityError as exc:
                reason: RefusalReason = (
                    "newer_revision" if exc.schema_revision is not None else "foreign_fingerprint"
                )
                refused.append(RefusedThread(thread_id, reason, str(exc), revision, fingerprint))
            except CorruptRecordError as exc:
                refused.append(RefusedThread(thread_id, "corrupt", str(exc), revision, fingerprint))
        if len(rows) < batch:
            break
        after = rows[-1][0]
    return CheckReport(
        compiled.fingerprint,
        sum(revisions.values()),
        dict(revisions),
        dict(fingerprints),
        tuple(refused),
    )


async def migrate_checkpoints(
    store: Migratable,
    *,
    batch: int = 100,
    migrations: Sequence[Migration] | None = None,
) -> MigrationReport:
    """Rewrite every checkpoint of an older schema revision as the current revision.

    Threads are taken ``batch`` at a time. Each is migrated under its own lock, held
    for one read and one short write. So live turns wait at most that long. Some
    threads are reported in ``failed`` and left as they were. Such a thread moved on
    (a turn committed meanwhile), stayed busy, or cannot be decoded. Run the
    migration again to retry those.
    Run it once every worker runs the library that knows the new revision.
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    current = current_revision() if migrations is None else len(migrations) + 1
    recorder = await store.recorder()
    migrated, failed = 0, []
    after: str | None = None
    while True:
        rows = await recorder.scan_threads(after, batch, current)
        for thread_id, _ in rows:
            try:
                async with recorder.lock(thread_id):
                    thread = await recorder.read_thread(thread_id)
                    if thread is None or thread.checkpoint is None:
                        continue
                    revision, _ = stamp(thread)
                    if revision is not None and revision >= current:
                        continue  # migrated meanwhile, by another run or a turn
                    checkpoint = read_checkpoint(thread_id, thread, migrations)
                    rewrite = rewrite_of(thread_id, checkpoint, recorder.options)
                    await recorder.rewrite_checkpoint(rewrite)
                    store.forget_checkpoint(thread_id)
                    migrated += 1
            except ThreadBusyError as exc:
                failed.append(RefusedThread(thread_id, "busy", str(exc)))
            except FencedCommitError as exc:
                failed.append(RefusedThread(thread_id, "moved", str(exc)))
            except CheckpointError as exc:
                reason: RefusalReason = (
                    "newer_revision" if isinstance(exc, CheckpointCompatibilityError) else "corrupt"
                )
                failed.append(RefusedThread(thread_id, reason, str(exc)))
        if len(rows) < batch:
            break
        after = rows[-1][0]
    return MigrationReport(current, migrated, tuple(failed))


async def prune(
    store: Recorded[MigrationRecorder],  # maintenance, and the thread locks
    *,
    older_than: timedelta,
    batch: int = 1000,
    now: datetime | None = None,
) -> PruneReport:
    """Delete published outbox events and drop turn results created before
    ``now - older_than``, ``batch`` rows per transaction.

    Unpublished events are kept whatever their age (the relay still owes them). A
    pruned turn keeps its ``(thread_id, turn_id)`` and request digest: delivering it
    again raises ``TurnExpiredError`` (or ``TurnConflictError`` for another request).
    A commit deletes its own turn's journal. The journal of a turn that never committed
    is deleted once all of its entries are older than the cutoff. A delivery of that
    turn after this asks the model again for every round, from the first.

    A turn's journal goes as a whole, under its thread's lock, or not at all. Entries
    pruned one by one by age could leave a turn's later rounds without its first ones.
    A redelivery would then go on from a transcript no delivery produced. Without the
    lock, a redelivery running meanwhile could record a round after the older ones
    were deleted. A thread busy with a turn is skipped; a later run prunes it.
    Timers that fired (or were void) before the cutoff are deleted; pending ones stay.
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    if older_than < timedelta(0):
        raise ValueError("older_than must not be negative")
    try:
        cutoff = (now or utcnow()) - older_than
    except OverflowError:
        raise ValueError(f"older_than={older_than} reaches back before year 1") from None
    recorder = await store.recorder()
    events = turns = 0
    while True:
        deleted = await recorder.prune_events(cutoff, batch)
        events += deleted
        if deleted < batch:
            break
    after: tuple[str, str] | None = None
    while True:
        dropped, after = await recorder.prune_turns(cutoff, after, batch)
        turns += dropped
        if after is None:
            break
    journal = 0
    stale: tuple[str, str] | None = None
    while True:
        found = await recorder.stale_journals(cutoff, stale, batch)
        for thread_id, turn_id in found:
            try:
                async with recorder.lock(thread_id, wait=False):
                    journal += await recorder.prune_journal(thread_id, turn_id, cutoff)
            except ThreadBusyError:
                continue  # a turn runs on the thread, perhaps this one redelivered
        if len(found) < batch:
            break
        stale = found[-1]
    timers = 0
    if isinstance(recorder, TimerRecorder):
        # A settled timer's row goes with its turn's result: its turn ID is kept.
        while True:
            deleted = await recorder.prune_timers(cutoff, batch)
            timers += deleted
            if deleted < batch:
                break
    return PruneReport(cutoff, events, turns, journal, timers)


@dataclass(frozen=True, slots=True)
class ExpiryReport:
    """What :func:`expire_interactions` did: interactions closed as expired (by this run;
    one another sweep closed first is not counted), and threads it could not reach."""

    now: datetime
    expired: int = 0
    failed: tuple[RefusedThread, ...] = ()


class _NotOverdue(Exception):
    """Raised inside a sweep's turn to commit nothing.

    Under the lock, the interaction seen in the scan turned out to have changed. A turn
    answered, replaced or expired it meanwhile."""


async def expire_interactions(
    store: Expirable,
    *,
    clock: Clock = system_clock,
    batch: int = 100,
    replies: Replies | None = None,
) -> ExpiryReport:
    """Close every interaction whose ``expires_at`` has passed, as the next turn on its
    thread would.

    This is for operators and cron. Without it, an abandoned confirmation stays open
    until someone writes to the thread again. Its ``interaction.expired`` event is
    delayed until then too.

    Each overdue interaction is closed by a turn of its own through ``with_turn``. That
    turn holds the thread's lock and has turn ID ``expire:<interaction id>``. Three
    things commit together, or not at all:

    - the next checkpoint: one version up, without the interaction and its held
      operation, messages and facts untouched.
    - ``interaction.expired``.
    - ``turn.committed``.

    A sweep run again, or two at once, closes each interaction once. The second
    delivery of its turn ID is a replay.
    Under the lock the decision is made again, at the clock's time then: an interaction
    answered meanwhile is left alone. No agent code runs: the checkpoint keeps the
    fingerprint it was written under, so the sweep needs no ``--agent``. ``replies``
    words the stored turns' reply (``Replies()``, the default wording, unless given).

    A thread the sweep cannot close is reported in ``failed`` and left as it was. The
    sweep goes on to the next. Such a thread is one of these:

    - busy past the lock timeout.
    - its checkpoint cannot be read.
    - a client's turn took its expiry turn ID before the kernel reserved the prefix
      (``conflict``; the thread's next turn expires it).

    Any other
    refusal of the store is reported as ``failed``. Run the sweep again to retry them.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError("batch must be at least 1")
    wording = replies if replies is not None else Replies()
    recorder = await store.recorder()
    now = read_clock(clock)
    expired, failed = 0, []
    after: str | None = None
    while True:
        rows = await recorder.read_interactions(after, batch, None)
        for thread_id, thread in rows:
            try:
                checkpoint = read_checkpoint(thread_id, thread, None)
            except CheckpointError as exc:
                failed.append(RefusedThread(thread_id, _sweep_reason(exc), str(exc)))
                continue
            active = checkpoint.interaction
            if active is None or not overdue(active, now):
                continue
            try:
                result = await _expire(store, thread_id, thread.tenant_id, active, clock, wording)
            except _NotOverdue:
                continue
            except KernelError as exc:
                # One thread's refusal must not stop the sweep: the threads after it
                # would then never expire, on this run or any other.
                failed.append(RefusedThread(thread_id, _sweep_reason(exc), str(exc)))
                continue
            if not result.replayed:
                expired += 1
        if len(rows) < batch:
            break
        after = rows[-1][0]
    return ExpiryReport(now, expired, tuple(failed))


async def _expire(
    store: Expirable,
    thread_id: str,
    tenant_id: str | None,
    seen: Interaction,
    clock: Clock,
    replies: Replies,
) -> TurnResult:
    """Close ``seen`` on ``thread_id`` in a turn of its own.

    It closes only if ``seen`` is still the active interaction and overdue when the
    turn holds the lock. Otherwise it raises ``_NotOverdue``."""
    scope = expiry_scope(thread_id, tenant_id, seen.id)

    async def operation(tx: TurnTransaction) -> TurnCommit:
        commit = expiry_commit(tx, seen.id, clock, replies)
        if commit is None:
            raise _NotOverdue
        return commit

    return await store.with_turn(scope, operation)


def reminder_commit(
    tx: TurnTransaction, interaction_id: str, now: datetime, replies: Replies
) -> TurnCommit | None:
    """The commit of a reminder that interaction ``interaction_id`` still waits and
    expires soon (``remind_before``); ``None`` if it is no longer active, or overdue.
    The turn changes nothing but the version: its reply and ``interaction.reminded``
    carry the prompt again."""
    checkpoint = tx.checkpoint
    active = checkpoint.interaction if checkpoint is not None else None
    if checkpoint is None or active is None or active.id != interaction_id:
        return None
    if overdue(active, now):
        return None  # too late to remind: the expiry closes it
    version = checkpoint.version + 1
    result = TurnResult(
        thread_id=tx.scope.thread_id,
        turn_id=tx.scope.turn_id,
        replayed=False,
        reply=replies.reminder(active),
        interaction=active,
        checkpoint_version=version,
    )
    assert active.expires_at is not None
    reminded = EventDraft(
        "interaction.reminded",
        {
            "interaction_id": active.id,
            "capability_id": active.capability_id,
            "prompt": active.prompt,
            "expires_at": active.expires_at.isoformat(),
        },
    )
    following = dataclasses.replace(checkpoint, version=version)
    events = (reminded, committed_event(version, ()))
    return TurnCommit(result, following, events, delta=CheckpointDelta(checkpoint.version))


def expiry_scope(thread_id: str, tenant_id: str | None, interaction_id: str) -> TurnScope:
    """The scope of the turn that expires ``interaction_id``: the sweep's and the expiry
    timer's are the same, so that between them it is expired once."""
    return TurnScope(
        thread_id,
        expiry_turn_id_of(interaction_id),
        tenant_id,
        request_digest(None, {"expire_interaction": interaction_id}),
    )


def expiry_commit(
    tx: TurnTransaction, interaction_id: str, clock: Clock, replies: Replies
) -> TurnCommit | None:
    """The commit that closes interaction ``interaction_id`` as expired, decided under
    the thread's lock; ``None`` if it is no longer the active one, or not overdue."""
    checkpoint = tx.checkpoint
    active = checkpoint.interaction if checkpoint is not None else None
    if checkpoint is None or active is None or active.id != interaction_id:
        return None
    now = read_clock(clock)
    if not overdue(active, now):
        return None  # the clock went back, or a test moved it
    version = checkpoint.version + 1
    step = expired_step(active)
    following = dataclasses.replace(
        checkpoint,
        version=version,
        agenda=tuple(a for a in checkpoint.agenda if a.interaction_id != active.id),
        interaction=None,
    )
    result = TurnResult(
        thread_id=tx.scope.thread_id,
        turn_id=tx.scope.turn_id,
        replayed=False,
        reply=replies.expired(active),
        interaction=None,
        steps=(step,),
        checkpoint_version=version,
    )
    events = (expired_event(active), committed_event(version, (step,)))
    # The interaction's expiry and reminder timers go with it: nothing is left to fire.
    timers = interaction_timers(tx.scope.thread_id, None, active, None, None, now)
    # Only the core changes: no message, fact or receipt index row is written.
    return TurnCommit(
        result, following, events, delta=CheckpointDelta(checkpoint.version), timers=tuple(timers)
    )


# -- helpers -----------------------------------------------------------------------------------


def _sweep_reason(error: KernelError) -> RefusalReason:
    """How the sweep reports a thread whose expiry turn raised ``error``."""
    if isinstance(error, ThreadBusyError):
        return "busy"
    if isinstance(error, CheckpointCompatibilityError):
        return "newer_revision"
    if isinstance(error, CheckpointError):
        return "corrupt"
    if isinstance(error, TurnConflictError | TurnExpiredError):
        return "conflict"
    return "failed"
