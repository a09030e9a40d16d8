"""What routes a Pydantic AI run through its turn.

The model wrapper records model responses in the turn's journal.
The toolset wrapper runs write tools through receipts.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    ModelResponseStreamEvent,
)
from pydantic_ai.models import (
    CompletedStreamedResponse,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import to_jsonable_python

from intention_kernel._capabilities import CapabilityContext
from intention_kernel.errors import CapabilityError, CorruptRecordError
from intention_kernel.integrations._bridge import KeyFunction, run_write, unlisted_tool

__all__ = ["STEP", "KernelModel", "KernelStep", "KernelToolset"]


@dataclass
class KernelStep:
    """The step a kernel run belongs to, and how many model requests its runs made."""

    ctx: CapabilityContext
    requests: int = 0
    #: The arguments of each call the person accepted, by tool call ID.
    #: That call may run with these arguments only.
    approved: dict[str, dict[str, Any]] = field(default_factory=dict)

    def next_key(self) -> str:
        """The journal key of the step's next model request: its position, from 1.

        Positions count across the step's runs.
        A step that first closes an unanswered approval makes two runs.
        A redelivery makes the same requests in the same order.
        Each one follows from the recorded response before it.
        """
        self.requests += 1
        return f"pydantic_ai.model.{self.requests}"


# The step a kernel run belongs to.
# The capability sets it for the runs it makes.
# The model and toolset wrappers read it.
# Without it a model request could not reach its turn's journal.
# Nor could a write tool reach its receipts.
STEP: ContextVar[KernelStep | None] = ContextVar("ik_pydantic_ai_step", default=None)


class KernelModel(WrapperModel):
    """The wrapped agent's model, as a kernel run calls it.

    Every model request of a run inside a turn goes through :meth:`request`.
    A streamed one goes through :meth:`request_stream`.
    Its response is recorded in the turn's journal with ``ctx.recorded``.
    The key is the step and the request's position.
    It is recorded before Pydantic AI runs the tools the response asks for.
    A delivery of the same turn after a crash gets the recorded response.
    It does not ask the model again.
    The response is stored as Pydantic AI's own ``ModelMessagesTypeAdapter`` dumps it.
    """

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        step = STEP.get()
        if step is None:
            return await super().request(messages, model_settings, model_request_parameters)

        async def ask() -> Any:
            response = await super(KernelModel, self).request(
                messages, model_settings, model_request_parameters
            )
            return _dump(response)

        key = step.next_key()
        return _load(await step.ctx.recorded(key, ask), step.ctx, key)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse]:
        step = STEP.get()
        if step is None:
            async with super().request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as live:
                yield live
            return
        # The stream is read to its end before the run sees it.
        # A response is recorded whole or not at all.
        # So the run reads its events after the model finished.
        events: list[ModelResponseStreamEvent] | None = None

        async def ask() -> Any:
            nonlocal events
            events = []
            async with super(KernelModel, self).request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as live:
                async for event in live:
                    events.append(event)
            return _dump(live.get())

        key = step.next_key()
        response = _load(await step.ctx.recorded(key, ask), step.ctx, key)
        yield CompletedStreamedResponse(
            response,
            model_request_parameters=model_request_parameters,
            # Recorded in an earlier delivery, so the events are made from the parts.
            replay_events=events if events is not None else True,
        )


def _dump(response: ModelResponse) -> Any:
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def _load(value: Any, ctx: CapabilityContext, key: str) -> ModelResponse:
    try:
        (message,) = ModelMessagesTypeAdapter.validate_python([value])
    except ValueError as exc:  # pydantic's ValidationError is one
        raise _corrupt(ctx, key, str(exc)) from exc
    if not isinstance(message, ModelResponse):
        raise _corrupt(ctx, key, f"it is a {message.kind}, not a model response")
    return message


def _corrupt(ctx: CapabilityContext, key: str, why: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"the recorded model response {key!r} of step {ctx.step_id!r} cannot be decoded: {why}",
        thread_id=ctx.thread_id,
        turn_id=ctx.turn_id,
        key=key,
    )


@dataclass
class KernelToolset(WrapperToolset[AgentDepsT]):
    """A toolset whose write tools run through the turn's receipts.

    In a kernel run, it refuses any tool in neither ``writes`` nor ``reads``.
    """

    writes: Mapping[str, KeyFunction] = field(default_factory=dict)
    reads: frozenset[str] = frozenset()

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        tools = await super().get_tools(ctx)
        current = STEP.get()
        if current is None:
            return tools  # outside a kernel run the toolset is the application's, as it was
        unlisted = [n for n in sorted(tools) if n not in self.writes and n not in self.reads]
        if unlisted:
            # Tools are listed before each model request.
            # Refused here, the tool is never offered to the model.
            # So nothing the run would do after the refusal has run yet.
            step = current.ctx
            raise CapabilityError(
                f"{step.capability_id}: " + "; ".join(unlisted_tool(n) for n in unlisted),
                capability_id=step.capability_id,
            )
        return tools

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        current = STEP.get()
        if current is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        step = current.ctx
        approved = current.approved.get(ctx.tool_call_id or "")
        if ctx.tool_call_approved and approved is not None:
            _check_approved(step, name, ctx.tool_call_id, approved, tool_args, tool)
        key_of = self.writes.get(name)
        if key_of is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        return await run_write(
            step,
            name,
            tool_args,
            key_of,
            lambda: self.wrapped.call_tool(name, tool_args, ctx, tool),
        )


def _check_approved(
    step: CapabilityContext,
    name: str,
    tool_call_id: str | None,
    approved: dict[str, Any],
    tool_args: dict[str, Any],
    tool: ToolsetTool[Any],
) -> None:
    """Refuse an approved call whose validated arguments are not the approved ones.

    Both sets of arguments are validated alike.
    The person accepted what they were shown.
    A hook that rewrote the arguments after validation would run a call nobody approved.
    """
    ran = to_jsonable_python(tool_args)
    try:
        expected = to_jsonable_python(tool.args_validator.validate_python(approved))
    except ValueError:  # pydantic's ValidationError is one
        expected = approved
    if ran != expected:
        raise CapabilityError(
            f"{step.capability_id}: the approved {name} call {tool_call_id!r} would run "
            f"with {ran!r}, not the approved {approved!r}; nothing ran",
            capability_id=step.capability_id,
        )
