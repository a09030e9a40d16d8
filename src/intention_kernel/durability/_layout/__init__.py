"""The stored checkpoint layout: how a checkpoint becomes rows, and rows a checkpoint.

A store keeps a thread's checkpoint in pieces, so a turn's cost does not grow with
its thread. The thread row holds the small *core*: everything but messages and facts.
Each message and each fact has a row of its own. A store may keep each receipt index
entry in a row too (``RecorderOptions.receipt_index_rows``); its core then leaves the
index out. A commit writes the core and only the rows its turn changed
(:class:`CheckpointRows`); reading puts the pieces back together into one document.

Everything the stored layout decides lives here, and all of it is pure. How each
piece is spelled as JSON, and how stored pieces are read back, is in
:mod:`.codec`. The engine
and the operations hand in a :class:`~intention_kernel._checkpoint.KernelCheckpoint`
and its :class:`~intention_kernel._checkpoint.CheckpointDelta`, and get rows back.
An adapter applies the rows in its store and never encodes a checkpoint itself.
A change of the layout (a new kind of row, say) touches this module, each adapter's
step that applies rows, the options that declare the rows, and the conformance test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from intention_kernel._checkpoint import (
    CheckpointDelta,
    KernelCheckpoint,
    delta_between,
)
from intention_kernel._facts import FactRecord
from intention_kernel.durability._contract.recorders import RecorderOptions
from intention_kernel.durability._contract.records import CheckpointRewrite
from intention_kernel.durability._layout.codec import (
    encode_bare_core,
    encode_core,
    encode_fact,
    encode_message,
    encode_receipt_ref,
)

__all__ = [
    "Base",
    "CheckpointRows",
    "all_rows",
    "checkpoint_rows",
    "delta_problems",
    "rewrite_of",
    "turn_rows",
]


# -- the rows of a commit ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Base:
    """The checkpoint a turn started from, as its engine holds it.

    ``exact``: its rows are stored exactly as a commit of it would store them.
    The next commit may then write a difference.
    ``receipts``: the JSON of each entry of its receipt index, if the engine encoded it.
    It is ``None`` when not known."""

    checkpoint: KernelCheckpoint | None
    exact: bool = True
    receipts: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class CheckpointRows:
    """The rows a commit writes (``TurnRecord.rows``), a difference with the stored ones.

    ``core`` is the new core document, for the thread row.
    ``messages`` are appended after the stored message rows.
    Their numbers go on from the thread's last message number.
    Then only the newest ``keep_messages`` rows are kept.
    The ``trim_messages`` rows just older than those are deleted.
    That range is bounded, so a store need not look at older rows.
    ``facts`` (``(key, record JSON)``) are inserted, or replace the row of their key.
    A replaced row keeps its place in the order.
    ``removed_facts`` are deleted.

    With ``rewrite``, every message and fact row of the thread is deleted first.
    ``messages`` and ``facts`` are then all of them.
    The stored rows were not the base this difference was computed from.

    A store may keep the receipt index in rows (``RecorderOptions.receipt_index_rows``).
    For such a store the core leaves the index out.
    The rows of the ``moved_index_keys`` are deleted first.
    Then the ``receipt_index`` rows (``(key, entry JSON)``) are appended after the rest.
    Then the ``trim_index`` oldest rows are deleted.
    With ``rewrite``, every index row is deleted first.
    ``receipt_index`` is then the whole index.
    Other stores get these fields empty.

    ``receipts`` is not stored: the engine keeps it for its next commit's core.
    It is the JSON of each entry of the new core's receipt index.
    It is ``None`` when the index is in rows of its own, not in the core.
    """

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


def turn_rows(
    base: Base,
    checkpoint: KernelCheckpoint,
    delta: CheckpointDelta | None,
    options: RecorderOptions,
) -> CheckpointRows:
    """The rows a turn's commit writes, in the rows its store's ``options`` declare.

    They follow ``delta``, which the caller checked first with :func:`delta_problems`.
    Without one, they follow the delta found by comparing values.
    A found delta that does not make ``checkpoint`` writes every row anew instead.
    Facts not keyed by their own key are such a checkpoint."""
    index_rows = options.receipt_index_rows
    if delta is None:
        delta = delta_between(base.checkpoint, checkpoint)
        if delta_problems(base.checkpoint, checkpoint, delta):
            return all_rows(checkpoint, index_rows=index_rows)
    return checkpoint_rows(base, checkpoint, delta, index_rows=index_rows)


def checkpoint_rows(
    base: Base, checkpoint: KernelCheckpoint, delta: CheckpointDelta, *, index_rows: bool = False
) -> CheckpointRows:
    """The rows that turn the stored ``base`` into ``checkpoint`` by ``delta``.

    The caller checked ``delta`` first with :func:`delta_problems`.
    Every row is written anew when the base's rows are not stored exactly.
    With ``index_rows`` the receipt index is rows too, not in the core."""
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
    """Every row of ``checkpoint`` anew, as a ``rewrite``.

    A commit over a base not stored exactly writes these.
    So does a checkpoint migration (``CheckpointRewrite``)."""
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


def rewrite_of(
    thread_id: str, checkpoint: KernelCheckpoint, options: RecorderOptions
) -> CheckpointRewrite:
    """``checkpoint`` written anew, in the rows its store's ``options`` declare."""
    return CheckpointRewrite(
        thread_id=thread_id,
        version=checkpoint.version,
        schema_revision=checkpoint.schema_revision,
        fingerprint=checkpoint.agent_fingerprint,
        rows=all_rows(checkpoint, index_rows=options.receipt_index_rows),
    )


