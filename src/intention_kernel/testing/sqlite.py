"""A testing seam into the SQLite adapter's writer thread (its group commit).

The adapter's writer thread commits the writes queued together in one transaction.
A failing write fails alone.
Each is acknowledged after the transaction's ``COMMIT``
(see :class:`~intention_kernel.durability.sqlite.SQLiteDurability`).
Tests of that need to hold the thread while writes queue.
They count the writes and the groups, and run statements on the writer's connection.
They stop (or kill) the thread between a group's last statement and its ``COMMIT``.
This module gives them that as an option of the adapter's constructor, ``seam=``::

    from intention_kernel.testing.sqlite import WriterProbe

    probe = WriterProbe()
    async with SQLiteDurability(path, seam=probe) as store:
        gate = await probe.hold()               # the writer thread waits
        turns = [asyncio.ensure_future(store.with_turn(...)) for ...]
        await gate.wait_for_queued(len(turns))  # every commit waits behind the gate
        with probe.group_points(stop_before_commit):
            await gate.release()                # the queued commits run as one group

- :class:`WriterProbe` is the seam.
  It counts one adapter's writer thread: calls queued, groups, writes grouped.
  It runs a call on the thread with the writer's connection.
  It runs a write through the adapter's own write path.
  Its :class:`WriterGate` holds the thread.
- Its group points call an action on the writer thread at two points of each group.
  At ``"before_commit"``, every write of the group ran and ``COMMIT`` is not sent.
  At ``"after_commit"``, ``COMMIT`` returned and no caller is told yet.
  The action gets the group's size.
  It may stall there, look at the file, raise, or end the process.
  :meth:`WriterProbe.group_points` arms one for a ``with`` block.
  ``WriterProbe(points=...)`` arms one from the start, for a worker process.
- ``WriterProbe(group_alone=True)`` makes every write run the group way, even alone.
  Such a write runs on the writer thread, in a transaction the writer opens.
  It fails as a write of a group fails, and is acknowledged after ``COMMIT``.
  :func:`grouping_durability` builds such an adapter.
  The conformance suite runs on it to prove that a write means the same in a group.

A probe serves one adapter; its points apply to that adapter only.
Its counts and calls need the adapter open.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, TypeVar

from intention_kernel.durability.sqlite import SQLiteDurability, StatementTrace
from intention_kernel.durability.sqlite._connection import WriterAccess
from intention_kernel.durability.sqlite._group import GroupPoint, GroupWriter
from intention_kernel.errors import KernelError

__all__ = [
    "AFTER_COMMIT",
    "BEFORE_COMMIT",
    "GroupAction",
    "GroupPoint",
    "QUEUE_WAIT",
    "WriterGate",
    "WriterProbe",
    "grouping_durability",
]

T = TypeVar("T")

#: Every write of the group ran, and its ``COMMIT`` is not sent.
#: Nothing of the group is on disk.
BEFORE_COMMIT: GroupPoint = "before_commit"
#: The group's ``COMMIT`` returned, and no caller is told yet.
#: The group is on disk, acknowledged to nobody.
AFTER_COMMIT: GroupPoint = "after_commit"

#: Called on the writer thread with the point reached and the size of the group.
GroupAction = Callable[[GroupPoint, int], None]

#: How long :meth:`WriterGate.wait_for_queued` waits for the calls it expects, in seconds.
QUEUE_WAIT = 5.0


def grouping_durability(
    path: str | os.PathLike[str],
    *,
    synchronous: Literal["FULL", "NORMAL"] = "FULL",
    lock_timeout: float = 30.0,
    busy_timeout: float = 30.0,
    trace: StatementTrace | None = None,
    probe: WriterProbe | None = None,
) -> SQLiteDurability:
    """A new, unopened adapter whose every write runs as a member of a group, even alone.

    Each write runs on the writer thread (``offload_writes=True``).
    It runs in a transaction the writer opens.
    It is acknowledged after ``COMMIT``.
    Without this, a lone write runs in a transaction of its own.
    A test would then meet the group way only when writes happen to overlap.
    ``probe`` is the adapter's seam; it must be a ``WriterProbe(group_alone=True)``.
    Without one, the adapter gets a new one.
    The other options are the adapter's.
    """
    if probe is None:
        probe = WriterProbe(group_alone=True)
    elif not probe.group_alone:
        raise ValueError("grouping_durability needs a WriterProbe(group_alone=True)")
    return SQLiteDurability(
        path,
        synchronous=synchronous,
        lock_timeout=lock_timeout,
        busy_timeout=busy_timeout,
        offload_writes=True,
        trace=trace,
        seam=probe,
    )


class WriterProbe:
    """What a test sees of, and does to, the writer thread of one SQLite adapter.

    Give it to the adapter as ``SQLiteDurability(path, seam=probe)``.
    ``group_alone``: even a lone write runs the group way (see :func:`grouping_durability`).
    ``points``: the action armed at each group's points from the start.

    Each call reads the adapter as it is then.
    After the adapter is closed and opened again, the counts are its new writer thread's.
    A call while the adapter is not open raises ``KernelError``.
    Use it on the event loop that runs the adapter.
    """

    def __init__(self, *, group_alone: bool = False, points: GroupAction | None = None) -> None:
        self._group_alone = group_alone
        self._points = points
        self._access: WriterAccess | None = None

    # -- the seam, as the adapter calls it ---------------------------------------------------

    @property
    def group_alone(self) -> bool:
        """Whether even a lone write runs the group way; the adapter reads it at opening."""
        return self._group_alone

    def at_point(self, point: GroupPoint, size: int) -> None:
        """Run the armed action, if any; the adapter calls it on the writer thread."""
        action = self._points
        if action is not None:
            action(point, size)

    def opened(self, writer: WriterAccess | None) -> None:
        """The adapter's writer once it opens; ``None`` once it closes."""
        self._access = writer

    # -- the group points ----------------------------------------------------------------------

    @contextmanager
    def group_points(self, action: GroupAction) -> Iterator[None]:
        """Run ``action`` at every group's points for the duration of a ``with`` block.

        The points are :data:`BEFORE_COMMIT` and :data:`AFTER_COMMIT`.
        What was armed before is armed again after the block.
        """
        before = self._points
        self._points = action
        try:
            yield
        finally:
            self._points = before

    def arm(self, action: GroupAction | None) -> None:
        """Run ``action`` at every group's points from now on (``None``: disarm)."""
        self._points = action

    # -- the writer thread ---------------------------------------------------------------------

    def _open(self) -> WriterAccess:
        access = self._access
        if access is None:
            raise KernelError("the SQLite adapter is closed")
        return access

    def _writer(self) -> GroupWriter:
        return self._open().worker

    @property
    def queued(self) -> int:
        """Calls handed to the writer thread and not yet settled.

        Those are writes waiting or running, a held :class:`WriterGate`,
        and a read that had to hop.
        """
        return self._writer().queued

    @property
    def idle(self) -> bool:
        """Whether nothing is queued on or running on the writer thread.

        Only then does the adapter use the writer's connection from the event loop.
        """
        return self._writer().idle

    @property
    def groups(self) -> int:
        """Transactions the writer thread ran for writes: groups, and writes alone."""
        return self._writer().groups

    @property
    def grouped(self) -> int:
        """Writes the writer thread ran in groups of more than one."""
        return self._writer().grouped

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` on the writer thread with the writer's connection.

        It runs alone and outside any transaction, after the calls queued before it.
        Use it to set a pragma, or to look at the file from the writer's side.
        A cursor it returns is closed on the thread
        (see :mod:`intention_kernel.durability.sqlite._group`).
        """
        access = self._open()
        conn = access.conn
        return await access.worker.submit(lambda: fn(conn))

    async def write(self, fn: Callable[[sqlite3.Connection], T], *, atomic: bool = False) -> T:
        """``fn(conn)`` as a write of the adapter's own.

        It runs inline or on the writer thread, as the adapter's ``offload_writes`` decides.
        On the thread it runs in a group; with ``group_alone``, always.
        ``fn`` never begins, commits or rolls back.
        With ``atomic``, a lone ``fn`` runs between ``BEGIN IMMEDIATE`` and ``COMMIT``.
        Without it, each statement autocommits.
        Driver errors reach the caller as the adapter's ``StoreError``.
        """
        return await self._open().write(fn, atomic=atomic)

    def connection(self) -> sqlite3.Connection:
        """The writer's connection, to use on the event loop while the thread is :attr:`idle`.

        The adapter's own inline reads and writes use it so too.
        Raises ``KernelError`` while a call is queued or running on the thread.
        Two threads would then use one connection at once.
        """
        conn = self._open().conn
        if not self.idle:
            raise KernelError("the SQLite writer thread is busy: its connection is not free")
        return conn

    async def hold(self, let_go_after: float = 10.0) -> WriterGate:
        """Hold the writer thread until :meth:`WriterGate.release`; returns once it is held.

        The writes queued meanwhile then form one group.
        A write queued before the hold could be taken from the queue with the gate.
        It would then run apart from the writes queued later.
        The gate lets go by itself after ``let_go_after`` seconds.
        So a failing test cannot hang the thread.
        """
        gate = WriterGate(self, let_go_after)
        await _until(gate._holding.is_set, lambda: "the writer thread did not take the gate")
        return gate


class WriterGate:
    """A call that keeps the writer thread waiting until it is released.

    The writes queued behind it run as one group when it is.
    :meth:`WriterProbe.hold` makes one, once it holds the thread.
    """

    def __init__(self, probe: WriterProbe, timeout: float) -> None:
        self._probe = probe
        self._released = threading.Event()
        self._holding = threading.Event()
        self._future = probe._writer().submit(lambda: self._hold(timeout))

    def _hold(self, timeout: float) -> bool:
        self._holding.set()
        return self._released.wait(timeout)

    async def wait_for_queued(self, count: int) -> None:
        """Until ``count`` calls wait behind the gate; a turn's commit is one.

        Raises ``AssertionError`` if they are not there within :data:`QUEUE_WAIT` seconds.
        """
        probe = self._probe
        await _until(
            lambda: probe.queued > count,  # the gate itself is one more
            lambda: f"{probe.queued - 1} calls queued behind the gate, not {count}",
        )

    async def release(self) -> None:
        """Let the writer thread go, and wait until the gate has left it.

        Raises ``AssertionError`` if the gate had already let go by itself (its timeout).
        The writes behind it may then not have formed one group.
        """
        self._released.set()
        if not await self._future:
            raise AssertionError("the writer gate timed out before it was released")


async def _until(done: Callable[[], bool], failure: Callable[[], str]) -> None:
    """Until ``done()``, looked at every millisecond.

    Raises ``AssertionError(failure())`` if it is still not done after :data:`QUEUE_WAIT` seconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUEUE_WAIT
    while not done():
        if loop.time() > deadline:
            raise AssertionError(failure())
        await asyncio.sleep(0.001)
