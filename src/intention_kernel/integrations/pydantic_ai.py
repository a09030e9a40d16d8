"""KernelAgent: a Pydantic AI ``Agent`` run as the loop of an intention-kernel turn.

::

    from pydantic_ai import Agent as PydanticAgent
    from intention_kernel import Kernel
    from intention_kernel.integrations.pydantic_ai import KernelAgent

    desk = PydanticAgent("openai:gpt-4o-mini", instructions="You run the help desk.")

    @desk.tool_plain
    def order_status(order_id: str) -> dict[str, str]: ...          # a read

    @desk.tool_plain(requires_approval=True)
    def issue_refund(order_id: str, cents: int) -> dict[str, str]: ...   # a write

    bridge = KernelAgent(desk, name="desk",
                         writes={"issue_refund": lambda args: args["order_id"]})
    kernel = Kernel(bridge.as_agent(version="1"), durability)

The design, in the terms of Pydantic AI's durable-execution interface (the one its
Temporal, DBOS and Prefect integrations use): :class:`KernelAgent` is a
``WrapperAgent``. It runs the wrapped agent with its model wrapped (a ``WrapperModel``)
and each of its toolsets wrapped (a ``WrapperToolset``), inside one kernel capability,
``<name>.agent`` (a write whose consent is its own, ``confirmation="capability"``):

- A message becomes one step of that capability, which runs the Pydantic AI agent on
  the thread's message history. The history is a fact of the thread
  (``<name>.conversation``), so it is committed with the turn or not at all.
- A tool named in ``writes`` runs through ``ctx.run_effect`` with the key
  ``"<tool name>:<writes[tool](args)>"``, a business operation ID the application
  derives from the call's arguments. A retried or redelivered turn re-runs the agent,
  and the tool call meets its receipt: completed, the stored value goes back to the
  model and the tool is not called; uncertain, the step is ``uncertain`` (the write is
  never retried blindly). Any other tool is a read and runs as it is.
- A tool with ``requires_approval=True`` makes Pydantic AI end the run with
  ``DeferredToolRequests``. The bridge's interpreter (it works in rounds) then proposes
  those exact calls as the capability's input, ``{"approvals": [{"tool_name",
  "tool_call_id", "args"}, ...]}``; the capability asks (``needs_confirmation``), so the
  kernel holds a durable interaction whose ``digest`` is over each tool, call ID and
  arguments, and whose prompt shows them. An accept in a later turn, in any process,
  calls the capability again: it resumes the run from the stored history with
  ``DeferredToolResults(approvals={id: ToolApproved()})``, so Pydantic AI runs exactly
  the held calls (each through its receipt) and the model's next request carries their
  results. A reject resumes with ``ToolDenied(reason)``: the model reads the person's
  reason as the denial. An answer with another digest runs nothing (the kernel refuses
  it). Calls the model made together are answered together: Pydantic AI resumes a run
  only with a result for every call it deferred.

Why one capability for the whole loop, and not one per tool: Pydantic AI runs its own
loop (model, tools, model), and an approval must resume *that* loop in the accepting
turn, which has no message for an interpreter to read; a capability called again with
the answer is the kernel's seam for exactly that. One capability also gives every
write one receipt namespace (``<name>.agent:...``), whether it ran in the turn that
proposed it or in the one that approved it.

What is recorded today, and what is not:

- Recorded: each write tool's outcome (its receipt), the message history of every
  committed turn, and a held approval (the interaction and the history it resumes).
- Not recorded yet: model responses. A redelivered turn that died before its commit
  asks the model again for the requests it had already made; a write it asks for
  again with the same business key is not repeated (the receipt answers), but a model
  that answers differently the second time may ask for other reads or writes. The seam
  for recording is :meth:`_KernelModel.request`: every model request of a kernel run
  goes through it, and recorded responses will be replayed there.

An approval tool must be named in ``writes``: the accepted call runs through its
receipt, so a redelivered accepting turn does not run it again. One that is not is
refused before the person is asked (the step fails, nothing runs).

Limits: while an approval is pending, a new message is answered with the pending
question (the run is paused on it); answer it first. A run that ends asking for
several approvals holds them in one interaction (one answer for all). External
(``CallDeferred``) tools are not supported: the step fails and says so. The history
fact keeps every message of the thread's runs (``Agent(max_messages=...)`` bounds the
kernel's own transcript, not it); it is not trimmed yet.

Needs the ``pydantic-ai`` extra: ``pip install 'intention-kernel[pydantic-ai]'``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic

try:
    from pydantic_ai import (
        DeferredToolRequests,
        DeferredToolResults,
        RunContext,
        ToolApproved,
        ToolDenied,
    )
    from pydantic_ai.agent import AbstractAgent, AgentRunResult, WrapperAgent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelResponse,
        ToolCallPart,
    )
    from pydantic_ai.models import Model, ModelRequestParameters
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import AgentDepsT
    from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
    from pydantic_ai.toolsets.abstract import ToolsetTool
    from pydantic_core import to_jsonable_python
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "intention_kernel.integrations.pydantic_ai needs Pydantic AI: "
        "pip install 'intention-kernel[pydantic-ai]'"
    ) from exc

import pydantic

from intention_kernel._json import dump_value
from intention_kernel.agent import Agent
from intention_kernel.capabilities import (
    Capability,
    CapabilityContext,
    CapabilityResult,
    capability,
)
from intention_kernel.effects import EffectAuthority
from intention_kernel.errors import CapabilityError, EffectUncertainError
from intention_kernel.facts import Fact
from intention_kernel.interpretation import (
    Answer,
    Decision,
    Intent,
    Interpretation,
    InterpretationRequest,
)
from intention_kernel.replies import Replies
from intention_kernel.turns import StepStatus

__all__ = ["KernelAgent", "KeyFunction", "effect_authority"]

#: Derives a write tool's business operation ID from the call's validated arguments.
KeyFunction = Callable[[dict[str, Any]], str]

# The step a kernel run belongs to. Set by the capability for the run it makes, read by
# the toolset wrapper: without it a write tool could not reach its turn's receipts.
_STEP: ContextVar[CapabilityContext | None] = ContextVar("ik_pydantic_ai_step", default=None)
_AUTHORITY: ContextVar[EffectAuthority | None] = ContextVar(
    "ik_pydantic_ai_authority", default=None
)


def effect_authority() -> EffectAuthority:
    """The receipt's authority for the write tool running now: pass its
    ``idempotency_key`` to the provider, so that it too deduplicates.

    Raises ``LookupError`` outside a write tool run by the kernel."""
    authority = _AUTHORITY.get()
    if authority is None:
        raise LookupError("effect_authority() is only set inside a write tool run by the kernel")
    return authority


class _Call(pydantic.BaseModel):
    """One tool call held for approval: what the person sees and the digest binds."""

    tool_name: str
    tool_call_id: str
    args: dict[str, Any]


class _AgentInput(pydantic.BaseModel):
    """The capability's input: a message for the agent, or a call to approve."""

    prompt: str | None = None
    approvals: list[_Call] | None = None

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> _AgentInput:
        if (self.prompt is None) == (self.approvals is None):
            raise ValueError("give exactly one of prompt and approvals")
        if self.approvals is not None and not self.approvals:
            raise ValueError("approvals holds at least one call")
        return self


