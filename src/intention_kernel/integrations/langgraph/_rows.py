"""KernelSaver's rows: what each store keeps of a LangGraph checkpoint.

It also holds the rule that moves a namespace's latest checkpoint.

A store keeps three things per thread and namespace:

- checkpoint rows.
- pending-write rows.
- a head, the ID of the latest checkpoint.

Checkpoints and values arrive serialized.
The rows hold the serializer's type name and bytes, never live objects.

The head moves by compare-and-set (see :func:`moves_head`).
That is decided under the store's write lock.
It is SQLite's write transaction, or a PostgreSQL transaction's advisory lock.
In memory, it is the memory store's lock.
So two writers that started from the same checkpoint cannot both extend it.
The second one is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from intention_kernel.errors import FencedCommitError

__all__ = [
    "CheckpointConflictError",
    "CheckpointRows",
    "StoredCheckpoint",
    "StoredWrite",
    "moves_head",
]

#: Metadata sources of a deliberate branch: time travel and ``update_state``.
FORK_SOURCES = frozenset({"fork", "update"})


class CheckpointConflictError(FencedCommitError):
    """Another writer moved the thread since this one read it: the checkpoint was refused.

    ``KernelSaver.put`` raises it when the parent is no longer the latest checkpoint.
    That is the latest of its thread and namespace.
    Nothing was stored.
    The run that got it lost the race.
    Load the thread again (``graph.get_state``) and run the step anew.
    """


@dataclass(frozen=True)
class StoredCheckpoint:
    """One checkpoint row: its place, its parent, and its serialized parts."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    type: str
    checkpoint: bytes
    metadata_type: str
    metadata: bytes
    #: The metadata's ``run_id``, for ``delete_for_runs``.
    run_id: str | None = None


@dataclass(frozen=True)
class StoredWrite:
    """One pending write of a task on a checkpoint."""

    task_id: str
    idx: int
    channel: str
    type: str
    value: bytes
    task_path: str


class CheckpointRows(Protocol):
    """The store operations KernelSaver needs; each store implements them."""

    async def put(self, row: StoredCheckpoint, *, fork: bool) -> None:
        """Store ``row`` and move the head as :func:`moves_head` decides, atomically."""
        ...

    async def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[StoredWrite],
        *,
        replace: bool,
    ) -> None:
        """Store ``writes``; an existing ``(task_id, idx)`` is kept unless ``replace``."""
        ...

    async def get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[StoredCheckpoint, list[StoredWrite]] | None:
        """The checkpoint (the head when ``checkpoint_id`` is None) and its writes."""
        ...

    async def search(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None = None,
    ) -> list[tuple[StoredCheckpoint, list[StoredWrite]]]:
        """Matching checkpoints with their writes, newest ID first (``limit``: at most)."""
        ...

    async def delete_thread(self, thread_id: str) -> None:
        """Remove every row of the thread, in every namespace."""
        ...

    async def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints of these runs and their writes.

        A namespace whose head was one of them gets a new head.
        That is its newest remaining checkpoint, or none.
        """
        ...

    async def copy_thread(self, source: str, target: str) -> None:
        """Copy every row of ``source`` (checkpoints, writes, heads) to ``target``."""
        ...

    async def prune(self, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        """Remove each thread's rows.

        With ``keep_latest``, each namespace's head and its writes stay.
        """
        ...


def moves_head(
    head: str | None,
    row: StoredCheckpoint,
    *,
    stored_parent: str | bool | None,
    parent_exists: bool,
    fork: bool,
) -> bool:
    """Whether storing ``row`` makes it the head; raise when it must not be stored.

    ``head`` is the namespace's head, or None for an empty namespace.
    ``stored_parent`` is the parent of a row already stored under ``row``'s ID.
    It is ``False`` when no such row is stored.
    ``parent_exists`` says whether ``row``'s parent is a stored checkpoint of the namespace.

    - The same checkpoint again, with the same parent: stored again, head unchanged.
    - An empty namespace: the first checkpoint becomes the head.
    - A parent that is the head: the new checkpoint becomes the head.
    - A fork from any stored checkpoint becomes the head.
      Time travel and ``update_state`` fork.
    - No parent on a namespace that has a head: kept as a root of its own.
      It is not the head.
      A later checkpoint naming it as parent is refused.
    - Any other parent: refused with :class:`CheckpointConflictError`.
    """
    if stored_parent is not False:
        if stored_parent == row.parent_id:
            return head is None
        raise CheckpointConflictError(
            f"checkpoint {row.checkpoint_id!r} of thread {row.thread_id!r} is stored "
            f"already with another parent ({stored_parent!r}, not {row.parent_id!r})",
            thread_id=row.thread_id,
        )
    if head is None or row.parent_id == head:
        return True
    if fork and parent_exists:
        return True
    if row.parent_id is None:
        return False
    where = f" (namespace {row.checkpoint_ns!r})" if row.checkpoint_ns else ""
    raise CheckpointConflictError(
        f"thread {row.thread_id!r}{where} moved on: its latest checkpoint is {head!r}, "
        f"not {row.parent_id!r}, which this run started from; another writer runs "
        "this thread, so this checkpoint was not stored",
        thread_id=row.thread_id,
    )
