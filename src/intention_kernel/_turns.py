"""The turn boundary: what goes into a durable turn and what comes out of it.

- ``TurnScope`` names the turn: thread, turn ID, tenant.
- ``TurnCommit`` is what an operation hands back to the adapter to commit
  atomically: result, next checkpoint, outbox events.
- ``TurnResult`` is what the caller sees. It is the same on a replay, except for
  ``replayed=True``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from intention_kernel import _adapters
from intention_kernel._adapters import LazyAdapter, first_use_serializer
from intention_kernel._checkpoint import CheckpointDelta, Interaction, KernelCheckpoint
from intention_kernel._facts import FactRecord
from intention_kernel._ids import new_id
from intention_kernel.errors import CorruptRecordError, InvalidRequestError, ReservedTurnIdError

if TYPE_CHECKING:
    from intention_kernel.durability._contract.records import TimerWrite

__all__ = [
    "EXPIRY_TURN_PREFIX",
    "KERNEL_EVENT_NAMESPACES",
    "RESERVED_TURN_PREFIXES",
    "TIMER_TURN_PREFIX",
    "EventDraft",
    "OutboxEvent",
    "StepResult",
    "StepStatus",
    "TurnCommit",
    "TurnResult",
    "TurnScope",
    "check_client_turn_id",
    "committed_event",
    "decode_result",
    "encode_result",
    "kernel_event_namespace",
    "request_digest",
]

#: Event types the kernel and its adapters emit live in these namespaces (``turn.committed``,
#: ``effect.completed``, ``receipt.resolved``, ...). Consumers rely on them (one
#: ``turn.committed`` per committed turn), so capabilities may not emit into them.
KERNEL_EVENT_NAMESPACES = frozenset(("turn", "interaction", "fact", "effect", "receipt", "timer"))


def kernel_event_namespace(type: str) -> str | None:
    """The kernel namespace ``type`` belongs to (``"turn"`` for ``"turn.committed"`` and
    for ``"turn"`` itself), or ``None`` if it is free for capabilities."""
    namespace = type.split(".", 1)[0]
    return namespace if namespace in KERNEL_EVENT_NAMESPACES else None


#: The prefix of the expiry sweep's turns: ``expire:<interaction id>``.
EXPIRY_TURN_PREFIX = "expire:"

#: The prefix of a timer's turns: ``timer:<key>@<due time>`` (see ``_timers``).
TIMER_TURN_PREFIX = "timer:"

#: Prefixes of the turn IDs the kernel makes for its own turns. A client turn under
#: such an ID would commit first; the kernel's own turn would then conflict with it.
#: A new kind of kernel turn adds its prefix here, so clients are refused it too.
RESERVED_TURN_PREFIXES: tuple[str, ...] = (EXPIRY_TURN_PREFIX, TIMER_TURN_PREFIX)


def check_client_turn_id(turn_id: str) -> str:
    """``turn_id`` if a client may deliver a turn under it; ``ReservedTurnIdError`` if it
    begins with a prefix of the kernel's own turns. Compared exactly, as stores compare."""
    if isinstance(turn_id, str):
        for prefix in RESERVED_TURN_PREFIXES:
            if turn_id.startswith(prefix):
                raise ReservedTurnIdError(
                    f"turn ID {turn_id!r} begins with {prefix!r}, a prefix reserved for the "
                    "kernel's own turns; choose another turn ID",
                    turn_id=turn_id,
                )
    return turn_id


@dataclass(frozen=True, slots=True)
class TurnScope:
    """Identity of one turn.

    ``request_digest`` (set by the kernel) is stored with the committed result. A
    later delivery of the same ``turn_id`` with another digest is refused with
    ``TurnConflictError``. It is not answered with this request's result.
    """

    thread_id: str
    turn_id: str
    tenant_id: str | None = None
    request_digest: str | None = None


class StepStatus(StrEnum):
    """Outcome of one agenda item in a turn. Compares equal to its string value."""

    COMPLETED = "completed"
    AWAITING_CONFIRMATION = "awaiting_confirmation"
    REJECTED = "rejected"
    FAILED = "failed"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True, slots=True)
