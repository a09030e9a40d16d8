"""intention-kernel: durable turns for conversational agents that act on the world.

Every turn is one durable transaction: it cannot commit twice.
External writes go through effect receipts, so a retry never repeats them.
Writes wait for a human confirmation that survives restarts.
The result, the next checkpoint and the outbox events commit together.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from intention_kernel._agent import Agent
from intention_kernel._authority import Principal
from intention_kernel._capabilities import (
    CancellationSignal,
    Capability,
    CapabilityContext,
    CapabilityResult,
    capability,
)
from intention_kernel._checkpoint import AgendaItem, Interaction, KernelCheckpoint, Message
from intention_kernel._effects import (
    EffectAuthority,
    EffectResult,
    Receipt,
    ReceiptStatus,
    Resolution,
)
from intention_kernel._facts import Evidence, Fact, FactRecord, FactRef
from intention_kernel._inbox import Cancellation, Queued
from intention_kernel._interpretation import (
    Answer,
    CapabilitySpec,
    FiredTimer,
    Intent,
    Interpretation,
    InterpretationRequest,
    Interpreter,
    Round,
    Rule,
    RuleInterpreter,
)
from intention_kernel._kernel import Kernel
from intention_kernel._replies import Replies
from intention_kernel._streaming import TurnEvent

if TYPE_CHECKING:  # loaded at first use: see ``__getattr__``
    from intention_kernel._sync import SyncKernel, TurnStream

from intention_kernel._timer_runner import TimerOutcome
from intention_kernel._turns import (
    RESERVED_TURN_PREFIXES,
    OutboxEvent,
    StepResult,
    StepStatus,
    TurnCommit,
    TurnResult,
    TurnScope,
)
from intention_kernel._turnstream import TurnStatus
from intention_kernel.durability._contract.records import Timer
from intention_kernel.errors import (
    CapabilityError,
    CheckpointCompatibilityError,
    CheckpointError,
    CompilationError,
    CorruptRecordError,
    CorruptStoreError,
    EffectError,
    EffectNotAppliedError,
    EffectUncertainError,
    EffectUsageError,
    EffectValueError,
    EventLoopRunningError,
    FencedCommitError,
    ForkedKernelError,
    InterpretationError,
    InvalidInputError,
    InvalidRequestError,
    JournalError,
    KernelClosedError,
    KernelError,
    LeaseLostError,
    ReceiptError,
    ReceiptNotFoundError,
    ReceiptStateError,
    ReservedTurnIdError,
    ShuttingDownError,
    SteerOrphanedError,
    StoreError,
    SyncKernelError,
    TenantMismatchError,
    ThreadBusyError,
    ThreadLockTimeoutError,
    TurnCancelledError,
    TurnConflictError,
    TurnExpiredError,
    UnknownCapabilityError,
)

#: Public names loaded at their first use: only sync callers need them. Their
#: modules (the sync facade and its loop thread) are a few ms of every import.
_LAZY = {"SyncKernel": "intention_kernel._sync", "TurnStream": "intention_kernel._sync"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


#: The version of the installed library.
__version__ = "0.1.0"

# A library never prints on its own. Take an application that did not configure
# logging. Without this, Python's last-resort handler writes every WARNING raw on its
# stderr, such as an uncertain write's. Applications that do configure logging see the
# records as before.
logging.getLogger("intention_kernel").addHandler(logging.NullHandler())

__all__ = [
    "AgendaItem",
    "Agent",
    "Answer",
    "CancellationSignal",
    "Cancellation",
    "Capability",
    "CapabilityContext",
    "CapabilityError",
    "CapabilityResult",
    "CapabilitySpec",
    "CheckpointCompatibilityError",
    "CheckpointError",
    "CompilationError",
    "CorruptRecordError",
    "CorruptStoreError",
    "EffectAuthority",
    "EffectError",
    "EffectNotAppliedError",
    "EffectResult",
    "EffectUncertainError",
    "EffectUsageError",
    "EffectValueError",
    "EventLoopRunningError",
    "Evidence",
    "Fact",
    "FiredTimer",
    "FactRecord",
    "FactRef",
    "FencedCommitError",
    "ForkedKernelError",
    "Intent",
    "Interaction",
    "Interpretation",
    "InterpretationError",
    "InterpretationRequest",
    "Interpreter",
    "InvalidInputError",
    "InvalidRequestError",
    "JournalError",
    "Kernel",
    "KernelCheckpoint",
    "KernelClosedError",
    "KernelError",
    "LeaseLostError",
    "Message",
    "OutboxEvent",
    "Principal",
    "Queued",
    "Receipt",
    "ReceiptError",
    "ReceiptNotFoundError",
    "ReceiptStateError",
    "RESERVED_TURN_PREFIXES",
    "ReservedTurnIdError",
    "ReceiptStatus",
    "Replies",
    "Resolution",
    "Round",
    "Rule",
    "RuleInterpreter",
    "StepResult",
    "StepStatus",
    "StoreError",
    "SyncKernel",
    "SyncKernelError",
    "TenantMismatchError",
    "ThreadBusyError",
    "ThreadLockTimeoutError",
    "Timer",
    "TimerOutcome",
    "TurnCommit",
    "TurnCancelledError",
    "ShuttingDownError",
    "SteerOrphanedError",
    "TurnConflictError",
    "TurnEvent",
    "TurnStatus",
    "TurnExpiredError",
    "TurnResult",
    "TurnScope",
    "TurnStream",
    "UnknownCapabilityError",
    "__version__",
    "capability",
]
