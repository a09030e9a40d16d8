"""The ``tx`` a turn's operation receives inside ``with_turn``, one per turn.

It holds the turn's scope and checkpoint.
It runs the turn's effect calls, and records each outcome before the turn ends
(:mod:`.effects`).
It keeps the values the turn records in the journal, ``recorded`` (:mod:`.journal`).
It builds the turn's commit (``record``) from what the operation returned.
One object holds the state of all three, its parts a chain of base classes. A turn
makes no more calls than one class would."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel._effects import (
    utcnow,
)
from intention_kernel._turns import TurnCommit, TurnScope, encode_result
from intention_kernel.durability._contract.records import TurnRecord
from intention_kernel.durability._engine.effects import TurnEffects
from intention_kernel.durability._layout import Base, delta_problems, turn_rows
from intention_kernel.errors import (
    KernelError,
    TenantMismatchError,
)

if TYPE_CHECKING:
    from intention_kernel.durability._contract.recorders import Recorder, RecorderOptions

__all__ = ["Transaction"]


class Transaction(TurnEffects):
    """The ``tx`` handed to an operation: scope, checkpoint, effects and the commit."""

    __slots__ = ("_checkpoint",)

    def __init__(
        self,
        scope: TurnScope,
        checkpoint: KernelCheckpoint | None,
        recorder: Recorder,
        write_outcome: Callable[[Awaitable[None]], Awaitable[None]],
    ) -> None:
        self._recorder = recorder
        # How an effect's outcome is written: one that a cancellation does not cut short.
        self._write_outcome = write_outcome
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
        # A receipt of another tenant was found: the turn must not commit. That holds
        # even if the operation caught the error. A capability's ``except Exception``
        # may catch it, or the runtime may turn it into a failed step. A commit would
        # take a thread that is not the turn's own.
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

    def record(
        self, commit: TurnCommit, expected: int, base: Base, options: RecorderOptions
    ) -> TurnRecord:
        """The record of ``commit``, over the stored ``base`` of version ``expected``, in
        the rows ``options`` declare. Refused if inconsistent: nothing is then written."""
        scope = self._scope
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
        if commit.timers and any(w.thread_id != scope.thread_id for w in commit.timers):
            problems.append("a timer write names another thread")
        delta = commit.delta
        if delta is not None and not problems:
            problems.extend(delta_problems(base.checkpoint, checkpoint, delta))
        if problems:
            raise KernelError(
                "refusing to commit an inconsistent turn: " + "; ".join(problems),
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        rows = turn_rows(base, checkpoint, delta, options)
        announced = tuple(commit.announced)
        # A key this transaction did not meet through run_effect is marked too. Only a
        # receipt known to carry this turn ID may rely on the turn row.
        marks: tuple[str, ...] = ()
        if announced:
            turns, turn_id = self._receipt_turns, scope.turn_id
            marks = tuple([k for k in announced if turns.get(k) != turn_id])
        return TurnRecord(
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
            tenant_id=scope.tenant_id,
            request_digest=scope.request_digest,
            expected_version=expected,
            version=checkpoint.version,
            result=encode_result(result),
            rows=rows,
            schema_revision=checkpoint.schema_revision,
            fingerprint=checkpoint.agent_fingerprint,
            events=tuple(commit.events),
            created_at=utcnow(),
            announced=announced,
            mark_announced=marks,
            journaled=self._journaled,
            timers=tuple(commit.timers),
        )
