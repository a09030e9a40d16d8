"""Facts: what capabilities learn, recorded with versions and evidence lineage.

A capability returns :class:`Fact` objects. The kernel records each one as a
:class:`FactRecord`: the key's next version, with :class:`Evidence` naming the
capability, turn, step and effect receipts that produced it and the exact fact
versions it was derived from. Business workflow state belongs here, not in
fields added to the kernel.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DerivedFacts", "Evidence", "Fact", "FactRecord", "FactRef", "FactTable"]


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


class DerivedFacts(dict[str, FactRecord]):
    """A checkpoint's facts built from an earlier checkpoint's ``base`` facts by adding or
    replacing the ``changed`` keys (none removed).

    Lets an adapter store only the changed facts instead of comparing every fact of a
    long thread. Like every checkpoint's facts, it must not be modified once built.
    """

    __slots__ = ("base", "changed")

    def __init__(self, base: dict[str, FactRecord], changes: dict[str, FactRecord]) -> None:
        super().__init__(base)
        self.update(changes)
        self.base: dict[str, FactRecord] | None = base
        self.changed: tuple[str, ...] = tuple(changes)


class FactTable(Mapping[str, FactRecord]):
    """The facts while a turn runs: the loaded checkpoint's (never copied nor modified)
    overlaid with the ones recorded in this turn.

    A read-only mapping for interpreters and capabilities; building it and reading a
    key cost the same however many facts the thread holds.
    """

    __slots__ = ("_base", "_changes")

    def __init__(self, base: dict[str, FactRecord]) -> None:
        if isinstance(base, DerivedFacts):
            # ``base`` was committed before a turn could start from it, so what it was
            # derived from is no longer needed; dropping it keeps a long thread from
            # holding a chain of every earlier version of its facts.
            base.base = None
        self._base = base
        self._changes: dict[str, FactRecord] = {}

    def __getitem__(self, key: str) -> FactRecord:
        changes = self._changes
        return changes[key] if key in changes else self._base[key]

    def __contains__(self, key: object) -> bool:
        return key in self._changes or key in self._base

    def __iter__(self) -> Iterator[str]:
        yield from self._base
        yield from (key for key in self._changes if key not in self._base)

    def __len__(self) -> int:
        return len(self._base) + sum(key not in self._base for key in self._changes)

    def __repr__(self) -> str:
        return f"FactTable({dict(self)!r})"

    def _record(self, record: FactRecord) -> None:
        """Record a new version (the runtime's only mutation)."""
        self._changes[record.key] = record

    def _merged(self) -> dict[str, FactRecord]:
        """The facts of the next checkpoint: the loaded dict itself when nothing changed."""
        if not self._changes:
            return self._base
        return DerivedFacts(self._base, self._changes)
