"""KernelCheckpoint: the canonical runtime state of a thread, and its codec.

A checkpoint stores only what the kernel needs to continue a conversation:
bounded messages, versioned facts with evidence, pending agenda items, the
active interaction, an index of the thread's effect receipts, and the agent
fingerprint and schema revision it was written under.

Everything here is pure: encoding, decoding, migrating older schema revisions
and deciding whether an agent may load a checkpoint. Adapters store the JSON
that :func:`encode_checkpoint` returns and hand back what they read to
:func:`decode_checkpoint`.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic

from intention_kernel.effects import ReceiptStatus
from intention_kernel.errors import CheckpointCompatibilityError, CorruptRecordError
from intention_kernel.facts import FactRecord

__all__ = [
    "CHECKPOINT_MIGRATIONS",
    "SCHEMA_REVISION",
    "AgendaItem",
    "Interaction",
    "KernelCheckpoint",
    "Message",
    "CoreEncoder",
    "Migration",
    "ReceiptRef",
    "assemble_checkpoint",
    "check_compatible",
    "continuation",
    "current_revision",
    "decode_checkpoint",
    "encode_checkpoint",
    "encode_checkpoint_core",
    "encode_fact",
    "encode_message",
]


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of the bounded conversation."""

    role: Literal["user", "assistant"]
    content: str
    turn_id: str


@dataclass(frozen=True, slots=True)
class Interaction:
    """A question the kernel is waiting for a person to answer.

    ``kind`` is ``"confirmation"`` (the kernel holds a planned write until it is
    accepted) or ``"capability"`` (the capability asked, and validates the answer
    itself when it is called again).

    ``digest`` binds an answer to the operation shown (``Answer.digest``): the sha256 of
    the canonical JSON of ``{capability_id, input, kind}``. It is computed when the
    interaction is created, and on load for a checkpoint stored before it existed.

    ``expires_at`` (UTC) is when the interaction expires unanswered: an answer after it
    runs nothing (see :mod:`intention_kernel.deadlines`). ``None`` is no deadline, as
    in every checkpoint stored before deadlines existed (the field is optional, so no
    schema revision was needed). It is not part of ``digest``: the deadline is not the
    operation.

    ``approvals`` is how many distinct actors must accept before the held operation runs
    (the capability's ``approvals`` when the interaction opened), and ``approved_by``
    names, in order, the actors whose accepts are recorded so far (a quorum's partial
    accepts; empty until then). Checkpoints stored before quorums existed read as one
    approval and no approvers: both fields are optional, so no schema revision was
    needed. Neither is part of ``digest``.
    """

    id: str
    kind: Literal["confirmation", "capability"]
    capability_id: str
    input: dict[str, Any]
    prompt: str
    details: Any = None
    step_id: str = ""
    turn_id: str = ""
    digest: str = ""
    expires_at: datetime | None = None
    approvals: int = 1
    approved_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(
                self, "digest", operation_digest(self.kind, self.capability_id, self.input)
            )


