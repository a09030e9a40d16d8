"""Testing kit: the in-memory adapter, a scripted interpreter, the adapter
conformance suite (:mod:`intention_kernel.testing.conformance`), fault points
(:mod:`intention_kernel.testing.faults`) and a seam into the SQLite adapter's group
commit (:mod:`intention_kernel.testing.sqlite`)."""

from __future__ import annotations

from intention_kernel.durability.memory import InMemoryDurability, MemoryTamper
from intention_kernel.testing.scripted import ScriptedInterpreter

__all__ = ["InMemoryDurability", "MemoryTamper", "ScriptedInterpreter"]
