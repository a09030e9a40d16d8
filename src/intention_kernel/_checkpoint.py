"""KernelCheckpoint: the canonical runtime state of a thread, and its codec.

A checkpoint stores only what the kernel needs to continue a conversation:

- bounded messages.
- versioned facts with evidence.
- pending agenda items.
- the active interaction.
- an index of the thread's effect receipts.
- the agent fingerprint and schema revision it was written under.

Everything here is pure: encoding, decoding, migrating older schema revisions
and deciding whether an agent may load a checkpoint. :func:`encode_checkpoint`
returns the whole document, and :func:`decode_checkpoint` reads one back.
A store keeps the document in pieces (rows): how is the stored layout's business,
:mod:`intention_kernel.durability._layout`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

from intention_kernel import _adapters
from intention_kernel._adapters import LazyAdapter
from intention_kernel._effects import ReceiptStatus
from intention_kernel._facts import FactRecord
from intention_kernel.errors import CheckpointCompatibilityError, CorruptRecordError

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
    "check_compatible",
    "current_revision",
    "decode_checkpoint",
    "delta_between",
    "encode_checkpoint",
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

    ``kind`` is ``"confirmation"`` or ``"capability"``. With ``"confirmation"``, the
    kernel holds a planned write until it is accepted. With ``"capability"``, the
    capability asked; it validates the answer itself when it is called again.

    ``digest`` binds an answer to the operation shown (``Answer.digest``): the sha256 of
    the canonical JSON of ``{capability_id, input, kind}``. It is computed when the
    interaction is created, and on load for a checkpoint stored before it existed.

    ``expires_at`` (UTC) is when the interaction expires unanswered: an answer after it
    runs nothing (see the guide *Approvals*). ``None`` is no deadline, as in every
    checkpoint stored before deadlines existed. The field is optional, so no schema
    revision was needed. It is not part of ``digest``: the deadline is not the
    operation.

    ``approvals`` is how many distinct actors must accept before the held operation runs.
    It is the capability's ``approvals`` when the interaction opened. ``approved_by``
    names, in order, the actors whose accepts are recorded so far. Those are a quorum's
    partial accepts; it is empty until then. Checkpoints stored before quorums existed
    read as one approval and no approvers. Both fields are optional, so no schema
    revision was needed. Neither is part of ``digest``.

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
    turn that used it saw it. So ``status`` is the status at that turn's commit, not
    necessarily the receipt's current one. The adapter's receipt is the authority
    (``list_receipts``). ``run_effect`` always reads that receipt, never the index. An
    operator's ``resolve_receipt`` changes the receipt, not the thread's committed
    checkpoints. The next turn that uses the key brings the entry up to date.

    Why not rewrite the entry on resolution? A committed checkpoint is one document per
    ``version``. Adapters keep the latest one decoded and reuse it while the stored
    version is unchanged. They commit later checkpoints as differences from it. So a
    same-version rewrite would be undone by the next commit of any worker holding the
    old one.
    """

    key: str
    id: str
    status: ReceiptStatus
    turn_id: str
    step_id: str


def _plain_facts(facts: Mapping[str, FactRecord]) -> dict[str, FactRecord]:
    return facts if type(facts) is dict else dict(facts)


class _PlainFacts:
    """``pydantic.PlainSerializer(_plain_facts, return_type=dict[str, FactRecord])``.

    Made when pydantic first builds a schema with it, not at import (see
    ``_adapters``). Its schema is the serializer's own."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        import pydantic

        serializer = pydantic.PlainSerializer(_plain_facts, return_type=dict[str, FactRecord])
        return serializer.__get_pydantic_core_schema__(source, handler)


#: A read-only mapping: a decoded checkpoint's facts are a dict, the runtime's next
#: checkpoint shares them with its predecessor (``facts.DerivedFacts``).
_Facts = Annotated[Mapping[str, FactRecord], _PlainFacts()]


@dataclass(frozen=True, slots=True)
class KernelCheckpoint:
    """The state a thread resumes from. ``version`` is 1 after the first committed turn.

    ``receipts`` is an index of the receipts the thread's turns used, each as its turn
    saw it (see :class:`ReceiptRef`). ``list_receipts`` says what they are now.
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
#: ``len(CHECKPOINT_MIGRATIONS) + 1``. Append, never edit or reorder. It is read each
#: time a checkpoint is decoded or written, never copied at import. So a test can
#: register a migration (``monkeypatch.setattr``) and watch turns migrate on read.
CHECKPOINT_MIGRATIONS: tuple[Migration, ...] = ()

#: The revision this release of the library writes.
SCHEMA_REVISION = len(CHECKPOINT_MIGRATIONS) + 1


def current_revision() -> int:
    """The revision checkpoints are written in: one past the registered migrations."""
    return len(CHECKPOINT_MIGRATIONS) + 1


# Built at their first use (see ``_adapters``): at import they cost a third of it.
_ADAPTER = LazyAdapter(KernelCheckpoint)


def encode_checkpoint(checkpoint: KernelCheckpoint) -> str:
    """The checkpoint as compact JSON text."""
    return _ADAPTER().dump_json(checkpoint).decode()


@dataclass(frozen=True, slots=True)
class CheckpointDelta:
    """How a checkpoint differs from the one it was built from, as its builder knows it.

    That base is version ``base_version``; 0 means none, the thread's first.

    Messages: the ``messages_trimmed`` oldest of the base's are dropped, then
    ``messages_appended`` added after the rest. Facts: each of ``facts_set`` is added,
    or replaces the record of its key, and the keys of ``facts_removed`` are gone.
    Receipt index: the base's entries of the ``receipts_moved`` keys are dropped. Then
    ``receipts_appended`` are added after the rest. Then the ``receipts_trimmed``
    oldest are dropped. Everything else (the core) is the checkpoint's own, written whole.

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
    """The delta that turns ``previous`` (``None``: an empty thread) into ``current``.

    It is found by comparing values: equal entries are kept, whatever objects hold them.

    Messages and receipt entries kept must be a run of ``previous``'s newest ones that
    starts ``current``. Otherwise they are all dropped and all of ``current``'s are
    appended. That is always a correct delta, just not the smallest."""
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
    """How many of ``previous``'s oldest entries to drop, and the entries to append.

    The entries go after the rest, so that the result equals ``current``."""
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
            except _adapters.ValidationError:
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
    except _adapters.ValidationError as exc:
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

    This is the deploy-time check. A changed agent (a version bump included) refuses
    old threads. It accepts them only if it lists their fingerprint in
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
