"""KernelAgent: an Agents SDK agent whose ``Runner`` runs are steps of a kernel capability."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any, Generic, TypeVar

from agents import Agent as SDKAgent
from agents import RunConfig, Runner, RunResult, RunState
from agents.items import ToolApprovalItem
from agents.models.interface import Model
from agents.run import DEFAULT_MAX_TURNS
from agents.run_context import RunContextWrapper
from agents.tool import FunctionTool
from pydantic_core import to_jsonable_python

from intention_kernel._authority import Approvers
from intention_kernel._capabilities import CapabilityContext, CapabilityResult
from intention_kernel._interpretation import Answer, Decision
from intention_kernel.errors import CapabilityError, CompilationError, KernelError
from intention_kernel.integrations._bridge import (
    CLOSED_UNANSWERED,
    REJECTED,
    BridgeAgent,
    KeyFunction,
    find_cause,
    listing_problems,
    tool_names,
)
from intention_kernel.integrations.openai_agents._held import AgentInput, Call, Conversation, load
from intention_kernel.integrations.openai_agents._model import RUN, KernelModel, StepRun
from intention_kernel.integrations.openai_agents._tools import kernel_tool

__all__ = ["KernelAgent"]

TContext = TypeVar("TContext")


class KernelAgent(BridgeAgent, Generic[TContext]):
    """An Agents SDK agent whose runs are turns of an intention-kernel thread.

    ``name`` names the kernel capability (``<name>.agent``) and the agent
    (:meth:`as_agent`).
    ``writes`` maps each write tool's name to a function of the call's arguments.
    That function derives the call's business operation ID.
    Each write tool is a function tool of ``agent``.
    ``reads`` names the tools that only read; hosted tools count too.
    They run as they are, with no receipt.
    Every tool of ``agent`` must be in one of the two.
    One in neither is refused here with ``CompilationError``: the bridge fails closed.
    ``context`` is passed to every run.
    It is not stored: a paused run resumes with the live one.
    ``prompt`` renders an approval's question from the tool's name and arguments.
    ``read_answer`` reads a message sent while an approval is pending.
    It returns the person's answer, or ``None`` when the message is not one.
    An answer is ``"accept"``, ``"reject"`` or an :class:`~intention_kernel.Answer`.
    A reject's ``reason`` is included.
    Without ``read_answer``, only ``Kernel.turn(answer=...)`` answers.
    ``approve_within`` is how long an approval stays open (``None``: until answered).
    After that, the run reads the call as rejected, before the next message.
    ``run_config`` and ``max_turns`` are ``Runner.run``'s.
    ``approvers`` and ``self_approval`` say who may answer its approvals.
    They work as for ``@capability`` (see the guide *Who may approve*).
    """

    def __init__(
        self,
        agent: SDKAgent[TContext],
        *,
        name: str,
        writes: Mapping[str, KeyFunction] | None = None,
        reads: Collection[str] | None = None,
        context: TContext | None = None,
        prompt: Callable[[str, dict[str, Any]], str] | None = None,
        description: str | None = None,
        read_answer: Callable[[str], Answer | Decision | None] | None = None,
        approve_within: timedelta | None = None,
        approvers: Approvers = None,
        self_approval: bool = True,
        run_config: RunConfig | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
    ) -> None:
        if not isinstance(agent, SDKAgent):
            raise TypeError(f"a KernelAgent wraps an agents.Agent, got {type(agent).__name__}")
        if agent.handoffs:
            raise TypeError(
                "a KernelAgent runs one agent: handoffs are not supported (each agent's "
                "tools and model would need the kernel's wrapping too)"
            )
        if agent.mcp_servers:
            raise TypeError(
                "a KernelAgent does not wrap MCP servers' tools: give the agent function "
                "tools, or use intention_kernel.integrations.mcp"
            )
        self._writes = dict(writes or {})
        tools = {t.name: t for t in agent.tools if isinstance(t, FunctionTool)}
        unknown = sorted(set(self._writes) - set(tools))
        if unknown:
            raise ValueError(
                f"writes names {', '.join(map(repr, unknown))}, which is not a function tool of "
                f"agent {agent.name!r} (its function tools: {', '.join(sorted(tools)) or 'none'})"
            )
        reads_set = tool_names("reads", reads)
        names = [t.name for t in agent.tools]
        problems = listing_problems(names, self._writes, reads_set)
        problems += [
            f"reads names {name!r}, which is not a tool of agent {agent.name!r}"
            for name in sorted(reads_set - set(names))
        ]
        if problems:
            raise CompilationError(problems)
        config = run_config if run_config is not None else RunConfig()
        model: Model | str | None = config.model if config.model is not None else agent.model
        # The run sees the wrapped model and the wrapped write tools only. The config's
        # own model is moved into the agent's: the SDK prefers it to the agent's, and
        # would otherwise bypass the journal.
        self._run_config = dataclasses.replace(config, model=None)
        self._agent: SDKAgent[TContext] = agent.clone(
            model=KernelModel(model, config.model_provider),
            tools=[
                kernel_tool(t, self._writes[t.name])
                if isinstance(t, FunctionTool) and t.name in self._writes
                else t
                for t in agent.tools
            ],
        )
        self._context = context
        self._max_turns = max_turns
        self._setup_bridge(
            name,
            self._handle,
            load,
            prompt=prompt,
            description=description,
            read_answer=read_answer,
            approve_within=approve_within,
            approvers=approvers,
            self_approval=self_approval,
        )

    @property
    def agent(self) -> SDKAgent[TContext]:
        """The agent the runs use: the application's, with its model and write tools
        wrapped (a clone; the application's agent is unchanged)."""
        return self._agent

    # -- the runs ---------------------------------------------------------------------------

    async def _run(
        self, run: StepRun, input: list[Any] | RunState[TContext, SDKAgent[TContext]]
    ) -> RunResult:
        token = RUN.set(run)
        try:
            return await Runner.run(
                self._agent,
                input,
                context=self._context,
                max_turns=self._max_turns,
                run_config=self._run_config,
            )
        except Exception as exc:
            # An uncertain write must stay uncertain, however the SDK wrapped it.
            # The SDK may wrap the tool's exception in a UserError.
            # A failed step would let a later turn retry the write.
            # Any other kernel error is reported as itself.
            found = find_cause(exc, KernelError)
            if found is not None and found is not exc:
                raise found from exc
            raise
        finally:
            RUN.reset(token)

    async def _restore(self, conversation: Conversation) -> RunState[Any, Any]:
        assert conversation.state is not None
        try:
            # A new wrapper per restore: the SDK rebuilds the stored approvals onto it.
            live = RunContextWrapper(context=self._context)
            return await RunState.from_json(self._agent, conversation.state, context_override=live)
        except Exception as exc:
            raise CapabilityError(
                f"{self.capability_id}: the paused run held for approval cannot be restored "
                f"({type(exc).__name__}: {exc}); nothing ran",
                capability_id=self.capability_id,
            ) from exc

    def _bind(self, state: RunState[Any, Any], calls: Sequence[Call]) -> list[ToolApprovalItem]:
        """The paused run's interruptions, if they are exactly the approved calls, to
        the argument; else nothing runs."""
        items = state.get_interruptions()
        held = [_call(item) for item in items]
        if held != list(calls):
            raise CapabilityError(
                f"{self.capability_id}: the paused run's calls differ from the approved ones; "
                "nothing ran",
                capability_id=self.capability_id,
            )
        return items

    async def _resume(
        self,
        run: StepRun,
        conversation: Conversation,
        calls: Sequence[Call],
        answer: Answer | None,
    ) -> RunResult:
        state = await self._restore(conversation)
        for item in self._bind(state, calls):
            if answer is not None and answer.decision == "accept":
                state.approve(item)
            else:
                message = CLOSED_UNANSWERED if answer is None else (answer.reason or REJECTED)
                state.reject(item, rejection_message=message)
        return await self._run(run, state)

    # -- the capability ---------------------------------------------------------------------

    async def _handle(self, input: AgentInput, ctx: CapabilityContext) -> CapabilityResult:
        raw = ctx.facts.get(self.fact_key)
        try:
            conversation = Conversation.load(raw.value if raw is not None else None)
        except ValueError as exc:
            raise CapabilityError(
                f"{self.capability_id}: the thread's {self.fact_key} fact cannot be read "
                f"({exc}); nothing ran",
                capability_id=self.capability_id,
            ) from exc
        run = StepRun(ctx)
        calls = input.approvals
        if calls is not None:
            if conversation.pending != calls:
                raise CapabilityError(
                    f"{self.capability_id}: the calls proposed for approval are not the "
                    "ones the agent is waiting on; nothing ran",
                    capability_id=self.capability_id,
                )
            if ctx.answer is None:
                asked = dataclasses.replace(conversation, asked=True)
                shown = [(call.tool_name, call.arguments) for call in calls]
                return self._ask(calls, shown, asked.dump())
            return self._outcome(await self._resume(run, conversation, calls, ctx.answer))
        items = conversation.items
        if conversation.pending:
            # The approval closed without an answer: the model is told so (each call
            # rejected) before it reads the new message.
            closed = await self._resume(run, conversation, conversation.pending, None)
            if closed.interruptions:
                return self._outcome(closed)
            items = closed.to_input_list()
        assert input.prompt is not None  # AgentInput holds exactly one of the two
        message = {"role": "user", "content": input.prompt}
        return self._outcome(await self._run(run, [*items, message]))

    def _outcome(self, result: RunResult) -> CapabilityResult:
        items = to_jsonable_python(result.to_input_list())
        if result.interruptions:
            calls: list[Call] = []
            for item in result.interruptions:
                self._require_key(item.tool_name or item.name or "")
                calls.append(_call(item))
            state = result.to_state().to_json(context_serializer=_no_context)
            return self._held(calls, Conversation(items, state, calls).dump())
        return self._done(to_jsonable_python(result.final_output), Conversation(items).dump())


def _call(item: ToolApprovalItem) -> Call:
    """The call an interruption holds, as the person is shown it."""
    raw = item.arguments
    try:
        arguments = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        arguments = {"_raw": raw}
    if not isinstance(arguments, dict):
        arguments = {"_raw": raw}
    return Call(
        tool_name=item.tool_name or item.name or "",
        call_id=item.call_id or "",
        arguments=arguments,
    )


def _no_context(context: Any) -> Mapping[str, Any]:
    # A context that is not a mapping (clients, credentials) is not stored: a resumed
    # run is given the live one. The SDK stores a mapping context as it is.
    return {}
