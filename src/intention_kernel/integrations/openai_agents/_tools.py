"""Write tools through the turn's receipts.

A function tool named in ``writes`` runs inside ``ctx.run_effect``.
Its key is one the application derives from the call's arguments.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
from agents.tool import FunctionTool
from agents.tool_context import ToolContext

from intention_kernel.integrations._bridge import KeyFunction, run_write
from intention_kernel.integrations.openai_agents._model import RUN

__all__ = ["kernel_tool"]


def kernel_tool(tool: FunctionTool, key_of: KeyFunction) -> FunctionTool:
    """A copy of ``tool`` whose calls inside a kernel run go through a receipt.

    The body runs without the tool's failure handler (``failure_error_function``).
    That handler turns an exception into text for the model.
    A write that may have happened would then be recorded as completed.
    Here an exception leaves the receipt ``uncertain`` and ends the run.
    ``EffectNotAppliedError`` instead makes the step ``failed``.
    Arguments are checked against the tool's JSON schema before anything is held.
    Bad ones reach the model as the tool's output, and nothing runs.
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
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"Invalid arguments for tool {tool.name}: not JSON ({exc}). Nothing ran."
        if not isinstance(args, dict):
            return f"Invalid arguments for tool {tool.name}: not a JSON object. Nothing ran."
        problem = jsonschema.exceptions.best_match(validator.iter_errors(args))
        if problem is not None:
            return f"Invalid arguments for tool {tool.name}: {problem.message}. Nothing ran."
        return await run_write(run.ctx, tool.name, args, key_of, lambda: run_body(ctx, arguments))

    return dataclasses.replace(tool, on_invoke_tool=invoke)
