"""KernelAgent: a Pydantic AI ``Agent`` run as the loop of an intention-kernel turn.

::

    from pydantic_ai import Agent as PydanticAgent
    from intention_kernel import Kernel
    from intention_kernel.integrations.pydantic_ai import KernelAgent

    desk = PydanticAgent("openai:gpt-4o-mini", instructions="You run the help desk.")

    @desk.tool_plain
    def order_status(order_id: str) -> dict[str, str]: ...          # a read

    @desk.tool_plain(requires_approval=True)
    def issue_refund(order_id: str, cents: int) -> dict[str, str]: ...   # a write

    bridge = KernelAgent(desk, name="desk",
                         writes={"issue_refund": lambda args: args["order_id"]},
                         reads=["order_status"])
    kernel = Kernel(bridge.as_agent(version="1"), durability)

The design follows Pydantic AI's durable-execution interface.
Its Temporal, DBOS and Prefect integrations use the same one.
:class:`KernelAgent` is a ``WrapperAgent``.
It wraps the agent's model in a ``WrapperModel``.
It wraps each of the agent's toolsets in a ``WrapperToolset``.
One kernel capability, ``<name>.agent``, runs the wrapped agent.
That capability is a write whose consent is its own (``confirmation="capability"``).

Messages:

- A message becomes one step of that capability.
  The step runs the Pydantic AI agent on the thread's message history.
- The history is a fact of the thread (``<name>.conversation``).
  So it is committed with the turn or not at all.

Write and read tools:

- A tool named in ``writes`` runs through ``ctx.run_effect``.
  Its key is ``"<tool name>:<writes[tool](args)>"``.
  That is a business operation ID the application derives from the arguments.
- A retried or redelivered turn re-runs the agent, and the call meets its receipt.
  A completed receipt sends the stored value back to the model, without a call.
  An uncertain receipt makes the step ``uncertain``: a write is never retried blindly.
- A tool named in ``reads`` runs as it is, with no receipt.
- A tool in neither is refused: the bridge fails closed.
  A function toolset holding one fails the build with ``CompilationError``.
  Any other toolset fails the step when a run lists it, before the model is asked.
- A write tool that did nothing raises ``EffectNotAppliedError``.
  The step fails, and a later turn may retry it.
- Any other exception, ``ModelRetry`` included, leaves the receipt ``uncertain``.
  The bridge cannot know whether the write happened before it.

Approvals:

- A tool with ``requires_approval=True`` makes Pydantic AI end the run.
  The run ends with ``DeferredToolRequests``.
- The bridge's interpreter works in rounds.
  It then proposes those exact calls as the capability's input.
  The input is ``{"approvals": [{"tool_name", "tool_call_id", "args"}, ...]}``.
- The capability asks (``needs_confirmation``), so the kernel holds a durable interaction.
  Its ``digest`` covers each tool, call ID and arguments, and its prompt shows them.
- An accept in a later turn, in any process, calls the capability again.
  It resumes the run from the stored history.
  It passes ``DeferredToolResults(approvals={id: ToolApproved()})``.
  So Pydantic AI runs exactly the held calls, each through its receipt.
  The model's next request then carries their results.
- A reject resumes with ``ToolDenied(reason)``.
  The model reads the person's reason as the denial.
- An answer with another digest runs nothing: the kernel refuses it.
- An accepted call runs only with the arguments the person was shown.
  Both are compared as the tool's schema validates them.
  So a number sent as text counts as that number.
  A hook may rewrite them after validation (a capability's ``after_tool_validate``, say).
  Then the call is refused before its receipt: the step fails, and nothing runs.
- Calls the model made together are answered together.
  Pydantic AI resumes a run only with a result for every call it deferred.

Why one capability for the whole loop, and not one per tool?
Pydantic AI runs its own loop: model, tools, model.
An approval must resume *that* loop in the accepting turn.
That turn has no message for an interpreter to read.
A capability called again with the answer is the kernel's seam for exactly that.
One capability also gives every write one receipt namespace (``<name>.agent:...``).
That holds whether the write ran in the proposing turn or the approving one.

What is recorded:

- Each model response goes in the turn's journal before Pydantic AI runs its tools.
  ``KernelModel`` (in ``_tools``) wraps the model for this.
  Every request of a kernel run goes through ``ctx.recorded``.
  Its key is ``pydantic_ai.model.<n>``, its position in the step's runs.
  The journal adds the step ID.
  The value is the ``ModelResponse`` as ``ModelMessagesTypeAdapter`` dumps it.
- A turn delivered again after a crash gets the recorded responses.
  It asks the model only for the requests it had not answered.
  Its writes meet their receipts, and its reads run again.
- A streamed request comes from an agent with an event stream handler.
  It is read to its end and recorded before the run sees it.
  So its events reach the handler once the response is complete.
  A recorded one is replayed as events made from its parts.
- Each write tool's outcome is recorded as its receipt.
- The message history of every committed turn is recorded.
- A held approval is recorded: the interaction and the history it resumes.

An approval tool must be named in ``writes``.
The accepted call runs through its receipt.
So a redelivered accepting turn does not run it again.
An approval tool missing from ``writes`` is refused before the person is asked.
The step fails, and nothing runs.

Limits follow.
While an approval is pending, a new message gets the pending question back.
The run is paused on it, so answer it first.
A run that ends asking for several approvals holds them in one interaction.
One answer covers them all.
External (``CallDeferred``) tools are not supported: the step fails and says so.
The history fact keeps what each run returns: every message of the thread's runs.
The agent's history processors may trim it (Pydantic AI's ``ProcessHistory``).
The guide's "A bounded history" shows one that cuts where a run starts.
``Agent(max_messages=...)`` bounds the kernel's own transcript, not this fact.

Needs the ``pydantic-ai`` extra: ``pip install 'intention-kernel[pydantic-ai]'``.
"""

from __future__ import annotations

try:
    import pydantic_ai  # noqa: F401  (checked first: the modules below import it)
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "intention_kernel.integrations.pydantic_ai needs Pydantic AI: "
        "pip install 'intention-kernel[pydantic-ai]'"
    ) from exc

from intention_kernel.integrations._bridge import KeyFunction, effect_authority
from intention_kernel.integrations.pydantic_ai._agent import KernelAgent

__all__ = ["KernelAgent", "KeyFunction", "effect_authority"]
