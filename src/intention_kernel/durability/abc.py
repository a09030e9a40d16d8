"""The storage contract for adapter authors, beside the application facade.

An application imports from :mod:`intention_kernel`; an adapter author imports from here.
Here are the contracts (:class:`Durability`, :class:`Recorder`) and the ID rules.
Here is the shared engine that applies the rules over a recorder (:class:`RecordedDurability`).
Here are the options a recorder declares (:class:`RecorderOptions`).
Here are the records a recorder reads and writes, and a commit's :class:`CheckpointDelta`.
This module is their public home; the modules that define them are private.
``Durability`` is documented in :mod:`intention_kernel.durability` too.

A new adapter subclasses :class:`RecordedDurability` over a recorder that subclasses
:class:`Recorder`, and runs :class:`~intention_kernel.testing.conformance.DurabilityConformance`.
"""

from __future__ import annotations

from intention_kernel._checkpoint import CheckpointDelta
from intention_kernel._ids import MAX_ID_BYTES, MAX_ID_LENGTH, check_id
from intention_kernel.durability import Durability, TurnOperation, TurnTransaction
from intention_kernel.durability._contract.ownership import owner_of, owns
from intention_kernel.durability._contract.recorders import (
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
from intention_kernel.durability._contract.records import (
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
from intention_kernel.durability._engine.recorded import RecordedDurability
from intention_kernel.durability._layout import CheckpointRows

__all__ = [
    "INTERACTION_MARKER",
    "MAX_ID_BYTES",
    "MAX_ID_LENGTH",
    "CheckpointDelta",
    "CheckpointRewrite",
    "CheckpointRows",
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
