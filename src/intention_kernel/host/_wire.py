"""The wire format: request bodies the host accepts and the views it answers with.

Request bodies are strict pydantic models: no coercion, no unknown fields.
The OpenAPI document is generated from these same models.
So what the schema promises and what the host accepts cannot drift apart.
Responses reuse the kernel's own types: ``TurnResult``, ``Receipt``, the checkpoint's records.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from starlette.requests import Request

from intention_kernel._checkpoint import AgendaItem, Interaction, KernelCheckpoint, Message
from intention_kernel._effects import Receipt
from intention_kernel._facts import FactRecord
from intention_kernel._ids import MAX_ID_LENGTH
from intention_kernel._inbox import Cancellation
from intention_kernel._interpretation import MAX_ANSWER_TEXT, Answer
from intention_kernel.durability._contract.records import PendingInteraction, Timer, TimerStatus
from intention_kernel.host._problems import HostProblem

__all__ = [
    "JSON_MEDIA_TYPE",
    "MAX_BODY_BYTES",
    "AnswerBody",
    "Health",
    "InteractionList",
    "InteractionView",
    "QueuedView",
    "ReceiptList",
    "ResolveBody",
    "ThreadView",
    "TimerList",
    "TimerView",
    "TurnBody",
    "dump",
    "read_body",
]

JSON_MEDIA_TYPE = "application/json"

#: Request bodies larger than this are refused with 413 before parsing.
MAX_BODY_BYTES = 1 << 20

#: Thread, turn and tenant IDs, as ``check_id`` accepts them.
Id = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH, pattern=r"^[^\x00]*$")
]


def _finite(value: Any) -> Any:
    """Refuse the numbers JSON cannot hold.

    The parser reads ``NaN``, ``Infinity`` and overflowing literals (``1e999``).
    It makes them non-finite floats, which no store can write.
    """
    pending = [value]
    while pending:  # iterative: the parser already bounds the depth, this adds no limit
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(
                "numbers must be finite (JSON has no NaN or Infinity, and 1e999 overflows)"
            )
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return value


#: Any JSON value, as RFC 8259 defines it: finite numbers only.
JsonValue = Annotated[
    Any,
    AfterValidator(_finite),
    Field(description="Any JSON value (numbers must be finite)"),
]


class _Body(BaseModel):
    # Strict: "true" is not a boolean and 1 is not a string, as the schema says.
    model_config = ConfigDict(strict=True, extra="forbid")


# Any model: the AG-UI endpoint reads the protocol's own ``RunAgentInput``.
M = TypeVar("M", bound=BaseModel)


class AnswerBody(_Body):
    """An answer to a pending interaction.

    Without ``interaction_id``, it answers the active one.
    ``reason`` explains a reject.
    ``digest`` binds the answer to the operation shown (the interaction's ``digest``).
    ``input`` edits the held input of the operation an accept approves.
    The kernel validates it against the capability's input schema.
    ``actor`` is the token's principal, and the host sets it.
    The host refuses an ``actor`` sent that names anyone else.
    An ``input`` goes with an accept, and the body is refused otherwise.
    The schema says so: ``if`` the decision is ``reject``, ``then`` no input.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"decision": {"const": "reject"}}, "required": ["decision"]},
            "then": {"properties": {"input": {"type": "null"}}},
        }
    )

    interaction_id: Id | None = None
    decision: Literal["accept", "reject"]
    value: JsonValue = None
    input: dict[str, JsonValue] | None = None
    reason: Annotated[str, Field(max_length=MAX_ANSWER_TEXT)] | None = None
    actor: Annotated[str, Field(max_length=MAX_ANSWER_TEXT)] | None = None
    digest: Annotated[str, Field(max_length=MAX_ANSWER_TEXT)] | None = None

    @pydantic.field_validator("input")
    @classmethod
    def _input_goes_with_an_accept(
        cls, value: dict[str, Any] | None, info: pydantic.ValidationInfo
    ) -> dict[str, Any] | None:
        # ``decision`` is declared before ``input``, so it is validated first.
        if value is not None and info.data.get("decision") == "reject":
            raise ValueError("an answer's input edits the operation an accept approves")
        return value

    def to_answer(self, actor: str) -> Answer:
        return Answer(
            self.interaction_id,
            self.decision,
            self.value,
            input=self.input,
            reason=self.reason,
            actor=actor,
            digest=self.digest,
        )


