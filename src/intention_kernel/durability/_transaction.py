"""The ``tx`` a turn's operation receives inside ``with_turn``: its scope, its
checkpoint, and the effect calls it makes, each settled before the turn ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from intention_kernel._json import text_problem
from intention_kernel.checkpoint import KernelCheckpoint
from intention_kernel.effects import EffectFn, EffectResult
from intention_kernel.errors import EffectUsageError, TenantMismatchError
from intention_kernel.turns import TurnScope

__all__ = ["EffectRunner", "Transaction"]

#: Runs one effect call of a turn: ``(scope, key, fn, step_id)``.
EffectRunner = Callable[[TurnScope, str, EffectFn, str], Awaitable[EffectResult[Any]]]


class Transaction:
    """The ``tx`` handed to an operation: scope, checkpoint and effect coordination."""

    __slots__ = (
        "_checkpoint",
        "_closed",
        "_idle",
        "_inflight",
        "_receipt_turns",
        "_refused",
        "_run",
        "_scope",
    )

    def __init__(
        self, run: EffectRunner, scope: TurnScope, checkpoint: KernelCheckpoint | None
    ) -> None:
        self._run = run
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
            result = await self._run(self._scope, key, fn, step_id)
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
