"""Shared by the ``SyncKernel`` tests: an agent whose write waits for a crowd of
conversations (``crowd_agent``), one whose write blocks until a plain thread opens a
gate (``gate_agent``), and the drop of a PostgreSQL schema."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Intent,
    Interpretation,
    InterpretationRequest,
    capability,
)
from intention_kernel.testing import ScriptedInterpreter

__all__ = ["CrowdProbe", "ThreadGate", "crowd_agent", "gate_agent"]


def _writes(capability_id: str) -> ScriptedInterpreter:
    """Every message asks for one ``capability_id`` step, its words as ``n``."""

    def interpret(request: InterpretationRequest) -> Interpretation:
        return Interpretation(intents=[Intent(capability_id, {"n": request.message})])

    return ScriptedInterpreter(interpret)


class CrowdProbe:
    """Counts the turns inside its capability at once, per conversation and in all.

    Each turn waits there (up to two seconds) until ``crowd`` conversations are inside
    together. A facade that ran one turn at a time would never gather them."""

    def __init__(self, crowd: int) -> None:
        self.crowd = crowd
        self.inside: dict[str, int] = {}
        self.most_inside_one_conversation = 0
        self.most_conversations_inside = 0
        self._gathered: asyncio.Event | None = None

    async def enter(self, thread_id: str) -> None:
        if self._gathered is None:  # made on the kernel's loop, where it is awaited
            self._gathered = asyncio.Event()
        self.inside[thread_id] = self.inside.get(thread_id, 0) + 1
        self.most_inside_one_conversation = max(
            self.most_inside_one_conversation, self.inside[thread_id]
        )
        present = sum(1 for n in self.inside.values() if n)
        self.most_conversations_inside = max(self.most_conversations_inside, present)
        if present >= self.crowd:
            self._gathered.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._gathered.wait(), 2.0)

    def leave(self, thread_id: str) -> None:
        self.inside[thread_id] -= 1


def crowd_agent(probe: CrowdProbe) -> Agent:
    @capability("crowd.work", effect="write", confirmation="capability")
    async def work(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """A write that needs no consent: it records the turn."""
        await probe.enter(ctx.thread_id)
        try:
            effect = await ctx.run_effect(
                f"work:{ctx.turn_id}", lambda authority: {"turn": ctx.turn_id}
            )
        finally:
            probe.leave(ctx.thread_id)
        return CapabilityResult(value=effect.value, reply="done")

    return Agent(name="crowd", version="1", capabilities=[work], interpreter=_writes("crowd.work"))


class ThreadGate:
    """A provider whose write blocks until a plain thread sets ``released``.

    It polls, so a cancelled turn leaves no thread behind waiting on the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.calls = 0

    async def write(self, authority: EffectAuthority) -> dict[str, str]:
        self.calls += 1
        self.entered.set()
        # A plain thread sets it: an asyncio.Event cannot be set from there.
        while not self.released.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        return {"written": authority.key}


def gate_agent(gate: ThreadGate) -> Agent:
    @capability("desk.write", effect="write", confirmation="capability")
    async def write(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """A write that needs no consent; it waits for the gate."""
        effect = await ctx.run_effect(f"write:{input['n']}", gate.write)
        return CapabilityResult(value=effect.value, reply="written")

    return Agent(name="desk", version="1", capabilities=[write], interpreter=_writes("desk.write"))
