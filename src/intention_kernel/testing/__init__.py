"""Testing kit: the in-memory adapter, a scripted interpreter, and the adapter
conformance suite (:mod:`intention_kernel.testing.conformance`)."""

from __future__ import annotations

from intention_kernel.durability.memory import InMemoryDurability, MemoryTamper
from intention_kernel.testing.scripted import ScriptedInterpreter

__all__ = ["InMemoryDurability", "MemoryTamper", "ScriptedInterpreter"]
