"""What routes a Pydantic AI run through its turn: the model wrapper (the seam for
recorded model responses) and the toolset wrapper (write tools through receipts)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import to_jsonable_python

from intention_kernel.capabilities import CapabilityContext
from intention_kernel.effects import EffectAuthority
from intention_kernel.errors import CapabilityError

__all__ = ["STEP", "KernelModel", "KernelToolset", "KeyFunction", "effect_authority"]

#: Derives a write tool's business operation ID from the call's validated arguments.
KeyFunction = Callable[[dict[str, Any]], str]

# The step a kernel run belongs to. Set by the capability for the run it makes, read by
# the toolset wrapper: without it a write tool could not reach its turn's receipts.
STEP: ContextVar[CapabilityContext | None] = ContextVar("ik_pydantic_ai_step", default=None)
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


class KernelModel(WrapperModel):
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
class KernelToolset(WrapperToolset[AgentDepsT]):
    """A toolset whose write tools run through the turn's receipts."""

    writes: Mapping[str, KeyFunction] = field(default_factory=dict)

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        step = STEP.get()
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
