"""Write tools through the turn's receipts: a function tool named in ``writes`` runs
inside ``ctx.run_effect`` with a key the application derives from its arguments."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import jsonschema
from agents.tool import FunctionTool
from agents.tool_context import ToolContext
from pydantic_core import to_jsonable_python

from intention_kernel.effects import EffectAuthority
from intention_kernel.errors import CapabilityError
from intention_kernel.integrations.openai_agents._model import RUN

__all__ = ["KeyFunction", "effect_authority", "kernel_tool"]

#: Derives a write tool's business operation ID from the call's parsed arguments.
KeyFunction = Callable[[dict[str, Any]], str]

_AUTHORITY: ContextVar[EffectAuthority | None] = ContextVar(
    "ik_openai_agents_authority", default=None
)


def effect_authority() -> EffectAuthority:
    """The receipt's authority for the write tool running now: pass its
    ``idempotency_key`` to the provider, so that it too deduplicates.

    Raises ``LookupError`` outside a write tool run by the kernel."""
    authority = _AUTHORITY.get()
    if authority is None:
        raise LookupError("effect_authority() is only set inside a write tool run by the kernel")
    return authority


def kernel_tool(tool: FunctionTool, key_of: KeyFunction) -> FunctionTool:
    """A copy of ``tool`` whose calls inside a kernel run go through a receipt.

    The body runs without the tool's failure handler (``failure_error_function``):
    that handler turns an exception into text for the model, which would record a
    write that may have happened as a completed one. Here an exception leaves the
    receipt ``uncertain`` and ends the run (``EffectNotAppliedError``: ``failed``).
    Arguments are checked against the tool's JSON schema before anything is held:
    bad ones reach the model as the tool's output, and nothing runs.
    """
    bare = dataclasses.replace(
        tool, _failure_error_function=None, _use_default_failure_error_function=False
    )
    run_body = bare.on_invoke_tool
    run_as_is = tool.on_invoke_tool
    validator = jsonschema.Draft202012Validator(tool.params_json_schema)

    async def invoke(ctx: ToolContext[Any], arguments: str) -> Any:
        run = RUN.get()
        if run is None:  # outside a kernel turn the tool is the SDK's, as it was
            return await run_as_is(ctx, arguments)
        step = run.ctx
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"Invalid arguments for tool {tool.name}: not JSON ({exc}). Nothing ran."
        if not isinstance(args, dict):
            return f"Invalid arguments for tool {tool.name}: not a JSON object. Nothing ran."
        problem = jsonschema.exceptions.best_match(validator.iter_errors(args))
        if problem is not None:
            return f"Invalid arguments for tool {tool.name}: {problem.message}. Nothing ran."
        try:
            operation = key_of(args)
        except Exception as exc:
            raise CapabilityError(
                f"the key function of write tool {tool.name!r} failed on {args!r}: "
                f"{type(exc).__name__}: {exc}; nothing ran",
                capability_id=step.capability_id,
            ) from exc
        if not isinstance(operation, str) or not operation:
            raise CapabilityError(
                f"the key function of write tool {tool.name!r} must return a non-empty "
                f"string, got {operation!r}; nothing ran",
                capability_id=step.capability_id,
            )

        async def apply(authority: EffectAuthority) -> Any:
            token = _AUTHORITY.set(authority)
            try:
                value = await run_body(ctx, arguments)
            finally:
                _AUTHORITY.reset(token)
            # What the model reads back is the stored JSON, on the first call and on
            # every replay alike: the two never differ.
            return to_jsonable_python(value)

        effect = await step.run_effect(f"{tool.name}:{operation}", apply)
        return effect.value

    return dataclasses.replace(tool, on_invoke_tool=invoke)
