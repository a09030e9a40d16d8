"""The ``tx`` a turn's operation receives inside ``with_turn``: its scope, its
checkpoint, the effect calls it makes, each settled before the turn ends, and the
values it records in the journal (``recorded``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from intention_kernel._json import describe_error, dump_value, load_value, normalize, text_problem
from intention_kernel.checkpoint import KernelCheckpoint
from intention_kernel.durability.records import JournalEntry
from intention_kernel.effects import EffectFn, EffectOrigin, EffectResult, utcnow
from intention_kernel.errors import (
    CorruptRecordError,
    EffectUsageError,
    JournalError,
    TenantMismatchError,
    TurnConflictError,
)
from intention_kernel.turns import TurnScope

if TYPE_CHECKING:
    from intention_kernel.durability.contract import JournalRecorder

__all__ = ["EffectRunner", "Transaction"]

#: Runs one effect call of a turn: ``(scope, key, fn, step_id, actor, origin)``.
EffectRunner = Callable[
    [TurnScope, str, EffectFn, str, str | None, EffectOrigin | None],
    Awaitable[EffectResult[Any]],
]


class Transaction:
    """The ``tx`` handed to an operation: scope, checkpoint and effect coordination."""

    __slots__ = (
        "_checkpoint",
        "_closed",
        "_idle",
        "_inflight",
        "_journal",
        "_journaled",
        "_receipt_turns",
        "_recorded",
        "_recording",
        "_refused",
        "_run",
        "_scope",
    )

    def __init__(
        self,
        run: EffectRunner,
        scope: TurnScope,
        checkpoint: KernelCheckpoint | None,
        journal: JournalRecorder,
    ) -> None:
        self._run = run
        self._journal = journal
        # The turn's journal, by key, once read (``None``: not read yet). A turn that
        # records nothing never reads it, so a one-round turn pays nothing for it.
        self._recorded: dict[str, Any] | None = None
        self._recording: set[str] = set()  # keys whose value is being computed
        # Whether the journal holds entries of this turn, for the commit to delete.
        self._journaled = False
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
        # The turn ID each receipt this turn met was completed under.
        self._receipt_turns: dict[str, str] = {}

    @property
    def scope(self) -> TurnScope:
        return self._scope

    @property
    def checkpoint(self) -> KernelCheckpoint | None:
        return self._checkpoint

    @property
    def refused(self) -> TenantMismatchError | None:
        """The refusal of a receipt of another tenant, if an effect call met one."""
        return self._refused

    @property
    def receipt_turns(self) -> Mapping[str, str]:
        """The turn ID each receipt this turn met was completed under, by key."""
        return self._receipt_turns

    @property
    def journaled(self) -> bool:
        """Whether the journal holds entries of this turn (read or written by it)."""
        return self._journaled

    async def recorded(
        self,
        key: str,
        compute: Callable[[], Awaitable[Any]],
        *,
        keep: Callable[[Any], bool] | None = None,
        stream: Callable[[], tuple[int, str]] | None = None,
    ) -> Any:
        """The JSON value recorded under ``key`` by this turn ID; if there is none,
        ``await compute()``, recorded (unless ``keep`` says not to) and returned.

        Either way the value comes back as the store reads it (tuples as lists, and so
        on), so that the first delivery and a redelivery go on from the same value.
        The entry is durable before this returns: a delivery of the same turn ID after a
        crash gets it without calling ``compute``. ``keep(value)`` returning ``False``
        hands the value back unrecorded (the runtime so skips a model round that asks
        for nothing, which the commit that follows records anyway). A key that is not
        storable text, or a value that is not JSON, raises ``JournalError`` and records
        nothing.

        ``stream()``, called just before the write, gives a streamed turn's events
        since its previous entry: written with the entry, in its transaction.
        """
        scope = self._scope
        if self._closed:
            raise JournalError(
                f"tx.recorded({key!r}) called after the turn ended",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        problem = (
            "it is not a non-empty string"
            if not isinstance(key, str) or not key
            else text_problem(key)
        )
        if problem is not None:
            raise JournalError(
                f"journal key {key!r} cannot be recorded: {problem}",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        if key in self._recording:
            # Two computations of one key would both be recorded; the second write would
            # be refused as a conflict after its computation (a model request) was paid.
            raise JournalError(
                f"journal key {key!r} is already being computed in this turn",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        recorded = self._recorded
        if recorded is None:
            recorded = self._recorded = await self._read_journal()
        if key in recorded:
            return recorded[key]
        self._recording.add(key)
        try:
            value = await compute()
        finally:
            self._recording.discard(key)
        try:
            stored = normalize(value)
            text = dump_value(stored)
        except (TypeError, ValueError) as exc:
            raise JournalError(
                f"the value computed for journal key {key!r} cannot be recorded: "
                f"{describe_error(exc)}",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            ) from exc
        if keep is not None and not keep(stored):
            return stored
        if self._closed:  # the turn ended while ``compute`` ran (a task left behind)
            raise JournalError(
                f"tx.recorded({key!r}) finished after the turn ended; nothing was recorded",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        entry = JournalEntry(
            scope.thread_id,
            scope.turn_id,
            key,
            scope.request_digest,
            text,
            utcnow(),
            scope.tenant_id,
            stream() if stream is not None else None,
        )
        # Marked before the write: a write whose acknowledgement is lost may still have
        # stored the entry, which the commit must then delete too.
        self._journaled = True
        await self._journal.write_journal(entry)
        recorded[key] = stored
        return stored

    async def _read_journal(self) -> dict[str, Any]:
        scope = self._scope
        entries = await self._journal.read_journal(scope.thread_id, scope.turn_id)
        found: dict[str, Any] = {}
        for entry in entries:
            if entry.tenant_id != scope.tenant_id:
                # Another tenant's turn of this ID recorded these values: continuing from
                # them would put that tenant's model responses in this tenant's reply.
                # Marked refused, so that no commit follows even if the error is caught.
                refused = TenantMismatchError(
                    f"turn {scope.turn_id!r} of thread {scope.thread_id!r} was started by "
                    "another tenant, whose model responses are recorded; nothing was read",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                )
                self._refused = refused
                raise refused
            if (
                scope.request_digest is not None
                and entry.request_digest is not None
                and entry.request_digest != scope.request_digest
            ):
                raise TurnConflictError(
                    f"turn {scope.turn_id!r} of thread {scope.thread_id!r} was started for a "
                    "different request, whose model responses are recorded; use a new turn "
                    "ID for a new request",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                )
            try:
                found[entry.key] = load_value(entry.value)
            except ValueError as exc:
                raise CorruptRecordError(
                    f"journal entry {entry.key!r} of turn {scope.turn_id!r} on thread "
                    f"{scope.thread_id!r} cannot be decoded: {exc}",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                    key=entry.key,
                ) from exc
        self._journaled = bool(found)
        return found

    async def run_effect(
        self,
        key: str,
        fn: EffectFn,
        *,
        step_id: str,
        actor: str | None = None,
        origin: EffectOrigin | None = None,
    ) -> EffectResult[Any]:
        if self._closed:
            raise EffectUsageError(
                "run_effect called after the turn ended", key=key, thread_id=self._scope.thread_id
            )
        if not isinstance(key, str) or not key:
            raise EffectUsageError("an effect key must be a non-empty string", key=str(key))
        problem = text_problem(key) or (
            "its step ID is not a non-empty string"
            if not isinstance(step_id, str) or not step_id
            else text_problem(step_id)
        )
        if problem is None and actor is not None:
            problem = (
                "its actor is not a string" if not isinstance(actor, str) else text_problem(actor)
            )
        if problem is None and origin is not None:
            problem = origin_problem(origin)
        if problem is not None:  # each is stored in a text column of its own
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
            result = await self._run(self._scope, key, fn, step_id, actor, origin)
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


def origin_problem(origin: object) -> str | None:
    """Why a receipt cannot record ``origin``, or ``None``: every store keeps its
    capability ID and names as text, and its input as JSON."""
    if not isinstance(origin, EffectOrigin):
        return f"its origin is not an EffectOrigin but {type(origin).__name__}"
    if not isinstance(origin.capability_id, str) or not origin.capability_id:
        return "its origin's capability ID is not a non-empty string"
    names = origin.approved_by
    if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
        return "its origin's approvers are not a tuple of strings"
    for text in (origin.capability_id, *names):
        problem = text_problem(text)
        if problem is not None:
            return problem
    try:
        normalize([origin.input, list(names)])
    except (TypeError, ValueError) as exc:
        return f"its origin's input is not JSON every store can read back: {exc}"
    return None
