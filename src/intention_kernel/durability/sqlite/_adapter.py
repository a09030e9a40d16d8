"""``SQLiteDurability``: the adapter class and its options."""

from __future__ import annotations

import os
from typing import Literal

from intention_kernel.durability._contract.options import check_seconds
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.durability.sqlite._connection import StatementTrace, WriterSeam
from intention_kernel.durability.sqlite._recorder import SQLiteRecorder

__all__ = ["SQLiteDurability", "StatementTrace", "WriterSeam"]


class SQLiteDurability(RecordedDurability):
    """Durability on one SQLite file, shared safely by any number of processes.

    - ``synchronous``: ``"FULL"`` (default) flushes every commit; ``"NORMAL"``
      may lose the last commits on power loss, never on a process crash.
    - ``lock_timeout``: how long a turn waits for a busy thread before
      ``ThreadBusyError``.
    - ``busy_timeout``: how long a statement waits for SQLite's write lock.
      Both are finite, non-negative seconds; NaN, infinity and negative values are
      refused with ``ValueError``.
    - ``offload_writes``: where write transactions run. Reads always run inline.
      ``None`` (default): on the event loop while the adapter runs one turn at a time.
      It moves to the adapter's worker thread as soon as turns overlap. So a disk flush
      or another process's write lock never stalls the other turns. ``True``: always on
      the worker thread (the event loop never waits on a write). ``False``: on the event
      loop, for programs that run one turn at a time. A turn with one write saves six
      thread switches. The exception is a write that another process's write lock keeps
      busy. It waits for the lock on the worker thread. The writes that come meanwhile
      follow it there.
      On the worker thread, writes commit in groups. The writes of overlapping turns
      queued while a commit flushes share the next transaction (one disk flush). A
      failing one fails alone, and its group-mates commit. Each is
      acknowledged only after that transaction's ``COMMIT``. A write that finds the
      worker idle runs alone at once, in its own transaction. So group commit needs no
      option: it only ever joins writes that would otherwise have waited in line.
    - ``trace``: called with ``"writer"`` or ``"reader"`` and the text of every statement
      that connection runs, from its opening on. It is called in the thread that runs
      the statement; the worker thread is named ``ik-sqlite``. It serves logging,
      counting statements per turn, or seeing where writes run. It runs inside the
      statement: it must be quick and must not raise.
    - ``seam``: a testing seam into the worker thread, for tests of group commit.
      It is :class:`intention_kernel.testing.sqlite.WriterProbe`; production passes none.

    The lock file ``<path>.locks`` sits beside the database's real file. Symlinks are
    resolved, so every path to one database shares one lock file. Keep them on a local
    file system: POSIX record locks are unreliable on network mounts.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        lock_timeout: float = 30.0,
        busy_timeout: float = 30.0,
        offload_writes: bool | None = None,
        trace: StatementTrace | None = None,
        seam: WriterSeam | None = None,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be 'FULL' or 'NORMAL'")
        lock_timeout = check_seconds("lock_timeout", lock_timeout)
        busy_timeout = check_seconds("busy_timeout", busy_timeout)
        self.path = os.fspath(path)
        super().__init__(
            SQLiteRecorder(
                self.path,
                synchronous=synchronous,
                lock_timeout=lock_timeout,
                busy_timeout=busy_timeout,
                offload_writes=offload_writes,
                trace=trace,
                seam=seam,
            )
        )

    def missing_store_reason(self) -> str:
        """Says whether the file is missing or holds no store."""
        if not os.path.isfile(self.path):
            return f"no SQLite store at {self.path!r}: the file does not exist"
        return f"{self.path!r} is not an intention-kernel store (no ik_schema table)"
