"""KernelAgent: an Agents SDK agent whose ``Runner`` runs are steps of a kernel capability."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
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

from intention_kernel._json import dump_value
from intention_kernel.agent import Agent
from intention_kernel.capabilities import (
    Capability,
    CapabilityContext,
    CapabilityResult,
    capability,
)
from intention_kernel.errors import CapabilityError, KernelError
from intention_kernel.facts import Fact
from intention_kernel.integrations.openai_agents._held import AgentInput, Call, Conversation, dump
from intention_kernel.integrations.openai_agents._interpreter import BridgeInterpreter
from intention_kernel.integrations.openai_agents._model import RUN, KernelModel, StepRun
from intention_kernel.integrations.openai_agents._tools import KeyFunction, kernel_tool
from intention_kernel.interpretation import Answer, Decision
from intention_kernel.replies import Replies

__all__ = ["KernelAgent"]

TContext = TypeVar("TContext")

#: What the model reads when an approval closed without an answer (it expired, or an
#: operator resolved the interaction), before the next message.
CLOSED_UNANSWERED = "The approval request closed unanswered."
#: What the model reads for a reject without a reason.
REJECTED = "The person rejected the tool call."


class KernelAgent(Generic[TContext]):
    """An Agents SDK agent whose runs are turns of an intention-kernel thread.

    ``name`` names the kernel capability (``<name>.agent``) and the agent
    (:meth:`as_agent`). ``writes`` maps each write tool's name (a function tool of
    ``agent``) to the function that derives its business operation ID from the call's
    arguments; every other tool is a read. ``context`` is passed to every run (it is
    not stored: a paused run resumes with the live one). ``prompt`` renders an
    approval's question from the tool's name and arguments. ``read_answer`` reads a
    message sent while an approval is pending as the person's answer (``"accept"``,
    ``"reject"`` or an :class:`~intention_kernel.Answer`, a reject's ``reason``
    included), or ``None`` when it is not one; without it, only
    ``Kernel.turn(answer=...)`` answers. ``approve_within`` is how long an approval
    stays open (``None``: until answered); the run then reads the call as rejected,
    before the next message. ``run_config`` and ``max_turns`` are ``Runner.run``'s.
    """

    def __init__(
        self,
        agent: SDKAgent[TContext],
        *,
        name: str,
        writes: Mapping[str, KeyFunction] | None = None,
        context: TContext | None = None,
        prompt: Callable[[str, dict[str, Any]], str] | None = None,
        description: str | None = None,
        read_answer: Callable[[str], Answer | Decision | None] | None = None,
        approve_within: timedelta | None = None,
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
        self._kernel_name = name
        self._context = context
        self._prompt = prompt or _default_prompt
        self._max_turns = max_turns
        self.capability_id = f"{name}.agent"
        self.fact_key = f"{name}.conversation"
        self.capability: Capability = self._build_capability(description, approve_within)
        self.interpreter = BridgeInterpreter(self.capability_id, self.fact_key, read_answer)

    @property
    def agent(self) -> SDKAgent[TContext]:
        """The agent the runs use: the application's, with its model and write tools
        wrapped (a clone; the application's agent is unchanged)."""
        return self._agent

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
            # An uncertain write must stay uncertain, however the SDK wrapped it (a
            # UserError around the tool's exception): a failed step would let a later
            # turn retry it. Any other kernel error is reported as itself.
            found = _find(exc, KernelError)
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

    def _build_capability(
        self, description: str | None, approve_within: timedelta | None
    ) -> Capability:
        async def handle(input: AgentInput, ctx: CapabilityContext) -> CapabilityResult:
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
                    return self._ask(conversation, calls)
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

        return capability(
            self.capability_id,
            effect="write",
            confirmation="capability",
            description=description or f"Run the {self._kernel_name} agent",
            confirm_within=approve_within,
        )(handle)

    def _ask(self, conversation: Conversation, calls: list[Call]) -> CapabilityResult:
        asked = dataclasses.replace(conversation, asked=True)
        return CapabilityResult.needs_confirmation(
            "\n".join(self._prompt(call.tool_name, call.arguments) for call in calls),
            details=dump(calls),
            facts=[Fact(self.fact_key, asked.dump())],
        )

    def _outcome(self, result: RunResult) -> CapabilityResult:
        if result.interruptions:
            calls: list[Call] = []
            for item in result.interruptions:
                name = item.tool_name or item.name or ""
                if name not in self._writes:
                    # Without a key the approved call would have no receipt, and a
                    # redelivered accepting turn would run it again: refused before asking.
                    raise CapabilityError(
                        f"{self.capability_id}: tool {name!r} needs approval but has no key "
                        "in writes; an approved call runs once only through its receipt",
                        capability_id=self.capability_id,
                    )
                calls.append(_call(item))
            state = result.to_state().to_json(context_serializer=_no_context)
            held = Conversation(to_jsonable_python(result.to_input_list()), state, calls)
            return CapabilityResult(
                value={"approvals": dump(calls)},
                facts=[Fact(self.fact_key, held.dump())],
                reply="",
            )
        output = to_jsonable_python(result.final_output)
        done = Conversation(to_jsonable_python(result.to_input_list()))
        return CapabilityResult(
            value={"output": output},
            facts=[Fact(self.fact_key, done.dump())],
            reply=output if isinstance(output, str) else dump_value(output),
        )


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


def _default_prompt(tool_name: str, args: dict[str, Any]) -> str:
    return f"Run {tool_name} with {json.dumps(args, sort_keys=True)}? Accept or reject."


def _find(exc: BaseException, kind: type[KernelError]) -> KernelError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
