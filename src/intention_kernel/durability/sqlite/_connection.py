"""The SQLite adapter's connections, worker thread and locks: where each statement runs.

- **Writes on one worker thread, reads inline on a second connection.** A write may
  flush to disk (``synchronous=FULL``) or wait up to ``busy_timeout`` for another
  process's write lock, so a write transaction may run on the adapter's worker thread,
  and the event loop then never blocks on it. A hop is never abandoned half-way: if
  the awaiting task is cancelled, the hop still finishes before the thread lock is
  released. Reads (the start of a turn, replays, inspection) run on the event loop
  itself: in WAL mode a reader never waits for a writer and never flushes, so a read
  costs less than the two thread switches of a hop. They run on a read-only connection
  of their own while writes may be on the worker (the writer's connection may be
  inside a transaction there), else on the writer's connection, whose page cache holds
  what it just wrote: a second connection reads again every page a write changed.
  ``:memory:`` has only the one connection, so there reads hop too.
- **By default a write hops only when turns overlap.** While the adapter runs a single
  turn (a CLI, a script, a worker serving one conversation at a time), nothing of its
  own waits on the event loop, and a hop's two thread switches cost more than the
  statements themselves on a busy machine: the write runs inline. As soon as a second
  turn (or an operator call) holds or awaits a thread lock, writes go to the worker
  thread so that the other turns keep running. Inline, nothing waits for a lock:
  when another connection holds the write lock, the write goes to the worker thread,
  which waits up to ``busy_timeout``, so a lock held elsewhere never stalls the event
  loop. ``offload_writes=True`` or ``False`` forces either behaviour (``False`` still
  hands a busy write to the worker).
- **The writer's connection has one user at a time.** The event loop uses it (an
  inline write, or a read) only while the worker has no call queued or running
  (``GroupWriter.idle``), whatever ``offload_writes`` says; without that, a write
  inline beside a hop would run statements on the connection from two threads at
  once. Nothing of the worker's that holds a statement reaches the event loop: a
  cursor is closed and an error's frames are cleared on the worker first (see
  :mod:`._group`), since freeing a cursor resets its statement on the thread that
  frees it.
- **On the worker thread, writes commit in groups** (:mod:`._group`): the writes
  queued while a ``COMMIT`` flushes share the next transaction, a savepoint each, and
  are acknowledged after its ``COMMIT``. So each write is a *body* that runs inside a
  transaction someone else opens: the group's, or (alone, and inline) its own, opened
  by ``_run`` when the write is ``atomic``; a body never begins, commits or rolls back.
- **Per-thread serialization with an OS lock** (:mod:`.._filelock`): no database
  transaction is open while the interpreter or a capability runs, no extra commit is
  spent on a lease, and a dead holder's lock vanishes with its process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Literal, Protocol, TypeAlias, TypeVar

from intention_kernel.durability._filelock import LockFile, lock_offset
from intention_kernel.durability._looplocks import LoopLocks
from intention_kernel.durability.sqlite._group import GroupPoint, GroupWriter, clear_frames
from intention_kernel.durability.sqlite._schema import HAS_SCHEMA_TABLE, migrate
from intention_kernel.errors import CorruptRecordError, CorruptStoreError, KernelError, StoreError

__all__ = ["SQLiteConnections", "StatementTrace", "WriterAccess", "WriterSeam"]

T = TypeVar("T")

#: Called with the connection's role and the text of each statement it runs, in the
#: thread that runs it (the worker thread ``ik-sqlite`` or the event loop's).
StatementTrace: TypeAlias = Callable[[Literal["writer", "reader"], str], None]


class WriterSeam(Protocol):
    """A testing kit's hold on one adapter's worker thread (``SQLiteDurability(seam=...)``).

    :class:`intention_kernel.testing.sqlite.WriterProbe` is the one the package ships.
    Production code passes none.
    """

    @property
    def group_alone(self) -> bool:
        """Whether even a lone write on the worker thread runs the group way.

        It then gets a transaction and a savepoint of its own.
        The adapter reads it when it opens.
        """
        ...

    def at_point(self, point: GroupPoint, size: int) -> None:
        """Called on the worker thread at each point of each group commit."""
        ...

    def opened(self, writer: WriterAccess | None) -> None:
        """Called when the adapter opens (its writer) and closes (``None``)."""
        ...


class WriterAccess:
    """The open writer of one adapter, as its :class:`WriterSeam` sees it."""

    def __init__(
        self, connections: SQLiteConnections, worker: GroupWriter, conn: sqlite3.Connection
    ) -> None:
        self._connections = connections
        #: The worker thread that runs the writes.
        self.worker = worker
        #: The writer's connection.
        self.conn = conn

    async def write(self, fn: Callable[[sqlite3.Connection], T], *, atomic: bool) -> T:
        """``fn(conn)`` as a write of the adapter's own (see ``SQLiteConnections._run``)."""
        return await self._connections._run(fn, atomic=atomic)


