"""intention-kernel: durable turns for conversational agents that act on the world.

Every turn is one durable transaction: it cannot commit twice.
External writes go through effect receipts, so a retry never repeats them.
Writes wait for a human confirmation that survives restarts.
The result, the next checkpoint and the outbox events commit together.
"""

from __future__ import annotations

import logging

from intention_kernel._inbox import Cancellation, Queued
from intention_kernel._sync import SyncKernel, TurnStream
from intention_kernel._timer_runner import TimerOutcome
from intention_kernel._turnstream import TurnStatus
from intention_kernel.agent import Agent
from intention_kernel.authority import Principal
from intention_kernel.capabilities import (
    CancellationSignal,
    Capability,
    CapabilityContext,
    CapabilityResult,
    capability,
)
from intention_kernel.checkpoint import AgendaItem, Interaction, KernelCheckpoint, Message
from intention_kernel.durability.records import Timer
from intention_kernel.effects import (
    EffectAuthority,
    EffectResult,
    Receipt,
    ReceiptStatus,
    Resolution,
)
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
from intention_kernel.facts import Evidence, Fact, FactRecord, FactRef
from intention_kernel.interpretation import (
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
from intention_kernel.kernel import Kernel
from intention_kernel.replies import Replies
from intention_kernel.streaming import TurnEvent
from intention_kernel.turns import (
    OutboxEvent,
    StepResult,
    StepStatus,
    TurnCommit,
    TurnResult,
    TurnScope,
)

#: The version of the installed library.
__version__ = "0.1.0"

# A library never prints on its own: without this, Python's last-resort handler writes
# every WARNING (an uncertain write, say) raw on stderr of an application that did not
# configure logging. Applications that do configure it see the records as before.
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
