"""The SQLite adapter's worker thread, which commits queued writes together.

The writes queued together share one transaction: a group commit.

- **Groups form by themselves, with no timer.**
  The thread takes every write queued while it was busy.
  It was usually busy waiting on the previous group's ``COMMIT``.
  It runs them as one group: ``BEGIN IMMEDIATE``, each write, one ``COMMIT``.
  So overlapping turns share one disk flush instead of paying one each.
  A write that finds the thread idle runs alone at once.
  So a lone write never waits for company.
- **A savepoint only for a group that has a failed atomic write.**
  An ``atomic`` write has statements that must commit together, as a turn's commit does.
  A group runs first with no savepoint at all.
  A savepoint is not free in SQLite: it copies each page a write then changes.
  With many turns a group, those copies cost more than the turns' statements.
  If an atomic write fails (a fenced turn), the whole transaction is rolled back.
  That write is settled with its error: nothing of it is on disk.
  Its group-mates then run again, with a savepoint per atomic write.
  Each runs between ``SAVEPOINT`` and ``RELEASE``.
  One that fails then rolls back to its savepoint.
  So only its own caller sees the error, and its group-mates commit.
  A body with side effects outside the database would cause them twice.
  No body has any: each is statements over plain values (:mod:`._bodies`).
  Only the fault points that tests arm would run twice.
- A write that is not atomic needs no savepoint.
  A receipt's claim or outcome, or a journal entry, is such a write.
  Alone, each of its statements autocommits when it ends.
  So a failure there keeps the statements before it too.
  In a group those statements stay in the transaction and commit with it.
  The outcome is the same.
- SQLite itself undoes the statement that fails (a statement rollback).
  That leaves the transaction open, with the group-mates' rows in it.
- A write alone in its group needs no savepoint.
  It runs in its own transaction, or as autocommitted statements.
  That is exactly how it ran before group commit.
- **Acknowledged only after ``COMMIT``.**
  No caller's future is settled with a result before the group's ``COMMIT`` has returned.
  Until then, nothing of the group is on disk.
  A failed atomic write's error may come sooner: none of its rows will commit.
  ``COMMIT`` may fail, or SQLite may roll the transaction back under a write.
  A full disk or an I/O error does that.
  Then every write already run in the group fails with that error.
  None is acknowledged.
  The fence and the turn-ID key make the caller's retry safe.
- **Other calls run alone, in order.**
  Opening and closing the connection are not writes.
  Nor is a read that had to hop.
  Each such call ends the group being collected.
  It then runs by itself after that group, outside any transaction.
- **Nothing that holds a statement leaves the thread.**
  A cursor of the writer's connection resets its statement when it is freed.
  That happens on whatever thread frees it.
  ``executemany`` leaves a cursor that keeps its statement.
  The event loop might free one while this thread reruns the same cached statement.
  That breaks the statement: SQLite answers ``bad parameter or other API misuse``.
  The write then fails.
  So a cursor handed back is closed here first.
  An error's traceback frames may hold cursors in their locals.
  They are cleared here before the error is handed over.
- **Every call is counted until the thread is done with it** (:attr:`GroupWriter.idle`).
  The count drops only when the thread has settled the call, after its ``COMMIT``.
  The event loop may use the connection itself only when nothing is queued or running here.
  That covers an inline write or read.
  The count does not drop when a caller stops waiting.
  The thread still runs the call to its end.
- **The thread never dies of a write.**
  A group's own statements may raise: ``BEGIN``, a savepoint, ``COMMIT``.
  Then the transaction is rolled back, and every write of the group fails with the error.
  Without that, one failed statement would stop the thread.
  Every later write would then wait for ever.
- **A call's future cannot be cancelled by its caller** (:class:`_CallFuture`).
  A task may be cancelled while it awaits one.
  It sees its ``CancelledError`` only once the thread has settled the call.
  So a caller never goes on while its write may still run.
  In particular, it keeps its thread lock until then.
  This needs no shield around each call.
  A shield would cost a second future and a callback per hop.
- **Handed off with a queue put, and one ``call_soon_threadsafe`` back per group.**
  ``loop.run_in_executor`` over a one-thread pool would cost twice as much.
  It wraps every call in a ``concurrent.futures.Future``.
  Then it wraps that in an asyncio future chained to it.
  A turn makes a hop per commit, so the cost counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import traceback
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any, Literal, TypeVar

__all__ = ["GroupPoint", "GroupPoints", "GroupWriter", "WriteJob", "clear_frames"]

T = TypeVar("T")

#: A moment of a group commit: just before or just after its ``COMMIT``.
GroupPoint = Literal["before_commit", "after_commit"]

#: Called on the worker thread at each point of a group commit, with the group's size.
#: ``"before_commit"``: every write of the group ran, and ``COMMIT`` is not sent.
#: ``"after_commit"``: ``COMMIT`` returned, and no future is settled yet.
#: Tests die, stall or look at the file there.
#: These points are the adapter's own, not steps of the turn protocol.
#: The protocol model checks only the protocol's points, so these are not in ``_faults``.
#: A test hands one to the adapter through :mod:`intention_kernel.testing.sqlite`.
GroupPoints = Callable[[GroupPoint, int], None]


class WriteJob:
    """One write, and how to run it in a group or alone.

    In a group, ``run(conn)`` runs inside a transaction that the writer opens.
    Alone, ``solo(conn)`` runs and opens its own transaction.
    ``error`` translates what the write raised.
    With ``atomic``, its statements must commit together.
    So in a group its failure rolls back all its rows (see the module docstring).
    """

    __slots__ = ("atomic", "error", "future", "loop", "run", "solo")

    def __init__(
        self,
        run: Callable[[sqlite3.Connection], Any],
        solo: Callable[[sqlite3.Connection], Any],
        error: Callable[[BaseException], BaseException],
        future: asyncio.Future[Any],
        loop: asyncio.AbstractEventLoop,
        atomic: bool,
    ) -> None:
        self.run = run
        self.solo = solo
        self.error = error
        self.future = future
        self.loop = loop
        self.atomic = atomic


class _CallFuture(asyncio.Future[Any]):
    """A call's future, settled only by the worker thread: it refuses ``cancel()``.

    ``Task.cancel()`` first tries to cancel the future its task awaits.
    When that refuses, asyncio marks the task instead.
    It throws ``CancelledError`` into the task once the future is settled.
    The task gets that instead of the result.
    A future that a cancel did settle would let the task go on too early.
    The thread would still be running its call.
    """

    __slots__ = ()

    def cancel(self, msg: Any | None = None) -> bool:
        return False


class _Call:
    """Any other call: runs alone, outside a group."""

    __slots__ = ("fn", "future", "loop")

    def __init__(
        self, fn: Callable[[], Any], future: asyncio.Future[Any], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.fn = fn
        self.future = future
        self.loop = loop


_Outcome = tuple["asyncio.Future[Any]", asyncio.AbstractEventLoop, Any, BaseException | None]


class GroupWriter:
    """The worker thread of one writer connection: writes in groups, other calls alone.

    A submitted call always runs to its end, and its future cannot be cancelled.
    ``group_alone`` makes even a lone write run inside a group's transaction.
    It fails as a failed write of a group does.
    The conformance suite uses it to run every write the group way.
    ``points`` is called at each group's :data:`GroupPoints`.
    """

    def __init__(
        self, name: str, *, group_alone: bool = False, points: GroupPoints | None = None
    ) -> None:
        self._jobs: SimpleQueue[WriteJob | _Call | None] = SimpleQueue()
        self._conn: sqlite3.Connection | None = None
        self._prepare: Callable[[sqlite3.Connection], None] = lambda _: None
        self._group_alone = group_alone
        self._points = points
        self._pending = 0  # calls submitted and not yet settled (event loop's side)
        self.groups = 0  # transactions committed (or failed), for tests and the benchmark
        self.grouped = 0  # writes run in groups of more than one, each counted once
        # A daemon thread: an adapter that is never closed must not keep the process alive.
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def attach(
        self, conn: sqlite3.Connection, prepare: Callable[[sqlite3.Connection], None]
    ) -> None:
        """Set the connection that writes run on.

        It is set once the connection is open, before any write.
        ``prepare(conn)`` runs on the thread before each group.
        """
        self._conn = conn
        self._prepare = prepare

    @property
    def queued(self) -> int:
        """Calls submitted and not yet settled.

        They are queued, running, or committed and not yet handed back.
        Read it on the event loop.
        """
        return self._pending

    @property
    def idle(self) -> bool:
        """Whether no call is queued or running.

        Only then may the event loop use the connection itself.
        Read it on the event loop.
        """
        return not self._pending

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``fn()`` alone on the thread (not a write of a group)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = _CallFuture(loop=loop)
        self._pending += 1
        self._jobs.put(_Call(fn, future, loop))
        return future

    def write(
        self,
        run: Callable[[sqlite3.Connection], T],
        solo: Callable[[sqlite3.Connection], T],
        error: Callable[[BaseException], BaseException],
        *,
        atomic: bool = True,
    ) -> asyncio.Future[T]:
        """Queue a write, whose future is settled after the ``COMMIT`` that made it durable.

        With ``atomic=False``, ``run`` is one statement.
        Or it is statements that may commit one by one (see the module docstring).
        It then runs in a group without a savepoint.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = _CallFuture(loop=loop)
        self._pending += 1
        self._jobs.put(WriteJob(run, solo, error, future, loop, atomic))
        return future

    def close(self) -> None:
        """Finish the calls already submitted, then stop the thread."""
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            first = jobs.get()
            # Everything queued meanwhile joins, mostly while the last COMMIT flushed.
            queued = [first]
            with contextlib.suppress(Empty):
                while True:
                    queued.append(jobs.get_nowait())
            group: list[WriteJob] = []
            for job in queued:
                if isinstance(job, WriteJob):
                    group.append(job)
                    continue
                if group:
                    self._commit(group)
                    group = []
                if job is None:
                    return
                self._settle([self._call(job)])
            if group:
                self._commit(group)

    @staticmethod
    def _call(job: _Call) -> _Outcome:
        try:
            return (job.future, job.loop, job.fn(), None)
        except BaseException as exc:  # handed to the awaiting task, not swallowed
            return (job.future, job.loop, None, exc)

    def _commit(self, group: list[WriteJob]) -> None:
        conn = self._conn
        assert conn is not None
        try:
            self._prepare(conn)
        except BaseException as exc:
            self.groups += 1
            self._settle([_failed(j, exc) for j in group])
            return
        if len(group) == 1 and not self._group_alone:
            job = group[0]
            try:
                outcome: _Outcome = (job.future, job.loop, job.solo(conn), None)
            except BaseException as exc:
                outcome = (job.future, job.loop, None, exc)
            self.groups += 1
            self._settle([outcome])
            return
        careful = False
        while group:
            group, careful = self._commit_group(conn, group, careful)

    def _commit_group(
        self, conn: sqlite3.Connection, group: list[WriteJob], careful: bool
    ) -> tuple[list[WriteJob], bool]:
        """Run ``group`` in one transaction and settle it.

        It answers the writes left to run, and whether they run carefully.
        At first no write gets a savepoint (see the module docstring).
        An atomic write that fails then rolls the whole transaction back.
        It is settled with its error, and the others run again, carefully.
        ``careful`` gives each atomic write a savepoint.
        SQLite may also lose the transaction under one of the writes.
        Then it answers the writes not run yet, to form a new group.
        """
        self.groups += 1
        if len(group) > 1 and not careful:  # a careful run's writes were counted
            self.grouped += len(group)
        done: list[tuple[WriteJob, Any, BaseException | None]] = []
        lost: BaseException | None = None
        undone: tuple[WriteJob, BaseException] | None = None  # a first run's failed atomic write
        try:
            conn.execute("BEGIN IMMEDIATE")
            for job in group:
                atomic = job.atomic
                if atomic and careful:
                    conn.execute("SAVEPOINT ik_write")
                try:
                    result = job.run(conn)
                except BaseException as exc:
                    if not conn.in_transaction:
                        # SQLite rolled the whole transaction back (a full disk, an I/O error).
                        # What the writes before this one wrote is gone too.
                        lost = exc
                        break
                    if atomic and not careful:
                        # Its rows before the failure are in the transaction.
                        # With no savepoint, only a rollback of all takes them back.
                        done.append((job, None, exc))
                        undone = (job, exc)
                        conn.rollback()
                        break
                    if atomic:
                        # Without this rollback, the failed write's rows would commit.
                        # A fenced turn's rows would commit with the group.
                        conn.execute("ROLLBACK TO ik_write")
                        conn.execute("RELEASE ik_write")
                    done.append((job, None, exc))
                else:
                    if atomic and careful:
                        conn.execute("RELEASE ik_write")
                    done.append((job, result, None))
            else:
                if self._points is not None:
                    self._points("before_commit", len(group))
                conn.execute("COMMIT")
        except BaseException as exc:
            # BEGIN, a savepoint statement, a rollback or COMMIT failed.
            # Nothing of the group is on disk, so every write fails.
            # A write that ran and failed keeps its own error.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.rollback()
            ran = {id(j): failed for j, _, failed in done}
            self._settle([_failed(j, ran.get(id(j)) or exc) for j in group])
            return [], False
        if undone is not None:
            # Nothing of the group is on disk: the failed write alone is settled.
            # The others ran before it, or not yet; they all run again.
            # No caller has seen an outcome of theirs, so the second run is the only one.
            failed, failure = undone
            for _, result, _ in done:
                _close_cursor(result)  # a result no caller will get
            self._settle([_failed(failed, failure)])
            return [j for j in group if j is not failed], True
        if lost is not None:
            failing = len(done) + 1
            self._settle([_failed(j, lost) for j in group[:failing]])
            return group[failing:], False
        if self._points is not None:
            self._points("after_commit", len(group))
        self._settle(
            [
                (j.future, j.loop, result, None if failed is None else j.error(failed))
                for j, result, failed in done
            ]
        )
        return [], False

    def _settle(self, outcomes: list[_Outcome]) -> None:
        """Hand ``outcomes`` to their event loops, with one wake-up of each.

        First, on this thread, it closes the cursors among them.
        It also clears their errors' frames.
        """
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for future, loop, result, exc in outcomes:
            _close_cursor(result)
            if exc is not None:
                clear_frames(exc)
            by_loop.setdefault(loop, []).append((future, loop, result, exc))

        for loop, settled in by_loop.items():

            def settle(settled: list[_Outcome] = settled) -> None:
                self._pending -= len(settled)  # the thread is done with them
                for future, _, result, exc in settled:
                    # Never done already: only this settles it (see _CallFuture).
                    if exc is None:
                        future.set_result(result)
                    else:
                        future.set_exception(exc)

            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
                loop.call_soon_threadsafe(settle)


def _failed(job: WriteJob, exc: BaseException) -> _Outcome:
    return (job.future, job.loop, None, job.error(exc))


def _close_cursor(result: Any) -> None:
    """Close ``result`` if it is a cursor, on this thread, the one that owns it."""
    if isinstance(result, sqlite3.Cursor):
        with contextlib.suppress(sqlite3.Error):  # a closed connection's cursor
            result.close()


def clear_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames in the tracebacks of ``exc``.

    The errors it was raised from are cleared too.
    So no cursor in them is freed on another thread.
    The tracebacks keep their lines.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        todo += [current.__cause__, current.__context__]
