"""KernelAgent: an OpenAI Agents SDK agent run as the loop of an intention-kernel turn.

::

    from agents import Agent as SDKAgent, function_tool
    from intention_kernel import Kernel
    from intention_kernel.integrations.openai_agents import KernelAgent

    @function_tool
    def order_status(order_id: str) -> dict[str, str]: ...               # a read

    @function_tool(needs_approval=True)
    def issue_refund(order_id: str, cents: int) -> dict[str, str]: ...   # a write

    desk = SDKAgent(name="desk", instructions="You run the help desk.", model="gpt-4o-mini",
                    tools=[order_status, issue_refund])
    bridge = KernelAgent(desk, name="desk",
                         writes={"issue_refund": lambda args: args["order_id"]},
                         reads=["order_status"])
    kernel = Kernel(bridge.as_agent(version="1"), durability)

The design uses the SDK's own seams, the ones its Temporal and DBOS integrations use.
Those are the ``Model`` interface and function tools' ``on_invoke_tool``.
A third is ``RunState``, for a run paused on approvals.
:class:`KernelAgent` clones the agent with its model and its write tools wrapped.
It runs the clone with ``Runner.run`` inside one kernel capability, ``<name>.agent``.
That capability is a write whose consent is its own (``confirmation="capability"``).

- A message becomes one step of that capability.
  The step runs the agent on the thread's input items.
  They are a fact of the thread (``<name>.conversation``).
  So they are committed with the turn or not at all.
- Each model response is recorded in the turn's journal before the run acts on it.
  The journal is ``ctx.recorded``, the kernel's ``tx.recorded``.
  A turn whose process died before its commit may be delivered again.
  It then reads the responses from the journal.
  The model is not asked again for a request it answered.
  So the run takes the same decisions.
- A function tool named in ``writes`` runs through ``ctx.run_effect``.
  Its key is ``"<tool name>:<writes[tool](args)>"``.
  That is a business operation ID the application derives from the call's arguments.
  A retried or redelivered turn runs the agent again.
  The tool call then meets its receipt.
  If the receipt is completed, the stored value goes back to the model.
  The tool is then not called.
  If it is uncertain, the step is ``uncertain``: the write is never retried blindly.
- A tool named in ``reads`` runs as it is, again on a redelivery.
  Hosted tools are reads too.
- A tool in neither is refused when the bridge is built (``CompilationError``).
  The bridge fails closed.
- A write tool that did nothing says so with ``EffectNotAppliedError``.
  That is a failed step, and a later turn may retry it.
  Any other exception leaves its receipt ``uncertain``.
  The bridge cannot know whether the write happened before the exception.
- The tool's ``failure_error_function`` is not applied to a write.
  It would turn an exception into text for the model.
  A write that may have happened would then look done.
- A tool with ``needs_approval`` makes the SDK end the run with
  ``RunResult.interruptions``.
  The run's ``RunState`` goes into the conversation fact.
  It is stored as ``to_json()``, without the application's context.
  The bridge's interpreter works in rounds.
  It proposes those exact calls as the capability's input:
  ``{"approvals": [{"tool_name", "call_id", "arguments"}, ...]}``.
  The capability asks (``needs_confirmation``).
  So the kernel holds a durable interaction.
  Its ``digest`` is over each tool, call ID and arguments, and its prompt shows them.
- An accept in a later turn, in any process, calls the capability again.
  The capability restores that ``RunState``.
  It checks that the state's interruptions are exactly the approved calls.
  It calls ``state.approve`` on each and resumes the run.
  So the SDK runs exactly the held calls, each through its receipt.
  The model then reads their results.
- A reject resumes with ``state.reject(item, rejection_message=reason)``.
  The model reads the person's reason.
- An answer with another digest runs nothing: the kernel refuses it.
- Calls the model made together are answered together.

Why one capability for the whole loop, and not one per tool?
The SDK runs its own loop: model, tools, model.
An approval must resume *that* run in the accepting turn.
That turn has no message for an interpreter to read.
A capability called again with the answer is the kernel's seam for exactly that.
One capability also gives every write one receipt namespace (``<name>.agent:...``).
That holds whether the write ran in the turn that proposed it or the one that approved it.

What is recorded:

- each model response of a turn until it commits (the journal, which the commit deletes),
- each write tool's outcome (its receipt),
- the input items of every committed turn,
- a paused run (the interaction and its ``RunState``).

Responses are matched to requests by their position in the step.
A read may return something else on a redelivery.
The run still meets the response the model gave after the first read.

An approval tool must be named in ``writes``.
The accepted call then runs through its receipt.
So a redelivered accepting turn does not run it again.
An approval tool not in ``writes`` is refused before the person is asked.
The step fails, and nothing runs.

Limits:

- One agent: no handoffs.
- No MCP servers on the agent; use :mod:`intention_kernel.integrations.mcp`.
- Runs are not streamed.
- While an approval is pending, a new message is answered with the pending question.
  Answer it first.
- An approval that closed unanswered (expired) reaches the model as rejected.
  That happens before the next message.
  The model may then ask for another approval.
  That message is then not given to the agent; the new question is asked.
  Send the message again after answering.
- A turn with ``answer=`` and no message asks no interpreter.
  A resumed run may pause on another approval.
  That approval is then asked before the next message is read.
- The conversation fact keeps every input item of the thread's runs.
  It is not trimmed yet.

Needs the ``openai-agents`` extra: ``pip install 'intention-kernel[openai-agents]'``.
"""

from __future__ import annotations

try:
    import agents  # noqa: F401  (checked first: the modules below import it)
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "intention_kernel.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'intention-kernel[openai-agents]'"
    ) from exc

from intention_kernel.integrations._bridge import KeyFunction, effect_authority
from intention_kernel.integrations.openai_agents._agent import KernelAgent

__all__ = ["KernelAgent", "KeyFunction", "effect_authority"]
