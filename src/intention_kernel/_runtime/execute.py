"""Step 4: run one capability for one agenda item and record what it produced.

A step's failure never aborts the turn. What the handler raised decides the
step's status:

- ``EffectUncertainError`` → ``uncertain``.
- ``EffectNotAppliedError``, or anything else → ``failed``.

Effect events are kept either way, because the receipts they describe are real.
Facts and custom events of a failed step are dropped. Task cancellation is the one
thing that propagates: the turn is abandoned and nothing commits.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any

from intention_kernel import _tracing
from intention_kernel._capabilities import Capability, CapabilityContext, CapabilityResult
from intention_kernel._checkpoint import AgendaItem, Interaction, ReceiptRef
from intention_kernel._deadlines import deadline
from intention_kernel._effects import EffectFn, EffectOrigin, EffectResult, Receipt, ReceiptStatus
from intention_kernel._facts import Evidence, FactRecord, FactRef
from intention_kernel._interpretation import Answer
from intention_kernel._json import describe_error, normalize, text_problem
from intention_kernel._runtime.state import TurnState
from intention_kernel._turns import EventDraft, StepResult, StepStatus, kernel_event_namespace
from intention_kernel.durability._contract.records import TimerWrite
from intention_kernel.errors import (
    CapabilityError,
    CheckpointError,
    EffectNotAppliedError,
    EffectUncertainError,
    EffectUsageError,
    FencedCommitError,
    JournalError,
    StoreError,
)

__all__ = ["execute"]

logger = logging.getLogger("intention_kernel.effect")

# Failures of the store, not of the step. They abort the turn instead of becoming a
# failed step. So a broken or corrupted store never gets a turn committed on top of it.
_STORE_FAILURES = (StoreError, CheckpointError, FencedCommitError)


def execute(
    state: TurnState,
    cap: Capability,
    item: AgendaItem,
    parsed: Any,
    answer: Answer | None = None,
    *,
    proposed: dict[str, Any] | None = None,
) -> Coroutine[Any, Any, StepResult]:
    """Run ``cap`` for ``item`` and fold the outcome into ``state`` (await the result).
    An untraced turn runs the step directly, without a span's frame around it.
    ``proposed`` is the input that was proposed when the approver edited it into
    ``item.input``: the step records both."""
    if not state.traced:
        return _execute(state, cap, item, parsed, answer, proposed)
    return _traced(state, cap, item, parsed, answer, proposed)


async def _traced(
    state: TurnState,
    cap: Capability,
    item: AgendaItem,
    parsed: Any,
    answer: Answer | None,
    proposed: dict[str, Any] | None,
) -> StepResult:
    with _tracing.span(
        "intention_kernel.step",
        thread_id=state.scope.thread_id,
        turn_id=state.scope.turn_id,
        step_id=item.step_id,
        capability_id=cap.id,
    ) as span:
        result = await _execute(state, cap, item, parsed, answer, proposed)
        _tracing.annotate(span, step_status=str(result.status))
    return result


async def _execute(
    state: TurnState,
    cap: Capability,
    item: AgendaItem,
    parsed: Any,
    answer: Answer | None,
    proposed: dict[str, Any] | None,
) -> StepResult:
    step = _Step(state, cap, item, proposed)
    ctx = CapabilityContext(
        thread_id=state.scope.thread_id,
        turn_id=state.scope.turn_id,
        step_id=item.step_id,
        tenant_id=state.scope.tenant_id,
        capability_id=cap.id,
        signal=state.signal,
        facts=state.facts,
        answer=answer,
        run_effect=step.call_effect,
        emit=step.emit,
        recorded=step.recorded,
        timers=step,
    )
    failure: Exception | None = None
    try:
        raw = await cap.handler(parsed, ctx)
    except asyncio.CancelledError:
        state.signal.cancel("the turn was cancelled")
        raise
    except _STORE_FAILURES:
        raise  # the store itself failed: abandon the turn, commit nothing
    except Exception as exc:
        failure = exc
    # ``step.end()``'s first line, here. It has more to do only when a call is still
    # running or failed: a wait, or a store failure to raise.
    step.ended = True
    if step._running or step._store_failure is not None:
        try:
            await step.end()
        except asyncio.CancelledError:
            state.signal.cancel("the turn was cancelled")
            raise
    unawaited = step.unawaited() if step._unstarted else None
    if unawaited is not None and failure is None:
        failure = unawaited
    if isinstance(failure, EffectUncertainError):
        result = step.finish(StepStatus.UNCERTAIN, error=describe_error(failure))
    elif failure is not None:
        result = step.finish(StepStatus.FAILED, error=describe_error(failure), cause=failure)
    else:
        result = step.complete(raw)
    task = state.task  # ``asyncio.current_task()``, asked once a turn
    if task is not None and task.cancelling():
        # The handler swallowed a cancellation (run_effect turns it into
        # EffectUncertainError, as the contract says); the turn itself must still stop.
        state.signal.cancel("the turn was cancelled")
        raise asyncio.CancelledError
    return result


class _Step:
    """Bookkeeping for one running step.

    Each applied write is announced exactly once, by the ``effect.completed`` event its
    step records. So a step ends only when every effect call it started has ended
    (:meth:`end`). Take a capability that gathers two calls, one of which fails. The
    other still runs when its handler raises. That call's event must still go out
    with the step. A call may come after the step ended, from a task the capability
    left behind. It is refused before its receipt is prepared, so before the provider
    is called: nothing could announce it. Announcing late calls with the turn instead
    was not chosen. A call may end after the turn committed, and then nothing
    announces it.
    """

    def __init__(
        self,
        state: TurnState,
        cap: Capability,
        item: AgendaItem,
        proposed: dict[str, Any] | None = None,
    ) -> None:
        self.state = state
        self.cap = cap
        self.item = item
        self.proposed = proposed
        self.receipts: list[Receipt] = []
        self.effect_events: list[EventDraft] = []
        self.emitted: list[EventDraft] = []
        self.timer_writes: list[TimerWrite] = []
        self.ended = False
        self._running = 0  # effect calls started and not yet ended
        self._idle: asyncio.Event | None = None  # made by ``end`` only when it must wait
        self._store_failure: BaseException | None = None
        self._receipt_ids: tuple[str, ...] | None = None  # see ``receipt_ids``
        self._effect_origin: EffectOrigin | None = None  # see ``_origin``
        # Each effect call the capability made while the step ran, started or not.
        self._calls: list[tuple[str, Coroutine[Any, Any, EffectResult[Any]]]] = []
        # How many of ``_calls`` have not started: most steps need no look at each.
        self._unstarted = 0

    async def end(self) -> None:
        """Refuse further effect calls and events, and wait for the calls still running.

        A store failure in any of them abandons the turn, as it would have had the
        handler seen it. The capability may have caught it, or left its call behind.
        """
        self.ended = True
        if self._running:
            idle = self._idle = asyncio.Event()
            await idle.wait()
        if self._store_failure is not None:
            raise self._store_failure

    def _refuse_after_end(self, what: str, key: str | None = None) -> EffectUsageError:
        scope = self.state.scope
        return EffectUsageError(
            f"{self.cap.id}: {what} after step {self.item.step_id!r} ended; await every "
            "effect and emit every event before the capability returns",
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
            key=key,
        )

    def unawaited(self) -> EffectUsageError | None:
        """The error of effect calls the capability made and never awaited, once the step
        ended; ``None`` if it awaited them all.

        Such a call never ran: no receipt, no provider call. Completing the step would
        tell the person a write was done that was not. Each is closed here, so that no
        "never awaited" warning follows; one a task still holds runs and is refused.
        """
        calls, self._calls = self._calls, []
        keys: list[str] = []
        tasks: set[Any] | None = None
        for key, call in calls:
            if inspect.getcoroutinestate(call) != inspect.CORO_CREATED:
                continue
            keys.append(key)
            if tasks is None:
                tasks = {task.get_coro() for task in asyncio.all_tasks()}
            if call not in tasks:
                call.close()
        if not keys:
            return None
        scope = self.state.scope
        named = ", ".join(f"ctx.run_effect({key!r})" for key in keys)
        logger.error(
            "%s: %s never awaited in step %r; the step failed and nothing ran",
            self.cap.id,
            named,
            self.item.step_id,
            extra={"thread_id": scope.thread_id, "turn_id": scope.turn_id},
        )
        return EffectUsageError(
            f"{self.cap.id}: {named} was not awaited, so the write never ran and nothing "
            "was done; await every run_effect call before the capability returns",
            thread_id=scope.thread_id,
            turn_id=scope.turn_id,
            key=keys[0],
        )

    # -- what the capability calls --------------------------------------------------------------

    def call_effect(self, key: str, fn: EffectFn) -> Coroutine[Any, Any, EffectResult[Any]]:
        """``ctx.run_effect``: the call, kept while the step runs to see that it is awaited."""
        call = self.run_effect(key, fn)
        if not self.ended:
            self._calls.append((key, call))
            self._unstarted += 1
        return call

    async def run_effect(self, key: str, fn: EffectFn) -> EffectResult[Any]:
        if self.ended:
            raise self._refuse_after_end("run_effect called", key)
        # Started before the end. A call made after it was never counted, and one
        # refused here stays counted: then ``unawaited`` looks at each call.
        self._unstarted -= 1
        self._running += 1
        # The call itself inline, not a method of its own: a frame fewer to resume at
        # each of the store's answers.
        try:
            cap, state = self.cap, self.state
            if cap.effect != "write":
                raise EffectUsageError(
                    f"{cap.id} is a read capability; only write capabilities may call run_effect",
                    thread_id=state.scope.thread_id,
                    turn_id=state.scope.turn_id,
                    key=key,
                )
            if not isinstance(key, str) or not key:
                raise EffectUsageError(f"{cap.id}: an effect key must be a non-empty string")
            full_key = f"{cap.id}:{key}"
            scope = state.scope
            with (
                _tracing.span(
                    "intention_kernel.effect",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                    step_id=self.item.step_id,
                    capability_id=cap.id,
                    key=full_key,
                )
                if state.traced
                else _tracing.NOOP
            ) as span:
                try:
                    # The store's ``run_effect``, with the approver and the origin. Each
                    # keyword goes only when there is one and the transaction names it. So
                    # a transaction of an adapter written before receipts recorded them
                    # still runs the writes.
                    tx = state.tx
                    options: dict[str, Any] = {}
                    if state.actor is not None:
                        options["actor"] = state.actor
                    if _names_origin(type(tx)):
                        options["origin"] = self._effect_origin or self._origin()
                    result = await tx.run_effect(full_key, fn, step_id=self.item.step_id, **options)
                except (EffectUncertainError, EffectNotAppliedError) as exc:
                    if exc.receipt is not None:
                        if span is not None:
                            receipt = exc.receipt
                            _tracing.annotate(
                                span, receipt_id=receipt.id, receipt_status=str(receipt.status)
                            )
                        self._note(exc.receipt, attempted=exc.receipt.turn_id == scope.turn_id)
                        _log_failure(exc, exc.receipt, cap.id)
                    raise
                if span is not None:
                    _tracing.annotate(
                        span,
                        receipt_id=result.receipt.id,
                        receipt_status=str(result.receipt.status),
                        replayed=result.replayed,
                    )
            if not result.replayed and logger.isEnabledFor(logging.INFO):
                receipt = result.receipt
                logger.info(
                    "effect %r on thread %r applied (receipt %s, attempt %d)",
                    full_key,
                    scope.thread_id,
                    receipt.id,
                    receipt.attempt,
                    extra={
                        "thread_id": scope.thread_id,
                        "turn_id": scope.turn_id,
                        "step_id": self.item.step_id,
                        "capability_id": cap.id,
                        "receipt_id": receipt.id,
                        "key": full_key,
                    },
                )
            # Each applied write is announced once, by the first committed turn that uses
            # its completed receipt. That is the turn that applied it. If that turn never
            # committed, it is the next one. The commit marks the receipt announced in the
            # same transaction.
            receipt = result.receipt
            announce = not receipt.announced and receipt.key not in state.announced
            self._note(receipt, attempted=announce, created=not result.replayed)
            return result
        except _STORE_FAILURES as exc:
            self._store_failure = exc
            raise
        finally:
            self._running -= 1
            if not self._running and self._idle is not None:
                self._idle.set()

    def _origin(self) -> EffectOrigin:
        """What this step's writes are for: its capability, the input that runs (mapped
        by the capability's ``redact``) and its approvers. ``CapabilityError`` when
        ``redact`` fails or gives what no store can hold: the write does not run."""
        origin = self._effect_origin
        if origin is not None:
            return origin
        cap = self.cap
        stored: Any = self.item.input
        if cap.redact is not None:
            try:
                # A copy: the agenda's input is what the approver saw, never redacted.
                stored = normalize(cap.redact(normalize(self.item.input)))
            except Exception as exc:
                raise CapabilityError(
                    f"{cap.id}: redact failed on the input, so the write did not run: "
                    f"{describe_error(exc)}",
                    capability_id=cap.id,
                ) from exc
        origin = EffectOrigin(cap.id, stored, self.state.approved_by)
        self._effect_origin = origin
        return origin

    def ran_input(self) -> Any:
        """The input the step ran with, as its receipt records it (after ``redact``);
        ``None`` when ``redact`` fails on it (the step failed)."""
        try:
            return self._origin().input
        except CapabilityError:
            return None

    async def recorded(self, key: str, compute: Callable[[], Awaitable[Any]]) -> Any:
        scope = self.state.scope
        if self.ended:
            raise JournalError(
                f"{self.cap.id}: recorded({key!r}) called after step {self.item.step_id!r} "
                "ended; nothing was recorded",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        if not isinstance(key, str) or not key:
            raise JournalError(
                f"{self.cap.id}: a journal key must be a non-empty string, got {key!r}",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        # Counted as a running call: the step waits for it to end. So its entry is
        # written (or refused) before the turn moves on.
        self._running += 1
        try:
            return await self.state.tx.recorded(f"{self.item.step_id}:{key}", compute)
        except _STORE_FAILURES as exc:
            self._store_failure = exc
            raise
        finally:
            self._running -= 1
            if not self._running and self._idle is not None:
                self._idle.set()

    def emit(self, type: str, payload: Any = None) -> None:
        if self.ended:
            raise self._refuse_after_end(f"event {type!r} emitted")
        if not isinstance(type, str) or not type:
            raise EffectUsageError(f"{self.cap.id}: an event type must be a non-empty string")
        namespace = kernel_event_namespace(type)
        if namespace is not None:
            # A forged turn.committed or effect.completed would break what consumers rely
            # on: one turn.committed per committed turn, one announcement per applied write.
            raise EffectUsageError(
                f"{self.cap.id}: event type {type!r} is in the kernel's reserved namespace "
                f"'{namespace}.'; capabilities emit in a namespace of their own (such as "
                f"'{self.cap.id.split('.', 1)[0]}.')"
            )
        problem = text_problem(type)
        if problem is not None:  # stored in a text column of its own, not as JSON
            raise EffectUsageError(
                f"{self.cap.id}: event type {type!r} cannot be stored: {problem}"
            )
        try:
            payload = normalize(payload)
        except (TypeError, ValueError) as exc:
            raise EffectUsageError(
                f"{self.cap.id}: payload of event {type!r} is not JSON-serializable: {exc}"
            ) from exc
        self.emitted.append(EventDraft(type, payload))

    def stage_timer(self, write: TimerWrite, event: EventDraft) -> None:
        """Stage a timer write (``ctx.schedule``, ``ctx.cancel_timer``) and its event:
        committed with the turn if this step completes, like its emitted events."""
        if self.ended:
            raise self._refuse_after_end(f"timer {write.key!r} staged")
        self.timer_writes.append(write)
        self.emitted.append(event)

    @property
    def now(self) -> datetime:
        """The turn's time (read once under the thread's lock)."""
        return self.state.now

    def _note(self, receipt: Receipt, *, attempted: bool, created: bool = False) -> None:
        """Index the receipt in the checkpoint and emit the matching effect event.

        ``created``: this very call prepared the receipt (its provider call ran now)."""
        state = self.state
        state.noted_receipts.pop(receipt.key, None)  # re-insert: the index keeps recency order
        # A receipt this call created (attempt 1) is not in the loaded index, so the index
        # needs no search for it. Its turn ID alone does not say so. An earlier attempt
        # of this same turn may have created it and died. Another turn may have indexed
        # it since.
        if not (created and receipt.attempt == 1):
            state.noted_known_receipt = True
        state.noted_receipts[receipt.key] = ReceiptRef(
            receipt.key, receipt.id, receipt.status, receipt.turn_id, receipt.step_id
        )
        self.receipts.append(receipt)
        status = receipt.status
        if status is ReceiptStatus.COMPLETED:
            if not attempted:
                return  # a deduplicated call: the write was announced already
            state.announced[receipt.key] = None
        payload = {
            "key": receipt.key,
            "receipt_id": receipt.id,
            "capability_id": self.cap.id,
            "step_id": receipt.step_id,
            "attempt": receipt.attempt,
            "status": str(status),
        }
        if status is not ReceiptStatus.COMPLETED:
            payload["error"] = receipt.error
            payload["attempted"] = attempted
        if state.actor is not None:
            payload["actor"] = state.actor
        self.effect_events.append(EventDraft(f"effect.{status}", payload))

    # -- outcomes -----------------------------------------------------------------------------

    def receipt_ids(self) -> tuple[str, ...]:
        """The IDs of the receipts the step's effect calls met, each once, in call order.

        Built once, when the step has ended: no effect call adds a receipt after that."""
        ids = self._receipt_ids
        if ids is None:
            assert self.ended
            receipts = self.receipts
            if len(receipts) < 2:  # most steps: no call, or one
                ids = (receipts[0].id,) if receipts else ()
            else:
                ids = tuple(dict.fromkeys(r.id for r in receipts))
            self._receipt_ids = ids
        return ids

    def finish(
        self,
        status: StepStatus,
        *,
        value: Any = None,
        error: str | None = None,
        cause: BaseException | None = None,
    ) -> StepResult:
        """Record the step. The reply line is the person's (``Agent.replies``); the
        technical detail goes to ``error`` only. ``cause`` is what made a step fail."""
        step = StepResult(
            step_id=self.item.step_id,
            capability_id=self.cap.id,
            status=status,
            value=value,
            error=error,
            receipt_ids=self._receipt_ids or self.receipt_ids(),
            proposed_input=self.proposed,
            approved_input=self.item.input if self.proposed is not None else None,
        )
        state = self.state
        state.add_step(step, self.ran_input() if state.sink is not None else None)
        if self.effect_events:
            self.flush_effect_events()
        replies = state.agent.agent.replies
        if status is StepStatus.FAILED:
            failure = cause if cause is not None else CapabilityError(error or "failed")
            state.replies.append(replies.failed(self.cap, step, failure))
        elif status is StepStatus.UNCERTAIN:
            state.replies.append(replies.uncertain(self.cap, step))
        return step

    def flush_effect_events(self) -> None:
        """Effect events go out in every outcome: the receipts they describe are real."""
        self.state.events.extend(self.effect_events)
        self.effect_events.clear()

    def complete(self, raw: Any) -> StepResult:
        state, cap = self.state, self.cap
        if self.effect_events:  # as ``flush_effect_events``, without its frame
            state.events.extend(self.effect_events)
            self.effect_events.clear()
        result = raw if isinstance(raw, CapabilityResult) else CapabilityResult(value=raw)
        if result.confirmation is not None and cap.confirmation != "capability":
            return self.finish(
                StepStatus.FAILED,
                error=f"{cap.id} asked for confirmation, which needs confirmation='capability'",
            )
        try:
            value = normalize(result.value)
            details = normalize(result.confirmation.details) if result.confirmation else None
        except (TypeError, ValueError) as exc:
            return self.finish(
                StepStatus.FAILED, error=f"the value is not JSON-serializable: {exc}"
            )
        try:
            records = self._records(result) if result.facts else ()
        except CapabilityError as exc:
            return self.finish(StepStatus.FAILED, error=str(exc))
        for record in records:
            state.fact_ledger.record(record)
            state.recorded.append(record)
            state.emit(
                "fact.recorded",
                {"key": record.key, "version": record.version, "step_id": self.item.step_id},
            )
        state.events.extend(self.emitted)
        state.timers.extend(self.timer_writes)
        if result.confirmation is not None:
            within = result.confirmation.expires_in
            if within is None:
                within = cap.confirm_within
            interaction = Interaction(
                id=state.new_interaction_id(),
                kind="capability",
                capability_id=cap.id,
                input=self.item.input,
                prompt=result.confirmation.prompt,
                details=details,
                step_id=self.item.step_id,
                turn_id=state.scope.turn_id,
                expires_at=deadline(state.now, within),
                proposed_by=state.proposer,
                who_may_answer=cap.answer_policy,
            )
            item = AgendaItem(
                self.item.step_id, cap.id, self.item.input, state.scope.turn_id, interaction.id
            )
            step = self.finish(StepStatus.AWAITING_CONFIRMATION, value=value)
            state.open_interaction(item, interaction)
            return step
        step = self.finish(StepStatus.COMPLETED, value=value)
        if result.reply is not None:
            state.replies.append(result.reply)
        else:
            state.replies.append(state.agent.agent.replies.done(cap, value))
        return step

    def _records(self, result: CapabilityResult) -> list[FactRecord]:
        """Version each fact and pin its lineage; all or nothing."""
        state = self.state
        pending: dict[str, FactRecord] = {}
        receipts = self.receipt_ids()
        for fact in result.facts:
            if not isinstance(fact.key, str) or not fact.key:
                raise CapabilityError(f"{self.cap.id}: a fact key must be a non-empty string")
            problem = text_problem(fact.key)
            if problem is not None:  # a fact's row is keyed by it, in a text column
                raise CapabilityError(
                    f"{self.cap.id}: fact key {fact.key!r} cannot be stored: {problem}"
                )
            try:
                fact_value = normalize(fact.value)
            except (TypeError, ValueError) as exc:
                raise CapabilityError(
                    f"{self.cap.id}: fact {fact.key!r} is not JSON-serializable: {exc}"
                ) from exc
            lineage = []
            for source in fact.derived_from:
                known = pending.get(source) or state.facts.get(source)
                if known is None:
                    raise CapabilityError(
                        f"{self.cap.id}: fact {fact.key!r} is derived from unknown fact {source!r}"
                    )
                lineage.append(FactRef(source, known.version))
            previous = pending.get(fact.key) or state.facts.get(fact.key)
            pending[fact.key] = FactRecord(
                key=fact.key,
                value=fact_value,
                version=(previous.version if previous else 0) + 1,
                evidence=Evidence(
                    capability_id=self.cap.id,
                    turn_id=state.scope.turn_id,
                    step_id=self.item.step_id,
                    receipt_ids=receipts,
                    derived_from=tuple(lineage),
                ),
            )
        return list(pending.values())


def _log_failure(exc: BaseException, receipt: Receipt, capability_id: str) -> None:
    """An uncertain write is an operator's business: say so at WARNING."""
    level = logging.WARNING if receipt.status is ReceiptStatus.UNCERTAIN else logging.INFO
    if logger.isEnabledFor(level):
        logger.log(
            level,
            "effect %r on thread %r is %s (receipt %s, attempt %d): %s",
            receipt.key,
            receipt.thread_id,
            receipt.status,
            receipt.id,
            receipt.attempt,
            exc,
            extra={
                "thread_id": receipt.thread_id,
                "turn_id": receipt.turn_id,
                "step_id": receipt.step_id,
                "capability_id": capability_id,
                "receipt_id": receipt.id,
                "key": receipt.key,
            },
        )


@functools.cache
def _names_origin(tx_type: type) -> bool:
    """Whether a transaction type's ``run_effect`` takes ``origin`` (asked once a type)."""
    try:
        parameters = inspect.signature(tx_type.run_effect).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False
    return "origin" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
