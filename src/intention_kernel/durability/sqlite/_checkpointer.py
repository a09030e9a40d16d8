"""WAL checkpoints on a thread of their own, off the commit path.

SQLite's automatic checkpoint runs inside the ``COMMIT`` that takes the WAL past
1,000 pages, on the committing connection: it copies every page of the WAL into the
database file and flushes that file, while the writer's caller waits. Here that is
the worker thread, which stalls a whole group of turns, or the event loop, which
stalls every task of the process. So the writer's connection leaves it to this thread
(its own automatic checkpoint waits for four times the threshold, a safety net, see
``SQLiteConnections.open``):

- **Woken by the writer, never waited for.** Every few writes the adapter calls
  :meth:`Checkpointer.wake`, which only sets an event. The thread then counts the
  frames of the WAL (:func:`_wal_frames`, from the ``-wal`` file) and, past
  ``after_frames``, checkpoints on a connection of its own until the WAL is all in the
  database file.
- **PASSIVE for the bulk.** A ``PASSIVE`` checkpoint takes no write lock and waits for
  no reader: it copies the frames no reader still needs, while writers keep appending.
- **The write lock for the tail, only if it is free.** SQLite starts the WAL over
  from its beginning (so that the file stops growing) only at a write that begins
  when every frame is in the database file, which ``PASSIVE`` passes chasing new
  frames seldom reach. So once a few frames are left, the thread runs ``RESTART``
  with no busy timeout: it takes the write lock only if no writer holds it at that
  instant, copies the last frames and starts the WAL over. A write that comes
  meanwhile waits for those few frames, where it used to run the whole checkpoint.
- **Harmless beside other processes and readers.** Each adapter on the file (in any
  process) has such a thread. SQLite lets one checkpoint run at a time; another finds
  the checkpoint lock taken and answers busy, which is skipped: the running one does
  the work. A reader's snapshot is never copied over: the checkpoint stops at the
  frames it still needs. A checkpoint killed half-way is safe, as SQLite's own are:
  the WAL still holds every frame, and the next checkpoint copies them again.
- **Stopped on close**, after its current checkpoint; a daemon, so that an adapter that
  is never closed does not keep the process alive.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import threading
from collections.abc import Callable

__all__ = ["Checkpointer"]

#: The WAL file's header and each frame's header (https://www.sqlite.org/walformat.html):
#: a frame belongs to the WAL's current generation when its salts (bytes 8-16 of its
#: header) are the file header's (bytes 16-24). The format has not changed since WAL
#: appeared (SQLite 3.7.0).
_WAL_HEADER, _FRAME_HEADER = 32, 24
#: At most this many checkpoints in a row; then the next wake-up.
_PASSES = 8
#: Frames behind at most which a checkpoint takes the write lock to finish the WAL.
_TAIL = 256


class Checkpointer:
    """The checkpoint thread of one database file, for one adapter.

    ``trace`` is handed every statement its connection runs (role ``"checkpointer"``).
    """

    def __init__(
        self,
        path: str,
        *,
        after_frames: int,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self._path = path
        # SQLite names the WAL after the database's real path (symlinks resolved).
        self._wal = os.path.realpath(path) + "-wal"
        self._after = after_frames
        self._trace = trace
        self._wanted = threading.Event()
        self._stopping = False
        # Frames of the WAL's current generation that this thread's last checkpoint found
        # in the database file. Without it, a WAL that did not start over (a reader in
        # it) would count as past the threshold at every wake-up, and be checkpointed
        # again for the few frames added since, each time with two flushes.
        self._copied = 0
        self._thread = threading.Thread(target=self._work, name="ik-sqlite-checkpoint", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Ask for a look at the WAL; returns at once."""
        self._wanted.set()

    def close(self) -> None:
        """Stop the thread once its current checkpoint, if any, is done."""
        self._stopping = True
        self._wanted.set()
        self._thread.join()

    def _work(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._stopping:
                    return
                frames = _wal_frames(self._wal)
                if frames < self._copied:
                    self._copied = 0  # the WAL started over
                if frames - self._copied < self._after:
                    continue
                if conn is None:
                    conn = self._connect()
                    if conn is None:
                        continue
                self._catch_up(conn)
        finally:
            if conn is not None:
                conn.close()

    def _catch_up(self, conn: sqlite3.Connection) -> None:
        """Checkpoint until the WAL is all in the database file, so that the next write
        starts it over (a few passes at most: writes go on meanwhile)."""
        behind = 1 << 31
        for _ in range(_PASSES):
            # The last frames with the write lock, if it is free this instant (no busy
            # timeout: a writer that holds it is never waited for): copied while new
            # frames keep coming, the WAL would never be all in the database file, and
            # SQLite starts it over only then. A write that comes meanwhile waits for
            # those few frames, not for the whole checkpoint it used to run itself.
            mode = "RESTART" if behind <= _TAIL else "PASSIVE"
            try:
                busy, frames, copied = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
            except sqlite3.Error:
                # Nothing is lost: the frames stay in the WAL for the next checkpoint.
                return
            # A busy checkpoint (another connection's runs) answers -1s: done for now.
            if frames < 0:
                return
            self._copied = copied
            if mode == "RESTART" and not busy:
                self._copied = 0  # the WAL starts over
                return
            before, behind = behind, frames - copied
            if self._stopping or (mode == "RESTART" and behind >= before):
                return  # a writer or a reader is in the way: the next wake-up

    def _connect(self) -> sqlite3.Connection | None:
        try:
            # No busy timeout: a PASSIVE checkpoint never waits, and neither does
            # anything else this connection runs.
            conn = sqlite3.connect(self._path, timeout=0, isolation_level=None)
        except sqlite3.Error:
            return None
        trace = self._trace
        if trace is not None:
            conn.set_trace_callback(trace)
        return conn


def _wal_frames(wal: str) -> int:
    """About how many frames the WAL holds since it last started over: the frames of
    the current generation, found by bisection over the frame headers' salts.

    A reading of a file that writers change meanwhile, so only an estimate; good enough
    to decide whether to checkpoint, never trusted for anything else. Opening and
    closing the ``-wal`` file here is safe: SQLite holds no POSIX lock on it (closing a
    descriptor of the ``-shm`` or database file would drop this process's locks on it).
    """
    try:
        fd = os.open(wal, os.O_RDONLY)
    except OSError:
        return 0
    try:
        header = os.pread(fd, _WAL_HEADER, 0)
        if len(header) < _WAL_HEADER:
            return 0
        (page,) = struct.unpack_from(">I", header, 8)
        frame = _FRAME_HEADER + (page or 65536)
        salts = header[16:24]
        low, high = 0, max(os.fstat(fd).st_size - _WAL_HEADER, 0) // frame  # [0, low) current
        while low < high:
            middle = (low + high) // 2
            if os.pread(fd, _FRAME_HEADER, _WAL_HEADER + middle * frame)[8:16] == salts:
                low = middle + 1
            else:
                high = middle
        return low
    except OSError:
        return 0
    finally:
        os.close(fd)