class StepResult:
    """One executed or planned agenda item of a turn.

    ``proposed_input`` and ``approved_input`` are set on the step of a confirmed
    operation whose held input the approver edited (``Answer(input=...)``). The first
    is what was proposed and shown. The second is what was approved and ran. Both are
    ``None`` otherwise.

    ``round`` is the round of the turn the step ran in. It is 1 for the first, and for
    every turn of an interpreter that does not work in rounds. A turn's steps grouped
    by ``round`` are what each model round asked for and what came of it. A result stored
    before the field existed reads as 1, which it was (rounds came with the field).

    ``actor`` is who answered, on the step of the interaction an answer resolved. That
    step is the accepted operation, or the rejected one. The value is ``Answer.actor``:
    the token's principal on the HTTP host. ``None`` on every other step, and when the
    answer named no one.
    """

    step_id: str
    capability_id: str
    status: StepStatus
    value: Any = None
    error: str | None = None
    receipt_ids: tuple[str, ...] = ()
    proposed_input: dict[str, Any] | None = None
    approved_input: dict[str, Any] | None = None
    round: int = 1
    actor: str | None = None


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What a turn returns. A replay returns the stored result with ``replayed=True``."""

    thread_id: str
    turn_id: str
    replayed: bool
    reply: str
    interaction: Interaction | None = None
    steps: tuple[StepResult, ...] = ()
    facts: tuple[FactRecord, ...] = ()
    checkpoint_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict; :meth:`from_dict` reverses it."""
        result: dict[str, Any] = _RESULT().dump_python(self, mode="json")
        return result

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnResult:
        """The result :meth:`to_dict` returned; ``InvalidRequestError`` for anything else."""
        try:
            return _RESULT().validate_python(data)
        except _adapters.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(the document)"
            raise InvalidRequestError(
                f"not a TurnResult document: {exc.error_count()} problem(s), first: "
                f"{first['msg']} at {where}"
            ) from exc


@dataclass(frozen=True, slots=True)
class EventDraft:
    """An outbox event produced by a turn, before the adapter numbers it."""

    type: str
    payload: Any = None
    #: ``evt_`` and 32 hex digits, time-ordered (see :func:`._ids.new_id`).
    #: A partial, not a lambda: three events a turn, each a frame of Python less.
    id: str = field(default_factory=functools.partial(new_id, "evt_"))


def committed_event(version: int, steps: Sequence[StepResult]) -> EventDraft:
    """The ``turn.committed`` event of a turn that commits checkpoint ``version``."""
    return EventDraft(
        "turn.committed",
        {
            "version": version,
            "steps": [
                {"step_id": s.step_id, "capability_id": s.capability_id, "status": str(s.status)}
                for s in steps
            ],
        },
    )


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """A committed outbox event.

    ``id`` is unique (for consumer dedupe); ``position`` increases in commit
    order across all threads (a relay's cursor); ``seq`` orders events within
    a thread. ``turn_id`` is ``None`` for operator actions.
    """

    id: str
    position: int
    thread_id: str
    turn_id: str | None
    seq: int
    type: str
    payload: Any
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TurnCommit:
    """What an operation returns to ``with_turn``: committed together, or not at all.

    ``announced`` lists the keys of completed receipts whose ``effect.completed``
    event is among ``events``. The adapter marks them announced in the same
    transaction. So a later turn does not announce them again.

    ``delta`` says how ``checkpoint`` differs from ``tx.checkpoint``, the one the
    operation started from; the commit writes exactly that difference. The turn runtime
    always gives it. Without it the adapter compares the two checkpoints' values
    (:func:`~intention_kernel._checkpoint.delta_between`). That costs what the thread
    holds rather than what the turn changed.

    ``timers`` are the thread's timer rows the turn sets, settles or deletes
    (``ctx.schedule``, a timer's own turn): committed with it, or not at all.
    """

    result: TurnResult
    checkpoint: KernelCheckpoint
    events: Sequence[EventDraft] = ()
    announced: Sequence[str] = ()
    delta: CheckpointDelta | None = None
    timers: Sequence[TimerWrite] = ()


_RESULT = LazyAdapter(TurnResult)
# Its serializer, called directly, as the checkpoint's pieces are (see ``checkpoint``),
# and built at its first use (see ``_adapters``).
_result_json = first_use_serializer(globals(), "_result_json", _RESULT)


def encode_result(result: TurnResult) -> str:
    return _result_json(result).decode()


def decode_result(text: str | bytes, *, replayed: bool, thread_id: str | None = None) -> TurnResult:
    try:
        result = _RESULT().validate_json(text)
    except _adapters.ValidationError as exc:
        raise CorruptRecordError(
            f"stored turn result of thread {thread_id!r} cannot be decoded: "
            f"{exc.errors()[0]['msg']}",
            thread_id=thread_id,
        ) from exc
    return replace(result, replayed=replayed) if result.replayed != replayed else result


def request_digest(message: str | None, answer: dict[str, Any] | None) -> str:
    """A stable digest of what was asked in a turn, stored with its result.

    The digest of the canonical JSON ``{"answer": ..., "message": ...}`` (sorted keys,
    no spaces), which stored turns carry: it must never change. A turn without an
    answer (most of them) builds the same text from its message alone. That skips the
    encoder's generic walk. ``tests/test_runtime.py`` checks the two agree.
    """
    if answer is None:
        # ``json.dumps`` of a string is this very function of the encoder's, called
        # through two layers of Python.
        text = "null" if message is None else encode_basestring_ascii(message)
        canonical = '{"answer":null,"message":' + text + "}"
    else:
        canonical = json.dumps(
            {"message": message, "answer": answer}, sort_keys=True, separators=(",", ":")
        )
    return hashlib.sha256(canonical.encode()).hexdigest()