def _receipts(base: Base, checkpoint: KernelCheckpoint, delta: CheckpointDelta) -> list[str]:
    """The JSON of the new receipt index's entries.

    The base's entries are kept as they were encoded; the appended ones are encoded."""
    if base.receipts is None or base.checkpoint is None:
        return [encode_receipt_ref(r) for r in checkpoint.receipts]
    parts = list(base.receipts)
    if delta.receipts_moved:
        moved = set(delta.receipts_moved)
        entries = base.checkpoint.receipts
        parts = [p for r, p in zip(entries, parts, strict=True) if r.key not in moved]
    parts += [encode_receipt_ref(r) for r in delta.receipts_appended]
    return parts[delta.receipts_trimmed :]


# -- checking a delta --------------------------------------------------------------------


def delta_problems(
    previous: KernelCheckpoint | None, checkpoint: KernelCheckpoint, delta: CheckpointDelta
) -> list[str]:
    """Why ``delta`` does not turn ``previous`` into ``checkpoint`` (empty: it may).

    It checks what a commit relies on: the base's version and the counts.
    It checks that what is appended is the new checkpoint's own, too.
    Its cost is that of what the turn changed, not of what the thread holds."""
    problems = []
    if delta.base_version != (previous.version if previous else 0):
        problems.append(f"the delta is from version {delta.base_version}, not the stored one")
        return problems
    # Each length is read once: this check runs on every commit.
    old_count = len(previous.messages) if previous else 0
    messages, appended = checkpoint.messages, delta.messages_appended
    count, added, trimmed = len(messages), len(appended), delta.messages_trimmed
    if not 0 <= trimmed <= old_count or (
        old_count - trimmed + added != count or messages[count - added :] != appended
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
    count, added, trimmed = len(receipts), len(appended_refs), delta.receipts_trimmed
    # The index's last entries are the appended ones the bound kept.
    if count < added:
        new, start = appended_refs[-count:], 0
    else:
        new, start = appended_refs, count - added
    if (
        kept + added - trimmed != count
        or not 0 <= trimmed <= kept + added
        or (receipts and receipts[start:] != new)
    ):
        problems.append("the delta's receipt index does not make the checkpoint's")
    return problems


def _facts_make(
    old: Mapping[str, FactRecord], facts: Mapping[str, FactRecord], delta: CheckpointDelta
) -> bool:
    """Whether ``delta`` turns the ``old`` facts into ``facts``.

    It sets ``delta.facts_set`` and removes ``delta.facts_removed``.
    The check is by the count, and by each key the delta names."""
    added = 0
    for record in delta.facts_set:
        found = facts.get(record.key)
        if found is not record and found != record:
            return False
        if record.key not in old:
            added += 1
    removed = delta.facts_removed
    if not removed:  # most turns: no call to count or scan an empty tuple
        return len(old) + added == len(facts)
    if len(old) + added - len(removed) != len(facts):
        return False
    return not any(key in facts or key not in old for key in removed)