class SQLiteConnections:
    """The writer and reader connections of one database file, the worker thread that
    runs writes, and the file of thread locks; the recorder runs every statement here."""

    def __init__(
        self,
        path: str,
        *,
        synchronous: Literal["FULL", "NORMAL"],
        lock_timeout: float,
        busy_timeout: float,
        offload_writes: bool | None,
        trace: StatementTrace | None = None,
        seam: WriterSeam | None = None,
    ) -> None:
        self._path = path
        self._trace = trace
        self._seam = seam
        self._offload_writes = offload_writes
        self._synchronous = synchronous
        self._lock_timeout = lock_timeout
        self._busy_timeout_ms = int(busy_timeout * 1000)
        self._writer_waits = True  # the writer's busy timeout is set (see _wait_for_locks)
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._worker: GroupWriter | None = None
        # Named after the database's real path: two adapters that reach one file through
        # a symlink or another relative path must share one lock file, or their turns
        # on a thread would overlap (and the later commit be fenced after running).
        self._locks = LockFile(os.path.realpath(path) + ".locks") if path != ":memory:" else None
        self._memory_locks = LoopLocks()
        self._memory_relayed: set[str] = set()
        self._lockers = 0  # tasks holding or awaiting a thread lock of this adapter

    # -- plumbing ------------------------------------------------------------------------------

    async def _run(
        self,
        fn: Callable[[sqlite3.Connection], T],
        thread_id: str | None = None,
        *,
        atomic: bool = False,
        write: bool = True,
    ) -> T:
        """Run the write ``fn`` on the worker thread, or inline (see the module
        docstring); a started hop always runs to its end.

        ``atomic``: ``fn`` runs several statements that must commit together; alone,
        it runs between ``BEGIN IMMEDIATE`` and ``COMMIT``. Otherwise it is one
        statement, or statements that may commit one by one, and autocommits alone.
        In a group it runs within the group's transaction either way, within a
        savepoint of its own only if it is atomic (see :mod:`._group`). ``write=False``
        (a read that must hop): ``fn`` never joins a group, as it may begin a
        transaction of its own.

        Inline, no statement waits for another connection's write lock: the writer's
        busy timeout is 0 there, and a busy database hands the call to the worker
        thread, which waits for it. Without that, a lock held by another process would
        stall the event loop, and every other task of the process, for up to
        ``busy_timeout``. The call starts again from its first statement on the worker
        only if it wrote nothing (a busy error comes from the statement that needs the
        write lock, and each call writes in one transaction or one statement, last).
        ``thread_id`` names the thread in the error when a row read is corrupt.
        """
        conn = self._conn
        if self._worker is None or conn is None:
            raise KernelError("the SQLite adapter is closed")
        solo = _in_transaction(fn) if atomic else fn
        if self._inline():
            self._wait_for_locks(conn, False)
            done = self._call(conn, solo, thread_id, conn.total_changes)
            if not isinstance(done, _Busy):
                return done
        return await self._hop(solo, thread_id, group=fn if write else None, atomic=atomic)

    async def _write(
        self,
        body: Callable[..., T],
        args: tuple[Any, ...] = (),
        thread_id: str | None = None,
        *,
        atomic: bool = False,
    ) -> T:
        """Run the write ``body(conn, *args)`` (one of :mod:`._bodies`, over plain
        values) as :meth:`_run` runs a write."""
        return await self._run(lambda conn: body(conn, *args), thread_id, atomic=atomic)

    def _call(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[sqlite3.Connection], T],
        thread_id: str | None,
        inline_changes: int | None = None,
    ) -> T | _Busy:
        """``fn(conn)``, rolled back on any error, with the driver's errors translated.
        Inline (``inline_changes``: the connection's change count before the call), a
        busy database that kept the call from writing anything answers ``_BUSY``, so
        that the caller hands the call to the worker thread.

        An error leaves with its frames cleared (see :func:`._group.clear_frames`): a
        caller may keep it while the connection is another thread's, and freeing a
        cursor held in one of its frames would touch the connection."""
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.rollback()
            clear_frames(exc)
            if (
                inline_changes is not None
                and _is_busy(exc)
                and conn.total_changes == inline_changes
            ):
                return _BUSY
            raise self._error(exc, thread_id) from exc
        except UnicodeDecodeError as exc:
            if conn.in_transaction:
                conn.rollback()
            clear_frames(exc)
            raise self._not_utf8(exc, thread_id) from exc
        except BaseException as exc:
            if conn.in_transaction:
                conn.rollback()
            clear_frames(exc)
            raise

    async def _hop(
        self,
        fn: Callable[[sqlite3.Connection], T],
        thread_id: str | None,
        group: Callable[[sqlite3.Connection], T] | None = None,
        *,
        atomic: bool = True,
    ) -> T:
        """Run ``fn`` on the worker thread, waiting up to ``busy_timeout`` for the write
        lock; a started hop always runs to its end. With ``group`` (the write's body),
        the write may share a transaction with others queued with it (see
        :mod:`._group`): ``fn`` is what runs when it is alone; ``atomic`` as for
        :meth:`_run`."""
        worker, conn = self._worker, self._conn
        if worker is None or conn is None:
            raise KernelError("the SQLite adapter is closed")

        def call(conn: sqlite3.Connection = conn) -> T:
            done = self._call(conn, fn, thread_id)
            assert not isinstance(done, _Busy)  # only an inline call answers _BUSY
            return done

        def error(exc: BaseException) -> BaseException:
            if isinstance(exc, sqlite3.Error):
                return self._error(exc, thread_id)
            if isinstance(exc, UnicodeDecodeError):
                return self._not_utf8(exc, thread_id)
            return exc

        def read() -> T:
            self._wait_for_locks(conn, True)
            return call()

        if group is None:
            future = worker.submit(read)
        else:
            future = worker.write(group, call, error, atomic=atomic)
        # A cancel of this task waits for the thread to settle the call: the future
        # refuses it (see _group), so the thread lock is kept until the write is done.
        return await future

    def _wait_for_locks(self, conn: sqlite3.Connection, waits: bool) -> None:
        """Give the writer's connection its busy timeout (on the worker) or none (inline).
        Only ever called where the connection is free: inline with no hop in flight, or
        on the worker thread; so the flag always says what the connection has."""
        if self._writer_waits is not waits:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms if waits else 0}")
            self._writer_waits = waits

    def _error(self, exc: sqlite3.Error, thread_id: str | None = None) -> KernelError:
        """A driver error at the adapter's edge: a damaged file is ``CorruptStoreError``
        (not transient: the host must not answer "retry"), the rest ``StoreError``."""
        if _is_corrupt(exc):
            return CorruptStoreError(
                f"SQLite database {self._path!r} is damaged: {exc}; restore it from a backup",
                thread_id=thread_id,
            )
        return StoreError(f"SQLite error on {self._path}: {type(exc).__name__}: {exc}")

    def _not_utf8(self, exc: UnicodeDecodeError, thread_id: str | None) -> CorruptRecordError:
        where = f"of thread {thread_id!r} " if thread_id is not None else ""
        return CorruptRecordError(
            f"a row {where}in SQLite database {self._path!r} holds text that is not UTF-8 "
            f"({exc.reason} at byte {exc.start}); it was written by something else than "
            "intention-kernel",
            thread_id=thread_id,
        )

    def _inline(self) -> bool:
        """Whether a write runs on the event loop now rather than on the worker thread
        (see the module docstring). Never while the worker has a call queued or
        running, even with ``offload_writes=False`` (whose writes hop when the database
        is busy): the writer's connection has one user at a time."""
        worker, offload = self._worker, self._offload_writes
        if worker is None or not worker.idle:
            return False
        return offload is False or (offload is None and self._lockers <= 1)

    async def _read(self, fn: Callable[[sqlite3.Connection], T], thread_id: str | None = None) -> T:
        """Run the read-only ``fn`` inline: on the writer's connection when writes run
        inline, else on the reader connection (see the module docstring); on
        ``:memory:``, which has no second connection, hop. Neither connection waits
        inline: a read the database keeps busy (a WAL reader rarely is; another process
        holding it in exclusive locking mode) runs again on the worker thread."""
        conn = self._reader
        if conn is None:
            return await self._run(fn, thread_id, write=False)
        if self._inline() and self._conn is not None:
            # The worker has no call queued or running, and none can start before
            # ``fn`` returns: it runs without an await, so the writer's connection is
            # free (see the docstring).
            conn = self._conn
            self._wait_for_locks(conn, False)
        # Only a transaction ``fn`` began is rolled back: a rollback of one it found
        # open would silently undo someone else's writes (none is ever open here).
        began = not conn.in_transaction
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            clear_frames(exc)
            if not _is_busy(exc):
                raise self._error(exc, thread_id) from exc
        except UnicodeDecodeError as exc:
            clear_frames(exc)
            raise self._not_utf8(exc, thread_id) from exc
        finally:
            if began and conn.in_transaction:
                conn.rollback()
        return await self._hop(fn, thread_id)

    async def open(self) -> None:
        seam = self._seam
        self._worker = GroupWriter(
            "ik-sqlite",
            group_alone=seam is not None and seam.group_alone,
            points=None if seam is None else seam.at_point,
        )

        def connect() -> sqlite3.Connection:
            directory = os.path.dirname(os.path.abspath(self._path))
            if self._path != ":memory:" and not os.path.isdir(directory):
                raise StoreError(f"directory of SQLite database {self._path!r} does not exist")
            conn = sqlite3.connect(
                self._path, isolation_level=None, check_same_thread=False, cached_statements=64
            )
            try:
                conn.text_factory = _TEXT
                self._traced(conn, "writer")
                conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
                _into_wal(conn, self._busy_timeout_ms / 1000)
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
                migrate(conn)
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            self._conn = await self._worker.submit(connect)
            self._worker.attach(self._conn, lambda conn: self._wait_for_locks(conn, True))
        except (sqlite3.Error, StoreError) as exc:
            self._worker.close()
            self._worker = None
            if isinstance(exc, StoreError):
                raise
            raise self._open_error(exc) from exc
        try:
            if self._path != ":memory:":
                # No busy timeout: it is only used inline (see _read).
                self._reader = sqlite3.connect(
                    self._path, timeout=0, isolation_level=None, check_same_thread=False
                )
                self._reader.text_factory = _TEXT
                self._traced(self._reader, "reader")
                self._reader.execute("PRAGMA query_only = 1")
            if self._locks is not None:
                self._locks.open()
        except (sqlite3.Error, OSError) as exc:
            # A read-only directory (or file system) can still open a database whose
            # -wal and -shm files a crash left behind, and then refuse the lock file.
            await self.close()
            raise self._open_error(exc) from exc
        if seam is not None:
            seam.opened(WriterAccess(self, self._worker, self._conn))

    def _traced(self, conn: sqlite3.Connection, role: Literal["writer", "reader"]) -> None:
        """Hand each statement ``conn`` runs to the ``trace`` option, if one was given."""
        trace = self._trace
        if trace is not None:
            conn.set_trace_callback(lambda sql: trace(role, sql))

    def _open_error(self, exc: sqlite3.Error | OSError) -> KernelError:
        if isinstance(exc, OSError):
            return StoreError(
                f"cannot open SQLite database {self._path!r}: its lock file "
                f"{exc.filename!r} cannot be opened for writing: {exc.strerror}"
            )
        if _is_corrupt(exc):
            return self._error(exc)
        return StoreError(f"cannot open SQLite database {self._path!r}: {exc}")

    async def exists(self) -> bool:
        if self._path == ":memory:":
            return True  # private to this adapter, like the in-memory one

        def probe() -> bool:
            if not os.path.isfile(self._path):
                return False
            # Read-only and without waiting, so that nothing is created, not even -wal.
            uri = Path(self._path).absolute().as_uri() + "?mode=ro"
            with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=0)) as conn:
                return conn.execute(HAS_SCHEMA_TABLE).fetchone() is not None

        try:
            return await asyncio.to_thread(probe)
        except sqlite3.Error as exc:
            if _is_corrupt(exc):
                raise self._error(exc) from exc
            raise StoreError(
                f"{self._path!r} cannot be read as a SQLite store: {type(exc).__name__}: {exc}"
            ) from exc

    async def close(self) -> None:
        conn, worker, reader = self._conn, self._worker, self._reader
        self._conn = None
        self._worker = None
        self._reader = None
        if self._seam is not None:
            self._seam.opened(None)
        if reader is not None:
            reader.close()
        if conn is not None and worker is not None:
            await worker.submit(conn.close)
        if worker is not None:
            worker.close()
        if self._locks is not None:
            self._locks.close()

    def lock(self, thread_id: str, *, wait: bool = True) -> AbstractAsyncContextManager[object]:
        return _ThreadLock(self, thread_id, wait)

    @asynccontextmanager
    async def claim_outbox(self, thread_id: str) -> AsyncIterator[bool]:
        # A byte of the same lock file as the turns' locks, at another offset: relays
        # exclude each other across processes, never a turn; the OS drops a dead
        # relay's claims. (Thread IDs hold no NUL, so the tag cannot name a thread.)
        locks = self._locks
        if locks is None:  # ":memory:" is private to this adapter
            if thread_id in self._memory_relayed:
                yield False
                return
            self._memory_relayed.add(thread_id)
            try:
                yield True
            finally:
                self._memory_relayed.discard(thread_id)
            return
        offset = lock_offset("\x00relay\x00" + thread_id)
        if not locks.try_acquire(offset):
            yield False
            return
        try:
            yield True
        finally:
            locks.release(offset)


