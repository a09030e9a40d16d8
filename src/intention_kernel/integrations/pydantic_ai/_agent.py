"""KernelAgent: the ``WrapperAgent`` whose runs are steps of a kernel capability."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Generic

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved
from pydantic_ai.agent import AbstractAgent, AgentRunResult, WrapperAgent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import AbstractToolset
from pydantic_core import to_jsonable_python

from intention_kernel._json import dump_value
from intention_kernel.agent import Agent
from intention_kernel.capabilities import (
    Capability,
    CapabilityContext,
    CapabilityResult,
    capability,
)
from intention_kernel.errors import CapabilityError, EffectUncertainError
from intention_kernel.facts import Fact
from intention_kernel.integrations.pydantic_ai._held import (
    AgentInput,
    Call,
    Conversation,
    denied,
    dump,
    held_call,
)
from intention_kernel.integrations.pydantic_ai._interpreter import BridgeInterpreter
from intention_kernel.integrations.pydantic_ai._tools import (
    STEP,
    KernelModel,
    KernelStep,
    KernelToolset,
    KeyFunction,
)
from intention_kernel.interpretation import Answer, Decision
from intention_kernel.replies import Replies

__all__ = ["KernelAgent"]


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
        self._model = KernelModel(wrapped.model)
        self._toolsets: list[AbstractToolset[AgentDepsT]] = [
            KernelToolset(toolset, writes=self._writes) for toolset in wrapped.toolsets
        ]
        self.capability_id = f"{name}.agent"
        self.fact_key = f"{name}.conversation"
        self.capability: Capability = self._build_capability(description, approve_within)
        self.interpreter = BridgeInterpreter(self.capability_id, self.fact_key, read_answer)

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
        step: KernelStep,
        prompt: str | None,
        history: Sequence[ModelMessage],
        deferred: DeferredToolResults | None = None,
    ) -> AgentRunResult[Any]:
        token = STEP.set(step)
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
            STEP.reset(token)

    def _build_capability(
        self, description: str | None, approve_within: timedelta | None
    ) -> Capability:
        async def handle(input: AgentInput, ctx: CapabilityContext) -> CapabilityResult:
            step = KernelStep(ctx)
            raw = ctx.facts.get(self.fact_key)
            conversation = Conversation.load(raw.value if raw is not None else None)
            calls = input.approvals
            if calls is not None:
                if ctx.answer is None:
                    return self._ask(conversation, calls)
                return self._outcome(await self._resume(step, conversation, calls))
            history = conversation.messages
            if conversation.pending:
                # The approval closed without an answer (it expired, or an operator
                # resolved it): the model is told so before it reads the new message.
                closed = await self._run(
                    step,
                    None,
                    history,
                    denied(conversation.pending, "The approval request closed unanswered."),
                )
                history = closed.all_messages()
            assert input.prompt is not None  # AgentInput holds exactly one of the two
            return self._outcome(await self._run(step, input.prompt, history))

        return capability(
            self.capability_id,
            effect="write",
            confirmation="capability",
            description=description or f"Run the {self._kernel_name} agent",
            confirm_within=approve_within,
        )(handle)

    def _ask(self, conversation: Conversation, calls: list[Call]) -> CapabilityResult:
        if conversation.pending != calls:
            raise CapabilityError(
                f"{self.capability_id}: the calls proposed for approval are not the ones the "
                "agent is waiting on",
                capability_id=self.capability_id,
            )
        asked = Conversation(conversation.messages, calls, asked=True)
        return CapabilityResult.needs_confirmation(
            "\n".join(self._prompt(call.tool_name, call.args) for call in calls),
            details=dump(calls),
            facts=[Fact(self.fact_key, asked.dump())],
        )

    async def _resume(
        self, step: KernelStep, conversation: Conversation, calls: list[Call]
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
            held = held_call(conversation.messages, call.tool_call_id)
            if held is None or held.tool_name != call.tool_name or held.args_as_dict() != call.args:
                raise CapabilityError(
                    f"{self.capability_id}: the held {call.tool_name} call "
                    f"{call.tool_call_id!r} differs from the approved one; nothing ran",
                    capability_id=self.capability_id,
                )
        answer = step.ctx.answer
        assert answer is not None
        if answer.decision == "accept":
            step.approved = {c.tool_call_id: c.args for c in calls}
            results = DeferredToolResults(approvals={c.tool_call_id: ToolApproved() for c in calls})
        else:
            results = denied(calls, answer.reason or "The person rejected the tool call.")
        return await self._run(step, None, conversation.messages, results)

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
            calls: list[Call] = []
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
                    Call(
                        tool_name=part.tool_name,
                        tool_call_id=part.tool_call_id,
                        args=part.args_as_dict(),
                    )
                )
            held = Conversation(messages, calls)
            return CapabilityResult(
                value={"approvals": dump(calls)},
                facts=[Fact(self.fact_key, held.dump())],
                reply="",
            )
        value = to_jsonable_python(output)
        return CapabilityResult(
            value={"output": value},
            facts=[Fact(self.fact_key, Conversation(messages).dump())],
            reply=value if isinstance(value, str) else dump_value(value),
        )


def _default_prompt(tool_name: str, args: dict[str, Any]) -> str:
    return f"Run {tool_name} with {json.dumps(args, sort_keys=True)}? Accept or reject."


def _find(exc: BaseException, kind: type[EffectUncertainError]) -> EffectUncertainError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