class _KernelModel(WrapperModel):
    """The wrapped agent's model, as a kernel run calls it.

    Every model request of a run made inside a turn goes through :meth:`request`: this
    is where recorded model responses will be looked up and stored (keyed by the step
    and the request's position in the run), once the kernel records them. Today it
    calls the model.
    """

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        return await super().request(messages, model_settings, model_request_parameters)


@dataclass
class _KernelToolset(WrapperToolset[AgentDepsT]):
    """A toolset whose write tools run through the turn's receipts."""

    writes: Mapping[str, KeyFunction] = field(default_factory=dict)

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        step = _STEP.get()
        key_of = self.writes.get(name)
        if step is None or key_of is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        operation = key_of(tool_args)
        if not isinstance(operation, str) or not operation:
            raise CapabilityError(
                f"the key function of write tool {name!r} must return a non-empty string, "
                f"got {operation!r}",
                capability_id=step.capability_id,
            )

        async def apply(authority: EffectAuthority) -> Any:
            token = _AUTHORITY.set(authority)
            try:
                value = await self.wrapped.call_tool(name, tool_args, ctx, tool)
            finally:
                _AUTHORITY.reset(token)
            # What the model reads back is the stored JSON, on the first call and on
            # every replay alike: the two never differ.
            return to_jsonable_python(value)

        effect = await step.run_effect(f"{name}:{operation}", apply)
        return effect.value


