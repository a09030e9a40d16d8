"""The model as a kernel run calls it.

Each response is recorded in the turn's journal before the run acts on it.
It is read from there when the turn is delivered again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pydantic
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.tool import Tool
from agents.usage import deserialize_usage, serialize_usage
from openai.types.responses import ResponseOutputItem
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic_core import to_jsonable_python

from intention_kernel._capabilities import CapabilityContext
from intention_kernel.errors import CapabilityError, CorruptRecordError

if TYPE_CHECKING:
    from agents.retry import ModelRetryAdvice, ModelRetryAdviceRequest

__all__ = ["RUN", "KernelModel", "StepRun", "dump_response", "load_response"]

_OUTPUT_ITEM: pydantic.TypeAdapter[ResponseOutputItem] = pydantic.TypeAdapter(ResponseOutputItem)


@dataclass
class StepRun:
    """The kernel step the runs of the moment belong to, and their response count.

    That count is how many model responses they have received so far.
    It is the next response's position.
    """

    ctx: CapabilityContext
    responses: int = 0


# Set by the capability around the runs it makes; read by the model and the write tools.
# Without it a model request could not reach its turn's journal, nor a write its receipts.
RUN: ContextVar[StepRun | None] = ContextVar("ik_openai_agents_run", default=None)


def dump_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as the JSON the journal stores."""
    return {
        "output": [to_jsonable_python(item) for item in response.output],
        "usage": serialize_usage(response.usage),
        "response_id": response.response_id,
        "request_id": response.request_id,
    }


def load_response(value: Any, key: str, ctx: CapabilityContext) -> ModelResponse:
    """The response a journal entry holds; ``CorruptRecordError`` if it holds none."""
    try:
        if not isinstance(value, dict):
            raise TypeError(f"a {type(value).__name__}, not an object")
        output = [_OUTPUT_ITEM.validate_python(item) for item in value["output"]]
        usage = value["usage"]
        if not isinstance(usage, dict):
            raise TypeError("its usage is not an object")
        return ModelResponse(
            output=output,
            usage=deserialize_usage(usage),
            response_id=value["response_id"],
            request_id=value["request_id"],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptRecordError(
            f"{ctx.capability_id}: the recorded model response {key!r} of turn "
            f"{ctx.turn_id!r} cannot be decoded: {type(exc).__name__}: {exc}",
            thread_id=ctx.thread_id,
            turn_id=ctx.turn_id,
            key=key,
        ) from exc


class KernelModel(Model):
    """The agent's model, as a kernel run calls it.

    ``wrapped`` is a ``Model``, or a model name (``None``: the SDK's default).
    ``provider`` resolves a name on the first request.
    Inside a kernel run, response N of the step is ``ctx.recorded("model.<N>", ...)``.
    It is recorded before the run acts on it.
    On a redelivery of the turn, it is read back without asking the model.
    Responses are matched by position, not by request.
    A read may return something else after the crash.
    The run still meets the response recorded after the first read.
    A request that fails records nothing and takes no position.
    The SDK's retry, or a redelivery, asks again at the same position.
    Outside a kernel run the model is called as it is.
    """

    def __init__(self, wrapped: Model | str | None, provider: ModelProvider) -> None:
        self._wrapped = wrapped
        self._provider = provider
        self._resolved: Model | None = wrapped if isinstance(wrapped, Model) else None

    def model(self) -> Model:
        if self._resolved is None:
            name = self._wrapped if isinstance(self._wrapped, str) else None
            self._resolved = self._provider.get_model(name)
        return self._resolved

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        def request() -> Awaitable[ModelResponse]:
            return self.model().get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )

        async def ask() -> dict[str, Any]:
            return dump_response(await request())

        run = RUN.get()
        if run is None:
            return await request()
        key = f"model.{run.responses + 1}"
        value = await run.ctx.recorded(key, ask)
        # Counted only once the response is in hand: a failed request must not shift
        # the positions of the responses after it.
        run.responses += 1
        return load_response(value, key, run.ctx)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        run = RUN.get()
        if run is not None:
            # A streamed response would reach the run before it is recorded.
            raise CapabilityError(
                f"{run.ctx.capability_id}: a kernel run does not stream its model responses",
                capability_id=run.ctx.capability_id,
            )
        return self.model().stream_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )

    def get_retry_advice(self, request: ModelRetryAdviceRequest) -> ModelRetryAdvice | None:
        return self.model().get_retry_advice(request)

    async def close(self) -> None:
        if self._resolved is not None:
            await self._resolved.close()
