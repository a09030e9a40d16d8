"""Testing kit: the in-memory adapter, a scripted interpreter, a billing agent, and
three modules.

``FakeProvider`` and ``billing_agent`` are the small billing agent the guides use.
The provider records every call that reached it, so a test can count the writes.

- :mod:`intention_kernel.testing.conformance` is the adapter conformance suite.
- :mod:`intention_kernel.testing.faults` arms fault points.
- :mod:`intention_kernel.testing.sqlite` is a seam into the SQLite adapter's group commit.
"""

from __future__ import annotations

from intention_kernel.durability._memory import InMemoryDurability, MemoryTamper
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing._scripted import ScriptedInterpreter

__all__ = [
    "FakeProvider",
    "InMemoryDurability",
    "MemoryTamper",
    "ScriptedInterpreter",
    "billing_agent",
]
