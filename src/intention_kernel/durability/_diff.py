"""What a commit writes: the rows a :class:`~intention_kernel.checkpoint.CheckpointDelta`
names, encoded, as a ``TurnRecord`` carries them. Pure: no store, no cache."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from intention_kernel.checkpoint import (
    CheckpointDelta,
    KernelCheckpoint,
    encode_bare_core,
    encode_core,
    encode_fact,
    encode_message,
    encode_receipt_ref,
)
from intention_kernel.facts import FactRecord

__all__ = ["Base", "CheckpointRows", "all_rows", "checkpoint_rows", "delta_problems"]


@dataclass(frozen=True, slots=True)
class Base:
    """The checkpoint a turn started from, as its engine holds it.

    ``exact``: its rows are stored exactly as a commit of it would store them, so the
    next commit may write a difference. ``receipts``: the JSON of each entry of its
    receipt index, when the engine encoded them for its core (``None``: not known)."""

    checkpoint: KernelCheckpoint | None
    exact: bool = True
    receipts: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class CheckpointRows:
    """The rows of a commit, named as ``TurnRecord`` names them; and ``receipts``, the
    JSON of each entry of the new core's receipt index, for the next commit's core
    (``None`` when the index is in rows of its own, not in the core)."""

    core: str
    receipts: Sequence[str] | None
    messages: Sequence[str]
    keep_messages: int
    trim_messages: int = 0
    facts: Sequence[tuple[str, str]] = ()
    removed_facts: Sequence[str] = ()
    rewrite: bool = False
    receipt_index: Sequence[tuple[str, str]] = ()
    moved_index_keys: Sequence[str] = ()
    trim_index: int = 0


def checkpoint_rows(
    base: Base, checkpoint: KernelCheckpoint, delta: CheckpointDelta, *, index_rows: bool = False
) -> CheckpointRows:
    """The rows that turn the stored ``base`` into ``checkpoint`` by ``delta`` (checked
    first with :func:`delta_problems`); every row anew when the base's rows are not
    stored exactly. With ``index_rows`` the receipt index is rows too, not in the core."""
    if not base.exact:
        # No stored base to write a difference from.
        return all_rows(checkpoint, index_rows=index_rows)
    if index_rows:
        core = encode_bare_core(checkpoint)
        receipts = None
        index = [(r.key, encode_receipt_ref(r)) for r in delta.receipts_appended]
    else:
        receipts = _receipts(base, checkpoint, delta)
        core = encode_core(checkpoint, receipts)
        index = []
    return CheckpointRows(
        core=core,
        receipts=receipts,
        messages=[encode_message(m) for m in delta.messages_appended],
        keep_messages=len(checkpoint.messages),
        trim_messages=delta.messages_trimmed,
        facts=[(r.key, encode_fact(r)) for r in delta.facts_set],
        removed_facts=delta.facts_removed,
        receipt_index=index,
        moved_index_keys=delta.receipts_moved if index_rows else (),
        trim_index=delta.receipts_trimmed if index_rows else 0,
    )


def all_rows(checkpoint: KernelCheckpoint, *, index_rows: bool = False) -> CheckpointRows:
    """Every row of ``checkpoint`` anew, as a ``rewrite``: what a commit over a base not
    stored exactly writes, and a checkpoint migration (``CheckpointRewrite``)."""
    messages = checkpoint.messages
    entries = [(r.key, encode_receipt_ref(r)) for r in checkpoint.receipts]
    if index_rows:
        core, receipts, index = encode_bare_core(checkpoint), None, entries
    else:
        receipts = [entry for _, entry in entries]
        core, index = encode_core(checkpoint, receipts), []
    return CheckpointRows(
        core=core,
        receipts=receipts,
        messages=[encode_message(m) for m in messages],
        keep_messages=len(messages),
        facts=[(key, encode_fact(r)) for key, r in checkpoint.facts.items()],
        rewrite=True,
        receipt_index=index,
    )


def _receipts(base: Base, checkpoint: KernelCheckpoint, delta: CheckpointDelta) -> list[str]:
    """The JSON of the new receipt index's entries: the base's kept as they were encoded,
    the appended ones encoded."""
    if base.receipts is None or base.checkpoint is None:
        return [encode_receipt_ref(r) for r in checkpoint.receipts]
    parts = list(base.receipts)
    if delta.receipts_moved:
        moved = set(delta.receipts_moved)
        entries = base.checkpoint.receipts
        parts = [p for r, p in zip(entries, parts, strict=True) if r.key not in moved]
    parts += [encode_receipt_ref(r) for r in delta.receipts_appended]
    return parts[delta.receipts_trimmed :]


def delta_problems(
    previous: KernelCheckpoint | None, checkpoint: KernelCheckpoint, delta: CheckpointDelta
) -> list[str]:
    """Why ``delta`` does not turn ``previous`` into ``checkpoint`` (empty: it may).

    Checks what a commit relies on at the cost of what the turn changed, not of what the
    thread holds: the base's version, the counts, and that what is appended is the new
    checkpoint's own."""
    problems = []
    if delta.base_version != (previous.version if previous else 0):
        problems.append(f"the delta is from version {delta.base_version}, not the stored one")
        return problems
    old_messages = previous.messages if previous else ()
    messages, appended = checkpoint.messages, delta.messages_appended
    count, trimmed = len(messages), delta.messages_trimmed
    if not 0 <= trimmed <= len(old_messages) or (
        len(old_messages) - trimmed + len(appended) != count
        or messages[count - len(appended) :] != appended
    ):
        problems.append("the delta's messages do not make the checkpoint's")
    if not _facts_make(previous.facts if previous else {}, checkpoint.facts, delta):
        problems.append("the delta's facts do not make the checkpoint's")
    old_receipts = previous.receipts if previous else ()
    moved = delta.receipts_moved
    if moved:
        gone = set(moved)
        kept = sum(r.key not in gone for r in old_receipts)
    else:
        kept = len(old_receipts)
    receipts, appended_refs = checkpoint.receipts, delta.receipts_appended
    count, trimmed = len(receipts), delta.receipts_trimmed
    new = appended_refs[-count:]
    if (
        kept + len(appended_refs) - trimmed != count
        or not 0 <= trimmed <= kept + len(appended_refs)
        or (receipts and receipts[count - len(new) :] != new)
    ):
        problems.append("the delta's receipt index does not make the checkpoint's")
    return problems


def _facts_make(
    old: Mapping[str, FactRecord], facts: Mapping[str, FactRecord], delta: CheckpointDelta
) -> bool:
    """Whether setting ``delta.facts_set`` and removing ``delta.facts_removed`` turns the
    ``old`` facts into ``facts``: by the count, and by each key the delta names."""
    added = 0
    for record in delta.facts_set:
        found = facts.get(record.key)
        if found is not record and found != record:
            return False
        if record.key not in old:
            added += 1
    removed = delta.facts_removed
    if len(old) + added - len(removed) != len(facts):
        return False
    return not any(key in facts or key not in old for key in removed)
