"""The SQLite adapter's connections, worker thread and locks: where each statement runs.

- **Writes on one worker thread, reads inline on a second connection.**
  A write may flush to disk (``synchronous=FULL``).
  It may also wait up to ``busy_timeout`` for another process's write lock.
  So a write transaction may run on the adapter's worker thread.
  The event loop then never blocks on it.
  A hop is never abandoned half-way.
  If the awaiting task is cancelled, the hop still finishes first.
  Only then is the thread lock released.
- Reads run on the event loop itself: the start of a turn, replays, inspection.
  In WAL mode a reader never waits for a writer and never flushes.
  So a read costs less than the two thread switches of a hop.
  While writes may be on the worker, reads use a read-only connection of their own.
  The writer's connection may be inside a transaction there.
  Otherwise reads use the writer's connection.
  Its page cache holds what it just wrote.
  A second connection reads again every page a write changed.
  ``:memory:`` has only the one connection, so there reads hop too.
- **By default a write hops only when turns overlap.**
  The adapter may run a single turn at a time.
  A CLI, a script, or a worker serving one conversation does so.
  Then nothing of the adapter's own waits on the event loop.
  On a busy machine a hop's two thread switches cost more than the statements.
  So the write runs inline.
  A second turn or an operator call may hold or await a thread lock.
  From then on, writes go to the worker thread so that the other turns keep running.
- Inline, nothing waits for a lock.
  When another connection holds the write lock, the write goes to the worker thread.
  The worker waits up to ``busy_timeout``.
  So a lock held elsewhere never stalls the event loop.
  ``offload_writes=True`` or ``False`` forces either behaviour.
  ``False`` still hands a busy write to the worker.
- **The writer's connection has one user at a time.**
  The event loop uses it for an inline write or a read.
  It does so only while the worker has no call queued or running (``GroupWriter.idle``).
  That holds whatever ``offload_writes`` says.
  Without it, an inline write beside a hop would use the connection from two threads.
- Nothing of the worker's that holds a statement reaches the event loop.
  The worker first closes a cursor and clears an error's frames (see :mod:`._group`).
  Freeing a cursor resets its statement on the thread that frees it.
- **On the worker thread, writes commit in groups** (:mod:`._group`).
  The writes queued while a ``COMMIT`` flushes share the next transaction.
  A failing write fails alone, and each is acknowledged after that ``COMMIT``.
- So each write is a *body* that runs inside a transaction someone else opens.
  That is the group's transaction, or the write's own when it runs alone and inline.
  ``_run`` opens that one when the write is ``atomic``.
  A body never begins, commits or rolls back.
- **Per-thread serialization with an OS lock** (:mod:`._filelock`).
  No database transaction is open while the interpreter or a capability runs.
  No extra commit is spent on a lease.
  A dead holder's lock vanishes with its process.
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

from intention_kernel.durability._engine.deliveries import Deliveries
from intention_kernel.durability._engine.looplocks import LoopLocks
from intention_kernel.durability.sqlite._filelock import LockFile, lock_offset, mark_offset
from intention_kernel.durability.sqlite._group import GroupPoint, GroupWriter, clear_frames
from intention_kernel.durability.sqlite._schema import HAS_SCHEMA_TABLE, migrate
from intention_kernel.errors import CorruptRecordError, CorruptStoreError, KernelError, StoreError

__all__ = ["SQLiteConnections", "StatementTrace", "WriterAccess", "WriterSeam"]

T = TypeVar("T")

#: Called with the connection's role and the text of each statement it runs.
#: It is called in the thread that runs the statement.
#: That is the worker thread ``ik-sqlite`` or the event loop's.
StatementTrace: TypeAlias = Callable[[Literal["writer", "reader"], str], None]


class WriterSeam(Protocol):
    """A testing kit's hold on one adapter's worker thread (``SQLiteDurability(seam=...)``).

    :class:`intention_kernel.testing.sqlite.WriterProbe` is the one the package ships.
    Production code passes none.
    """

    @property
    def group_alone(self) -> bool:
        """Whether even a lone write on the worker thread runs the group way.

        It then runs in a transaction the writer opens.
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
    """The connections, worker thread and thread locks of one database file.

    It holds the writer and reader connections.
    It holds the worker thread that runs writes.
    It holds the file of thread locks.
    The recorder runs every statement here.
    """

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
        # Named after the database's real path.
        # Two adapters may reach one file through a symlink or another relative path.
        # They must share one lock file, or their turns on a thread would overlap.
        # The later commit would then be fenced after running.
        self._locks = LockFile(os.path.realpath(path) + ".locks") if path != ":memory:" else None
        self._memory_locks = LoopLocks()
        self._memory_relayed: set[str] = set()
        self._lockers = 0  # tasks holding or awaiting a thread lock of this adapter
        self._memory_deliveries = Deliveries()  # ":memory:"'s marks (see ``turn_lock``)

    # -- plumbing ------------------------------------------------------------------------------

    async def _run(
        self,
        fn: Callable[[sqlite3.Connection], T],
        thread_id: str | None = None,
        *,
        atomic: bool = False,
        write: bool = True,
    ) -> T:
        """Run the write ``fn`` on the worker thread, or inline.

        The module docstring says which.
        A started hop always runs to its end.

        With ``atomic``, ``fn`` runs statements that must commit together.
        Alone, it then runs between ``BEGIN IMMEDIATE`` and ``COMMIT``.
        Otherwise ``fn`` is one statement, or statements that may commit one by one.
        Alone, it then autocommits.
        In a group it runs within the group's transaction either way.
        If it is atomic, a failure rolls back all its rows (see :mod:`._group`).
        ``write=False`` marks a read that must hop.
        Its ``fn`` never joins a group, as it may begin a transaction of its own.

        Inline, no statement waits for another connection's write lock.
        The writer's busy timeout is 0 there.
        A busy database hands the call to the worker thread, which waits for it.
        Without that, a lock held by another process would stall the event loop.
        Every other task of the process would stall too, for up to ``busy_timeout``.
        The call starts again on the worker only if it wrote nothing.
        A busy error comes from the statement that needs the write lock.
        Each call writes last, in one transaction or one statement.
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
        """Run the write ``body(conn, *args)`` as :meth:`_run` runs a write.

        ``body`` is one of :mod:`._bodies`, over plain values.
        The inline case runs here, without ``_run``'s closures.
        Every write of a lone turn is inline: three to six frames fewer.
        A busy database, or a write that must hop, goes through ``_run``.
        """
        conn = self._conn
        if conn is not None and self._inline():
            if self._writer_waits:
                self._wait_for_locks(conn, False)
            changes = conn.total_changes
            try:
                if not atomic:
                    return body(conn, *args)
                conn.execute("BEGIN IMMEDIATE")
                done = body(conn, *args)
                conn.execute("COMMIT")
                return done
            except BaseException as exc:
                failure = self._failure(conn, exc, thread_id, changes)
                if failure is exc:
                    raise
                if not isinstance(failure, _Busy):
                    raise failure from exc
            # Busy: the worker thread waits for the lock (as ``_run`` hands it over).
            return await self._hop(
                self._whole(body, args, atomic),
                thread_id,
                group=self._whole(body, args),
                atomic=atomic,
            )
        return await self._run(self._whole(body, args), thread_id, atomic=atomic)

    @staticmethod
    def _whole(
        body: Callable[..., T], args: tuple[Any, ...], atomic: bool = False
    ) -> Callable[[sqlite3.Connection], T]:
        """``body(conn, *args)`` as a call of the connection alone.

        When ``atomic``, it runs between ``BEGIN IMMEDIATE`` and ``COMMIT``.
        """

        def write(conn: sqlite3.Connection) -> T:
            return body(conn, *args)

        return _in_transaction(write) if atomic else write

    def _call(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[sqlite3.Connection], T],
        thread_id: str | None,
        inline_changes: int | None = None,
    ) -> T | _Busy:
        """``fn(conn)``, rolled back on any error, with the driver's errors translated.

        Inline, ``inline_changes`` is the connection's change count before the call.
        There a busy database that kept the call from writing answers ``_BUSY``.
        The caller then hands the call to the worker thread (see :meth:`_failure`).
        """
        try:
            return fn(conn)
        except BaseException as exc:
            failure = self._failure(conn, exc, thread_id, inline_changes)
            if failure is exc:
                raise
            if isinstance(failure, _Busy):
                return failure
            raise failure from exc

    def _failure(
        self,
        conn: sqlite3.Connection,
        exc: BaseException,
        thread_id: str | None,
        inline_changes: int | None,
    ) -> BaseException | _Busy:
        """What a call that raised ``exc`` on ``conn`` raises, after a rollback.

        That is ``exc`` itself, the driver's error translated, or ``_BUSY``.
        An error leaves with its frames cleared (see :func:`._group.clear_frames`).
        A caller may keep it while the connection is another thread's.
        Freeing a cursor held in one of its frames would touch the connection.
        """
        if conn.in_transaction:
            conn.rollback()
        clear_frames(exc)
        if isinstance(exc, sqlite3.Error):
            if (
                inline_changes is not None
                and _is_busy(exc)
                and conn.total_changes == inline_changes
            ):
                return _BUSY
            return self._error(exc, thread_id)
        if isinstance(exc, UnicodeDecodeError):
            return self._not_utf8(exc, thread_id)
        return exc

    async def _hop(
        self,
        fn: Callable[[sqlite3.Connection], T],
        thread_id: str | None,
        group: Callable[[sqlite3.Connection], T] | None = None,
        *,
        atomic: bool = True,
    ) -> T:
        """Run ``fn`` on the worker thread, waiting up to ``busy_timeout`` for the write lock.

        A started hop always runs to its end.
        ``group`` is the write's body.
        With it, the write may share a transaction with others queued with it.
        :mod:`._group` says how.
        ``fn`` is what runs when the write is alone.
        ``atomic`` means what it means for :meth:`_run`.
        """
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
        # A cancel of this task waits for the thread to settle the call.
        # The future refuses the cancel (see _group).
        # So the thread lock is kept until the write is done.
        return await future

    def _wait_for_locks(self, conn: sqlite3.Connection, waits: bool) -> None:
        """Give the writer's connection its busy timeout (on the worker) or none (inline).

        It is called only where the connection is free.
        That is inline with no hop in flight, or on the worker thread.
        So the flag always says what the connection has.
        """
        if self._writer_waits is not waits:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms if waits else 0}")
            self._writer_waits = waits

    def _error(self, exc: sqlite3.Error, thread_id: str | None = None) -> KernelError:
        """A driver error at the adapter's edge.

        A damaged file is ``CorruptStoreError``.
        It is not transient, so the host must not answer "retry".
        The rest is ``StoreError``.
        """
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
        """Whether a write runs on the event loop now rather than on the worker thread.

        The module docstring says when.
        Never while the worker has a call queued or running.
        That holds even with ``offload_writes=False``, whose writes hop when busy.
        The writer's connection has one user at a time.
        """
        worker, offload = self._worker, self._offload_writes
        # ``worker.idle``, read without the property's frame (four calls a turn).
        if worker is None or worker._pending:
            return False
        return offload is False or (offload is None and self._lockers <= 1)

    async def _read(self, fn: Callable[[sqlite3.Connection], T], thread_id: str | None = None) -> T:
        """Run the read-only ``fn`` inline.

        It runs on the writer's connection when writes run inline.
        Otherwise it runs on the reader connection (see the module docstring).
        ``:memory:`` has no second connection, so there the read hops.
        Neither connection waits inline.
        A read the database keeps busy runs again on the worker thread.
        A WAL reader rarely is busy.
        Another process holding exclusive locking mode can make it so.
        """
        conn = self._reader
        if conn is None:
            return await self._run(fn, thread_id, write=False)
        if self._inline() and self._conn is not None:
            # The worker has no call queued or running.
            # None can start before ``fn`` returns, since it runs without an await.
            # So the writer's connection is free (see the docstring).
            conn = self._conn
            if self._writer_waits:
                self._wait_for_locks(conn, False)
        # Only a transaction ``fn`` began is rolled back.
        # Rolling back one it found open would silently undo someone else's writes.
        # None is ever open here.
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
            # A read-only directory or file system can still open a crashed database.
            # Its -wal and -shm files are left behind, and then the lock file is refused.
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
        return _ThreadLock(self, thread_id, wait, None)

    def turn_lock(
        self, thread_id: str, turn_id: str, wait: bool
    ) -> AbstractAsyncContextManager[object]:
        """The thread's lock for a turn, with the turn marked as its holder (``_deliveries``).

        The mark is a byte of the lock file, at an offset of its own. It costs two
        system calls, and no commit. The OS drops a dead process's marks. A cancel in
        any process sees it (``running``). Marks lie above every thread's byte
        (``mark_offset``). A hash collision only makes a cancel answer ``"requested"``."""
        return _ThreadLock(self, thread_id, wait, turn_id)

    def running(self, thread_id: str, turn_id: str) -> bool:
        """Whether a delivery of the turn holds its thread, in any process."""
        if self._locks is None:
            return (thread_id, turn_id) in self._memory_deliveries
        return self._locks.busy(mark_offset(thread_id, turn_id))

    @asynccontextmanager
    async def claim_outbox(self, thread_id: str) -> AsyncIterator[bool]:
        # A byte of the turns' lock file, at another offset.
        # Relays exclude each other across processes, but never exclude a turn.
        # The OS drops a dead relay's claims.
        # Thread IDs hold no NUL, so the tag cannot name a thread.
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
    """:meth:`SQLiteConnections.lock`'s and ``turn_lock``'s context manager.

    It is a class, not a generator, because every turn enters one.
    It counts its task in ``_lockers`` from before the wait until the release.
    So the adapter knows turns may overlap.
    A free thread's lock is taken here directly.
    Only a wait goes through the lock file's ``hold``.
    With a turn, it marks the turn once the lock is held, until the release.
    A delivery still waiting for the lock is not marked.
    Its queued copy may then still be dequeued.
    The mark is let go before the lock.
    Otherwise the turn's next delivery could take the lock and find its mark taken.
    It would then run unmarked.
    """

    __slots__ = ("_adapter", "_hold", "_mark", "_offset", "_thread_id", "_turn_id", "_wait")

    def __init__(
        self, adapter: SQLiteConnections, thread_id: str, wait: bool, turn_id: str | None
    ) -> None:
        self._adapter = adapter
        self._thread_id = thread_id
        self._wait = wait
        self._turn_id = turn_id
        self._hold: AbstractAsyncContextManager[object] | None = None
        self._offset: int | None = None  # the byte taken without ``hold``
        self._mark: int | None = None  # the turn's byte, or -1 for ":memory:"'s count

    async def __aenter__(self) -> object:
        adapter, thread_id, turn_id = self._adapter, self._thread_id, self._turn_id
        locks = adapter._locks
        if locks is None:  # ":memory:" is private to this adapter
            hold: AbstractAsyncContextManager[object] = adapter._memory_locks.hold(
                thread_id, None, wait=self._wait
            )
        else:
            # Most threads are free: one attempt, without ``hold``'s context manager.
            offset = lock_offset(thread_id)
            if turn_id is None:
                taken = locks.try_acquire(offset)
            else:
                mark = mark_offset(thread_id, turn_id)
                taken, marked = locks.try_acquire_marked(offset, mark)
                if marked:
                    self._mark = mark
            if taken:
                adapter._lockers += 1
                self._offset = offset
                return thread_id
            hold = locks.hold(thread_id, adapter._lock_timeout, wait=self._wait)
        adapter._lockers += 1
        try:
            held = await hold.__aenter__()
        except BaseException:
            adapter._lockers -= 1
            raise
        self._hold = hold
        if turn_id is not None:
            try:
                if locks is None:
                    adapter._memory_deliveries.take((thread_id, turn_id))
                    self._mark = -1
                else:
                    mark = mark_offset(thread_id, turn_id)
                    if locks.try_acquire(mark):
                        self._mark = mark
            except BaseException as exc:  # the lock is let go with the mark's error
                await self.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        return thread_id if locks is not None else held

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        offset, hold, mark = self._offset, self._hold, self._mark
        self._offset = self._hold = self._mark = None
        adapter = self._adapter
        try:
            locks = adapter._locks
            if offset is not None:
                if locks is not None:
                    locks.release(offset, mark)
                return None
            if mark is not None:
                if locks is None:
                    assert self._turn_id is not None
                    adapter._memory_deliveries.give((self._thread_id, self._turn_id))
                else:
                    locks.release(mark)
            assert hold is not None
            return await hold.__aexit__(*exc_info)
        finally:
            adapter._lockers -= 1


def _in_transaction(fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """``fn`` between ``BEGIN IMMEDIATE`` and ``COMMIT``.

    ``_call`` rolls back a failure.
    """

    def transaction(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN IMMEDIATE")
        result = fn(conn)
        conn.execute("COMMIT")
        return result

    return transaction


def _into_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Switch ``conn``'s database to WAL, waiting up to ``timeout`` seconds for others.

    Connections of other processes may switch a new file at the same moment.
    SQLite then answers busy at once, without its busy handler.
    Without this retry, one of them fails to open.
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
    """Whether SQLite found the file damaged.

    A malformed page or a truncated file is ``SQLITE_CORRUPT``.
    A file that is not a database is ``SQLITE_NOTADB``.
    """
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    return code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


#: Decodes stored text strictly.
#: Text that is not UTF-8 then raises ``UnicodeDecodeError``, a class the adapter translates.
#: The driver would raise ``OperationalError`` instead.
#: Only its message would tell that from a failing statement.
_TEXT = functools.partial(str, encoding="utf-8")


class _Busy:
    """What an inline call answers when a busy database kept it from writing."""


_BUSY = _Busy()


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused a lock that another connection holds.

    That is ``SQLITE_BUSY`` and its extended codes.
    """
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == sqlite3.SQLITE_BUSY
