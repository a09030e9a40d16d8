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

The graph is the prebuilt ReAct agent or any compiled ``StateGraph`` whose tools run
in ``ToolNode`` nodes. It runs inside one kernel capability, ``<name>.agent`` (a write
whose consent is its own, ``confirmation="capability"``):

- A message becomes one step of that capability, which runs the graph on the
  thread's saved state. The state is a fact of the thread (``<name>.conversation``):
  the latest LangGraph checkpoint, as the graph's own serializer writes it. Each run
  uses a saver in memory, loaded from the fact; the turn's commit stores the fact
  with the kernel's checkpoint, its receipts and its events. No checkpoint is written
  between LangGraph's steps, so there is no window between its ``put_writes`` and
  ``put``. One turn of a thread runs at a time, across processes and hosts, because
  the kernel's lock or lease serializes turns. The graph's own checkpointer is not
  used inside turns.
- Each chat-model call is recorded in the turn's journal before the tools it asks
  for run. LangChain's chat models consult an LLM cache before calling their provider
  and fill it before returning; the bridge installs one that reads and writes the
  journal inside kernel runs and defers to the application's cache elsewhere. The
  key is the call's digest (its messages, without IDs, and the model's parameters)
  and how many times the step asked it before. A turn delivered again after a crash
  asks the model only what it had not answered. A streamed call (``stream_mode=
  "messages"``) is read to its end before it is recorded. A model response that did
  not pass through the journal (a model with its own cache or ``cache=False``, a node
  calling ``astream`` itself) fails the step before the graph reads it.
- A tool named in ``writes`` runs through ``ctx.run_effect`` with the key
  ``"<tool name>:<writes[tool](args)>"``. The bridge wraps each ``ToolNode``
  (``awrap_tool_call``, inside any wrapper of the application's). A redelivered or
  retried turn meets the receipt: completed, the stored result goes back to the model
  and the tool is not called; uncertain, the step is ``uncertain``. A write tool that
  did nothing says so with ``EffectNotAppliedError``; any other exception leaves its
  receipt ``uncertain``, also when the ``ToolNode`` handles tool errors. Arguments the
  tool's schema refuses run nothing and hold no receipt.
- Every tool of a ``ToolNode`` must be in ``writes`` or in ``reads``: an unlisted one
  is refused at construction (``CompilationError``). A tool that starts outside a
  ``ToolNode`` fails the step unless it is in ``reads``.
- A tool named in ``approve`` pauses on ``interrupt({"tool_name", "tool_call_id",
  "args"})`` before its receipt is held. Any other ``interrupt()`` of the graph (in a
  node, in a read tool) pauses the same way, with its own value. The bridge's
  interpreter proposes the paused interrupts as the capability's input; the capability
  asks, so the kernel holds a durable interaction whose ``digest`` covers each
  interrupt's ID and value (and the call it pauses). An accept in a later turn, in any
  process, resumes the saved graph with ``Command(resume={id: answer})``, where the
  answer is ``{"decision", "reason", "value", "actor"}``. An approved tool then runs
  through its receipt, and only with the arguments shown. A reject's reason (or
  :data:`~intention_kernel.integrations._bridge.REJECTED`) becomes the tool's
  result, which the model reads. An interrupt inside a write tool's own body pauses
  after its receipt was held: the receipt is then ``uncertain``; use ``approve``.

A ``ToolNode`` runs a response's calls at once; inside a turn the bridge runs those
of one task one at a time, in order, and none after a call paused. The prebuilt ReAct
agent runs each call as a task of its own: its approvals pause together and are
answered together. A hand-built ``ToolNode`` asks them one after another; an answer
given earlier is replayed to its call when the task resumes, and that call must still
have the arguments accepted.

LangChain's ``HumanInTheLoopMiddleware`` (``create_agent``) pauses on a review request,
held as any interrupt. The answer becomes the middleware's decision: an accept is
``approve``; ``value={"args": ...}`` is ``edit``; ``value={"respond": text}`` is
``respond``; a reject is ``reject``, with its reason (see ``_hitl``).

:class:`KernelSaver` is a LangGraph checkpointer on the same stores, for graphs the
application drives itself (``graph.invoke``). A checkpoint is stored only if its
parent is still its thread's latest; a stale one raises
:class:`CheckpointConflictError`, so two writers of one thread never interleave.

Limits: while an approval is pending, a new message is answered with the pending
question. The saved state keeps the thread's whole message list, as LangGraph's own
checkpoints do.

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