class _ThreadLock:
    """:meth:`SQLiteConnections.lock`'s context manager: a class, not a generator,
    because every turn enters one. It counts its task in ``_lockers`` from before the
    wait until the release, so the adapter knows turns may overlap."""

    __slots__ = ("_adapter", "_hold", "_thread_id", "_wait")

    def __init__(self, adapter: SQLiteConnections, thread_id: str, wait: bool) -> None:
        self._adapter = adapter
        self._thread_id = thread_id
        self._wait = wait
        self._hold: AbstractAsyncContextManager[object] | None = None

    async def __aenter__(self) -> object:
        adapter, thread_id = self._adapter, self._thread_id
        locks = adapter._locks
        if locks is None:  # ":memory:" is private to this adapter
            hold: AbstractAsyncContextManager[object] = adapter._memory_locks.hold(
                thread_id, None, wait=self._wait
            )
        else:
            hold = locks.hold(thread_id, adapter._lock_timeout, wait=self._wait)
        adapter._lockers += 1
        try:
            held = await hold.__aenter__()
        except BaseException:
            adapter._lockers -= 1
            raise
        self._hold = hold
        return thread_id if locks is not None else held

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        hold = self._hold
        assert hold is not None
        self._hold = None
        try:
            return await hold.__aexit__(*exc_info)
        finally:
            self._adapter._lockers -= 1


