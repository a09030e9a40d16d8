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

The design, in the terms of Pydantic AI's durable-execution interface (the one its
Temporal, DBOS and Prefect integrations use): :class:`KernelAgent` is a
``WrapperAgent``. It runs the wrapped agent with its model wrapped (a ``WrapperModel``)
and each of its toolsets wrapped (a ``WrapperToolset``), inside one kernel capability,
``<name>.agent`` (a write whose consent is its own, ``confirmation="capability"``):

- A message becomes one step of that capability, which runs the Pydantic AI agent on
  the thread's message history. The history is a fact of the thread
  (``<name>.conversation``), so it is committed with the turn or not at all.
- A tool named in ``writes`` runs through ``ctx.run_effect`` with the key
  ``"<tool name>:<writes[tool](args)>"``, a business operation ID the application
  derives from the call's arguments. A retried or redelivered turn re-runs the agent,
  and the tool call meets its receipt: completed, the stored value goes back to the
  model and the tool is not called; uncertain, the step is ``uncertain`` (the write is
  never retried blindly). A tool named in ``reads`` runs as it is, with no receipt.
  A tool in neither is refused (the bridge fails closed): when the bridge is built if
  a function toolset holds it (``CompilationError``), else when a run lists it (the
  step fails before the model is asked, nothing runs). A write tool
  that did nothing says so with ``EffectNotAppliedError`` (a failed step; a later turn
  may retry it); any other exception, ``ModelRetry`` included, leaves its receipt
  ``uncertain``: the bridge cannot know whether the write happened before it.
- A tool with ``requires_approval=True`` makes Pydantic AI end the run with
  ``DeferredToolRequests``. The bridge's interpreter (it works in rounds) then proposes
  those exact calls as the capability's input, ``{"approvals": [{"tool_name",
  "tool_call_id", "args"}, ...]}``; the capability asks (``needs_confirmation``), so the
  kernel holds a durable interaction whose ``digest`` is over each tool, call ID and
  arguments, and whose prompt shows them. An accept in a later turn, in any process,
  calls the capability again: it resumes the run from the stored history with
  ``DeferredToolResults(approvals={id: ToolApproved()})``, so Pydantic AI runs exactly
  the held calls (each through its receipt) and the model's next request carries their
  results. A reject resumes with ``ToolDenied(reason)``: the model reads the person's
  reason as the denial. An answer with another digest runs nothing (the kernel refuses
  it). An accepted call runs only with the arguments the person was shown, both as
  the tool's schema validates them (a number sent as text is that number): if a hook
  rewrote them after validation (a capability's ``after_tool_validate``, say), the
  call is refused before its receipt (the step fails, nothing runs). Calls the model
  made together are answered together: Pydantic AI resumes a run only with a result
  for every call it deferred.

Why one capability for the whole loop, and not one per tool: Pydantic AI runs its own
loop (model, tools, model), and an approval must resume *that* loop in the accepting
turn, which has no message for an interpreter to read; a capability called again with
the answer is the kernel's seam for exactly that. One capability also gives every
write one receipt namespace (``<name>.agent:...``), whether it ran in the turn that
proposed it or in the one that approved it.

What is recorded:

- Each model response, in the turn's journal, before Pydantic AI runs the tools it
  asks for: ``KernelModel`` (in ``_tools``) wraps the model, and every request of a
  kernel run goes through ``ctx.recorded`` under the key ``pydantic_ai.model.<n>``, its
  position in the step's runs (the journal adds the step ID). The value is the
  ``ModelResponse`` as ``ModelMessagesTypeAdapter`` dumps it. A turn delivered again
  after a crash gets the recorded responses and asks the model only for the requests
  it had not answered; its writes meet their receipts and its reads run again. A
  streamed request (an agent with an event stream handler) is read to its end and
  recorded before the run sees it, so its events reach the handler once the response
  is complete; a recorded one is replayed as events made from its parts.
- Each write tool's outcome (its receipt), the message history of every committed
  turn, and a held approval (the interaction and the history it resumes).

An approval tool must be named in ``writes``: the accepted call runs through its
receipt, so a redelivered accepting turn does not run it again. One that is not is
refused before the person is asked (the step fails, nothing runs).

Limits: while an approval is pending, a new message is answered with the pending
question (the run is paused on it); answer it first. A run that ends asking for
several approvals holds them in one interaction (one answer for all). External
(``CallDeferred``) tools are not supported: the step fails and says so. The history
fact keeps every message of the thread's runs (``Agent(max_messages=...)`` bounds the
kernel's own transcript, not it); it is not trimmed yet.

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
