"""Capabilities: the operations an agent can run, and what they see while running.

::

    @capability("payments.charge", effect="write", description="Charge a payment intent")
    async def charge(input: ChargeInput, ctx: CapabilityContext) -> CapabilityResult:
        effect = await ctx.run_effect(f"charge:{input.payment_intent_id}",
                                      lambda authority: provider.charge(...))
        return CapabilityResult(value=effect.value, facts=[Fact("charge", effect.value)])

``capability()`` only records the definition; ``Kernel(...)`` compiles and
checks it. The handler's first parameter may be annotated with a pydantic model
(input is validated against it) or ``dict``.
"""

from __future__ import annotations

import inspect
import sys
import threading
import typing
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from intention_kernel import _adapters
from intention_kernel._authority import (
    Approvers,
    approvers_problem,
    describe_approvers,
    frozen_roles,
)
from intention_kernel._deadlines import duration_problem
from intention_kernel._facts import Fact, FactRecord, FactTable
from intention_kernel._json import MAX_NESTING, dump_value, normalize, too_deep
from intention_kernel.errors import EffectUsageError, InvalidInputError

if TYPE_CHECKING:
    import pydantic

    from intention_kernel._effects import EffectFn, EffectResult
    from intention_kernel._interpretation import Answer
    from intention_kernel._turns import EventDraft
    from intention_kernel.durability._contract.records import Timer, TimerWrite

__all__ = [
    "CancellationSignal",
    "Capability",
    "CapabilityContext",
    "CapabilityResult",
    "ConfirmationMode",
    "ConfirmationRequest",
    "EffectKind",
    "capability",
]

EffectKind = Literal["read", "write"]
ConfirmationMode = Literal["none", "required", "capability"]

Handler = Callable[[Any, "CapabilityContext"], Awaitable[Any]]
PromptSource = str | Callable[[Any], str]
#: Maps an operation's input to what its receipt stores (``@capability(redact=...)``).
Redactor = Callable[[dict[str, Any]], Any]