def _in_transaction(fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """``fn`` between ``BEGIN IMMEDIATE`` and ``COMMIT`` (a failure is rolled back by
    ``_call``)."""

    def transaction(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN IMMEDIATE")
        result = fn(conn)
        conn.execute("COMMIT")
        return result

    return transaction


def _into_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Switch ``conn``'s database to WAL, waiting up to ``timeout`` seconds for others.

    SQLite answers busy at once, without its busy handler, when connections of other
    processes switch a new file at the same moment. Without this retry one of them fails
    to open.
    """
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _is_corrupt(exc: sqlite3.Error) -> bool:
    """Whether SQLite found the file damaged: a malformed page or a truncated file
    (``SQLITE_CORRUPT``), or a file that is not a database (``SQLITE_NOTADB``)."""
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    return code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


#: Decodes stored text strictly, so that text that is not UTF-8 raises
#: ``UnicodeDecodeError`` (a class the adapter translates) rather than the driver's
#: ``OperationalError``, which only its message would tell from a failing statement.
_TEXT = functools.partial(str, encoding="utf-8")


class _Busy:
    """What an inline call answers when a busy database kept it from writing."""


_BUSY = _Busy()


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused a lock that another connection holds (``SQLITE_BUSY`` and
    its extended codes)."""
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == sqlite3.SQLITE_BUSY
