"""The storage contract for adapter authors, beside the application facade.

An application imports from :mod:`intention_kernel`; an adapter author imports from
here: the contracts (:class:`Durability`, :class:`Recorder`), the shared engine that
applies the rules over a recorder (:class:`RecordedDurability`), the options a
recorder declares (:class:`RecorderOptions`), the records a recorder reads and writes,
and the ID rules. Each name is documented where it is defined:
:mod:`intention_kernel.durability` (``Durability``), :mod:`~intention_kernel.durability.contract`
(the recorder), :mod:`~intention_kernel.durability.records`,
:mod:`~intention_kernel.durability.ownership` and :mod:`~intention_kernel.durability.engine`.

A new adapter subclasses :class:`RecordedDurability` over a recorder that subclasses
:class:`Recorder`, and runs :class:`~intention_kernel.testing.conformance.DurabilityConformance`.
"""

from __future__ import annotations

from intention_kernel._ids import MAX_ID_BYTES, MAX_ID_LENGTH, check_id
from intention_kernel.durability import Durability, TurnOperation, TurnTransaction
from intention_kernel.durability.contract import (
    EffectRecorder,
    Expirable,
    InboxRecorder,
    InteractionQueue,
    JournalRecorder,
    MaintenanceRecorder,
    Migratable,
    MigrationRecorder,
    Operable,
    OutboxRecorder,
    PlanFn,
    Recorded,
    Recorder,
    RecorderOptions,
    ResolutionFn,
    StreamRecorder,
    TenantStore,
    TimerRecorder,
    TurnRecorder,
)
from intention_kernel.durability.engine import RecordedDurability
from intention_kernel.durability.ownership import owner_of, owns
from intention_kernel.durability.records import (
    INTERACTION_MARKER,
    CheckpointRewrite,
    InboxEntry,
    JournalEntry,
    OutboxBacklog,
    OutboxDelivery,
    PendingInteraction,
    StoredStream,
    StoredThread,
    StoredTurn,
    ThreadOwner,
    Timer,
    TimerWrite,
    TurnRecord,
    TurnStart,
)

__all__ = [
    "INTERACTION_MARKER",
    "MAX_ID_BYTES",
    "MAX_ID_LENGTH",
    "CheckpointRewrite",
    "Durability",
    "EffectRecorder",
    "InboxEntry",
    "InboxRecorder",
    "Expirable",
    "InteractionQueue",
    "JournalEntry",
    "JournalRecorder",
    "MaintenanceRecorder",
    "Migratable",
    "MigrationRecorder",
    "Operable",
    "OutboxRecorder",
    "OutboxBacklog",
    "OutboxDelivery",
    "PendingInteraction",
    "PlanFn",
    "Recorded",
    "RecordedDurability",
    "Recorder",
    "RecorderOptions",
    "ResolutionFn",
    "StoredStream",
    "StoredThread",
    "StoredTurn",
    "StreamRecorder",
    "TenantStore",
    "ThreadOwner",
    "Timer",
    "TimerRecorder",
    "TimerWrite",
    "TurnOperation",
    "TurnRecord",
    "TurnRecorder",
    "TurnStart",
    "TurnTransaction",
    "check_id",
    "owner_of",
    "owns",
]