def operation_digest(kind: str, capability_id: str, input: Mapping[str, Any]) -> str:
    """The sha256 of the canonical JSON of an operation (sorted keys, no spaces).

    It must never change: an answer's ``digest`` is compared with it across releases."""
    canonical = json.dumps(
        {"capability_id": capability_id, "input": input, "kind": kind},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class AgendaItem:
    """A planned operation that has not run yet: exactly what will run on acceptance."""

    step_id: str
    capability_id: str
    input: dict[str, Any]
    turn_id: str
    interaction_id: str | None = None
    status: Literal["awaiting_confirmation"] = "awaiting_confirmation"


@dataclass(frozen=True, slots=True)
class ReceiptRef:
    """The checkpoint's index entry for an effect receipt (the adapter holds the full receipt).

    The index lists the receipts this thread's turns used, the most recently used last,
    at most ``Agent.max_receipts`` of them. Each entry records the receipt as the last
    turn that used it saw it: ``status`` is the status at that turn's commit, not
    necessarily the receipt's current one. The adapter's receipt is the authority
    (``list_receipts``; ``run_effect`` always reads it, never the index): an operator's
    ``resolve_receipt`` changes that receipt, not the thread's committed checkpoints, and
    the entry is brought up to date by the next turn that uses the key.

    Why not rewrite the entry on resolution: a committed checkpoint is one document per
    ``version`` (adapters keep the latest decoded and reuse it while the stored version
    is unchanged, and commit later checkpoints as differences from it), so a same-version
    rewrite would be undone by the next commit of any worker that holds the old one.
    """

    key: str
    id: str
    status: ReceiptStatus
    turn_id: str
    step_id: str


def _plain_facts(facts: Mapping[str, FactRecord]) -> dict[str, FactRecord]:
    return facts if type(facts) is dict else dict(facts)


#: A read-only mapping: a decoded checkpoint's facts are a dict, the runtime's next
#: checkpoint shares them with its predecessor (``facts.DerivedFacts``).
_Facts = Annotated[
    Mapping[str, FactRecord],
    pydantic.PlainSerializer(_plain_facts, return_type=dict[str, FactRecord]),
]


@dataclass(frozen=True, slots=True)
class KernelCheckpoint:
    """The state a thread resumes from. ``version`` is 1 after the first committed turn.

    ``receipts`` is an index of the receipts the thread's turns used, each as its turn
    saw it (see :class:`ReceiptRef`); ``list_receipts`` says what they are now.
    """

    schema_revision: int
    agent_fingerprint: str
    version: int
    messages: tuple[Message, ...] = ()
    facts: _Facts = field(default_factory=dict)
    agenda: tuple[AgendaItem, ...] = ()
    interaction: Interaction | None = None
    receipts: tuple[ReceiptRef, ...] = ()


Migration = Callable[[dict[str, Any]], dict[str, Any]]

#: Ordered migrations of the stored checkpoint document. ``CHECKPOINT_MIGRATIONS[i]``
#: turns revision ``i + 1`` into revision ``i + 2``; the current revision is therefore
#: ``len(CHECKPOINT_MIGRATIONS) + 1``. Append, never edit or reorder. Read each time a
#: checkpoint is decoded or written (never copied at import), so that a test can
#: register a migration (``monkeypatch.setattr``) and watch turns migrate on read.
CHECKPOINT_MIGRATIONS: tuple[Migration, ...] = ()

#: The revision this release of the library writes.
SCHEMA_REVISION = len(CHECKPOINT_MIGRATIONS) + 1


def current_revision() -> int:
    """The revision checkpoints are written in: one past the registered migrations."""
    return len(CHECKPOINT_MIGRATIONS) + 1


_ADAPTER: pydantic.TypeAdapter[KernelCheckpoint] = pydantic.TypeAdapter(KernelCheckpoint)
_MESSAGE: pydantic.TypeAdapter[Message] = pydantic.TypeAdapter(Message)
_FACT: pydantic.TypeAdapter[FactRecord] = pydantic.TypeAdapter(FactRecord)
_RECEIPT_REF: pydantic.TypeAdapter[ReceiptRef] = pydantic.TypeAdapter(ReceiptRef)
_ROWS = frozenset(("messages", "facts"))
_ROWS_AND_RECEIPTS = _ROWS | {"receipts"}


def encode_checkpoint(checkpoint: KernelCheckpoint) -> str:
    """The checkpoint as compact JSON text."""
    return _ADAPTER.dump_json(checkpoint).decode()


# Adapters store a checkpoint in pieces, so that a turn writes what it changed and not
# the whole document: the small *core* (everything but messages and facts) in the
# thread row, each message and each fact in a row of its own. Reading puts the pieces
# back together into the document that ``decode_checkpoint`` reads.


def encode_checkpoint_core(checkpoint: KernelCheckpoint) -> str:
    """The checkpoint without its messages and facts, as compact JSON text."""
    return _ADAPTER.dump_json(checkpoint, exclude=_ROWS).decode()  # type: ignore[arg-type]


class CoreEncoder:
    """Encodes the successive cores of one thread (see :func:`encode_checkpoint_core`).

    The receipt index is most of a core (up to ``max_receipts`` entries) and a turn
    changes one or two entries: the runtime carries the others over as the same
    objects, so their JSON from the previous core is reused instead of encoded again.
    """

    __slots__ = ("_parts", "_refs")

    def __init__(self) -> None:
        # The last index encoded and its entries' JSON (holding the entries keeps them,
        # and so their identity, alive).
        self._refs: tuple[ReceiptRef, ...] = ()
        self._parts: list[str] = []

    def encode(self, checkpoint: KernelCheckpoint) -> str:
        refs, previous = checkpoint.receipts, self._refs
        appended = continuation(previous, refs)
        if appended is not None:  # the usual turn: oldest entries dropped, new ones added
            kept = len(refs) - len(appended)
            parts = self._parts[len(previous) - kept :] + [_encode_ref(r) for r in appended]
        else:  # an entry moved (a key used again): look each one up
            known = {id(r): text for r, text in zip(previous, self._parts, strict=True)}
            parts = [known.get(id(r)) or _encode_ref(r) for r in refs]
        self._refs, self._parts = refs, parts
        head = _ADAPTER.dump_json(checkpoint, exclude=_ROWS_AND_RECEIPTS).decode()  # type: ignore[arg-type]
        return f'{head[:-1]},"receipts":[{",".join(parts)}]}}'


def _encode_ref(ref: ReceiptRef) -> str:
    return _RECEIPT_REF.dump_json(ref).decode()


def continuation(previous: Sequence[Any], current: Sequence[Any]) -> Sequence[Any] | None:
    """The entries ``current`` appends to what it keeps of ``previous`` (after dropping
    some of its oldest), or ``None`` if it is not such a continuation. Compared by
    identity: the runtime carries kept entries over as the same objects, so this costs
    a few pointer compares."""
    if not current:
        return current
    first = current[0]
    start = next((i for i, item in enumerate(previous) if item is first), len(previous))
    kept = len(previous) - start
    if kept > len(current) or not all(map(operator.is_, previous[start:], current[:kept])):
        return None
    return current[kept:]


def encode_message(message: Message) -> str:
    return _MESSAGE.dump_json(message).decode()


def encode_fact(record: FactRecord) -> str:
    return _FACT.dump_json(record).decode()


def assemble_checkpoint(
    core: str, messages: Sequence[str], facts: Sequence[tuple[str, str]]
) -> tuple[str, bool]:
    """The whole checkpoint document from a stored core and its message and fact rows
    (oldest message first; facts as ``(key, record JSON)`` in recording order).

    Returns the document and whether it was stored in pieces. A core that holds its own
    messages or facts is a whole document (written by an earlier version of the
    library): it is returned as it is, rows ignored, and the second value is ``False``.
    Anything that is not a JSON object is returned unchanged for ``decode_checkpoint``
    to refuse.
    """
    try:
        document = json.loads(core)
    except ValueError:
        return core, False
    if not isinstance(document, dict) or not document or _ROWS & document.keys():
        return core, False
    facts_text = ",".join(f"{json.dumps(key, ensure_ascii=False)}:{body}" for key, body in facts)
    head = core.rstrip()[:-1]
    return f'{head},"messages":[{",".join(messages)}],"facts":{{{facts_text}}}}}', True


def decode_checkpoint(
    text: str | bytes,
    *,
    thread_id: str | None = None,
    migrations: Sequence[Migration] | None = None,
) -> KernelCheckpoint:
    """Decode stored checkpoint JSON, migrating older schema revisions (by
    ``migrations``, :data:`CHECKPOINT_MIGRATIONS` unless given).

    Raises :class:`CheckpointCompatibilityError` for a revision newer than the
    migrations know, and :class:`CorruptRecordError` for anything that does not
    decode into a valid checkpoint.
    """
    registered = migrations is None
    if migrations is None:
        migrations = CHECKPOINT_MIGRATIONS
    current = len(migrations) + 1
    try:
        if registered:
            # Fast path: the document is very likely current; validate straight from JSON.
            try:
                checkpoint = _ADAPTER.validate_json(text)
            except pydantic.ValidationError:
                checkpoint = None
            if checkpoint is not None and checkpoint.schema_revision == current:
                return checkpoint
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(
            f"stored checkpoint of thread {thread_id!r} is not valid JSON: {exc}",
            thread_id=thread_id,
        ) from exc
    if not isinstance(document, dict) or not isinstance(document.get("schema_revision"), int):
        raise CorruptRecordError(
            f"stored checkpoint of thread {thread_id!r} has no integer schema_revision",
            thread_id=thread_id,
        )
    revision: int = document["schema_revision"]
    if revision > current:
        raise CheckpointCompatibilityError(
            f"checkpoint of thread {thread_id!r} has schema revision {revision}, newer than "
            f"{current}, the newest this version of intention-kernel understands; upgrade "
            "the library before serving this thread",
            schema_revision=revision,
            thread_id=thread_id,
        )
    if revision < 1:
        raise CorruptRecordError(
            f"stored checkpoint of thread {thread_id!r} has invalid schema revision {revision}",
            thread_id=thread_id,
        )
    for migrate in migrations[revision - 1 :]:
        document = migrate(document)
    document["schema_revision"] = current
    try:
        return _ADAPTER.validate_python(document)
    except pydantic.ValidationError as exc:
        raise CorruptRecordError(
            f"stored checkpoint of thread {thread_id!r} does not match schema revision "
            f"{current}: {exc.error_count()} problem(s), first: {exc.errors()[0]['msg']} at "
            f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}",
            thread_id=thread_id,
        ) from exc


def check_compatible(
    checkpoint: KernelCheckpoint,
    *,
    fingerprint: str,
    compatible: Collection[str] = (),
    thread_id: str | None = None,
) -> None:
    """Refuse a checkpoint written by an agent this one does not declare compatible.

    This is the deploy-time check: a changed agent (a version bump included)
    refuses old threads unless it lists their fingerprint in
    ``Agent(compatible_fingerprints=[...])``.
    """
    stored = checkpoint.agent_fingerprint
    if stored == fingerprint or stored in compatible:
        return
    raise CheckpointCompatibilityError(
        f"thread {thread_id!r} was written by agent fingerprint {stored}, and this agent "
        f"({fingerprint}) does not declare it compatible; add it to "
        "Agent(compatible_fingerprints=[...]) if the old state is safe to resume",
        fingerprint=stored,
        thread_id=thread_id,
    )