class TurnBody(_Body):
    """One turn: a message, an answer, or both.

    The turn ID may come from the ``Idempotency-Key`` header instead.
    Keep it the same when retrying a delivery.
    """

    # "A message, an answer, or both", said in the schema too.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["message"], "properties": {"message": {"type": "string"}}},
                {"required": ["answer"], "properties": {"answer": {"not": {"type": "null"}}}},
            ]
        }
    )

    turn_id: Id | None = None
    message: str | None = None
    answer: Literal["accept", "reject"] | AnswerBody | None = None

    def resolved_answer(self, actor: str) -> Answer | None:
        """The answer, with ``actor`` (the token's principal) as its actor.

        It raises ``HostProblem`` 403 ``forbidden`` when the body names another actor.
        """
        if self.answer is None:
            return None
        if isinstance(self.answer, str):
            return Answer(None, self.answer, actor=actor)
        if self.answer.actor is not None and self.answer.actor != actor:
            raise HostProblem(
                "forbidden",
                "an answer's actor is the token's principal; this token may not answer as "
                "another actor",
            )
        return self.answer.to_answer(actor)


#: A note must hold more than white space.
#: This is checked with Python's regular expressions.
#: The schema's generators and validators use them too.
#: So the host and its document agree on what white space is.
_NOT_BLANK = re.compile(r"\S")


def _says_something(note: str) -> str:
    if not _NOT_BLANK.search(note):
        raise ValueError("the note must say why (it holds only white space)")
    return note


#: What the schema says of a resolution's value, beside what the fields say.
#: Applied, it must be given, ``null`` included.
#: Not applied, it may only be ``null``.
_RESOLUTION_VALUE: dict[str, pydantic.JsonValue] = {
    "anyOf": [
        {"properties": {"applied": {"const": True}}, "required": ["value"]},
        {"properties": {"applied": {"const": False}, "value": {"type": "null"}}},
    ]
}


class ResolveBody(_Body):
    """An operator's reconciliation of an uncertain receipt.

    ``applied: true`` needs ``value``, the provider's result.
    Every later use of the receipt gets it in place of a call.
    It is ``null`` if the provider returned nothing.
    Left out, later uses would get ``null`` for good.
    ``note`` says why, for whoever looks at the receipt next.
    It must hold more than white space.
    """

    model_config = ConfigDict(json_schema_extra=_RESOLUTION_VALUE)

    thread_id: Id
    key: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    applied: bool
    value: JsonValue = None
    note: Annotated[
        str,
        StringConstraints(min_length=1, max_length=2000),
        AfterValidator(_says_something),
        Field(json_schema_extra={"pattern": _NOT_BLANK.pattern}),
    ]

    @pydantic.model_validator(mode="after")
    def _value_goes_with_applied(self) -> ResolveBody:
        if self.applied and "value" not in self.model_fields_set:
            raise ValueError(
                "applied: true needs a value, the provider's result that later uses of the "
                "receipt get (null if it returned nothing)"
            )
        if not self.applied and self.value is not None:
            raise ValueError("applied: false takes no value (null or none)")
        return self


@dataclass(frozen=True, slots=True)
class InteractionView(Interaction):
    """The active interaction as the thread view shows it.

    It holds the checkpoint's record and ``input_schema``.
    That is the JSON schema of the capability's input.
    It is set for a ``"confirmation"``, whose held input an accept may edit (``answer.input``).
    It is ``None`` for a ``"capability"`` interaction, whose input is not edited.
    It is ``None`` too for a capability this agent no longer has.
    The console validates an edit against it before sending.
    The kernel validates it again against the input model.
    """

    input_schema: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class QueuedView:
    """A message waiting in the thread's inbox.

    It shows its turn ID, its 1-based place and its text.
    It says whether it steers a running turn (``on_busy="steer"``).
    Otherwise it runs as a turn of its own.
    """

    turn_id: str
    position: int
    message: str | None
    steer: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ThreadView:
    """A thread's latest checkpoint, as an operator reads it.

    ``compatible`` says whether this host's agent may continue the thread.
    That is so when its fingerprint is this agent's, or one it declares compatible.
    ``inbox`` holds the messages waiting to run on it, in order.
    It is empty for a store without an inbox.
    """

    thread_id: str
    version: int
    agent_fingerprint: str
    compatible: bool
    messages: tuple[Message, ...]
    facts: tuple[FactRecord, ...]
    interaction: InteractionView | None
    agenda: tuple[AgendaItem, ...]
    inbox: tuple[QueuedView, ...] = ()

    @classmethod
    def of(
        cls,
        thread_id: str,
        checkpoint: KernelCheckpoint,
        *,
        compatible: bool,
        input_schemas: Mapping[str, dict[str, Any]],
    ) -> ThreadView:
        """``input_schemas``: each capability's input schema, by capability ID."""
        active = checkpoint.interaction
        interaction = None
        if active is not None:
            schema = input_schemas.get(active.capability_id)
            interaction = InteractionView(
                **{f.name: getattr(active, f.name) for f in fields(Interaction)},
                input_schema=schema if active.kind == "confirmation" else None,
            )
        return cls(
            thread_id=thread_id,
            version=checkpoint.version,
            agent_fingerprint=checkpoint.agent_fingerprint,
            compatible=compatible,
            messages=checkpoint.messages,
            facts=tuple(checkpoint.facts[key] for key in sorted(checkpoint.facts)),
            interaction=interaction,
            agenda=checkpoint.agenda,
        )


