"""Facts: what capabilities learn, recorded with versions and evidence lineage.

A capability returns :class:`Fact` objects.
The kernel records each one as a :class:`FactRecord`, the key's next version.
Its :class:`Evidence` names the capability, turn, step and effect receipts behind it.
It also names the exact fact versions it was derived from.
Business workflow state belongs here, not in fields added to the kernel.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DerivedFacts",
    "Evidence",
    "Fact",
    "FactLedger",
    "FactRecord",
    "FactRef",
    "FactTable",
]


@dataclass(frozen=True, slots=True)
class Fact:
    """A fact a capability wants recorded.

    ``derived_from`` names the keys of facts this one was computed from.
    The kernel pins them to their current versions in the record's evidence.
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


_ABSENT: Any = object()
_UNCHANGED: Any = object()


class _Diff:
    """A version's facts: those of the version ``then``, with ``changes`` applied in order.

    ``_ABSENT`` as the record means the key is not there.
    Each key appears once.
    """

    __slots__ = ("changes", "then")

    def __init__(self, changes: dict[str, Any], then: DerivedFacts) -> None:
        self.changes = changes
        self.then = then


class DerivedFacts(Mapping[str, FactRecord]):
    """A checkpoint's facts, built from an earlier checkpoint's ``base`` facts.

    It adds or replaces the ``changes`` keys, and removes none.
    It does not copy the others.

    The versions derived from one another share a single dict.
    That is a persistent map, after Baker's trick.
    One version holds the dict.
    Each other version holds the changes that turn a neighbouring version into it.
    Reading a version that does not hold the dict first moves the dict to it.
    The changes are applied on the way.
    So every version reads as it was built, however many were derived since.
    Deriving a version from the latest costs what a turn changed.
    Reading the latest costs the same, never what the thread holds.
    A version keeps no reference to the one it was derived from.
    So a long thread does not keep every earlier version alive.

    One key of a version next to the holder is read through that version's changes.
    That read does not move the dict.
    A commit checks its new facts, key by key, against the ones it derived them from.
    Without this, it would move the dict there and back each turn.

    It is read-only, like every checkpoint's facts.
    It is not safe to read from another OS thread in one case.
    That is while a version of the same thread's facts is being derived or read.
    """

    __slots__ = ("_held", "_size")

    def __init__(self, base: Mapping[str, FactRecord], changes: Mapping[str, FactRecord]) -> None:
        # A plain dict may be shared by the checkpoint it was decoded for.
        # So it is copied, once.
        # A dict is told apart by its type first.
        # ``isinstance`` on a Mapping subclass runs the ABC machinery in Python.
        derived = base if type(base) is not dict and isinstance(base, DerivedFacts) else None
        data = derived._dict() if derived is not None else dict(base)
        undo = {}
        for key, record in changes.items():
            undo[key] = data.get(key, _ABSENT)
            data[key] = record
        if derived is not None:
            # Undone last change first: added keys leave from the end.
            derived._held = _Diff(dict(reversed(undo.items())), self)
        self._held: dict[str, FactRecord] | _Diff = data
        # A version's facts never change: its size is known without moving the dict.
        self._size = len(data)

    def _dict(self) -> dict[str, FactRecord]:
        """The shared dict, holding this version's facts (moved here if need be)."""
        held = self._held
        if type(held) is dict:
            return held
        path = []  # from this version to the one holding the dict
        version = self
        while isinstance(held, _Diff):
            path.append(version)
            version = held.then
            held = version._held
        data = held
        for nearer in reversed(path):
            diff = nearer._held
            assert isinstance(diff, _Diff) and diff.then is version
            undo = {}
            for key, record in diff.changes.items():
                undo[key] = data.get(key, _ABSENT)
                if record is _ABSENT:
                    del data[key]
                else:
                    data[key] = record
            version._held = _Diff(dict(reversed(undo.items())), nearer)
            nearer._held = data
            version = nearer
        return data

    def get(self, key: Any, default: Any = None) -> Any:
        """The record of ``key`` in this version, else ``default``.

        If the next version holds the dict, it reads through this version's changes.
        It then does not move the dict.
        """
        held = self._held
        if type(held) is dict:
            return held.get(key, default)
        assert isinstance(held, _Diff)
        data = held.then._held
        if type(data) is not dict:  # further away: moved here, as every other read does
            return self._dict().get(key, default)
        record = held.changes.get(key, _UNCHANGED)
        if record is _UNCHANGED:
            return data.get(key, default)
        return default if record is _ABSENT else record

    def __getitem__(self, key: str) -> FactRecord:
        record = self.get(key, _ABSENT)
        if record is _ABSENT:
            raise KeyError(key)
        return record  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return self.get(key, _ABSENT) is not _ABSENT

    def __iter__(self) -> Iterator[str]:
        # A copy of the keys: reading another version while iterating moves the dict.
        return iter(list(self._dict()))

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"DerivedFacts({self._dict()!r})"


class FactTable(Mapping[str, FactRecord]):
    """The facts while a turn runs.

    The loaded checkpoint's facts are overlaid with the ones recorded in this turn.
    The loaded ones are never copied nor modified.
    It is a read-only mapping for interpreters and capabilities.
    Building it and reading a key cost the same, however many facts the thread holds.
    The turn records through the :class:`FactLedger` that owns the table.
    """

    __slots__ = ("_base", "_changes")

    def __init__(self, base: Mapping[str, FactRecord]) -> None:
        self._base = base
        self._changes: dict[str, FactRecord] = {}

    def __getitem__(self, key: str) -> FactRecord:
        changes = self._changes
        return changes[key] if key in changes else self._base[key]

    def __contains__(self, key: object) -> bool:
        return key in self._changes or key in self._base

    def get(self, key: str, default: Any = None) -> Any:
        # Not Mapping's ``get``, which goes through ``__getitem__`` and catches KeyError.
        # Every key not recorded yet would then cost an exception, and most are not.
        changes = self._changes
        return changes[key] if key in changes else self._base.get(key, default)

    def __iter__(self) -> Iterator[str]:
        yield from self._base
        yield from (key for key in self._changes if key not in self._base)

    def __len__(self) -> int:
        return len(self._base) + sum(key not in self._base for key in self._changes)

    def __repr__(self) -> str:
        return f"FactTable({dict(self)!r})"


class FactLedger:
    """What one turn records over the loaded checkpoint's facts.

    ``table`` is the read-only view handed to interpreters and capabilities.
    Only the ledger's owner, the turn runtime, records.
    So a capability cannot write a fact that its result did not declare.
    """

    __slots__ = ("_base", "table")

    def __init__(self, base: Mapping[str, FactRecord]) -> None:
        self._base = base
        self.table = FactTable(base)

    def record(self, record: FactRecord) -> None:
        """Record a new version of ``record.key``; a later one in the turn replaces it."""
        self.table._changes[record.key] = record

    def changed(self) -> tuple[FactRecord, ...]:
        """The records the next checkpoint sets, one per key.

        They come in the order their keys were first recorded in this turn.
        """
        return tuple(self.table._changes.values())

    def merged(self) -> Mapping[str, FactRecord]:
        """The facts of the next checkpoint: the loaded ones themselves when nothing changed."""
        changes = self.table._changes
        if not changes:
            return self._base
        return DerivedFacts(self._base, changes)