@dataclass(frozen=True)
class _Conversation:
    """The ``<name>.conversation`` fact: the run's history and the calls it holds for
    approval (empty: none)."""

    messages: list[ModelMessage]
    pending: list[_Call] = field(default_factory=list)
    asked: bool = False

    @classmethod
    def load(cls, value: Any) -> _Conversation:
        if not isinstance(value, Mapping):
            return cls([])
        return cls(
            list(ModelMessagesTypeAdapter.validate_python(value.get("messages") or [])),
            [_Call.model_validate(call) for call in value.get("pending") or []],
            bool(value.get("asked", False)),
        )

    def dump(self) -> dict[str, Any]:
        return {
            "messages": ModelMessagesTypeAdapter.dump_python(self.messages, mode="json"),
            "pending": _dump(self.pending),
            "asked": self.asked,
        }


class KernelAgent(WrapperAgent[AgentDepsT, Any], Generic[AgentDepsT]):
    """A Pydantic AI agent whose runs are turns of an intention-kernel thread.

    ``name`` names the kernel capability (``<name>.agent``) and the agent
    (:meth:`as_agent`). ``writes`` maps each write tool's name to the function that
    derives its business operation ID from the call's arguments; every other tool is a
    read. ``deps`` is passed to every run. ``prompt`` renders an approval's question
    from the tool's name and arguments. ``read_answer`` reads a message sent while an
    approval is pending as the person's answer (``"accept"``, ``"reject"`` or an
    :class:`~intention_kernel.Answer`, a reject's ``reason`` included), or ``None``
    when it is not one; without it, only ``Kernel.turn(answer=...)`` answers.
    ``approve_within`` is how long an approval stays open (``None``: until answered);
    the run then reads the call as denied, before the next message.
    """

    def __init__(
        self,
        wrapped: AbstractAgent[AgentDepsT, Any],
        *,
        name: str,
        writes: Mapping[str, KeyFunction] | None = None,
        deps: AgentDepsT = None,  # type: ignore[assignment]
        prompt: Callable[[str, dict[str, Any]], str] | None = None,
        description: str | None = None,
        read_answer: Callable[[str], Answer | Decision | None] | None = None,
        approve_within: timedelta | None = None,
    ) -> None:
        super().__init__(wrapped)
        if not isinstance(wrapped.model, Model):
            raise TypeError(
                "a KernelAgent needs an agent with a model (a Model instance, not a name or "
                "None): the kernel wraps it to route its requests"
            )
        self._kernel_name = name
        self._writes = dict(writes or {})
        self._deps = deps
        self._prompt = prompt or _default_prompt
        self._model = _KernelModel(wrapped.model)
        self._toolsets: list[AbstractToolset[AgentDepsT]] = [
            _KernelToolset(toolset, writes=self._writes) for toolset in wrapped.toolsets
        ]
        self.capability_id = f"{name}.agent"
        self.fact_key = f"{name}.conversation"
        self.capability: Capability = self._build_capability(description, approve_within)
        self.interpreter = _Interpreter(self.capability_id, self.fact_key, read_answer)

    def as_agent(
        self,
        version: str,
        *,
        max_messages: int = 50,
        max_receipts: int = 100,
        compatible_fingerprints: Sequence[str] = (),
        replies: Replies | None = None,
    ) -> Agent:
        """The intention-kernel :class:`~intention_kernel.Agent` that runs this agent:
        its one capability and its interpreter, in at most three rounds a turn (the
        run, the approval it asks for, the reply). The other parameters are
        ``Agent``'s."""
        return Agent(
            name=self._kernel_name,
            version=version,
            capabilities=[self.capability],
            interpreter=self.interpreter,
            max_messages=max_messages,
            max_receipts=max_receipts,
            compatible_fingerprints=compatible_fingerprints,
            replies=replies if replies is not None else Replies(),
            max_rounds=3,
        )

    @contextmanager
    def _kernel_overrides(self) -> Iterator[None]:
        # As the DBOS and Temporal agents do: the run sees the wrapped model and the
        # wrapped toolsets only; ``tools=[]`` keeps the agent's own function tools from
        # being offered twice (they are in the wrapped function toolset already).
        with self.wrapped.override(model=self._model, toolsets=self._toolsets, tools=[]):
            yield

    async def _run(
        self,
        ctx: CapabilityContext,
        prompt: str | None,
        history: Sequence[ModelMessage],
        deferred: DeferredToolResults | None = None,
    ) -> AgentRunResult[Any]:
        token = _STEP.set(ctx)
        try:
            with self._kernel_overrides():
                return await self.wrapped.run(
                    prompt,
                    message_history=list(history) or None,
                    deferred_tool_results=deferred,
                    deps=self._deps,
                    output_type=[self.wrapped.output_type, DeferredToolRequests],
                )
        except Exception as exc:
            # An uncertain write must stay uncertain, however Pydantic AI wrapped it:
            # a failed step would let a later turn retry it.
            uncertain = _find(exc, EffectUncertainError)
            if uncertain is not None and uncertain is not exc:
                raise uncertain from exc
            raise
        finally:
            _STEP.reset(token)

    def _build_capability(
        self, description: str | None, approve_within: timedelta | None
    ) -> Capability:
        async def handle(input: _AgentInput, ctx: CapabilityContext) -> CapabilityResult:
            raw = ctx.facts.get(self.fact_key)
            conversation = _Conversation.load(raw.value if raw is not None else None)
            calls = input.approvals
            if calls is not None:
                if ctx.answer is None:
                    return self._ask(conversation, calls)
                return self._outcome(await self._resume(ctx, conversation, calls))
            history = conversation.messages
            if conversation.pending:
                # The approval closed without an answer (it expired, or an operator
                # resolved it): the model is told so before it reads the new message.
                closed = await self._run(
                    ctx,
                    None,
                    history,
                    _denied(conversation.pending, "The approval request closed unanswered."),
                )
                history = closed.all_messages()
            assert input.prompt is not None  # _AgentInput holds exactly one of the two
            return self._outcome(await self._run(ctx, input.prompt, history))

        return capability(
            self.capability_id,
            effect="write",
            confirmation="capability",
            description=description or f"Run the {self._kernel_name} agent",
            confirm_within=approve_within,
        )(handle)

    def _ask(self, conversation: _Conversation, calls: list[_Call]) -> CapabilityResult:
        if conversation.pending != calls:
            raise CapabilityError(
                f"{self.capability_id}: the calls proposed for approval are not the ones the "
                "agent is waiting on",
                capability_id=self.capability_id,
            )
        asked = _Conversation(conversation.messages, calls, asked=True)
        return CapabilityResult.needs_confirmation(
            "\n".join(self._prompt(call.tool_name, call.args) for call in calls),
            details=_dump(calls),
            facts=[Fact(self.fact_key, asked.dump())],
        )

    async def _resume(
        self, ctx: CapabilityContext, conversation: _Conversation, calls: list[_Call]
    ) -> AgentRunResult[Any]:
        # What runs is the history's held calls: they must be the approved ones, to the
        # argument, or nothing runs.
        if conversation.pending != calls:
            raise CapabilityError(
                f"{self.capability_id}: the approved calls are no longer the ones held; "
                "nothing ran",
                capability_id=self.capability_id,
            )
        for call in calls:
            held = _held_call(conversation.messages, call.tool_call_id)
            if held is None or held.tool_name != call.tool_name or held.args_as_dict() != call.args:
                raise CapabilityError(
                    f"{self.capability_id}: the held {call.tool_name} call "
                    f"{call.tool_call_id!r} differs from the approved one; nothing ran",
                    capability_id=self.capability_id,
                )
        answer = ctx.answer
        assert answer is not None
        if answer.decision == "accept":
            results = DeferredToolResults(approvals={c.tool_call_id: ToolApproved() for c in calls})
        else:
            results = _denied(calls, answer.reason or "The person rejected the tool call.")
        return await self._run(ctx, None, conversation.messages, results)

    def _outcome(self, run: AgentRunResult[Any]) -> CapabilityResult:
        messages = run.all_messages()
        output = run.output
        if isinstance(output, DeferredToolRequests):
            if output.calls:
                names = ", ".join(sorted({c.tool_name for c in output.calls}))
                raise CapabilityError(
                    f"{self.capability_id}: tools deferred for external execution ({names}) "
                    "are not supported by the kernel bridge",
                    capability_id=self.capability_id,
                )
            calls: list[_Call] = []
            for part in output.approvals:
                if part.tool_name not in self._writes:
                    # Without a key the approved call would have no receipt, and a
                    # redelivered accepting turn would run it again: refused before asking.
                    raise CapabilityError(
                        f"{self.capability_id}: tool {part.tool_name!r} needs approval but has "
                        "no key in writes; an approved call runs once only through its receipt",
                        capability_id=self.capability_id,
                    )
                calls.append(
                    _Call(
                        tool_name=part.tool_name,
                        tool_call_id=part.tool_call_id,
                        args=part.args_as_dict(),
                    )
                )
            held = _Conversation(messages, calls)
            return CapabilityResult(
                value={"approvals": _dump(calls)},
                facts=[Fact(self.fact_key, held.dump())],
                reply="",
            )
        value = to_jsonable_python(output)
        return CapabilityResult(
            value={"output": value},
            facts=[Fact(self.fact_key, _Conversation(messages).dump())],
            reply=value if isinstance(value, str) else dump_value(value),
        )


