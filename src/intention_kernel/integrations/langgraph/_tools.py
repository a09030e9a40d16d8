"""The tool seam between each ``ToolNode`` of the graph and the turn.

Write tools run through the turn's receipts.
The tools named in ``approve`` ask the person first.

A ``ToolNode`` takes an async wrapper around each tool call (``awrap_tool_call``).
That is LangGraph's own interception point.
Its human-in-the-loop middleware uses the same one.
The bridge sets one on every ``ToolNode`` of the graph.
It goes inside any wrapper the application set.
So what it sees is the call that runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import pydantic
from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.pregel import Pregel
from langgraph.types import Command, interrupt

from intention_kernel.errors import CapabilityError, CompilationError, EffectUncertainError
from intention_kernel.integrations._bridge import REJECTED, KeyFunction, run_write
from intention_kernel.integrations.langgraph._step import STEP, KernelStep, TaskGate

__all__ = ["IN_TOOL_NODE", "ToolSeam", "tool_nodes"]

#: The attribute that marks a ``ToolNode`` wrapper as a seam's (its ``ToolSeam``).
SEAM = "_intention_kernel_seam"

#: The tool a ``ToolNode`` of a kernel run is calling now.
#: The guard reads it.
IN_TOOL_NODE: ContextVar[str | None] = ContextVar("ik_langgraph_tool", default=None)


class _Skipped(GraphInterrupt):
    """A tool call not run because a call before it paused its task.

    LangGraph and the ``ToolNode`` see it as an interrupt.
    A ``ToolNode`` never handles one.
    It carries no interrupt of its own.
    So the task's first exception, the real pause, is the one seen.
    """

    def __init__(self, name: str) -> None:
        super().__init__(())
        self.tool_name = name


Execute = Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]


def tool_nodes(graph: Pregel[Any, Any, Any, Any]) -> Iterator[ToolNode]:
    """Every ``ToolNode`` of ``graph`` and of the subgraphs it declares."""
    graphs: list[Pregel[Any, Any, Any, Any]] = [graph]
    graphs.extend(sub for _, sub in graph.get_subgraphs(recurse=True) if isinstance(sub, Pregel))
    for each in graphs:
        for node in each.nodes.values():
            if isinstance(node.bound, ToolNode):
                yield node.bound


class ToolSeam:
    """The wrapper the bridge sets on each ``ToolNode`` of one graph."""

    def __init__(
        self,
        capability_id: str,
        writes: Mapping[str, KeyFunction],
        reads: frozenset[str],
        approve: frozenset[str],
    ) -> None:
        self.capability_id = capability_id
        self.writes = writes
        self.reads = reads
        self.approve = approve

    def install(self, graph: Pregel[Any, Any, Any, Any]) -> None:
        """Set the wrapper on every ``ToolNode`` of ``graph``, once its tools are all listed.

        Otherwise it raises ``CompilationError``, and nothing is changed.
        """
        nodes = list(tool_nodes(graph))
        names = {name for node in nodes for name in node.tools_by_name}
        problems = [
            f"{self.capability_id}: tool {name!r} is neither in writes nor in reads; "
            "list every tool, so that no write runs without its receipt"
            for name in sorted(names - set(self.writes) - self.reads)
        ]
        problems.extend(
            f"{self.capability_id}: writes names {name!r}, which no ToolNode of the graph has"
            for name in sorted(set(self.writes) - names)
        )
        problems.extend(
            f"{self.capability_id}: tool {name!r} is both a write and a read"
            for name in sorted(set(self.writes) & self.reads)
        )
        problems.extend(
            f"{self.capability_id}: approve names {name!r}, which is not in writes; an "
            "approved call runs once only through its receipt"
            for name in sorted(self.approve - set(self.writes))
        )
        for node in nodes:
            if node._wrap_tool_call is not None and node._awrap_tool_call is None:
                problems.append(
                    f"{self.capability_id}: a ToolNode has a sync wrap_tool_call only; give "
                    "it an async awrap_tool_call too, which the kernel runs inside"
                )
            if getattr(node._awrap_tool_call, SEAM, None) not in (None, self):
                # Two seams on one node would hold two receipts for one write.
                # The inner one would be prepared inside the outer one's provider call.
                problems.append(
                    f"{self.capability_id}: a ToolNode of the graph is run by another "
                    "KernelAgent already; compile the graph once for each"
                )
        if problems:
            raise CompilationError(problems)
        for node in nodes:
            if getattr(node._awrap_tool_call, SEAM, None) is self:
                continue
            node._awrap_tool_call = self._around(node._awrap_tool_call)

    def _around(self, outer: Any) -> Any:
        """The node's wrapper: this seam, inside the application's ``outer`` if any."""

        async def wrapped(request: ToolCallRequest, execute: Execute) -> ToolMessage | Command[Any]:
            if outer is None:
                return await self.wrap(request, execute)

            async def inner(request: ToolCallRequest) -> ToolMessage | Command[Any]:
                return await self.wrap(request, execute)

            result: ToolMessage | Command[Any] = await outer(request, inner)
            return result

        setattr(wrapped, SEAM, self)
        return wrapped

    async def wrap(self, request: ToolCallRequest, execute: Execute) -> ToolMessage | Command[Any]:
        step = STEP.get()
        if step is None:  # the graph run outside a turn, as it is
            return await execute(request)
        call = request.tool_call
        name, call_id = call["name"], call.get("id") or ""
        args = dict(call.get("args") or {})
        configurable = request.runtime.config.get("configurable") or {}
        gate = step.gates.setdefault(str(configurable.get("checkpoint_ns", "")), TaskGate())
        async with gate.lock:
            if gate.stopped:
                # A call before this one paused the task.
                # This one runs when the task is resumed.
                raise _Skipped(name)
            token = IN_TOOL_NODE.set(name)
            try:
                if name in self.approve:
                    refused = self._ask(step, name, call_id, args)
                    if refused is not None:
                        return refused
                if name in self.writes:
                    return await self._write(step, request, execute, name, call_id, args)
                return await execute(request)
            except GraphInterrupt as paused:
                gate.stopped = True
                for raised in paused.args[0] if paused.args else ():
                    step.paused[raised.id] = {
                        "tool_name": name,
                        "tool_call_id": call_id,
                        "args": args,
                    }
                raise
            finally:
                IN_TOOL_NODE.reset(token)

    def _ask(
        self, step: KernelStep, name: str, call_id: str, args: dict[str, Any]
    ) -> ToolMessage | None:
        """Pause on the call until the person answers.

        A reject's reason, or :data:`REJECTED`, is the tool's result.
        The model reads it.
        """
        shown = {"tool_name": name, "tool_call_id": call_id, "args": args}
        answer = interrupt(shown)  # raises until the answer is given, before any receipt
        decision = answer.get("decision") if isinstance(answer, Mapping) else None
        if decision != "accept":
            reason = answer.get("reason") if isinstance(answer, Mapping) else None
            return ToolMessage(
                content=reason or REJECTED, name=name, tool_call_id=call_id, status="error"
            )
        if step.approved.get(call_id) != args:
            # The person accepted what they were shown.
            # A call whose arguments differ is not that call.
            # A wrapper may have rewritten them, or another call taken its ID.
            raise CapabilityError(
                f"{self.capability_id}: the approved {name} call {call_id!r} would run with "
                f"{args!r}, not the approved {step.approved.get(call_id)!r}; nothing ran",
                capability_id=self.capability_id,
            )
        return None

    async def _write(
        self,
        step: KernelStep,
        request: ToolCallRequest,
        execute: Execute,
        name: str,
        call_id: str,
        args: dict[str, Any],
    ) -> ToolMessage:
        schema = request.tool.tool_call_schema if request.tool is not None else None
        if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
            try:
                schema.model_validate(args)
            except pydantic.ValidationError:
                # The tool refuses these arguments, so it will not run.
                # So no receipt is held.
                # The ToolNode answers the model with the error, as it does alone.
                result = await execute(request)
                assert isinstance(result, ToolMessage)
                return result

        async def run() -> Any:
            result = await execute(request)
            if not isinstance(result, ToolMessage):
                raise CapabilityError(
                    f"{self.capability_id}: write tool {name!r} returned a "
                    f"{type(result).__name__}; a write answers with a ToolMessage",
                    capability_id=self.capability_id,
                )
            if result.status == "error":
                # The ToolNode turned the tool's exception into a message.
                # Whether the write happened before it is unknown.
                # So it must not run again.
                raise CapabilityError(
                    f"{self.capability_id}: write tool {name!r} failed: {result.content}",
                    capability_id=self.capability_id,
                )
            value: dict[str, Any] = {"content": result.content}
            if result.artifact is not None:
                value["artifact"] = result.artifact
            return value

        try:
            value = await run_write(step.ctx, name, args, self.writes[name], run)
        except EffectUncertainError as exc:
            # Kept on the step, for a ToolNode that handles tool errors.
            # It would turn the error into a message, and the step would end completed.
            step.uncertain = step.uncertain or exc
            raise
        # The model reads back the stored JSON, on the first call and every replay.
        # So the two never differ.
        return ToolMessage(
            content=value["content"],
            name=name,
            tool_call_id=call_id,
            artifact=value.get("artifact"),
        )
