"""Facts: what capabilities learn, recorded with versions and evidence lineage.

A capability returns :class:`Fact` objects. The kernel records each one as a
:class:`FactRecord`: the key's next version, with :class:`Evidence` naming the
capability, turn, step and effect receipts that produced it and the exact fact
versions it was derived from. Business workflow state belongs here, not in
fields added to the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Evidence", "Fact", "FactRecord", "FactRef"]


@dataclass(frozen=True, slots=True)
class Fact:
    """A fact a capability wants recorded.

    ``derived_from`` names the keys of facts this one was computed from; the
    kernel pins them to their current versions in the record's evidence.
    """

    key: str
    value: Any
    derived_from: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FactRef:
    """A pointer to one version of a fact."""

    key: str
    version: int


@dataclass(frozen=True, slots=True)
class Evidence:
    """Where a fact version came from."""

    capability_id: str
    turn_id: str
    step_id: str
    receipt_ids: tuple[str, ...] = ()
    derived_from: tuple[FactRef, ...] = ()


@dataclass(frozen=True, slots=True)
class FactRecord:
    """One recorded version of a fact."""

    key: str
    value: Any
    version: int
    evidence: Evidence
