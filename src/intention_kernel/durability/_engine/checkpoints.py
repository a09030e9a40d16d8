"""The checkpoints an engine keeps decoded, per thread."""

from __future__ import annotations

from collections import OrderedDict

from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel.durability._contract.records import StoredThread
from intention_kernel.durability._layout import Base, CheckpointRows
from intention_kernel.durability._layout.codec import decode
from intention_kernel.errors import CorruptRecordError

__all__ = ["CheckpointCache"]


class CheckpointCache:
    """The checkpoint an engine last committed or decoded, per thread.

    It keeps the ``size`` threads used last. An entry committed here also keeps the
    JSON of its receipt index entries. The next core needs them (see
    :func:`~intention_kernel.durability._layout.codec.encode_core`).

    A turn whose stored version still matches reuses its entry instead of reading and
    decoding the whole document again. Any other writer bumps the version, so a stale
    entry is never used. Entries are shared and read as they were built. The runtime
    copies what it changes: the facts, a ``DerivedFacts`` that shares their storage.
    Each entry's rows are stored exactly, so the next commit may write a difference.
    """

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, Base] = OrderedDict()

    def get(self, thread_id: str) -> Base | None:
        return self._entries.get(thread_id)

    def current(self, thread_id: str, thread: StoredThread | None, cached: Base | None) -> Base:
        """The thread's current checkpoint, as the base of its next commit.

        It is ``cached``, an entry read before the thread's lock, if the stored version
        is still its own. Else it is the stored one, decoded and remembered."""
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

    def remember(self, thread_id: str, checkpoint: KernelCheckpoint, rows: CheckpointRows) -> None:
        """Keep ``checkpoint``, just committed as ``rows``."""
        self._remember(thread_id, Base(checkpoint, True, rows.receipts))

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
