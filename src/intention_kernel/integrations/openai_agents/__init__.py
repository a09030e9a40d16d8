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

The design, in the terms of the SDK (the seams its Temporal and DBOS integrations use:
the ``Model`` interface, function tools' ``on_invoke_tool``, and ``RunState`` for a
run paused on approvals): :class:`KernelAgent` clones the agent with its model
wrapped and its write tools wrapped, and runs it with ``Runner.run`` inside one kernel
capability, ``<name>.agent`` (a write whose consent is its own,
``confirmation="capability"``):

- A message becomes one step of that capability, which runs the agent on the thread's
  input items. They are a fact of the thread (``<name>.conversation``), so they are
  committed with the turn or not at all.
- Each model response is recorded in the turn's journal (``ctx.recorded``, the
  kernel's ``tx.recorded``) before the run acts on it. A turn whose process died
  before its commit, delivered again, reads the responses from there: the model is
  not asked again for a request it answered, and the run takes the same decisions.
- A function tool named in ``writes`` runs through ``ctx.run_effect`` with the key
  ``"<tool name>:<writes[tool](args)>"``, a business operation ID the application
  derives from the call's arguments. A retried or redelivered turn runs the agent
  again, and the tool call meets its receipt: completed, the stored value goes back to
  the model and the tool is not called; uncertain, the step is ``uncertain`` (the write
  is never retried blindly). A tool named in ``reads`` (hosted tools too) runs as it
  is, again on a redelivery. A tool in neither is refused when the bridge is built
  (``CompilationError``): the bridge fails closed. A write tool that did nothing says
  so with ``EffectNotAppliedError`` (a failed step; a later turn may retry it); any
  other exception leaves its receipt
  ``uncertain``: the bridge cannot know whether the write happened before it. The
  tool's ``failure_error_function`` is not applied to a write: it would turn an
  exception into text for the model, and a write that may have happened into one that
  looks done.
- A tool with ``needs_approval`` makes the SDK end the run with
  ``RunResult.interruptions``. The run's ``RunState`` (``to_json()``, without the
  application's context) goes into the conversation fact, and the bridge's
  interpreter (it works in rounds) proposes those exact calls as the capability's
  input, ``{"approvals": [{"tool_name", "call_id", "arguments"}, ...]}``; the
  capability asks (``needs_confirmation``), so the kernel holds a durable interaction
  whose ``digest`` is over each tool, call ID and arguments, and whose prompt shows
  them. An accept in a later turn, in any process, calls the capability again: it
  restores that ``RunState``, checks that its interruptions are exactly the approved
  calls, ``state.approve``\\ s each and resumes the run, so the SDK runs exactly the held
  calls (each through its receipt) and the model reads their results. A reject
  resumes with ``state.reject(item, rejection_message=reason)``: the model reads the
  person's reason. An answer with another digest runs nothing (the kernel refuses it).
  Calls the model made together are answered together.

Why one capability for the whole loop, and not one per tool: the SDK runs its own loop
(model, tools, model), and an approval must resume *that* run in the accepting turn,
which has no message for an interpreter to read; a capability called again with the
answer is the kernel's seam for exactly that. One capability also gives every write
one receipt namespace (``<name>.agent:...``), whether it ran in the turn that proposed
it or in the one that approved it.

What is recorded: each model response of a turn until it commits (the journal; the
commit deletes it), each write tool's outcome (its receipt), the input items of every
committed turn, and a paused run (the interaction and its ``RunState``). Responses are
matched to requests by position in the step: a read that returns something else on a
redelivery still meets the response the model gave after the first read.

An approval tool must be named in ``writes``: the accepted call runs through its
receipt, so a redelivered accepting turn does not run it again. One that is not is
refused before the person is asked (the step fails, nothing runs).

Limits: one agent (no handoffs, no MCP servers on the agent: use
:mod:`intention_kernel.integrations.mcp`); runs are not streamed. While an approval is
pending, a new message is answered with the pending question; answer it first. An
approval that closed unanswered (expired) reaches the model as rejected before the next
message; if the model then asks for another approval, that message is not given to the
agent (the new question is asked; send it again after answering). A turn with
``answer=`` and no message asks no interpreter, so a resumed run that pauses on another
approval has it asked before the next message is read. The conversation fact keeps
every input item of the thread's runs; it is not trimmed yet.

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
