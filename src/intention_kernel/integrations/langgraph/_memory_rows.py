"""KernelSaver's rows in memory, beside an ``InMemoryDurability`` (tests, examples)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import replace

from intention_kernel.integrations.langgraph._rows import (
    StoredCheckpoint,
    StoredWrite,
    moves_head,
)

__all__ = ["MemoryRows", "memory_rows"]

_Place = tuple[str, str]  # (thread_id, checkpoint_ns)


class MemoryRows:
    """Checkpoints, writes and heads in dictionaries, under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checkpoints: dict[_Place, dict[str, StoredCheckpoint]] = {}
        self._writes: dict[tuple[str, str, str], dict[tuple[str, int], StoredWrite]] = {}
        self._heads: dict[_Place, str] = {}

    async def put(self, row: StoredCheckpoint, *, fork: bool) -> None:
        place = (row.thread_id, row.checkpoint_ns)
        with self._lock:
            rows = self._checkpoints.get(place, {})
            same = rows.get(row.checkpoint_id)
            head = moves_head(
                self._heads.get(place),
                row,
                stored_parent=False if same is None else same.parent_id,
                parent_exists=row.parent_id in rows,
                fork=fork,
            )
            self._checkpoints.setdefault(place, {})[row.checkpoint_id] = row
            if head:
                self._heads[place] = row.checkpoint_id

    async def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[StoredWrite],
        *,
        replace: bool,
    ) -> None:
        with self._lock:
            stored = self._writes.setdefault((thread_id, checkpoint_ns, checkpoint_id), {})
            for write in writes:
                key = (write.task_id, write.idx)
                if replace or key not in stored:
                    stored[key] = write

    def _with_writes(self, row: StoredCheckpoint) -> tuple[StoredCheckpoint, list[StoredWrite]]:
        writes = self._writes.get((row.thread_id, row.checkpoint_ns, row.checkpoint_id), {})
        return row, sorted(writes.values(), key=lambda w: (w.task_path, w.task_id, w.idx))

    async def get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[StoredCheckpoint, list[StoredWrite]] | None:
        place = (thread_id, checkpoint_ns)
        with self._lock:
            wanted = checkpoint_id if checkpoint_id is not None else self._heads.get(place)
            row = self._checkpoints.get(place, {}).get(wanted or "")
            return None if row is None else self._with_writes(row)

    async def search(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None = None,
    ) -> list[tuple[StoredCheckpoint, list[StoredWrite]]]:
        with self._lock:
            found = [
                row
                for (thread, ns), rows in self._checkpoints.items()
                if thread_id in (None, thread) and checkpoint_ns in (None, ns)
                for row in rows.values()
                if checkpoint_id in (None, row.checkpoint_id)
                and (before is None or row.checkpoint_id < before)
            ]
            found.sort(key=lambda row: row.checkpoint_id, reverse=True)
            return [self._with_writes(row) for row in found[:limit]]

    async def delete_thread(self, thread_id: str) -> None:
        with self._lock:
            self._delete([thread_id])

    def _delete(self, thread_ids: Sequence[str]) -> None:
        for table in (self._checkpoints, self._heads):
            for place in [p for p in table if p[0] in thread_ids]:
                del table[place]
        for key in [k for k in self._writes if k[0] in thread_ids]:
            del self._writes[key]

    async def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        wanted = set(run_ids)
        with self._lock:
            for place, rows in self._checkpoints.items():
                gone = [cid for cid, row in rows.items() if row.run_id in wanted]
                for checkpoint_id in gone:
                    del rows[checkpoint_id]
                    self._writes.pop((*place, checkpoint_id), None)
                if self._heads.get(place) in gone:
                    if rows:
                        self._heads[place] = max(rows)
                    else:
                        del self._heads[place]

    async def copy_thread(self, source: str, target: str) -> None:
        with self._lock:
            for (thread, ns), rows in list(self._checkpoints.items()):
                if thread == source:
                    copied = self._checkpoints.setdefault((target, ns), {})
                    for checkpoint_id, row in rows.items():
                        copied[checkpoint_id] = replace(row, thread_id=target)
            for (thread, ns, checkpoint_id), writes in list(self._writes.items()):
                if thread == source:
                    self._writes[(target, ns, checkpoint_id)] = dict(writes)
            for (thread, ns), head in list(self._heads.items()):
                if thread == source:
                    self._heads[(target, ns)] = head

    async def prune(self, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        with self._lock:
            if not keep_latest:
                self._delete(thread_ids)
                return
            for place, rows in self._checkpoints.items():
                if place[0] not in thread_ids:
                    continue
                head = self._heads.get(place)
                for checkpoint_id in [cid for cid in rows if cid != head]:
                    del rows[checkpoint_id]
                    self._writes.pop((*place, checkpoint_id), None)


#: One set of rows per memory store: two savers over one store share its threads.
_ROWS: weakref.WeakKeyDictionary[object, MemoryRows] = weakref.WeakKeyDictionary()
_ROWS_LOCK = threading.Lock()


def memory_rows(store: object) -> MemoryRows:
    """The rows kept beside ``store`` (an ``InMemoryDurability``), made on first use."""
    with _ROWS_LOCK:
        rows = _ROWS.get(store)
        if rows is None:
            rows = _ROWS[store] = MemoryRows()
        return rows