class CancellationSignal:
    """Cooperative cancellation for a running turn (``ctx.signal``).

    Set when the turn is cancelled. Pass it to provider calls that can abort;
    ``event`` is a :class:`threading.Event` for code running in worker threads.
    """

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        # Made when first asked for. Most turns are never cancelled, and no capability
        # waits on the event. A threading.Event (a Condition and its lock) costs more
        # to make than the rest of a capability call's bookkeeping.
        self._event: threading.Event | None = None
        self.reason: str | None = None

    @property
    def event(self) -> threading.Event:
        event = self._event
        if event is None:
            with _EVENT_CREATION:  # a worker thread and the loop may ask at once
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        return event

    @property
    def cancelled(self) -> bool:
        event = self._event
        return event is not None and event.is_set()

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the running call to stop: sets ``event`` and records ``reason``."""
        self.reason = reason
        self.event.set()


_EVENT_CREATION = threading.Lock()


@dataclass(frozen=True, slots=True)
class ConfirmationRequest:
    """A capability's own request for consent (``confirmation="capability"`` mode).

    ``expires_in`` is how long the person has to answer (``None``: the capability's
    ``confirm_within``); it must be a positive ``timedelta`` (``ValueError``).
    """

    prompt: str
    details: Any = None
    expires_in: timedelta | None = None

    def __post_init__(self) -> None:
        if self.expires_in is not None:
            problem = duration_problem("expires_in", self.expires_in)
            if problem is not None:
                raise ValueError(problem)


@dataclass(frozen=True, slots=True)
class CapabilityResult:
    """What a capability returns: a value, facts to record and an optional reply."""

    value: Any = None
    facts: Sequence[Fact] = ()
    reply: str | None = None
    confirmation: ConfirmationRequest | None = None

    @classmethod
    def needs_confirmation(
        cls,
        prompt: str,
        details: Any = None,
        *,
        facts: Sequence[Fact] = (),
        value: Any = None,
        expires_in: timedelta | None = None,
    ) -> CapabilityResult:
        """Ask the person before writing (only in ``confirmation="capability"`` mode).

        The kernel opens an interaction; the answering turn calls the capability
        again with the same input and ``ctx.answer`` set. ``facts`` are recorded in
        the asking turn (a quote the answer will be checked against, say).
        ``expires_in`` (a positive ``timedelta``) is how long the person has. ``None``
        takes the capability's ``confirm_within``, if any. An answer after that does not
        call the capability again, and the interaction closes as expired.
        """
        return cls(
            value=value,
            facts=facts,
            confirmation=ConfirmationRequest(prompt, details, expires_in),
        )


class _EffectRunner(Protocol):
    def __call__(self, key: str, fn: EffectFn) -> Coroutine[Any, Any, EffectResult[Any]]: ...


class _Recorder(Protocol):
    async def __call__(self, key: str, compute: Callable[[], Awaitable[Any]]) -> Any: ...


class _TimerStage(Protocol):
    """Where a step stages its timer writes (the runtime's step)."""

    @property
    def now(self) -> datetime: ...

    def stage_timer(self, write: TimerWrite, event: EventDraft) -> None: ...


class CapabilityContext:
    """What a running capability sees of its turn.

    Built by the kernel for each step; applications only read it and call
    :meth:`run_effect`, :meth:`recorded` and :meth:`emit`.
    """

    __slots__ = (
        "_emit",
        "_recorded",
        "_run_effect",
        "_timers",
        "answer",
        "capability_id",
        "facts",
        "signal",
        "step_id",
        "tenant_id",
        "thread_id",
        "turn_id",
    )

    def __init__(
        self,
        *,
        thread_id: str,
        turn_id: str,
        step_id: str,
        tenant_id: str | None,
        capability_id: str,
        signal: CancellationSignal,
        facts: Mapping[str, FactRecord],
        answer: Answer | None,
        run_effect: _EffectRunner,
        emit: Callable[[str, Any], None],
        recorded: _Recorder,
        timers: _TimerStage | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.turn_id = turn_id
        self.step_id = step_id
        self.tenant_id = tenant_id
        self.capability_id = capability_id
        self.signal = signal
        # The runtime's FactTable is already a read-only view; copy anything else.
        self.facts: Mapping[str, FactRecord] = (
            facts if isinstance(facts, FactTable) else MappingProxyType(dict(facts))
        )
        self.answer = answer
        self._run_effect = run_effect
        self._emit = emit
        self._recorded = recorded
        self._timers = timers

    def run_effect(self, key: str, fn: EffectFn) -> Coroutine[Any, Any, EffectResult[Any]]:
        """Run an external write at most once per ``key`` in this thread: await it.

        The stored key is ``"<capability_id>:<key>"``. A completed receipt for it
        returns the original value without calling ``fn``; an uncertain one
        raises ``EffectUncertainError``. ``fn`` receives an ``EffectAuthority``
        and may be sync or async. Its value must be JSON that every store can read
        back: no integer of more than 4,300 digits, say.

        An async ``fn`` runs on the event loop. A sync one (a ``lambda`` included) runs
        in a worker thread of the loop's default executor, in a copy of this context.
        So a blocking provider SDK holds up only this turn. An awaitable it returns is
        awaited on the loop. If the turn is cancelled while a sync call runs, the
        receipt is recorded ``uncertain`` at once. The thread cannot be stopped, and
        what it does later is not recorded. So give it ``signal.event``.

        Await the call before the capability returns. A step ends when all of its
        effect calls have ended. A call made after that is refused with
        ``EffectUsageError`` before ``fn`` is called: nothing could announce it. A
        call the capability never awaited never ran: it fails the step, naming the key.
        """
        # Not ``async def``: the step must see the call made, even if never awaited.
        return self._run_effect(key, fn)

    async def recorded(self, key: str, compute: Callable[[], Awaitable[Any]]) -> Any:
        """The JSON value this step recorded under ``key`` in an earlier delivery.

        The delivery is of this turn. If there is none, ``await compute()``, record it
        and return it.

        For what is costly or not repeatable and has no effect to guard, such as a
        model's response. A delivery of the same turn ID after a crash gets the value
        without calling ``compute``. Either way the value comes back as the store reads
        it (tuples as lists, and so on). The entry is durable before this returns, and
        the turn's commit deletes it. The journal key is ``"<step_id>:<key>"``, so a
        step never reads another step's values. These raise ``JournalError`` and record
        nothing: a key that is empty or not storable text, a value that is not JSON, a
        call after the step ended.
        """
        return await self._recorded(key, compute)

    def emit(self, type: str, payload: Any = None) -> None:
        """Add an event to the turn's outbox (committed only if the turn commits).

        Types in the kernel's namespaces (``turn.``, ``interaction.``, ``fact.``,
        ``effect.``, ``receipt.``) are refused with ``EffectUsageError``.
        """
        self._emit(type, payload)

    def schedule(
        self,
        key: str,
        *,
        at: datetime | None = None,
        after: timedelta | None = None,
        message: str | None = None,
        data: Any = None,
        unless_version_after: int | None = None,
        every: timedelta | None = None,
        cron: str | None = None,
    ) -> Timer:
        """Set timer ``key`` of this thread: a turn the kernel runs when it is due.

        Exactly one of ``at`` (a timezone-aware time) and ``after`` (from the turn's
        time) says when. The timer is committed with this turn, and only if the step
        completes: a turn that does not commit sets no timer. Setting a key again moves
        its timer. When due it runs as a turn under the agent's interpreter, which sees
        ``message`` and ``data`` in ``InterpretationRequest.timer``. With
        ``unless_version_after``, it is void if the thread's version is then above it.
        With ``every``, it recurs. With ``cron`` alone, it fires at each of its times
        (a cron expression in UTC, the ``cron`` extra). Bad input raises
        ``InvalidRequestError``.
        """
        from intention_kernel._timers import plan_timer, set_event
        from intention_kernel.durability._contract.records import TimerWrite

        stage = self._stage()
        timer = plan_timer(
            self.thread_id,
            key,
            now=stage.now,
            at=at,
            after=after,
            message=message,
            data=data,
            unless_version_after=unless_version_after,
            every=every,
            cron=cron,
            tenant_id=self.tenant_id,
        )
        stage.stage_timer(TimerWrite(self.thread_id, timer.key, timer), set_event(timer))
        return timer

    def cancel_timer(self, key: str) -> None:
        """Cancel timer ``key`` of this thread, with this turn's commit. A key with no
        pending timer is no error, and changes nothing: a fired timer's row stays.
        Otherwise ``timer.cancelled`` is emitted with the turn."""
        from intention_kernel._timers import cancelled_event, check_key
        from intention_kernel.durability._contract.records import TimerWrite

        stage = self._stage()
        key = check_key(key)
        stage.stage_timer(TimerWrite(self.thread_id, key, None), cancelled_event(key))

    def _stage(self) -> _TimerStage:
        if self._timers is None:
            raise EffectUsageError(f"{self.capability_id}: this context cannot set timers")
        return self._timers


@dataclass(frozen=True, slots=True)
class Capability:
    """A recorded capability definition. Create it with :func:`capability`."""

    id: str
    effect: EffectKind
    confirmation: ConfirmationMode
    description: str
    handler: Handler
    input_model: type[pydantic.BaseModel] | None
    prompt: PromptSource | None = None
    definition_errors: tuple[str, ...] = field(default=(), compare=False)
    confirm_within: timedelta | None = None
    approvals: int = 1
    approvers: Approvers = None
    self_approval: bool = True
    redact: Redactor | None = None
    remind_before: timedelta | None = None

    @property
    def who_may_answer(self) -> str:
        """Who may answer this capability's confirmations, in words for a person."""
        return describe_approvers(self.approvers, self.self_approval, self.approvals)

    @property
    def answer_policy(self) -> str | None:
        """What an interaction it opens records as ``who_may_answer``: the description,
        or ``None`` when anyone may answer once. Nothing more is stored for a capability
        without a policy than before policies existed."""
        if self.approvers is None and self.self_approval and self.approvals == 1:
            return None
        return self.who_may_answer

    @property
    def input_schema(self) -> dict[str, Any]:
        """JSON schema of the input (an open object for ``dict`` inputs)."""
        if self.input_model is None:
            return {"type": "object"}
        return self.input_model.model_json_schema()

    def parse_input(self, raw: Any) -> tuple[Any, dict[str, Any]]:
        """Validate raw input; return (handler argument, canonical JSON-able dict)."""
        # A dict first, by its type: ``isinstance`` against ``Mapping`` runs the ABC
        # machinery. ``normalize`` returns a copy, so a dict needs no copy of its own.
        plain = type(raw) is dict
        if not plain and not isinstance(raw, Mapping):
            raise InvalidInputError(
                f"input for {self.id} must be an object, got {type(raw).__name__}",
                capability_id=self.id,
            )
        if self.input_model is None:
            try:
                data = normalize(raw if plain else dict(raw))
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"input for {self.id} is not JSON-serializable: {exc}", capability_id=self.id
                ) from exc
            return data, data
        if too_deep(raw, MAX_NESTING):
            raise InvalidInputError(
                f"input for {self.id} is nested more than {MAX_NESTING} levels deep",
                capability_id=self.id,
            )
        try:
            model = self.input_model.model_validate(raw)
        except _adapters.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(input)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise InvalidInputError(
                f"invalid input for {self.id}: {problems}",
                capability_id=self.id,
                errors=[dict(e) for e in exc.errors(include_url=False)],
            ) from exc
        try:
            # A field may hold what no store can read back (an integer too long, say).
            canonical = normalize(model.model_dump(mode="json"))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"invalid input for {self.id}: {exc}", capability_id=self.id
            ) from exc
        return model, canonical

    def render_prompt(self, parsed: Any, canonical: dict[str, Any]) -> str:
        """The confirmation prompt shown before this write runs."""
        if callable(self.prompt):
            return self.prompt(parsed)
        if isinstance(self.prompt, str):
            return self.prompt.format(**canonical)
        # For a person: text as it is, other values as JSON, never Python reprs.
        args = ", ".join(
            f"{k}: {v if isinstance(v, str) else dump_value(v)}" for k, v in canonical.items()
        )
        what = self.description or self.id
        return f"{what} ({args})? Reply yes or no." if args else f"{what}? Reply yes or no."

    async def __call__(self, input: Any, ctx: CapabilityContext) -> Any:
        return await self.handler(input, ctx)


