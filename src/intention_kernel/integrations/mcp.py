"""The tools of an MCP server as capabilities, run inside durable turns.

::

    from mcp import Client, StdioServerParameters
    from intention_kernel.integrations.mcp import mcp_capabilities

    server = StdioServerParameters(command="python", args=["tickets_server.py"])
    async with Client(server) as client:               # or Client("http://host/mcp")
        tools = await mcp_capabilities(client, namespace="tickets", trusted=True)
        kernel = Kernel(Agent(name="desk", version="1", capabilities=tools,
                              interpreter=interpreter), store)

Each tool the server lists becomes the capability ``<namespace>.<tool>``.
The tool part is the tool's name in lower case.
Every character other than a letter, a digit or ``_`` becomes ``_``.
The capability is described by the tool's description.
Its input schema is the tool's own.

**Reads and writes.** A tool is a read only when two things hold.
The application marks the server ``trusted``.
The tool's annotations say ``readOnlyHint: true``.
Every other tool is a write with ``confirmation="required"``.
The kernel holds such a write until the person accepts.
Annotations are hints from the server, not guarantees.
The MCP specification tells clients to treat them as untrusted unless the server is.
An untrusted server may call a delete read-only.
``policy`` changes the decision per tool.
It is a mapping from tool name to ``"read"`` or ``"write"``.
Or it is a callable that takes the listed ``mcp.types.Tool``.
The callable returns ``"read"``, ``"write"`` or ``None`` (the default rule).

**Writes.** Each call runs through ``ctx.run_effect``.
Its receipt key is ``key(tool_name, arguments)``.
By default that is ``"<tool name>:<sha256 of the canonical JSON of the arguments>"``.
The same call asked again in the thread reuses its receipt.
A redelivered or retried turn asks again, and so does a model asking twice.
The server is called at most once.
Other arguments are another call.
The receipt's idempotency key travels in the request's ``_meta``.
It is under :data:`IDEMPOTENCY_KEY_META`, for a server that deduplicates as well.
What the server answers decides the receipt:

- a result: ``completed``, the step's value is the result (see :func:`result_value`).
- a result with ``isError: true``: ``failed`` (``EffectNotAppliedError``).
  The failed step's error holds the tool's text.
  A model that works in rounds sees it.
  The kernel takes the server at its word.
  An error result is the server saying the tool did not do its work.
  So a later call with the same arguments may run it again.
- a JSON-RPC error whose code refuses the request before it runs: ``failed``.
  Those codes are parse error, invalid request, method not found and invalid params.
  MCP adds header mismatch and unsupported protocol version.
  It also adds missing client capability and URL elicitation required.
- anything else: ``uncertain``.
  That is no answer: the connection closed, the process died, the timeout passed.
  It is also an internal error, a result the client cannot read, or cancellation.
  The request may have reached the server and run.
  It is never sent again for that key.
  An operator resolves the receipt (``intention-kernel receipts resolve``).

**Inputs.** Arguments are validated against the tool's input schema when the step is planned.
The schema is a JSON Schema of the draft its ``$schema`` names (2020-12 without one).
So bad arguments are a failed step before anything is sent.
A confirmation never holds arguments the schema refuses.
The schema is part of the agent's fingerprint.
A server that changes a tool's schema changes the fingerprint.
Threads of the old one are then refused until the agent declares it compatible.

**Connection.** The capabilities call through the ``client`` they were built with.
The application owns it: it opens it and closes it.
Once its connection is lost, reads fail and writes become uncertain.
That lasts until the application connects again.
It then builds a new kernel from a new list.

Needs the ``mcp`` extra: ``pip install 'intention-kernel[mcp]'``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, Self, cast

try:
    import jsonschema
    import mcp
    import mcp_types
    from jsonschema.protocols import Validator
    from mcp.shared.exceptions import MCPError
    from referencing import Registry
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "intention_kernel.integrations.mcp needs the official mcp SDK: "
        "pip install 'intention-kernel[mcp]'",
        name=exc.name,
    ) from exc

import pydantic
from pydantic_core import PydanticCustomError

from intention_kernel._authority import Approvers, approvers_problem, frozen_roles
from intention_kernel._capabilities import (
    Capability,
    CapabilityContext,
    CapabilityResult,
    Redactor,
)
from intention_kernel._checkpoint import operation_digest
from intention_kernel._effects import EffectAuthority
from intention_kernel.errors import CapabilityError, CompilationError, EffectNotAppliedError

__all__ = [
    "IDEMPOTENCY_KEY_META",
    "KeyFunction",
    "ToolArguments",
    "ToolEffect",
    "ToolPolicy",
    "default_effect",
    "default_key",
    "mcp_capabilities",
    "result_value",
    "tool_capability",
]

#: The ``_meta`` key of a write's ``tools/call`` request that carries the receipt's
#: idempotency key (``EffectAuthority.idempotency_key``).
IDEMPOTENCY_KEY_META = "intention-kernel/idempotency-key"

#: What a tool does to the world: a read runs at once, a write waits for a yes.
ToolEffect = Literal["read", "write"]
#: By tool name, or a callable over the listed tool (``None``: the default rule).
ToolPolicy = Mapping[str, ToolEffect] | Callable[[mcp_types.Tool], ToolEffect | None]
#: ``(tool name, validated arguments) -> receipt key`` (a business operation ID).
KeyFunction = Callable[[str, dict[str, Any]], str]

# JSON-RPC errors that refuse a request before any handler runs it.
# With one of them, the tool was not called.
# Any other code may come after the tool ran.
# That includes an internal error and a server's own code.
# It also includes the SDK's own "connection closed" and "timed out".
_REFUSALS = frozenset(
    {
        mcp_types.PARSE_ERROR,
        mcp_types.INVALID_REQUEST,
        mcp_types.METHOD_NOT_FOUND,
        mcp_types.INVALID_PARAMS,
        mcp_types.HEADER_MISMATCH,
        mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY,
        mcp_types.UNSUPPORTED_PROTOCOL_VERSION,
        mcp_types.URL_ELICITATION_REQUIRED,
    }
)

_NAMESPACE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*")


class ToolArguments(pydantic.RootModel[dict[str, Any]]):
    """The arguments of one MCP tool, validated against the tool's input schema.

    :func:`tool_capability` makes one subclass per tool.
    Its JSON schema is the tool's schema as the server listed it.
    It is not one pydantic derives.
    The model sees it verbatim, and the fingerprint hashes it.
    """

    tool_name: ClassVar[str] = ""
    tool_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    tool_validator: ClassVar[Validator]

    @pydantic.model_validator(mode="after")
    def _conforms(self) -> Self:
        problems = [
            f"{'.'.join(str(p) for p in error.absolute_path) or '(input)'}: {error.message}"
            for error in sorted(
                self.tool_validator.iter_errors(self.root), key=lambda e: list(e.absolute_path)
            )
        ]
        if problems:
            raise PydanticCustomError(
                "mcp_input_schema",
                "arguments do not match the input schema of MCP tool {tool}: {problems}",
                {"tool": self.tool_name, "problems": "; ".join(problems)},
            )
        return self

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The tool's own input schema, as the server listed it."""
        return copy.deepcopy(cls.tool_schema)


