"""KernelAgent: a compiled LangGraph graph whose runs are steps of a kernel capability."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Command
from pydantic_core import to_jsonable_python

from intention_kernel._authority import Approvers
from intention_kernel._capabilities import CapabilityContext, CapabilityResult
from intention_kernel._interpretation import Answer, Decision
from intention_kernel.errors import CapabilityError, CorruptRecordError, EffectUncertainError
from intention_kernel.integrations._bridge import (
    CLOSED_UNANSWERED,
    BridgeAgent,
    KeyFunction,
    find_cause,
)
from intention_kernel.integrations.langgraph._held import (
    AgentInput,
    Call,
    Conversation,
    restore,
    snapshot,
)
from intention_kernel.integrations.langgraph._hitl import is_review, review_decisions, shown_action
from intention_kernel.integrations.langgraph._model import JournalGuard, install_journal_cache
from intention_kernel.integrations.langgraph._step import STEP, KernelStep
from intention_kernel.integrations.langgraph._tools import ToolSeam

__all__ = ["KernelAgent"]


def default_input(message: str) -> dict[str, Any]:
    """A person's message as the input of a graph whose state has ``messages``."""
    return {"messages": [HumanMessage(message)]}


def default_output(state: Any) -> Any:
    """The text of the last message of the final state (the graph's answer)."""
    messages = state.get("messages") if isinstance(state, Mapping) else None
    if not messages:
        return to_jsonable_python(state)
    last = messages[-1]
    if isinstance(last, BaseMessage):
        return last.text if isinstance(last.text, str) else to_jsonable_python(last.content)
    return to_jsonable_python(last)


class KernelAgent(BridgeAgent):
    """A compiled LangGraph graph whose runs are turns of an intention-kernel thread.

    ``name`` names the kernel capability (``<name>.agent``).
    It also names the agent (:meth:`as_agent`).
    ``writes`` maps each write tool's name to a key function.
    That function derives the business operation ID from the call's arguments.
    ``reads`` names the tools that only read.
    Every tool of every ``ToolNode`` must be in one of the two.
    ``approve`` names the write tools the person must accept before they run.
    The person accepts them call by call.
    ``prompt`` renders an approval's question from the tool's name and arguments.
    ``read_answer`` reads a message sent while an approval is pending.
    It returns the person's answer, or ``None`` when the message is not one.
    ``approve_within`` is how long an approval stays open.
    With ``None``, it stays open until answered.
    When it closes, the run reads it as rejected.
    ``approvers`` and ``self_approval`` say who may answer its approvals.
    They work as for ``@capability`` (see the guide *Who may approve*).
    ``to_input`` makes the graph's input from a message.
    ``to_reply`` makes the reply from the graph's final state.
    ``context`` is LangGraph's run context.
    ``config`` is merged into every run's config (``recursion_limit``, tags).

    Raises :class:`~intention_kernel.CompilationError` when a tool is not listed, or
    a listed write or approval names no tool of a ``ToolNode``.
    """

    def __init__(
        self,
        graph: Pregel[Any, Any, Any, Any],
        *,
        name: str,
        writes: Mapping[str, KeyFunction] | None = None,
        reads: Iterable[str] = (),
        approve: Iterable[str] = (),
        prompt: Callable[[str, dict[str, Any]], str] | None = None,
        description: str | None = None,
        read_answer: Callable[[str], Answer | Decision | None] | None = None,
        approve_within: timedelta | None = None,
        approvers: Approvers = None,
        self_approval: bool = True,
        to_input: Callable[[str], Any] = default_input,
        to_reply: Callable[[Any], Any] = default_output,
        context: Any = None,
        config: RunnableConfig | None = None,
    ) -> None:
        if not isinstance(graph, Pregel):
            raise TypeError(
                "a KernelAgent needs a compiled LangGraph graph (StateGraph(...).compile() "
                f"or create_react_agent(...)), got {type(graph).__name__}"
            )
        self._setup_bridge(
            name,
            self._handle,
            Conversation.load,
            prompt=prompt,
            description=description,
            read_answer=read_answer,
            approve_within=approve_within,
            approvers=approvers,
            self_approval=self_approval,
        )
        self._writes = dict(writes or {})
        self._reads = frozenset(reads)
        ToolSeam(self.capability_id, self._writes, self._reads, frozenset(approve)).install(graph)
        install_journal_cache()
        self.graph = graph
        self._to_input = to_input
        self._to_reply = to_reply
        self._context = context
        self._config: RunnableConfig = config or {}

    async def _handle(self, input: AgentInput, ctx: CapabilityContext) -> CapabilityResult:
        raw = ctx.facts.get(self.fact_key)
        conversation = Conversation.load(raw.value if raw is not None else None)
        calls = input.approvals
        if calls is not None:
            if conversation.pending != calls:
                raise CapabilityError(
                    f"{self.capability_id}: the interrupts to answer are not the ones the "
                    "graph waits on; nothing ran",
                    capability_id=self.capability_id,
                )
            if ctx.answer is None:
                asked = Conversation(
                    conversation.state, calls, asked=True, approved=conversation.approved
                )
                return self._ask(calls, [_shown(call) for call in calls], asked.dump())
            return await self._resume(ctx, conversation, calls, ctx.answer)
        run = await _Run.start(self, ctx, conversation)
        if conversation.pending:
            # The approval closed without an answer: it expired, or an operator resolved it.
            # The graph reads it as rejected before the new message.
            closed = {
                "decision": "reject",
                "reason": CLOSED_UNANSWERED,
                "value": None,
                "actor": None,
            }
            await run.invoke(_resume_command(self, conversation.pending, closed))
        assert input.prompt is not None  # AgentInput holds exactly one of the two
        await run.invoke(self._to_input(input.prompt))
        return await run.outcome()

    async def _resume(
        self,
        ctx: CapabilityContext,
        conversation: Conversation,
        calls: list[Call],
        answer: Answer,
    ) -> CapabilityResult:
        run = await _Run.start(self, ctx, conversation)
        # What resumes is the saved state's interrupts.
        # They must be the answered ones, to the value, or nothing runs.
        if await run.held() != [(c.interrupt_id, c.value) for c in calls]:
            raise CapabilityError(
                f"{self.capability_id}: the saved graph no longer waits on the answered "
                "interrupts; nothing ran",
                capability_id=self.capability_id,
            )
        resume = {
            "decision": answer.decision,
            "reason": answer.reason,
            "value": answer.value,
            "actor": answer.actor,
        }
        if answer.decision == "accept":
            run.step.approved.update(
                {c.tool_call_id: c.args for c in calls if c.tool_call_id and c.args is not None}
            )
        await run.invoke(_resume_command(self, calls, resume))
        return await run.outcome()


