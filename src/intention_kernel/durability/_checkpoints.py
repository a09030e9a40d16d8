"""The checkpoints an engine keeps decoded, and how a stored checkpoint is decoded."""

from __future__ import annotations

from collections import OrderedDict

from intention_kernel.checkpoint import (
    CoreEncoder,
    KernelCheckpoint,
    assemble_checkpoint,
    current_revision,
    decode_checkpoint,
)
from intention_kernel.durability.records import StoredThread
from intention_kernel.errors import CorruptRecordError

__all__ = ["CheckpointCache", "decode"]


class CheckpointCache:
    """The checkpoint an engine last committed or decoded, per thread, for the ``size``
    threads used last; and per cached thread the encoder of its next core.

    A turn whose stored version still matches reuses its entry instead of reading and
    decoding the whole document again. Any other writer bumps the version, so a stale
    entry is never used. Entries are shared and read as they were built: the runtime
    copies what it changes (the facts, a ``DerivedFacts`` that shares their storage).
    Each entry's rows are stored exactly, so the next commit may write a difference.
    """

    __slots__ = ("_checkpoints", "_encoders", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._checkpoints: OrderedDict[str, KernelCheckpoint] = OrderedDict()
        # Per cached thread, the JSON of its core's receipt index entries, for the next core.
        self._encoders: dict[str, CoreEncoder] = {}

    def get(self, thread_id: str) -> KernelCheckpoint | None:
        return self._checkpoints.get(thread_id)

    def current(
        self, thread_id: str, thread: StoredThread | None, cached: KernelCheckpoint | None
    ) -> tuple[KernelCheckpoint | None, bool]:
        """The thread's current checkpoint (``cached`` if still current, else decoded and
        remembered), and whether its rows are stored exactly, so that a commit may write a
        difference."""
        if thread is None or not thread.version:
            return None, True
        if thread.checkpoint is None:
            if cached is None or cached.version != thread.version:
                raise CorruptRecordError(
                    f"thread {thread_id!r} is at version {thread.version} but has no checkpoint",
                    thread_id=thread_id,
                )
            return cached, True
        checkpoint, stored_in_rows = decode(thread_id, thread)
        if checkpoint.version != thread.version:
            raise CorruptRecordError(
                f"thread {thread_id!r} is at version {thread.version} but its "
                f"checkpoint says {checkpoint.version}",
                thread_id=thread_id,
            )
        if stored_in_rows:
            self.remember(thread_id, checkpoint)
        return checkpoint, stored_in_rows

    def remember(self, thread_id: str, checkpoint: KernelCheckpoint) -> None:
        cache = self._checkpoints
        cache[thread_id] = checkpoint
        cache.move_to_end(thread_id)
        if len(cache) > self.size:
            forgotten, _ = cache.popitem(last=False)
            self._encoders.pop(forgotten, None)

    def forget(self, thread_id: str) -> None:
        self._checkpoints.pop(thread_id, None)
        self._encoders.pop(thread_id, None)

    def clear(self) -> None:
        self._checkpoints.clear()
        self._encoders.clear()

    def encoder(self, thread_id: str) -> CoreEncoder:
        """The encoder of the thread's next core, made if it has none."""
        encoder = self._encoders.get(thread_id)
        if encoder is None:
            if len(self._encoders) >= self.size:
                self._encoders.clear()  # threads whose commits failed; rare
            encoder = self._encoders[thread_id] = CoreEncoder()
        return encoder


def decode(thread_id: str, thread: StoredThread) -> tuple[KernelCheckpoint, bool]:
    """The stored checkpoint, and whether its rows are exactly what a commit of it would
    store: stored in rows (not as one document) and of the current schema revision (a
    migrated checkpoint's rows are of an older shape, so its next commit rewrites them)."""
    assert thread.checkpoint is not None
    core = thread.checkpoint
    text, stored_in_rows = assemble_checkpoint(core, thread.messages, thread.facts)
    # The core is encoded with ``schema_revision`` first; anything else is just not
    # trusted as exact, which costs one full rewrite and is always safe.
    exact = stored_in_rows and core.startswith(f'{{"schema_revision":{current_revision()},')
    return decode_checkpoint(text, thread_id=thread_id), exact
