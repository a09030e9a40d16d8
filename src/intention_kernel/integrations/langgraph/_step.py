"""The step a graph run belongs to, shared by the model seam and the tool seam."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from intention_kernel._capabilities import CapabilityContext
from intention_kernel.errors import CapabilityError, EffectUncertainError

__all__ = ["STEP", "KernelStep", "TaskGate"]

T = TypeVar("T")


@dataclass
class TaskGate:
    """The tool calls of one ``ToolNode`` task, run one at a time.

    A ``ToolNode`` runs a response's calls at once (``asyncio.gather``).
    It ends its task at the first exception, an interrupt included.
    It does not cancel the others.
    Calls asking for approval together would each pause.
    The answer to one could then resume another.
    So calls run one at a time, in the response's order.
    None runs once a call paused; it runs when the task is resumed.
    """

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stopped: bool = False


@dataclass
class KernelStep:
    """One kernel step running a graph, shared by its model calls and tool calls."""

    ctx: CapabilityContext
    loop: asyncio.AbstractEventLoop
    #: How many model calls of each prompt digest the step has made.
    asked: Counter[str] = field(default_factory=Counter)
    #: Journal keys looked up and missed, by prompt digest, awaiting their response.
    missed: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: The generations the journal answered or recorded; kept alive for their ``id``.
    journaled: dict[int, Any] = field(default_factory=dict)
    #: The arguments of each tool call the person accepted, by tool call ID.
    approved: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The tool call each interrupt raised in a tool paused, by interrupt ID.
    paused: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The first uncertain write of the run, however the graph handled its error.
    uncertain: EffectUncertainError | None = None
    #: The gate of each ``ToolNode`` task of the run, by its checkpoint namespace.
    gates: dict[str, TaskGate] = field(default_factory=dict)

    def next_key(self, digest: str) -> str:
        """The journal key of the next model call with this prompt digest.

        A call is keyed by what it asks, not by its position.
        Graph branches may call the model at once.
        Keyed by position, they would take each other's answers.
        """
        self.asked[digest] += 1
        return f"langgraph.model.{digest}.{self.asked[digest]}"

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the step's event loop, from a sync node's worker thread."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            # Blocking the loop on a coroutine it must itself run would never return.
            raise CapabilityError(
                f"{self.ctx.capability_id}: a chat model was called synchronously inside an "
                "async node; call it with ainvoke there",
                capability_id=self.ctx.capability_id,
            )
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result()  # type: ignore[arg-type]


# Set by the capability for the graph run it makes.
# The model and tool seams read it.
# Without it a model call could not reach its turn's journal.
# Nor could a write reach its receipts.
STEP: ContextVar[KernelStep | None] = ContextVar("ik_langgraph_step", default=None)
