"""PostgreSQL thread leases: how a turn (or an operator action, or a relay) takes a
thread, keeps it while it runs, and lets it go, holding no session in between.

A lease is a row of ``ik_leases``: an owner, a fencing epoch and an expiry on the
server's clock. Taking it is one statement, and every write of the holder names its
epoch in the same statement (``FENCE``), so a holder that lost it writes nothing
more. While the turn runs, a timer renews the lease every third of its expiry. A dead
holder stops renewing, and its thread is free once the lease expires.

Waiting: a turn that finds the thread busy polls with backoff, on a pooled session
borrowed for one statement at a time, so waiting turns never drain the pool. A turn
of this adapter that lets a thread go wakes this adapter's waiters at once; a
worker elsewhere is seen at the next poll.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from intention_kernel.durability.abc import TurnStart
from intention_kernel.durability.postgres._schema import START_TURN, turn_start
from intention_kernel.durability.postgres._sessions import (
    Connection,
    PostgresSessions,
    execute,
    translated,
)
from intention_kernel.durability.postgres._statements import (
    RELEASE_LEASE,
    RENEW_LEASE,
    TAKE_LEASE,
)
from intention_kernel.errors import StoreError, ThreadBusyError, ThreadLockTimeoutError

__all__ = ["Lease", "PostgresLeases"]

T = TypeVar("T")

_FIRST_WAIT = 0.001
_MAX_WAIT = 0.025

#: The params of a lease nobody holds: every fenced write naming it is refused.
NO_LEASE = {"lease_kind": "turn", "lease_epoch": 0, "lease_owner": ""}


@dataclass(eq=False)
class Lease:
    """A lease this adapter holds. ``committed``: the turn's commit released it already.
    ``lost``: a renewal found it lapsed or taken over (the fence refuses its writes)."""

    thread_id: str
    kind: str
    owner: str
    epoch: int
    committed: bool = False
    lost: bool = False
    #: The timer of the next renewal, or the renewal in flight.
    renewal: asyncio.TimerHandle | asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def params(self) -> dict[str, Any]:
        """What a fenced statement names: the lease row, its epoch and its owner."""
        return {
            "thread_id": self.thread_id,
            "lease_kind": self.kind,
            "lease_epoch": self.epoch,
            "lease_owner": self.owner,
        }


class PostgresLeases(PostgresSessions):
    """The sessions, and the thread leases and relay claims taken through them."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        lock_timeout: float,
        pool_size: tuple[int, int],
        timeout: float,
        connect_timeout: float | None,
        lease_expiry: float,
    ) -> None:
        super().__init__(dsn, schema, lock_timeout, pool_size, timeout, connect_timeout)
        self._expiry = timedelta(seconds=lease_expiry)
        self._renew_every = lease_expiry / 3
        # Each acquisition gets an owner of its own: a release by owner then lets go of
        # exactly that grant, even one whose epoch never came back (see ``_acquire``).
        self._owner_prefix = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._grants = itertools.count(1)
        self._leases: dict[str, Lease] = {}  # turn leases, by thread
        self._claims: dict[str, Lease] = {}  # relay claims, by thread
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._background: set[asyncio.Task[Any]] = set()

    def _new_owner(self) -> str:
        return f"{self._owner_prefix}:{next(self._grants)}"

    def lease_params(self, thread_id: str) -> dict[str, Any]:
        """The fence params of this adapter's turn lease on ``thread_id``; without one,
        params that every fence refuses."""
        lease = self._leases.get(thread_id)
        return lease.params if lease is not None else {"thread_id": thread_id, **NO_LEASE}

    # -- taking a thread -----------------------------------------------------------------------

    @asynccontextmanager
    async def lock(self, thread_id: str, *, wait: bool = True) -> AsyncIterator[Lease]:
        owner = self._new_owner()
        params = {
            "thread_id": thread_id,
            "lease_kind": "turn",
            "lease_owner": owner,
            "expiry": self._expiry,
        }

        async def take(conn: Connection) -> tuple[int, None] | None:
            row = await (await execute(conn, self._q(TAKE_LEASE), params)).fetchone()
            return None if row is None else (row[0], None)

        epoch, _ = await self._acquire(thread_id, "turn", owner, take, wait)
        assert epoch is not None
        lease = Lease(thread_id, "turn", owner, epoch)
        async with self._holding(lease, self._leases):
            yield lease

    @asynccontextmanager
    async def start_turn(
        self, thread_id: str, turn_id: str, known_version: int | None, *, wait: bool = True
    ) -> AsyncIterator[TurnStart]:
        """The lease and ``begin_turn`` in one statement (see ``ik_start_turn_leased``);
        a committed turn comes back without a lease (so a replay is answered even with
        ``wait=False`` on a busy thread)."""
        owner = self._new_owner()
        params = {
            "thread_id": thread_id,
            "turn_id": turn_id,
            "known_version": known_version,
            "owner": owner,
            "expiry": self._expiry,
        }

        async def attempt(conn: Connection) -> tuple[int | None, TurnStart] | None:
            row = await (await execute(conn, self._q(START_TURN), params)).fetchone()
            return None if row is None else (row[0], turn_start(row[1:]))

        epoch, start = await self._acquire(thread_id, "turn", owner, attempt, wait)
        if epoch is None:  # a committed turn, read without a lease
            yield start
            return
        async with self._holding(Lease(thread_id, "turn", owner, epoch), self._leases):
            yield start

    async def _acquire(
        self,
        thread_id: str,
        kind: str,
        owner: str,
        attempt: Callable[[Connection], Awaitable[tuple[int | None, T] | None]],
        queue: bool,
    ) -> tuple[int | None, T]:
        """Run ``attempt`` (a statement that takes the lease if it lapsed) until it answers.

        ``attempt`` answers ``None`` while another holder's lease is alive, else the
        epoch it took (``None``: it needed none) and what it read. ``queue=False``
        makes one attempt: ``ThreadBusyError`` once it answers ``None``.

        Between attempts the turn sleeps with backoff, holding no session, or until a
        holder of this adapter lets the thread go. An attempt interrupted in flight
        may have been granted on the server: the grant is released by its owner in
        the background (else it would keep the thread until it expires).
        """
        deadline, wait = time.monotonic() + self._lock_timeout, _FIRST_WAIT
        while True:
            try:
                # Repeatable: a retried attempt finds its own grant alive, and waits
                # for it to lapse, which only costs time; the release below ends it.
                got = await self._run(attempt)
            except BaseException:
                self._in_background(self._release_owner(thread_id, kind, owner))
                raise
            if got is not None:
                return got
            if not queue:
                raise ThreadBusyError(
                    f"thread {thread_id!r} is busy: another turn holds it", thread_id=thread_id
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ThreadLockTimeoutError(
                    f"thread {thread_id!r} stayed taken by another turn for {self._lock_timeout}s",
                    thread_id=thread_id,
                )
            await self._nap(thread_id, min(wait * random.uniform(0.5, 1.0), remaining))
            wait = min(wait * 2, _MAX_WAIT)

    async def _nap(self, thread_id: str, seconds: float) -> None:
        """Sleep ``seconds``, or less if a holder of this adapter lets the thread go."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        waiters = self._waiters.setdefault(thread_id, [])
        waiters.append(woken)
        timer = loop.call_later(seconds, _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()
            if woken in waiters:  # not woken by ``_wake``, which takes the whole list
                waiters.remove(woken)
                if not waiters and self._waiters.get(thread_id) is waiters:
                    del self._waiters[thread_id]

    def _wake(self, thread_id: str) -> None:
        for woken in self._waiters.pop(thread_id, ()):
            _wake(woken)

    # -- holding it ----------------------------------------------------------------------------

    @asynccontextmanager
    async def _holding(self, lease: Lease, held: dict[str, Lease]) -> AsyncIterator[Lease]:
        """Hold ``lease`` for the block: renewed while it runs, released at its end."""
        held[lease.thread_id] = lease
        self._renew_later(lease)
        try:
            yield lease
        finally:
            if lease.renewal is not None:
                lease.renewal.cancel()
                lease.renewal = None
            if held.get(lease.thread_id) is lease:
                del held[lease.thread_id]
            if lease.committed or lease.lost:  # let go already, or lapsed
                self._wake(lease.thread_id)
            else:
                # Shielded, so that a cancelled turn still lets go of its thread; a
                # release that fails leaves the lease to lapse at its expiry.
                release = asyncio.ensure_future(
                    self._release_owner(lease.thread_id, lease.kind, lease.owner)
                )
                try:
                    await asyncio.shield(release)
                except asyncio.CancelledError:
                    await asyncio.wait([release])  # unlike ``await``, never cancels it
                    raise

    def _renew_later(self, lease: Lease) -> None:
        """Renew ``lease`` in a third of its expiry. A timer, not a task that sleeps: most
        turns end before it is due, and a timer costs a turn far fewer calls."""
        loop = asyncio.get_running_loop()
        lease.renewal = loop.call_later(self._renew_every, self._renew_now, lease)

    def _renew_now(self, lease: Lease) -> None:
        lease.renewal = asyncio.ensure_future(self._renew(lease))

    async def _renew(self, lease: Lease) -> None:
        """Extend ``lease`` from now, then schedule the next renewal. A renewal that fails
        for the store is tried again at the next interval, until the lease lapses; the
        fence judges every write meanwhile. Cancelled when the holder lets go."""
        params = {**lease.params, "expiry": self._expiry}

        async def renew(conn: Connection) -> bool:
            row = await (await execute(conn, self._q(RENEW_LEASE), params)).fetchone()
            return row is not None

        try:
            if not await self._run(renew):
                lease.lost = True  # lapsed or taken over: no renewal brings it back
                lease.renewal = None
                return
        except StoreError:
            pass
        self._renew_later(lease)

    async def _release_owner(self, thread_id: str, kind: str, owner: str) -> None:
        params = {"thread_id": thread_id, "lease_kind": kind, "lease_owner": owner}

        async def release(conn: Connection) -> None:
            await execute(conn, self._q(RELEASE_LEASE), params)

        try:
            with translated():
                await self._run(release)
        except StoreError:
            pass  # the lease lapses at its expiry
        finally:
            self._wake(thread_id)

    def _in_background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)  # held, so that it is not collected mid-way
        task.add_done_callback(self._background.discard)

    # -- the outbox relay ----------------------------------------------------------------------

    @asynccontextmanager
    async def claim_outbox(self, thread_id: str) -> AsyncIterator[bool]:
        # A lease of kind 'relay': relays exclude each other on every host, never a
        # turn, and a dead relay's claim lapses at its expiry. Its marks are fenced
        # by it (MARK_PUBLISHED), so a relay that lost its claim marks nothing.
        owner = self._new_owner()
        params = {
            "thread_id": thread_id,
            "lease_kind": "relay",
            "lease_owner": owner,
            "expiry": self._expiry,
        }

        async def take(conn: Connection) -> tuple[int, None] | None:
            row = await (await execute(conn, self._q(TAKE_LEASE), params)).fetchone()
            return None if row is None else (row[0], None)

        try:
            epoch, _ = await self._acquire(thread_id, "relay", owner, take, False)
        except ThreadBusyError:
            yield False
            return
        assert epoch is not None
        async with self._holding(Lease(thread_id, "relay", owner, epoch), self._claims):
            yield True

    def claim_params(self, thread_id: str) -> dict[str, Any]:
        """The fence params of this adapter's relay claim of ``thread_id``."""
        claim = self._claims.get(thread_id)
        if claim is not None:
            return claim.params
        return {"thread_id": thread_id, **NO_LEASE, "lease_kind": "relay"}

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background))
        await super().close()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
