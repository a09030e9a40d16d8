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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic

from intention_kernel._adapters import LazyAdapter, first_use_serializer
from intention_kernel.effects import ReceiptStatus
from intention_kernel.errors import CheckpointCompatibilityError, CorruptRecordError
from intention_kernel.facts import FactRecord

__all__ = [
    "CHECKPOINT_MIGRATIONS",
    "SCHEMA_REVISION",
    "AgendaItem",
    "CheckpointDelta",
    "Interaction",
    "KernelCheckpoint",
    "Message",
    "Migration",
    "ReceiptRef",
    "assemble_checkpoint",
    "check_compatible",
    "current_revision",
    "decode_checkpoint",
    "delta_between",
    "encode_bare_core",
    "encode_checkpoint",
    "encode_checkpoint_core",
    "encode_core",
    "encode_fact",
    "encode_message",
    "encode_receipt_ref",
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

    ``proposed_by`` is the name of the principal whose turn proposed the operation
    (``None``: the turn named no principal). ``who_may_answer`` describes, for a
    person, who may answer it (the capability's approver policy when it opened).
    ``None`` means anyone who may post to the thread: the default policy, and every
    checkpoint stored before policies existed. Both are optional, so no schema revision
    was needed. The policy itself is the capability's current one.
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
    proposed_by: str | None = None
    who_may_answer: str | None = None

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


# Built at their first use (see ``_adapters``): at import they cost a third of it.
_ADAPTER = LazyAdapter(KernelCheckpoint)
_MESSAGE = LazyAdapter(Message)
_FACT = LazyAdapter(FactRecord)
_RECEIPT_REF = LazyAdapter(ReceiptRef)
_ROWS = frozenset(("messages", "facts"))
_ROWS_AND_RECEIPTS = _ROWS | {"receipts"}
# The serializers of the pieces every commit writes, called directly: ``dump_json`` is
# a layer of Python that passes each of its options' defaults on every call, and the
# serializer's own defaults are the same, so the bytes are too. Each name is rebound
# to the real serializer at its first call.
_to_json = first_use_serializer(globals(), "_to_json", _ADAPTER)
_message_json = first_use_serializer(globals(), "_message_json", _MESSAGE)
_fact_json = first_use_serializer(globals(), "_fact_json", _FACT)
_receipt_ref_json = first_use_serializer(globals(), "_receipt_ref_json", _RECEIPT_REF)


def encode_checkpoint(checkpoint: KernelCheckpoint) -> str:
    """The checkpoint as compact JSON text."""
    return _ADAPTER().dump_json(checkpoint).decode()


# Adapters store a checkpoint in pieces, so that a turn writes what it changed and not
# the whole document: the small *core* (everything but messages and facts) in the
# thread row, each message and each fact in a row of its own. Reading puts the pieces
# back together into the document that ``decode_checkpoint`` reads.


def encode_checkpoint_core(checkpoint: KernelCheckpoint) -> str:
    """The checkpoint without its messages and facts, as compact JSON text."""
    return _ADAPTER().dump_json(checkpoint, exclude=_ROWS).decode()  # type: ignore[arg-type]


def encode_core(checkpoint: KernelCheckpoint, receipts: Sequence[str]) -> str:
    """The text :func:`encode_checkpoint_core` returns, given the JSON of each entry of
    the checkpoint's receipt index (:func:`encode_receipt_ref`), oldest first.

    The receipt index is most of a core and a turn changes one or two entries, so a
    writer keeps each entry's JSON from the previous core instead of encoding it again.
    The index is the core's last field, so it is put after the rest of the core.
    """
    head = _to_json(checkpoint, exclude=_ROWS_AND_RECEIPTS).decode()
    return f'{head[:-1]},"receipts":[{",".join(receipts)}]}}'


def encode_bare_core(checkpoint: KernelCheckpoint) -> str:
    """The core without its receipt index, for a store that keeps each index entry in a
    row of its own (``RecorderOptions.receipt_index_rows``)."""
    return _to_json(checkpoint, exclude=_ROWS_AND_RECEIPTS).decode()


def encode_receipt_ref(ref: ReceiptRef) -> str:
    """One receipt index entry as compact JSON, as it appears in a core."""
    return _receipt_ref_json(ref).decode()


@dataclass(frozen=True, slots=True)
class CheckpointDelta:
    """How a checkpoint differs from the one of version ``base_version`` it was built
    from (0: none, the thread's first), as its builder knows it.

    Messages: the ``messages_trimmed`` oldest of the base's are dropped, then
    ``messages_appended`` added after the rest. Facts: each of ``facts_set`` is added,
    or replaces the record of its key, and the keys of ``facts_removed`` are gone.
    Receipt index: the base's entries of the ``receipts_moved`` keys are dropped, then
    ``receipts_appended`` added after the rest, then the ``receipts_trimmed`` oldest
    dropped. Everything else (the core) is the checkpoint's own, written whole.

    The turn runtime builds it as it builds the checkpoint; a commit then writes exactly
    these rows (``TurnCommit.delta``). :func:`delta_between` finds it by comparing
    values, for a checkpoint built another way.
    """

    base_version: int
    messages_appended: tuple[Message, ...] = ()
    messages_trimmed: int = 0
    facts_set: tuple[FactRecord, ...] = ()
    facts_removed: tuple[str, ...] = ()
    receipts_moved: tuple[str, ...] = ()
    receipts_appended: tuple[ReceiptRef, ...] = ()
    receipts_trimmed: int = 0


def delta_between(previous: KernelCheckpoint | None, current: KernelCheckpoint) -> CheckpointDelta:
    """The delta that turns ``previous`` (``None``: an empty thread) into ``current``,
    found by comparing values: equal entries are kept, whatever objects hold them.

    Messages and receipt entries kept must be a run of ``previous``'s newest ones that
    starts ``current``; otherwise they are all dropped and all of ``current``'s
    appended, which is always a correct delta, just not the smallest."""
    if previous is None:
        return CheckpointDelta(
            base_version=0,
            messages_appended=current.messages,
            facts_set=tuple(current.facts.values()),
            receipts_appended=current.receipts,
        )
    messages_trimmed, messages_appended = _appended(previous.messages, current.messages)
    receipts_trimmed, receipts_appended = _appended(previous.receipts, current.receipts)
    old, new = previous.facts, current.facts
    return CheckpointDelta(
        base_version=previous.version,
        messages_appended=messages_appended,
        messages_trimmed=messages_trimmed,
        facts_set=tuple(record for key, record in new.items() if old.get(key) != record),
        facts_removed=tuple(key for key in old if key not in new),
        receipts_appended=receipts_appended,
        receipts_trimmed=receipts_trimmed,
    )


def _appended(previous: Sequence[Any], current: tuple[Any, ...]) -> tuple[int, tuple[Any, ...]]:
    """How many of ``previous``'s oldest entries to drop, and the entries to append after
    the rest, so that the result equals ``current``."""
    if not current:
        return len(previous), ()
    try:
        start = previous.index(current[0])
    except ValueError:
        return len(previous), current
    kept = len(previous) - start
    if kept > len(current) or tuple(previous[start:]) != current[:kept]:
        return len(previous), current
    return start, current[kept:]


def encode_message(message: Message) -> str:
    return _message_json(message).decode()


def encode_fact(record: FactRecord) -> str:
    return _fact_json(record).decode()


def assemble_checkpoint(
    core: str,
    messages: Sequence[str],
    facts: Sequence[tuple[str, str]],
    receipt_index: Sequence[str] | None = None,
) -> tuple[str, bool]:
    """The whole checkpoint document from a stored core and its message and fact rows
    (oldest message first; facts as ``(key, record JSON)`` in recording order), and its
    receipt index rows (oldest first; ``None``: the core holds the index).

    Returns the document and whether it was stored in pieces as a commit of it would
    store it. A core that holds its own messages or facts is a whole document (written
    by an earlier version of the library): it is returned as it is, rows ignored, and
    the second value is ``False``. A core that holds its receipt index although index
    rows were read was written before its store kept them: its own index is used, and
    the second value is ``False`` too. Anything that is not a JSON object is returned
    unchanged for ``decode_checkpoint`` to refuse.
    """
    try:
        document = json.loads(core)
    except ValueError:
        return core, False
    if not isinstance(document, dict) or not document or _ROWS & document.keys():
        return core, False
    facts_text = ",".join(f"{json.dumps(key, ensure_ascii=False)}:{body}" for key, body in facts)
    head = core.rstrip()[:-1]
    rows = f'"messages":[{",".join(messages)}],"facts":{{{facts_text}}}}}'
    if receipt_index is None or "receipts" in document:
        return f"{head},{rows}", receipt_index is None
    return f'{head},"receipts":[{",".join(receipt_index)}],{rows}', True


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
                checkpoint = _ADAPTER().validate_json(text)
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
        return _ADAPTER().validate_python(document)
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
