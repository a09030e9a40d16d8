"""KernelAgent: a compiled LangGraph graph run as the loop of an intention-kernel turn.

::

    from langgraph.prebuilt import create_react_agent
    from intention_kernel import Kernel
    from intention_kernel.integrations.langgraph import KernelAgent

    graph = create_react_agent(model, [order_status, cancel_order, issue_refund])
    bridge = KernelAgent(graph, name="desk",
                         reads={"order_status"},
                         writes={"cancel_order": lambda args: args["order_id"],
                                 "issue_refund": lambda args: args["order_id"]},
                         approve={"issue_refund"})
    kernel = Kernel(bridge.as_agent(version="1"), durability)

The graph is the prebuilt ReAct agent, or any compiled ``StateGraph``.
Its tools must run in ``ToolNode`` nodes.
It runs inside one kernel capability, ``<name>.agent``.
That capability is a write whose consent is its own (``confirmation="capability"``).

State:

- A message becomes one step of that capability.
  The step runs the graph on the thread's saved state.
- The state is a fact of the thread (``<name>.conversation``).
  It holds the latest LangGraph checkpoint, as the graph's own serializer writes it.
- Each run uses a saver in memory, loaded from the fact.
  The turn's commit stores the fact with the kernel's checkpoint, receipts and events.
- No checkpoint is written between LangGraph's steps.
  So there is no window between its ``put_writes`` and ``put``.
- One turn of a thread runs at a time, across processes and hosts.
  The kernel's lock or lease serializes turns.
  The graph's own checkpointer is not used inside turns.

Model calls:

- Each chat-model call is recorded in the turn's journal before its tools run.
- LangChain's chat models consult an LLM cache before calling their provider.
  They fill it before returning.
  The bridge installs a cache that reads and writes the journal inside kernel runs.
  Elsewhere it defers to the application's cache.
- The key is the call's digest and how many times the step asked it before.
  The digest covers the call's messages, without IDs, and the model's parameters.
- A turn delivered again after a crash asks the model only what it had not answered.
- A streamed call (``stream_mode="messages"``) is read to its end before it is recorded.
- A model response may not pass through the journal.
  A model with its own cache or ``cache=False`` does that.
  So does a node calling ``astream`` itself.
  Such a response fails the step before the graph reads it.

Tools:

- A tool named in ``writes`` runs through ``ctx.run_effect``.
  Its key is ``"<tool name>:<writes[tool](args)>"``.
- The bridge wraps each ``ToolNode`` with ``awrap_tool_call``.
  That wrapper sits inside any wrapper of the application's.
- A redelivered or retried turn meets the receipt.
  A completed receipt sends the stored result back to the model, without a call.
  An uncertain receipt makes the step ``uncertain``.
- A write tool that did nothing raises ``EffectNotAppliedError``.
  Any other exception leaves its receipt ``uncertain``.
  That holds even when the ``ToolNode`` handles tool errors.
- Arguments the tool's schema refuses run nothing and hold no receipt.
- Every tool of a ``ToolNode`` must be in ``writes`` or in ``reads``.
  An unlisted one is refused at construction (``CompilationError``).
- A tool that starts outside a ``ToolNode`` fails the step unless it is in ``reads``.

Approvals and interrupts:

- A tool named in ``approve`` pauses before its receipt is held.
  It pauses on ``interrupt({"tool_name", "tool_call_id", "args"})``.
- Any other ``interrupt()`` of the graph pauses the same way, with its own value.
  That covers an interrupt in a node or in a read tool.
- The bridge's interpreter proposes the paused interrupts as the capability's input.
  The capability asks, so the kernel holds a durable interaction.
  Its ``digest`` covers each interrupt's ID and value, and the call it pauses.
- An accept in a later turn, in any process, resumes the saved graph.
  It resumes with ``Command(resume={id: answer})``.
  The answer is ``{"decision", "reason", "value", "actor"}``.
- An approved tool then runs through its receipt, and only with the arguments shown.
- A reject's reason becomes the tool's result, which the model reads.
  Without a reason, the result is :data:`~intention_kernel.integrations._bridge.REJECTED`.
- An interrupt inside a write tool's own body pauses after its receipt was held.
  The receipt is then ``uncertain``, so use ``approve`` instead.

A ``ToolNode`` runs a response's calls at once.
Inside a turn, the bridge runs the calls of one task one at a time, in order.
It runs none after a call paused.
The prebuilt ReAct agent runs each call as a task of its own.
So its approvals pause together and are answered together.
A hand-built ``ToolNode`` asks them one after another.
An answer given earlier is replayed to its call when the task resumes.
That call must still have the arguments accepted.

LangChain's ``HumanInTheLoopMiddleware`` (``create_agent``) pauses on a review request.
The request is held as any interrupt is.
The answer becomes the middleware's decision (see ``_hitl``):

- an accept is ``approve``.
- ``value={"args": ...}`` is ``edit``.
- ``value={"respond": text}`` is ``respond``.
- a reject is ``reject``, with its reason.

:class:`KernelSaver` is a LangGraph checkpointer on the same stores.
It serves graphs the application drives itself (``graph.invoke``).
A checkpoint is stored only if its parent is still its thread's latest.
A stale one raises :class:`CheckpointConflictError`.
So two writers of one thread never interleave.

Limits:

- While an approval is pending, a new message gets the pending question back.
- The saved state keeps the thread's whole message list.
  LangGraph's own checkpoints do the same.

Needs the ``langgraph`` extra: ``pip install 'intention-kernel[langgraph]'``.
"""

from __future__ import annotations

try:
    import langchain_core  # noqa: F401  (checked first: the modules below import them)
    import langgraph.pregel  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "intention_kernel.integrations.langgraph needs LangGraph: "
        "pip install 'intention-kernel[langgraph]'"
    ) from exc

from intention_kernel.integrations._bridge import KeyFunction, effect_authority
from intention_kernel.integrations.langgraph._agent import KernelAgent
from intention_kernel.integrations.langgraph._saver import CheckpointConflictError, KernelSaver

__all__ = [
    "CheckpointConflictError",
    "KernelAgent",
    "KernelSaver",
    "KeyFunction",
    "effect_authority",
]
