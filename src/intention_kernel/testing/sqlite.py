"""A testing seam into the SQLite adapter's writer thread (its group commit).

The adapter's writer thread commits the writes queued together in one transaction, a
savepoint each, and acknowledges them after its ``COMMIT`` (see
:class:`~intention_kernel.durability.sqlite.SQLiteDurability`). Tests of that need
to hold the thread while writes queue, to count the writes and the groups, to run
statements on the writer's connection, and to stop (or kill) the thread between a
group's last statement and its ``COMMIT``. This module gives them that without
reaching into the adapter::

    from intention_kernel.testing.sqlite import WriterProbe, group_points

    async with SQLiteDurability(path) as store:
        probe = WriterProbe(store)
        gate = await probe.hold()               # the writer thread waits
        turns = [asyncio.ensure_future(store.with_turn(...)) for ...]
        await gate.wait_for_queued(len(turns))  # every commit waits behind the gate
        with group_points(stop_before_commit):
            await gate.release()                # the queued commits run as one group

- :func:`grouping_durability`: an adapter whose every write runs the group way, even
  alone: on the writer thread, in a transaction the writer opens, in a savepoint,
  acknowledged after ``COMMIT``. The conformance suite runs on it to prove that a
  write means the same inside a group as alone.
- :class:`WriterProbe`: the counts of one adapter's writer thread (calls queued,
  groups, writes grouped), a call on the thread with the writer's connection, a
  write through the adapter's own write path, and :class:`WriterGate`, which holds
  the thread.
- :func:`group_points` and :func:`arm_group_points`: a callable run on the writer
  thread at ``"before_commit"`` (every write of the group ran, ``COMMIT`` not sent)
  and ``"after_commit"`` (``COMMIT`` returned, no caller told yet), with the group's
  size. It may stall there, look at the file, raise, or end the process.

The points are process-wide: they apply to every SQLite adapter of the process.
Everything else is per adapter, and needs the adapter open.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, TypeVar

from intention_kernel.durability.sqlite import SQLiteDurability, StatementTrace, _group
from intention_kernel.durability.sqlite._connection import SQLiteConnections
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
    "arm_group_points",
    "group_points",
    "grouping_durability",
]

T = TypeVar("T")

#: Every write of the group ran; its ``COMMIT`` is not sent: nothing of it is on disk.
BEFORE_COMMIT: GroupPoint = "before_commit"
#: The group's ``COMMIT`` returned; no caller is told yet: on disk, acknowledged to nobody.
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
) -> SQLiteDurability:
    """A new, unopened adapter whose every write runs as a member of a group, also
    when it is alone: on the writer thread (``offload_writes=True``), in a transaction
    the writer opens, within a savepoint, acknowledged after ``COMMIT``. Without the
    switch, a lone write runs in a transaction of its own, so a test would meet the
    group way only when writes happen to overlap. The options are the adapter's."""
    durability = SQLiteDurability(
        path,
        synchronous=synchronous,
        lock_timeout=lock_timeout,
        busy_timeout=busy_timeout,
        offload_writes=True,
        trace=trace,
    )
    _connections(durability).group_alone = True  # read when the adapter opens
    return durability


@contextmanager
def group_points(action: GroupAction) -> Iterator[None]:
    """Run ``action`` at every group's points for the duration of a ``with`` block (see
    :data:`BEFORE_COMMIT`, :data:`AFTER_COMMIT`); what was armed before is armed
    again after it."""
    before = _group.group_fault
    arm_group_points(action)
    try:
        yield
    finally:
        _group.group_fault = before


def arm_group_points(action: GroupAction | None) -> None:
    """Run ``action`` at every group's points from now on (``None``: disarm); for a
    worker process that ends itself at one (``os._exit``)."""
    _group.group_fault = action