def default_effect(tool: mcp_types.Tool, *, trusted: bool) -> ToolEffect:
    """``"read"`` for a tool of a trusted server that declares ``readOnlyHint: true``,
    ``"write"`` for every other tool."""
    hint = tool.annotations.read_only_hint if tool.annotations is not None else None
    return "read" if trusted and hint is True else "write"


def default_key(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """``"<tool name>:<sha256>"`` of the canonical JSON of the call (sorted keys)."""
    return f"{tool_name}:{operation_digest('mcp.tools/call', tool_name, arguments)}"


def result_value(result: mcp_types.CallToolResult) -> dict[str, Any]:
    """A tool result as the step's value: ``{"content": [...]}``, and
    ``"structuredContent"`` when the server sent one, in MCP's own JSON."""
    value: dict[str, Any] = {
        "content": [
            block.model_dump(mode="json", by_alias=True, exclude_none=True)
            for block in result.content
        ]
    }
    if result.structured_content is not None:
        value["structuredContent"] = result.structured_content
    return value


async def mcp_capabilities(
    client: mcp.Client,
    *,
    namespace: str,
    trusted: bool = False,
    policy: ToolPolicy | None = None,
    key: KeyFunction | None = None,
    call_timeout: float | None = None,
    approvers: Approvers = None,
    self_approval: bool = True,
    redact: Redactor | None = None,
) -> list[Capability]:
    """List the server's tools and make each a capability (see the module docstring).

    - ``namespace``: the first part of every capability ID (``"tickets"``,
      ``"infra.github"``): lower-case words joined by dots.
    - ``trusted``: whether the application trusts this server's annotations.
    - ``policy``: ``"read"`` or ``"write"`` per tool.
      A mapping must name only tools the server lists.
      A misspelt name would silently keep the default.
    - ``key``: the receipt key of a write call; by default :func:`default_key`.
    - ``call_timeout``: seconds to wait for each call's answer.
      ``None`` means the client's own default.
      A write whose answer does not come in time is ``uncertain``.
    - ``approvers``, ``self_approval``, ``redact``: every write tool's approver policy.
      They also set its receipt redaction.
      They work as for ``@capability``.

    Raises :class:`~intention_kernel.CompilationError` in four cases.
    The namespace is not an ID, or a policy names an unknown tool.
    Two tools' capability IDs collide, or an input schema is not a JSON Schema.
    """
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    problems: list[str] = []
    if isinstance(policy, Mapping):
        listed = {tool.name for tool in tools}
        problems.extend(
            f"the MCP policy names tool {name!r}, which the server does not list"
            for name in policy
            if name not in listed
        )
    capabilities: list[Capability] = []
    names: dict[str, str] = {}
    for tool in tools:
        try:
            cap = tool_capability(
                client,
                tool,
                namespace=namespace,
                effect=_decide(tool, policy, trusted=trusted),
                key=key,
                call_timeout=call_timeout,
                approvers=approvers,
                self_approval=self_approval,
                redact=redact,
            )
        except CompilationError as exc:
            problems.extend(exc.problems)
            continue
        if cap.id in names:
            problems.append(
                f"MCP tools {names[cap.id]!r} and {tool.name!r} both become capability "
                f"{cap.id!r}; serve them under names that differ in more than punctuation "
                "and case, or from two clients with two namespaces"
            )
            continue
        names[cap.id] = tool.name
        capabilities.append(cap)
    if problems:
        raise CompilationError(list(dict.fromkeys(problems)))
    return capabilities


def tool_capability(
    client: mcp.Client,
    tool: mcp_types.Tool,
    *,
    namespace: str,
    effect: ToolEffect,
    key: KeyFunction | None = None,
    call_timeout: float | None = None,
    approvers: Approvers = None,
    self_approval: bool = True,
    redact: Redactor | None = None,
) -> Capability:
    """One listed tool as a capability that calls it through ``client``; ``effect`` as
    decided (:func:`mcp_capabilities` applies the policy). No I/O.

    ``approvers``, ``self_approval`` and ``redact`` apply to a write tool only (a read
    asks no one and writes no receipt)."""
    if not _NAMESPACE.fullmatch(namespace):
        raise CompilationError(
            [f"MCP namespace {namespace!r} must be lower-case words joined by dots"]
        )
    if effect not in ("read", "write"):
        raise CompilationError([f"MCP tool {tool.name!r}: effect must be 'read' or 'write'"])
    capability_id = f"{namespace}.{_slug(tool.name)}"
    problem = approvers_problem(capability_id, approvers)
    if problem is not None:
        raise CompilationError([problem])
    model = _arguments_model(tool, capability_id)
    keyed = key or default_key

    async def call(arguments: dict[str, Any], meta: dict[str, Any] | None) -> Any:
        try:
            result = await client.call_tool(
                tool.name,
                arguments,
                read_timeout_seconds=call_timeout,
                meta=cast("mcp_types.RequestParamsMeta | None", meta),
            )
        except MCPError as exc:
            if exc.code in _REFUSALS:
                raise _refused(capability_id, tool.name, exc, write=meta is not None) from exc
            raise  # an uncertain outcome: run_effect records it so
        if result.is_error:
            raise _refused(capability_id, tool.name, result, write=meta is not None)
        return result_value(result)

    async def read(arguments: ToolArguments, ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult(value=await call(arguments.root, None))

    async def write(arguments: ToolArguments, ctx: CapabilityContext) -> CapabilityResult:
        values = arguments.root

        async def send(authority: EffectAuthority) -> Any:
            return await call(values, {IDEMPOTENCY_KEY_META: authority.idempotency_key})

        effect_result = await ctx.run_effect(keyed(tool.name, values), send)
        return CapabilityResult(value=effect_result.value)

    return Capability(
        id=capability_id,
        effect=effect,
        confirmation="none" if effect == "read" else "required",
        # A label in the kernel's replies ("<description>: <value>"), hence no final stop.
        description=(tool.description or tool.title or tool.name).strip().removesuffix("."),
        handler=read if effect == "read" else write,
        input_model=model,
        approvers=None if effect == "read" else frozen_roles(approvers),
        self_approval=True if effect == "read" else self_approval,
        redact=None if effect == "read" else redact,
    )


def _decide(tool: mcp_types.Tool, policy: ToolPolicy | None, *, trusted: bool) -> ToolEffect:
    if isinstance(policy, Mapping):
        chosen: ToolEffect | None = policy.get(tool.name)
    elif policy is not None:
        chosen = policy(tool)
    else:
        chosen = None
    return chosen if chosen is not None else default_effect(tool, trusted=trusted)


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9_]", "_", name.lower())
    return slug if slug[:1].isalpha() else f"t{slug}"


def _arguments_model(tool: mcp_types.Tool, capability_id: str) -> type[ToolArguments]:
    schema = tool.input_schema
    validator_class = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator
    )
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise CompilationError(
            [f"MCP tool {tool.name!r}: its input schema is not a JSON Schema: {exc.message}"]
        ) from exc
    # An empty registry: a "$ref" resolves within the schema, never by fetching a URL.
    validator = validator_class(schema, registry=Registry())
    name = "".join(part.capitalize() for part in capability_id.split(".")) + "Arguments"
    namespace = {
        "tool_name": tool.name,
        "tool_schema": copy.deepcopy(schema),
        "tool_validator": validator,
        "__module__": __name__,
    }
    return cast("type[ToolArguments]", type(name, (ToolArguments,), namespace))


def _refused(
    capability_id: str,
    tool_name: str,
    answer: mcp_types.CallToolResult | MCPError,
    *,
    write: bool,
) -> Exception:
    """The error a refused call raises: ``EffectNotAppliedError`` for a write (its
    receipt becomes ``failed``), ``CapabilityError`` for a read."""
    if isinstance(answer, MCPError):
        detail = f"the server refused the call (JSON-RPC error {answer.code}: {answer})"
    else:
        text = " ".join(
            block.text for block in answer.content if isinstance(block, mcp_types.TextContent)
        )
        detail = f"the tool answered with an error: {text or '(no text)'}"
    message = f"MCP tool {tool_name!r}: {detail}"
    if write:
        return EffectNotAppliedError(message)
    return CapabilityError(message, capability_id=capability_id)
