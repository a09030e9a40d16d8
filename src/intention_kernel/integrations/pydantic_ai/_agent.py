"""KernelAgent: the ``WrapperAgent`` whose runs are steps of a kernel capability."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Generic

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved
from pydantic_ai.agent import AbstractAgent, AgentRunResult, WrapperAgent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset
from pydantic_core import to_jsonable_python

from intention_kernel._authority import Approvers
from intention_kernel._capabilities import CapabilityContext, CapabilityResult
from intention_kernel._interpretation import Answer, Decision
from intention_kernel.errors import CapabilityError, CompilationError, EffectUncertainError
from intention_kernel.integrations._bridge import (
    CLOSED_UNANSWERED,
    REJECTED,
    BridgeAgent,
    KeyFunction,
    find_cause,
    listing_problems,
    tool_names,
)
from intention_kernel.integrations.pydantic_ai._held import (
    AgentInput,
    Call,
    Conversation,
    HeldCalls,
    denied,
    held_call,
)
from intention_kernel.integrations.pydantic_ai._tools import (
    STEP,
    KernelModel,
    KernelStep,
    KernelToolset,
)

__all__ = ["KernelAgent"]


class KernelAgent(BridgeAgent, WrapperAgent[AgentDepsT, Any], Generic[AgentDepsT]):
    """A Pydantic AI agent whose runs are turns of an intention-kernel thread.

    ``name`` names the kernel capability (``<name>.agent``).
    It also names the agent (:meth:`as_agent`).
    ``writes`` maps each write tool's name to a key function.
    That function derives the business operation ID from the call's arguments.
    ``reads`` names the tools that only read.
    They run as they are, with no receipt.

    Every tool must be in one of the two: the bridge fails closed.
    An unlisted tool of the agent's function toolsets is refused here (``CompilationError``).
    Some toolsets list their tools only at run time.
    A prefixed or dynamic toolset, or an MCP server, does so.
    An unlisted tool of one fails the step before the model is asked.

    ``deps`` is passed to every run.
    ``prompt`` renders an approval's question from the tool's name and arguments.
    ``read_answer`` reads a message sent while an approval is pending.
    It returns the person's answer, or ``None`` when the message is not one.
    An answer is ``"accept"``, ``"reject"`` or an :class:`~intention_kernel.Answer`.
    An ``Answer`` may carry a reject's ``reason``.
    Without ``read_answer``, only ``Kernel.turn(answer=...)`` answers.
    ``approve_within`` is how long an approval stays open.
    With ``None``, it stays open until answered.
    When it closes, the run reads the call as denied, before the next message.
    ``approvers`` and ``self_approval`` say who may answer its approvals.
    They work as for ``@capability`` (see the guide *Who may approve*).
    """

    def __init__(
        self,
        wrapped: AbstractAgent[AgentDepsT, Any],
        *,
        name: str,
        writes: Mapping[str, KeyFunction] | None = None,
        reads: Collection[str] | None = None,
        deps: AgentDepsT = None,  # type: ignore[assignment]
        prompt: Callable[[str, dict[str, Any]], str] | None = None,
        description: str | None = None,
        read_answer: Callable[[str], Answer | Decision | None] | None = None,
        approve_within: timedelta | None = None,
        approvers: Approvers = None,
        self_approval: bool = True,
    ) -> None:
        super().__init__(wrapped)
        if not isinstance(wrapped.model, Model):
            raise TypeError(
                "a KernelAgent needs an agent with a model (a Model instance, not a name or "
                "None): the kernel wraps it to route its requests"
            )
        self._writes = dict(writes or {})
        self._reads = tool_names("reads", reads)
        _check_listed(wrapped, self._writes, self._reads)
        self._deps = deps
        self._model = KernelModel(wrapped.model)
        self._toolsets: list[AbstractToolset[AgentDepsT]] = [
            KernelToolset(toolset, writes=self._writes, reads=self._reads)
            for toolset in wrapped.toolsets
        ]
        self._setup_bridge(
            name,
            self._handle,
            HeldCalls.load,
            prompt=prompt,
            description=description,
            read_answer=read_answer,
            approve_within=approve_within,
            approvers=approvers,
            self_approval=self_approval,
        )

    @contextmanager
    def _kernel_overrides(self) -> Iterator[None]:
        # The run sees only the wrapped model and toolsets, as in the DBOS and Temporal agents.
        # ``tools=[]`` keeps the agent's own function tools from being offered twice.
        # They are in the wrapped function toolset already.
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
            # An uncertain write must stay uncertain, however Pydantic AI wrapped it.
            # A failed step would let a later turn retry it.
            uncertain = find_cause(exc, EffectUncertainError)
            if uncertain is not None and uncertain is not exc:
                raise uncertain from exc
            raise
        finally:
            STEP.reset(token)

    async def _handle(self, input: AgentInput, ctx: CapabilityContext) -> CapabilityResult:
        step = KernelStep(ctx)
        raw = ctx.facts.get(self.fact_key)
        conversation = Conversation.load(raw.value if raw is not None else None)
        calls = input.approvals
        if calls is not None:
            if ctx.answer is None:
                if conversation.pending != calls:
                    raise CapabilityError(
                        f"{self.capability_id}: the calls proposed for approval are not the "
                        "ones the agent is waiting on",
                        capability_id=self.capability_id,
                    )
                asked = Conversation(conversation.messages, calls, asked=True)
                shown = [(call.tool_name, call.args) for call in calls]
                return self._ask(calls, shown, asked.dump())
            return self._outcome(await self._resume(step, conversation, calls))
        history = conversation.messages
        if conversation.pending:
            # The approval closed without an answer: it expired, or an operator resolved it.
            # The model is told so before it reads the new message.
            closed = await self._run(
                step, None, history, denied(conversation.pending, CLOSED_UNANSWERED)
            )
            history = closed.all_messages()
        assert input.prompt is not None  # AgentInput holds exactly one of the two
        return self._outcome(await self._run(step, input.prompt, history))

    async def _resume(
        self, step: KernelStep, conversation: Conversation, calls: list[Call]
    ) -> AgentRunResult[Any]:
        # What runs is the history's held calls.
        # They must be the approved ones, to the argument, or nothing runs.
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
            results = denied(calls, answer.reason or REJECTED)
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
                self._require_key(part.tool_name)
                calls.append(
                    Call(
                        tool_name=part.tool_name,
                        tool_call_id=part.tool_call_id,
                        args=part.args_as_dict(),
                    )
                )
            return self._held(calls, Conversation(messages, calls).dump())
        return self._done(to_jsonable_python(output), Conversation(messages).dump())


def _check_listed(
    agent: AbstractAgent[Any, Any], writes: Mapping[str, KeyFunction], reads: frozenset[str]
) -> None:
    """Refuse a function tool in neither ``writes`` nor ``reads``, or a tool in both.

    Only function toolsets name their tools before a run.
    The others are checked when a run lists them (``KernelToolset.get_tools``).
    """
    tools = [
        name
        for toolset in agent.toolsets
        if isinstance(toolset, FunctionToolset)
        for name in toolset.tools
    ]
    problems = listing_problems(tools, writes, reads)
    if problems:
        raise CompilationError(problems)