class WriterProbe:
    """What a test sees of, and does to, the writer thread of one SQLite adapter.

    Each call reads the adapter as it is then: after the adapter is closed and opened
    again, the counts are its new writer thread's. A call on a closed adapter raises
    ``KernelError``. Use it on the event loop that runs the adapter.
    """

    def __init__(self, durability: SQLiteDurability) -> None:
        self._connections = _connections(durability)

    def _writer(self) -> GroupWriter:
        worker = self._connections._worker
        if worker is None:
            raise KernelError("the SQLite adapter is closed")
        return worker

    def _conn(self) -> sqlite3.Connection:
        conn = self._connections._conn
        if conn is None:
            raise KernelError("the SQLite adapter is closed")
        return conn

    @property
    def queued(self) -> int:
        """Calls handed to the writer thread and not yet settled: writes waiting or
        running, a held :class:`WriterGate`, a read that had to hop."""
        return self._writer().queued

    @property
    def idle(self) -> bool:
        """Whether nothing is queued on or running on the writer thread: only then does
        the adapter use the writer's connection from the event loop."""
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
        """``fn(conn)`` on the writer thread with the writer's connection, alone and
        outside any transaction, after the calls queued before it (to set a pragma, or
        to look at the file from the writer's side). A cursor it returns is closed on
        the thread (see :mod:`intention_kernel.durability.sqlite._group`)."""
        conn = self._conn()
        return await self._writer().submit(lambda: fn(conn))

    async def write(self, fn: Callable[[sqlite3.Connection], T], *, atomic: bool = False) -> T:
        """``fn(conn)`` as a write of the adapter's own: inline or on the writer thread as
        the adapter's ``offload_writes`` decides, in a group there (on a
        :func:`grouping_durability`, always). ``fn`` never begins, commits or rolls back;
        ``atomic``: alone, it runs between ``BEGIN IMMEDIATE`` and ``COMMIT``, else each
        statement autocommits. Driver errors reach the caller as the adapter's
        ``StoreError``."""
        return await self._connections._run(fn, atomic=atomic)

    def connection(self) -> sqlite3.Connection:
        """The writer's connection, to use on the event loop while the writer thread is
        :attr:`idle`, as the adapter's own inline reads and writes do. Raises
        ``KernelError`` while a call is queued or running there: two threads would then
        use one connection at once."""
        conn = self._conn()
        if not self.idle:
            raise KernelError("the SQLite writer thread is busy: its connection is not free")
        return conn

    async def hold(self, let_go_after: float = 10.0) -> WriterGate:
        """Hold the writer thread until :meth:`WriterGate.release`, so that the writes
        queued meanwhile form one group; returns once the thread is held. A write
        queued before that could be taken from the queue with the gate, and run apart
        from the writes queued later. The gate lets go by itself after ``let_go_after``
        seconds, so that a failing test cannot hang the thread."""
        gate = WriterGate(self, let_go_after)
        await _until(gate._holding.is_set, lambda: "the writer thread did not take the gate")
        return gate


class WriterGate:
    """A call that keeps the writer thread waiting until it is released; the writes
    queued behind it run as one group when it is. Made by :meth:`WriterProbe.hold`,
    once it holds the thread."""

    def __init__(self, probe: WriterProbe, timeout: float) -> None:
        self._probe = probe
        self._released = threading.Event()
        self._holding = threading.Event()
        self._future = probe._writer().submit(lambda: self._hold(timeout))

    def _hold(self, timeout: float) -> bool:
        self._holding.set()
        return self._released.wait(timeout)

    async def wait_for_queued(self, count: int) -> None:
        """Until ``count`` calls wait behind the gate (a turn's commit is one); raises
        ``AssertionError`` if they are not there within :data:`QUEUE_WAIT` seconds."""
        probe = self._probe
        await _until(
            lambda: probe.queued > count,  # the gate itself is one more
            lambda: f"{probe.queued - 1} calls queued behind the gate, not {count}",
        )

    async def release(self) -> None:
        """Let the writer thread go, and wait until the gate has left it. Raises
        ``AssertionError`` if the gate had already let go by itself (its timeout): the
        writes behind it may then not have formed one group."""
        self._released.set()
        if not await self._future:
            raise AssertionError("the writer gate timed out before it was released")


async def _until(done: Callable[[], bool], failure: Callable[[], str]) -> None:
    """Until ``done()``, looked at every millisecond; ``AssertionError(failure())`` if
    it is still not after :data:`QUEUE_WAIT` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUEUE_WAIT
    while not done():
        if loop.time() > deadline:
            raise AssertionError(failure())
        await asyncio.sleep(0.001)


def _connections(durability: SQLiteDurability) -> SQLiteConnections:
    recorder = durability._recorder
    if not isinstance(recorder, SQLiteConnections):
        raise TypeError(f"not a SQLite adapter: {durability!r}")
    return recorder