class _Interpreter:
    """Routes each message to the agent's capability, in rounds: the run; the approval
    it asked for, if any; then nothing more (the run's output is the reply)."""

    multi_round = True

    def __init__(
        self,
        capability_id: str,
        fact_key: str,
        read_answer: Callable[[str], Answer | Decision | None] | None,
    ) -> None:
        self._capability_id = capability_id
        self._fact_key = fact_key
        self._read_answer = read_answer

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if not request.rounds:
            active = request.interaction
            if active is not None and active.capability_id == self._capability_id:
                answer = self._read_answer(request.message) if self._read_answer else None
                if answer is not None:
                    # The person's own words answer the question they were shown; the
                    # kernel calls the capability again, which resumes the run.
                    return Interpretation(answer=answer)
                return Interpretation(reply=f"Answer this first: {active.prompt}")
            raw = request.facts.get(self._fact_key)
            conversation = _Conversation.load(raw.value if raw is not None else None)
            if conversation.pending and not conversation.asked:
                # A resumed run paused on another approval, in a turn with no rounds
                # left to ask it: it is asked now, before the agent reads anything new.
                return Interpretation(
                    intents=[self._approval(_dump(conversation.pending))],
                    reply="Before anything else, the agent needs an approval.",
                )
            prompt = {"prompt": request.message}
            return Interpretation(intents=[Intent(self._capability_id, prompt)])
        last = request.rounds[-1]
        # After the person's answer resumed the run, its step is the round's answer step.
        step = last.steps[-1] if last.steps else last.answer_step
        if step is None:
            return Interpretation()
        if step.status == StepStatus.AWAITING_CONFIRMATION:
            return Interpretation(reply="The agent asks for your approval.")
        value = step.value
        if step.status == StepStatus.COMPLETED and isinstance(value, dict) and "approvals" in value:
            return Interpretation(intents=[self._approval(value["approvals"])])
        return Interpretation()

    def _approval(self, calls: Any) -> Intent:
        return Intent(self._capability_id, {"approvals": calls})


def _default_prompt(tool_name: str, args: dict[str, Any]) -> str:
    return f"Run {tool_name} with {json.dumps(args, sort_keys=True)}? Accept or reject."


def _denied(calls: Sequence[_Call], message: str) -> DeferredToolResults:
    return DeferredToolResults(approvals={c.tool_call_id: ToolDenied(message) for c in calls})


def _dump(calls: Sequence[_Call]) -> list[dict[str, Any]]:
    return [call.model_dump(mode="json") for call in calls]


def _held_call(messages: Sequence[ModelMessage], tool_call_id: str) -> ToolCallPart | None:
    """The call ``tool_call_id`` of the history's last model response."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id:
                    return part
            return None
    return None


def _find(exc: BaseException, kind: type[EffectUncertainError]) -> EffectUncertainError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