@dataclass(frozen=True, slots=True)
class ReceiptList:
    """The current receipt per (thread, key), oldest first."""

    receipts: tuple[Receipt, ...]


@dataclass(frozen=True, slots=True)
class InteractionList:
    """Pending interactions of the caller's threads, in thread ID order.

    Pass ``next_after`` as ``after`` to read on.
    It is ``None`` when there are no more.
    """

    interactions: tuple[PendingInteraction, ...]
    next_after: str | None


@dataclass(frozen=True, slots=True)
class TimerView:
    """One timer of a thread: a turn the kernel runs at ``due_at``.

    ``status`` is ``pending`` until it fires (``fired``) or its guard voids it (``void``).
    A recurring timer stays pending, and ``due_at`` is its next occurrence.
    ``turn_id`` is the turn of its last firing.
    Keys beginning with ``kernel:`` are the kernel's own.
    They are a confirmation's expiry and its reminder.
    """

    key: str
    status: TimerStatus
    due_at: datetime
    message: str | None
    data: Any
    every_seconds: float | None
    cron: str | None
    unless_version_after: int | None
    turn_id: str | None

    @classmethod
    def of(cls, timer: Timer) -> TimerView:
        """The view of a stored timer."""
        every = timer.every.total_seconds() if timer.every is not None else None
        return cls(
            timer.key,
            timer.status,
            timer.due_at,
            timer.message,
            timer.data,
            every,
            timer.cron,
            timer.unless_version_after,
            timer.turn_id,
        )


@dataclass(frozen=True, slots=True)
class TimerList:
    """A thread's timers, in key order."""

    thread_id: str
    timers: tuple[TimerView, ...]


@dataclass(frozen=True, slots=True)
class Health:
    status: Literal["ok"]
    agent: str
    agent_version: str
    fingerprint: str


_DUMPERS: dict[type[Any], pydantic.TypeAdapter[Any]] = {
    cls: pydantic.TypeAdapter(cls)
    for cls in (ThreadView, ReceiptList, Receipt, Health, InteractionList, Cancellation, TimerList)
}


def dump(
    value: ThreadView | ReceiptList | Receipt | Health | InteractionList | Cancellation | TimerList,
) -> Any:
    """The JSON-compatible form of a response view."""
    return _DUMPERS[type(value)].dump_python(value, mode="json")


async def read_body(request: Request, model: type[M]) -> M:
    """Read and validate a JSON body.

    - 415 when not sent as ``application/json``.
    - 413 when too large.
    - 400 when not JSON.
    - 422 when it does not match ``model``.

    The media type is checked because the parser would read JSON from any body.
    A browser sends ``text/plain``, or a form, from any page without a preflight.
    It sends ``application/json`` only after one.
    """
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        raise HostProblem(
            "unsupported-media-type",
            f"the body must be sent as Content-Type: {JSON_MEDIA_TYPE}, got {media_type or 'none'}",
            headers={"Accept": JSON_MEDIA_TYPE},  # RFC 9110: what a 415 would take
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HostProblem("payload-too-large", f"the body exceeds {MAX_BODY_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HostProblem("payload-too-large", f"the body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:
        return model.model_validate_json(b"".join(chunks))
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        if any(error["type"] == "json_invalid" for error in errors):
            raise HostProblem("malformed-request", "the body is not a JSON document") from None
        raise HostProblem(
            "invalid-request",
            "; ".join(_describe(error) for error in errors[:5]),
            errors=[{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors],
        ) from None


def _describe(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "body"
    return f"{where}: {error['msg']}"