def capability(
    id: str,
    *,
    effect: EffectKind = "read",
    confirmation: ConfirmationMode | None = None,
    description: str | None = None,
    prompt: PromptSource | None = None,
    confirm_within: timedelta | None = None,
    approvals: int = 1,
    approvers: Approvers = None,
    self_approval: bool = True,
    redact: Redactor | None = None,
    remind_before: timedelta | None = None,
) -> Callable[[Handler], Capability]:
    """Declare a capability. Records only; ``Kernel(...)`` checks the definition.

    ``confirmation`` defaults to ``"none"`` for reads and ``"required"`` for writes.
    ``"required"`` holds any capability, read or write, until the person accepts;
    ``"none"`` is refused for writes at compilation.
    ``prompt`` is the confirmation prompt: a ``str.format`` template over the
    input's fields, or a callable taking the validated input.
    ``confirm_within`` (a positive ``timedelta``) is how long the person has to answer
    its confirmation. The confirmation then carries ``expires_at``. An accept after
    that runs nothing (see the guide *Approvals*). In ``"capability"`` mode it is the
    default ``expires_in`` of ``needs_confirmation``. ``None``: no deadline. A bad value,
    or one on a capability that never asks (``confirmation="none"``), is refused at
    compilation.
    ``approvals`` (a positive ``int``) is how many distinct people must accept the
    confirmation before the operation runs. That is a quorum (see the guide
    *Approvals*). Above 1 it needs ``confirmation="required"``:
    the kernel holds the operation and counts the accepts. A bad value is refused at
    compilation.
    ``approvers`` is who may answer its confirmations, accept or reject (see the guide
    *Who may approve*). ``None`` is anyone who may post to the thread. It may also be
    a role, a set of roles, or a callable ``(principal, interaction) -> bool``.
    ``self_approval=False`` refuses an accept from the principal whose turn proposed
    the operation. A refused answer runs nothing and leaves the interaction open.
    ``redact`` maps the input that ran before its receipt stores it (for secrets).
    ``remind_before`` (a positive ``timedelta``): a confirmation with a deadline gets
    a reminder turn that long before it expires. It gets it only if it still waits
    then. The reminder is a timer (see :mod:`intention_kernel._timers`). Its reply and
    ``interaction.reminded`` carry the prompt again. It must be shorter than
    ``confirm_within``, and the capability must ask: else ``CompilationError``.
    """

    def decorate(handler: Handler) -> Capability:
        errors: list[str] = []
        if not inspect.iscoroutinefunction(handler):
            errors.append(f"{id}: the handler must be an async function")
        # String annotations (``from __future__ import annotations``) may name a model
        # defined in the enclosing function; resolve them where the decorator is applied.
        model, problem = _input_model(handler, sys._getframe(1).f_locals)
        if problem:
            errors.append(f"{id}: {problem}")
        if confirm_within is not None:
            problem = duration_problem("confirm_within", confirm_within)
            if problem is not None:
                errors.append(f"{id}: {problem}")
        if remind_before is not None:
            problem = duration_problem("remind_before", remind_before)
            if problem is not None:
                errors.append(f"{id}: {problem}")
        # ``bool`` is an ``int``: ``approvals=True`` is a mistake, not one approval.
        if not isinstance(approvals, int) or isinstance(approvals, bool) or approvals < 1:
            errors.append(f"{id}: approvals must be a positive int, not {approvals!r}")
        policy = approvers
        problem = approvers_problem(id, approvers)
        if problem is not None:
            errors.append(problem)
        else:
            policy = frozen_roles(approvers)
        if not isinstance(self_approval, bool):
            errors.append(f"{id}: self_approval must be True or False, not {self_approval!r}")
        if redact is not None and not callable(redact):
            errors.append(f"{id}: redact must be a callable (input) -> input, not {redact!r}")
        doc = inspect.getdoc(handler) or ""
        return Capability(
            id=id,
            effect=effect,
            confirmation=confirmation or ("required" if effect == "write" else "none"),
            description=description if description is not None else doc.split("\n", 1)[0],
            handler=handler,
            input_model=model,
            prompt=prompt,
            definition_errors=tuple(errors),
            confirm_within=confirm_within,
            approvals=approvals,
            approvers=policy,
            self_approval=self_approval,
            redact=redact,
            remind_before=remind_before,
        )

    return decorate


def _input_model(
    handler: Handler, localns: Mapping[str, Any]
) -> tuple[type[pydantic.BaseModel] | None, str | None]:
    params = list(inspect.signature(handler).parameters.values())
    if len(params) != 2:
        return None, "the handler must take exactly (input, ctx)"
    annotation: Any = params[0].annotation
    if annotation is inspect.Parameter.empty:
        return None, None
    if isinstance(annotation, str):
        try:
            hints = typing.get_type_hints(handler, localns=dict(localns))
            annotation = hints.get(params[0].name, annotation)
        except Exception as exc:
            return None, f"cannot resolve the input annotation {annotation!r}: {exc}"
    origin = typing.get_origin(annotation) or annotation
    if origin in (dict, Mapping, typing.Any):
        return None, None
    # A pydantic model's class means ``pydantic.main`` is loaded: without it, no
    # annotation is one, and the package does not load pydantic to say so.
    models = sys.modules.get("pydantic.main")
    if (
        models is not None
        and isinstance(annotation, type)
        and issubclass(annotation, models.BaseModel)
    ):
        return annotation, None
    return None, f"the input annotation must be a pydantic model or dict, not {annotation!r}"
