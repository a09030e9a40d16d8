"""The checkpoints an engine keeps decoded, and how a stored checkpoint is decoded."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from intention_kernel.checkpoint import (
    KernelCheckpoint,
    assemble_checkpoint,
    current_revision,
    decode_checkpoint,
)
from intention_kernel.durability._diff import Base
from intention_kernel.durability.records import StoredThread
from intention_kernel.errors import CorruptRecordError

__all__ = ["CheckpointCache", "decode"]


class CheckpointCache:
    """The checkpoint an engine last committed or decoded, per thread, for the ``size``
    threads used last, with the JSON of its receipt index entries when it was committed
    here (for the next core, see :func:`~intention_kernel.checkpoint.encode_core`).

    A turn whose stored version still matches reuses its entry instead of reading and
    decoding the whole document again. Any other writer bumps the version, so a stale
    entry is never used. Entries are shared and read as they were built: the runtime
    copies what it changes (the facts, a ``DerivedFacts`` that shares their storage).
    Each entry's rows are stored exactly, so the next commit may write a difference.
    """

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, Base] = OrderedDict()

    def get(self, thread_id: str) -> Base | None:
        return self._entries.get(thread_id)

    def current(self, thread_id: str, thread: StoredThread | None, cached: Base | None) -> Base:
        """The thread's current checkpoint, as the base of its next commit: ``cached`` (an
        entry read before the thread's lock) if the stored version is still its own, else
        the stored one decoded and remembered."""
        if thread is None or not thread.version:
            return Base(None)
        if thread.checkpoint is None:
            # The recorder ships no checkpoint when the version the engine knows is current.
            known = cached.checkpoint if cached is not None else None
            if cached is None or known is None or known.version != thread.version:
                raise CorruptRecordError(
                    f"thread {thread_id!r} is at version {thread.version} but has no checkpoint",
                    thread_id=thread_id,
                )
            return cached
        checkpoint, stored_in_rows = decode(thread_id, thread)
        if checkpoint.version != thread.version:
            raise CorruptRecordError(
                f"thread {thread_id!r} is at version {thread.version} but its "
                f"checkpoint says {checkpoint.version}",
                thread_id=thread_id,
            )
        base = Base(checkpoint, stored_in_rows)
        if stored_in_rows:
            self._remember(thread_id, base)
        return base

    def remember(
        self, thread_id: str, checkpoint: KernelCheckpoint, receipts: Sequence[str] | None
    ) -> None:
        """Keep ``checkpoint``, just committed with ``receipts`` as its index's JSON
        (``None``: its index is in rows, not in its core)."""
        self._remember(thread_id, Base(checkpoint, True, receipts))

    def _remember(self, thread_id: str, entry: Base) -> None:
        entries = self._entries
        entries[thread_id] = entry
        entries.move_to_end(thread_id)
        if len(entries) > self.size:
            entries.popitem(last=False)

    def forget(self, thread_id: str) -> None:
        self._entries.pop(thread_id, None)

    def clear(self) -> None:
        self._entries.clear()


def decode(thread_id: str, thread: StoredThread) -> tuple[KernelCheckpoint, bool]:
    """The stored checkpoint, and whether its rows are exactly what a commit of it would
    store: stored in rows (not as one document) and of the current schema revision (a
    migrated checkpoint's rows are of an older shape, so its next commit rewrites them)."""
    assert thread.checkpoint is not None
    core = thread.checkpoint
    text, stored_in_rows = assemble_checkpoint(
        core, thread.messages, thread.facts, thread.receipt_index
    )
    # The core is encoded with ``schema_revision`` first; anything else is just not
    # trusted as exact, which costs one full rewrite and is always safe.
    exact = stored_in_rows and core.startswith(f'{{"schema_revision":{current_revision()},')
    return decode_checkpoint(text, thread_id=thread_id), exact