def _resume_command(agent: KernelAgent, calls: list[Call], answer: dict[str, Any]) -> Command[Any]:
    """The ``Command`` that answers ``calls``.

    It carries ``answer`` itself for plain interrupts.
    For review requests it carries the decisions of LangChain's middleware (see ``_hitl``).
    An answer a review request does not allow fails the step before anything runs.
    """
    resume: dict[str, Any] = {}
    for call in calls:
        if not is_review(call.value):
            resume[call.interrupt_id] = answer
            continue
        try:
            resume[call.interrupt_id] = review_decisions(call.value, answer)
        except ValueError as exc:
            raise CapabilityError(
                f"{agent.capability_id}: {exc}; nothing ran",
                capability_id=agent.capability_id,
            ) from exc
    return Command(resume=resume)


def _shown(call: Call) -> tuple[str, dict[str, Any]]:
    if call.tool_name is not None and call.args is not None:
        return call.tool_name, call.args
    action = shown_action(call.value)
    if action is not None:
        return action
    value = call.value if isinstance(call.value, dict) else {"value": call.value}
    return "interrupt", value


class _Run:
    """One step's runs of the graph, on a saver that holds the thread's state."""

    def __init__(self, agent: KernelAgent, ctx: CapabilityContext, saver: Any) -> None:
        self.agent = agent
        self.step = KernelStep(ctx, asyncio.get_running_loop())
        self.graph = agent.graph.copy(update={"checkpointer": saver})
        self.saver = saver
        config: dict[str, Any] = dict(agent._config)
        config["configurable"] = {**(config.get("configurable") or {}), "thread_id": ctx.thread_id}
        callbacks = config.get("callbacks")
        guard = JournalGuard(self.step, agent._reads)
        config["callbacks"] = [*(callbacks if isinstance(callbacks, list) else []), guard]
        self.config: RunnableConfig = config  # type: ignore[assignment]

    @classmethod
    async def start(
        cls, agent: KernelAgent, ctx: CapabilityContext, conversation: Conversation
    ) -> _Run:
        try:
            saver = await restore(conversation.state, ctx.thread_id)
        except ValueError as exc:
            raise CorruptRecordError(
                f"{agent.capability_id}: the saved graph state of thread {ctx.thread_id!r} "
                f"cannot be decoded: {exc}",
                thread_id=ctx.thread_id,
                turn_id=ctx.turn_id,
            ) from exc
        run = cls(agent, ctx, saver)
        run.step.approved = dict(conversation.approved)
        return run

    async def invoke(self, input: Any) -> None:
        token = STEP.set(self.step)
        try:
            await self.graph.ainvoke(input, self.config, context=self.agent._context)
        except Exception as exc:
            # An uncertain write must stay uncertain, however the graph wrapped it.
            # A failed step would let a later turn retry it.
            uncertain = find_cause(exc, EffectUncertainError)
            if uncertain is not None and uncertain is not exc:
                raise uncertain from exc
            raise
        finally:
            STEP.reset(token)
            self.step.gates.clear()  # a resumed task may reuse its namespace
        if self.step.uncertain is not None:
            raise self.step.uncertain

    async def held(self) -> list[tuple[str, Any]]:
        state = await self.graph.aget_state(self.config)
        return [(i.id, _json(self.agent, i.value)) for i in state.interrupts]

    async def outcome(self) -> CapabilityResult:
        agent = self.agent
        state = await self.graph.aget_state(self.config)
        pending = {task.id for task in state.tasks}
        saved = await snapshot(self.saver, self.step.ctx.thread_id, pending)
        if state.interrupts:
            calls = [
                Call(
                    interrupt_id=i.id,
                    value=_json(agent, i.value),
                    **self.step.paused.get(i.id, {}),
                )
                for i in state.interrupts
            ]
            held = Conversation(saved, calls, approved=self.step.approved)
            return agent._held(calls, held.dump())
        output = to_jsonable_python(agent._to_reply(state.values))
        return agent._done(output, Conversation(saved).dump())


def _json(agent: KernelAgent, value: Any) -> Any:
    try:
        return to_jsonable_python(value)
    except Exception as exc:
        raise CapabilityError(
            f"{agent.capability_id}: an interrupt's value is not JSON ({exc}); the person "
            "must be shown what they answer",
            capability_id=agent.capability_id,
        ) from exc
