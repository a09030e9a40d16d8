"""The effect part of a turn's ``tx``: its effect calls and their receipts.

``run_effect`` claims a receipt, calls the provider if the receipt lets it, and records
the outcome before it returns. ``settle`` waits for calls a turn left running, so that
none outlives the thread's lock. :class:`~._transaction.Transaction` takes this part in.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from intention_kernel import _faults
from intention_kernel._calls import is_async_callable
from intention_kernel._effects import (
    EffectAuthority,
    EffectFn,
    EffectOrigin,
    EffectPlan,
    EffectResult,
    Receipt,
    plan_effect,
    settle,
    utcnow,
)
from intention_kernel._json import describe_error, normalize, text_problem
from intention_kernel.durability._engine.effect_calls import call_in_thread
from intention_kernel.durability._engine.journal import TurnJournal
from intention_kernel.errors import (
    EffectNotAppliedError,
    EffectUncertainError,
    EffectUsageError,
    EffectValueError,
    TenantMismatchError,
)

if TYPE_CHECKING:
    pass

__all__ = ["TurnEffects", "origin_problem"]


class TurnEffects(TurnJournal):
    """``Transaction``'s effect methods, over the journal part's shared state."""

    __slots__ = ("_idle", "_inflight", "_receipt_turns", "_write_outcome")

    _write_outcome: Callable[[Awaitable[None]], Awaitable[None]]
    _inflight: dict[str, asyncio.Task[Any] | None]
    _idle: asyncio.Event | None
    _receipt_turns: dict[str, str]

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
        # Claim the receipt of ``key``, call ``fn`` if it may run, and record its
        # outcome. Inline, not a method of its own: a frame fewer to resume at each
        # statement's answer.
        try:
            scope, recorder = self._scope, self._recorder
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
                    actor=actor,
                    origin=origin,
                )

            decided = await recorder.claim_effect(scope.thread_id, key, plan)
            if decided.outcome == "replay":
                existing = decided.existing
                assert existing is not None
                self._receipt_turns[existing.key] = existing.turn_id
                return EffectResult(existing.value, existing, replayed=True)
            if decided.outcome == "fail_closed":
                receipt = decided.write or decided.existing
                assert receipt is not None
                raise EffectUncertainError(
                    f"effect {key!r} on thread {scope.thread_id!r} may already have been "
                    f"applied (receipt {receipt.id} is uncertain); it will not be retried until "
                    "an operator resolves it",
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
                    value, cancelled_after_return = await call_in_thread(fn, authority)
                    # A sync function (a lambda) may wrap a coroutine.
                    if inspect.isawaitable(value):
                        value = await value
            except EffectNotAppliedError as exc:
                failed = settle(prepared, "failed", now=utcnow(), error=describe_error(exc))
                await self._write_outcome(recorder.write_receipt(failed, prepared))
                exc.thread_id, exc.turn_id, exc.key, exc.receipt = (
                    scope.thread_id,
                    scope.turn_id,
                    key,
                    failed,
                )
                raise
            except (Exception, asyncio.CancelledError) as exc:
                raise await self._fail_closed(
                    prepared,
                    EffectUncertainError,
                    describe_error(exc),
                    f"effect {key!r} on thread {scope.thread_id!r} failed with "
                    f"{describe_error(exc)}; it may have been applied, so it is recorded as "
                    "uncertain",
                ) from exc
            try:
                stored = normalize(value)
            except (TypeError, ValueError) as exc:
                # The write happened, but its value cannot be recorded. Replaying it later
                # could not return the same value. So fail closed, for an operator.
                raise await self._fail_closed(
                    prepared,
                    EffectValueError,
                    f"the provider returned a value that is not JSON-serializable: {exc}",
                    f"effect {key!r} returned a value that cannot be stored ({exc}); recorded as "
                    "uncertain",
                ) from exc
            completed = settle(prepared, "completed", now=utcnow(), value=stored)
            await self._write_outcome(recorder.write_receipt(completed, prepared))
            if cancelled_after_return:
                raise asyncio.CancelledError  # delivered now that the outcome is recorded
            if _faults.armed:
                _faults.reach(_faults.AFTER_RECEIPT_COMPLETED)
            self._receipt_turns[completed.key] = completed.turn_id
            return EffectResult(stored, completed)
        except TenantMismatchError as exc:
            self._refused = exc
            raise
        finally:
            del self._inflight[key]
            if not self._inflight and self._idle is not None:
                self._idle.set()

    async def settle(self, *, cancel: bool) -> None:
        """Close the transaction to new effect calls, and wait for the calls still running.

        Such a call runs in a task the operation left behind. Each must record its
        outcome before this returns. With ``cancel``, cancel them first; each then
        records ``uncertain``.

        Called before the turn leaves the thread's lock. Without it, a call could outlive
        its operation. It would leave its receipt ``prepared`` under a free lock while
        its provider call still runs. The next holder would take a live attempt for a
        dead one. That holder is a turn, or an operator resolving it as not applied.
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
                # The receipts first, then the cancellation. The calls are cancelled too.
                # So the wait ends as soon as each has recorded ``uncertain``.
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

    async def _fail_closed(
        self,
        prepared: Receipt,
        kind: type[EffectUncertainError],
        error: str,
        message: str,
    ) -> EffectUncertainError:
        """Settle ``prepared`` as ``uncertain`` with ``error``, then return the ``kind`` of
        error to raise. The write may have happened. So the receipt is written before the
        error leaves, and no later call with the key runs it again."""
        scope = self._scope
        uncertain = settle(prepared, "uncertain", now=utcnow(), error=error)
        await self._write_outcome(self._recorder.write_receipt(uncertain, prepared))
        return kind(
            message,
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
            key=prepared.key,
            receipt=uncertain,
        )


def origin_problem(origin: object) -> str | None:
    """Why a receipt cannot record ``origin``, or ``None``.

    Every store keeps its capability ID and names as text, and its input as JSON."""
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
