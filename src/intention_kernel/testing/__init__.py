"""Testing kit: the in-memory adapter, a scripted interpreter, and three modules.

- :mod:`intention_kernel.testing.conformance` is the adapter conformance suite.
- :mod:`intention_kernel.testing.faults` arms fault points.
- :mod:`intention_kernel.testing.sqlite` is a seam into the SQLite adapter's group commit.
"""

from __future__ import annotations

from intention_kernel.durability.memory import InMemoryDurability, MemoryTamper
from intention_kernel.testing.scripted import ScriptedInterpreter

__all__ = ["InMemoryDurability", "MemoryTamper", "ScriptedInterpreter"]
