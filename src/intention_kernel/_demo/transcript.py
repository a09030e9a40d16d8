"""What a demo run produces: scenes of turns, a restart and an operator action, as data.

Everything here is read back from the store after each step.
That covers the receipts, the outbox and the provider's ledger.
So a renderer or a test sees what is on disk, not what the code hoped for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from intention_kernel import Interaction, Receipt, TurnResult

__all__ = [
    "Check",
    "DemoRun",
    "OperatorAction",
    "Restart",
    "Scene",
    "SceneStep",
    "Summary",
    "TurnView",
]


@dataclass(frozen=True, slots=True)
class TurnView:
    """One delivered turn and what the store said right after it."""

    turn_id: str
    message: str
    result: TurnResult
    receipts: tuple[Receipt, ...]
    """The stored receipts named by this turn's steps, read after the turn."""
    provider_calls: int
    """Requests the provider has received so far (its ledger, read from disk)."""
    provider_calls_delta: int
    charges: int
    """Charges the provider has applied so far."""
    outbox_events: int
    outbox_delta: int


@dataclass(frozen=True, slots=True)
class Restart:
    """The adapter was closed and everything in memory dropped; the file was reopened."""

    checkpoint_version: int | None
    interaction: Interaction | None


@dataclass(frozen=True, slots=True)
class OperatorAction:
    """An operator reconciling an uncertain receipt against the provider's ledger."""

    uncertain: tuple[Receipt, ...]
    provider_record: dict[str, Any] | None
    resolved: Receipt
    note: str


SceneStep = TurnView | Restart | OperatorAction


@dataclass(slots=True)
class Scene:
    key: str
    title: str
    narration: str
    steps: list[SceneStep] = field(default_factory=list)

    def turns(self) -> list[TurnView]:
        return [s for s in self.steps if isinstance(s, TurnView)]


@dataclass(frozen=True, slots=True)
class Summary:
    deliveries: int
    turns_committed: int
    provider_calls: int
    charges: int
    receipts_by_status: Mapping[str, int]
    events_by_type: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Check:
    """A guarantee the demo verified from the stored data."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True, slots=True)
class DemoRun:
    db_path: str
    thread_id: str
    scenes: tuple[Scene, ...]
    summary: Summary
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)

    def scene(self, key: str) -> Scene:
        return next(s for s in self.scenes if s.key == key)
