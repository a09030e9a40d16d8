"""PostgreSQL thread leases: how a turn takes a thread, keeps it and lets it go.

An operator action or a relay takes a thread the same way. No session is held in
between.

A lease is a row of ``ik_leases``: an owner, a fencing epoch and an expiry on the
server's clock. Taking it is one statement. Every write of the holder names its
epoch in the same statement (``FENCE``). So a holder that lost it writes nothing
more. While the turn runs, the lease is renewed at least every third of its expiry
(one timer for all of an adapter's leases). A dead holder stops renewing, and its
thread is free once the lease expires.

Waiting: a turn that finds the thread busy polls with backoff, from 1 ms to 25 ms.
It borrows a pooled session for one statement at a time. So waiting turns never drain
the pool. Only one waiting turn of an adapter polls a thread; the others sleep until
it takes the thread. A turn of this adapter that lets a thread go wakes this
adapter's waiters at once. A release elsewhere is seen at the next poll.

Why polling, not ``LISTEN``/``NOTIFY`` (measured: ``bench/handoff.py``, README there).
A hand-off across processes takes 8 to 10 ms at p50 and 24 to 26 ms at p99, directly
and through PgBouncer. A waiting adapter sends about 48 statements a second per
busy thread, whatever its number of waiting turns. ``NOTIFY`` would have to be sent
by every release and commit. PostgreSQL serializes the commits of notifying
transactions on one lock, across the whole server. In the bench, 8 committing
clients fell from about 2,400 commits a second to about 450. Every turn would pay
that to spare the rare contended thread a poll. And a transaction pooler does not
carry ``LISTEN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar, Token
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

__all__ = ["AHEAD", "NO_LEASE", "Lease", "PostgresLeases"]

T = TypeVar("T")

_FIRST_WAIT = 0.001
_MAX_WAIT = 0.025

#: Set while a turn starts, a lease renews or stop checks are read together:
#: their statements queue ahead (see ``PostgresSessions._borrow``).
AHEAD: ContextVar[bool] = ContextVar("ik_lease_ahead", default=False)

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
    #: When its turn first waited for a session after its start (monotonic): the
    #: place of each later statement of the turn in the adapter's session queue.
    waited: float | None = field(default=None, repr=False)
    #: The renewal in flight.
    renewal: asyncio.Task[None] | None = field(default=None, repr=False)
    #: The renewal ticks seen since the lease was taken or its last renewal began.
    ticks: int = field(default=0, repr=False)
    #: What a fenced statement names: the lease row, its epoch and its owner. Made
    #: once; each statement copies it into its own parameters.
    params: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.params = {
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
        # Each lease is renewed every third of its expiry at most (see ``_tick``).
        self._tick_every = lease_expiry / 6
        self._renewing: dict[Lease, None] = {}  # every lease held, turn or relay
        self._ticker: asyncio.TimerHandle | None = None
        # Each acquisition gets an owner of its own. A release by owner then lets go of
        # exactly that grant, even one whose epoch never came back (see ``_acquire``).
        self._owner_prefix = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._grants = itertools.count(1)
        self._leases: dict[str, Lease] = {}  # turn leases, by thread
        # The turn lease the running task holds, seen by the tasks it starts too. A
        # write names that grant, not the adapter's newest lease on the thread. Say a
        # turn's lease lapsed while another turn of this adapter took the thread. The
        # first turn must not write under the newer grant.
        self._held: ContextVar[Lease | None] = ContextVar(f"ik_lease_{id(self)}", default=None)
        self._claims: dict[str, Lease] = {}  # relay claims, by thread
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._pollers: dict[str, str] = {}  # the owner of the one waiter polling, by thread

    def _priority(self) -> float:
        """Starts and renewals first; then a turn's statements by its first wait.

        See ``PostgresSessions._borrow`` for why."""
        now = time.monotonic()
        if AHEAD.get():
            return now - self._head_start
        lease = self._held.get()
        if lease is None:
            return now
        if lease.waited is None:
            lease.waited = now
        return lease.waited

    def _new_owner(self) -> str:
        return f"{self._owner_prefix}:{next(self._grants)}"

    def turn_lease(self, thread_id: str) -> Lease | None:
        """The turn lease on ``thread_id`` that the running task holds, else this
        adapter's (a caller outside the task that took it)."""
        lease = self._held.get()
        if lease is not None and lease.thread_id == thread_id:
            return lease
        return self._leases.get(thread_id)

    def lease_params(self, thread_id: str) -> dict[str, Any]:
        """The fence params of the turn lease on ``thread_id`` (see ``turn_lease``);
        without one, params that every fence refuses."""
        # ``turn_lease``, inline: three calls a turn ask it (the claim, the outcome and
        # the commit).
        lease = self._held.get()
        if lease is None or lease.thread_id != thread_id:
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

    def start_turn(
        self, thread_id: str, turn_id: str, known_version: int | None, *, wait: bool = True
    ) -> _TurnStarting:
        """The lease and ``begin_turn`` in one statement (see ``ik_start_turn_leased``).

        A committed turn comes back without a lease. So a replay is answered even with
        ``wait=False`` on a busy thread."""
        return _TurnStarting(self, thread_id, turn_id, known_version, wait)

    async def _acquire(
        self,
        thread_id: str,
        kind: str,
        owner: str,
        attempt: Callable[[Connection], Awaitable[tuple[int | None, T] | None]],
        queue: bool,
        *,
        tried: bool = False,
    ) -> tuple[int | None, T]:
        """Run ``attempt`` (a statement that takes the lease if it lapsed) until it answers.

        ``attempt`` answers ``None`` while another holder's lease is alive, else the
        epoch it took (``None``: it needed none) and what it read. ``queue=False``
        makes one attempt: ``ThreadBusyError`` once it answers ``None``. ``tried``:
        the caller made the first attempt as this would, and it answered ``None``.
        The lock timeout then counts from this call.

        Between attempts the turn sleeps with backoff, holding no session, or until a
        holder of this adapter lets the thread go. Only one waiting turn of this
        adapter polls a thread; the others sleep until a wake. An attempt interrupted in flight
        may have been granted on the server. Its owner releases the grant in the
        background. Else the grant would keep the thread until it expires.
        """
        deadline, wait = time.monotonic() + self._lock_timeout, _FIRST_WAIT
        try:
            while True:
                if tried:
                    tried = False
                else:
                    try:
                        # Repeatable: a retried attempt finds its own grant alive, and
                        # waits for it to lapse, which only costs time; the release
                        # below ends it.
                        got = await self._run(attempt)
                    except BaseException:
                        self._in_background(self._release_owner(thread_id, kind, owner))
                        raise
                    if got is not None:
                        return got
                if not queue:
                    raise ThreadBusyError(
                        f"thread {thread_id!r} is busy: another turn holds it",
                        thread_id=thread_id,
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ThreadLockTimeoutError(
                        f"thread {thread_id!r} stayed taken by another turn for "
                        f"{self._lock_timeout}s",
                        thread_id=thread_id,
                    )
                # One waiter of this adapter polls a thread; the others sleep until a
                # wake. Else the statements a busy thread costs grow with its waiters.
                if self._pollers.setdefault(thread_id, owner) == owner:
                    await self._nap(thread_id, min(wait * random.uniform(0.5, 1.0), remaining))
                    wait = min(wait * 2, _MAX_WAIT)
                else:
                    await self._nap(thread_id, remaining)
        finally:
            if self._pollers.get(thread_id) == owner:
                # The poller took the thread, gave up or was cancelled. Its peers wake,
                # and the first of them to find the thread busy polls from then on.
                del self._pollers[thread_id]
                self._wake(thread_id)

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

    def _holding(self, lease: Lease, held: dict[str, Lease]) -> _Holding:
        """Hold ``lease`` for the block: renewed while it runs, released at its end."""
        return _Holding(self, lease, held)

    def _hold(self, lease: Lease, held: dict[str, Lease]) -> Token[Lease | None] | None:
        """Start holding ``lease``; the token of the running task's turn lease, if set."""
        held[lease.thread_id] = lease
        token = self._held.set(lease) if held is self._leases else None
        self._renewing[lease] = None
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(self._tick_every, self._tick)
        return token

    async def _let_go(
        self, lease: Lease, held: dict[str, Lease], token: Token[Lease | None] | None
    ) -> None:
        """Stop holding ``lease``: no more renewals, and the lease row released."""
        if token is not None:
            with contextlib.suppress(ValueError):  # closed in another context
                self._held.reset(token)
        del self._renewing[lease]
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

    def _tick(self) -> None:
        """Renew each lease held since before the previous tick, then tick again.

        One timer for every lease this adapter holds, not one per lease. A timer per
        turn cost the turn about eighty calls. Most of them went to the event loop's
        heap, where every cancelled timer stays until it is due. A tick comes every
        sixth of the expiry. A lease is renewed at its second tick, so at most a
        third of the expiry after it was taken or last renewed. A renewal that fails
        for the store is tried again at the next tick, until the lease lapses. The
        fence judges every write meanwhile. With no lease held, the ticks stop.
        """
        self._ticker = None
        if not self._renewing:
            return
        for lease in self._renewing:
            if lease.lost or lease.renewal is not None:
                continue
            lease.ticks += 1
            if lease.ticks >= 2:
                lease.ticks = 0
                lease.renewal = asyncio.ensure_future(self._renew(lease))
        self._ticker = asyncio.get_running_loop().call_later(self._tick_every, self._tick)

    async def _renew(self, lease: Lease) -> None:
        """Extend ``lease`` from now. Cancelled when the holder lets go."""
        params = {**lease.params, "expiry": self._expiry}

        async def renew(conn: Connection) -> bool:
            row = await (await execute(conn, self._q(RENEW_LEASE), params)).fetchone()
            return row is not None

        AHEAD.set(True)  # a task of its own: nothing else runs in its context
        try:
            if not await self._run(renew):
                lease.lost = True  # lapsed or taken over: no renewal brings it back
        except StoreError:
            lease.ticks = 2  # tried again at the next tick
        finally:
            lease.renewal = None

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
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._background:
            await asyncio.wait(list(self._background))
        await super().close()


class _Holding:
    """The block that holds a lease (``PostgresLeases._holding``). A class, not a
    generator context manager: a turn crosses it, and a generator costs more calls."""

    __slots__ = ("_held", "_lease", "_leases", "_token")

    def __init__(self, leases: PostgresLeases, lease: Lease, held: dict[str, Lease]) -> None:
        self._leases, self._lease, self._held = leases, lease, held
        self._token: Token[Lease | None] | None = None

    async def __aenter__(self) -> Lease:
        self._token = self._leases._hold(self._lease, self._held)
        return self._lease

    async def __aexit__(self, *exc: object) -> None:
        await self._leases._let_go(self._lease, self._held, self._token)


class _TurnStarting:
    """The block of ``PostgresLeases.start_turn``: the lease and the thread's read in
    one statement, the lease held to the block's end. A class, as ``_Holding`` is."""

    __slots__ = ("_known", "_lease", "_leases", "_thread_id", "_token", "_turn_id", "_wait")

    def __init__(
        self,
        leases: PostgresLeases,
        thread_id: str,
        turn_id: str,
        known_version: int | None,
        wait: bool,
    ) -> None:
        self._leases, self._thread_id, self._turn_id = leases, thread_id, turn_id
        self._known, self._wait = known_version, wait
        self._lease: Lease | None = None
        self._token: Token[Lease | None] | None = None

    async def __aenter__(self) -> TurnStart:
        leases, thread_id = self._leases, self._thread_id
        owner = leases._new_owner()
        params = {
            "thread_id": thread_id,
            "turn_id": self._turn_id,
            "known_version": self._known,
            "owner": owner,
            "expiry": leases._expiry,
        }
        statement = leases._sql[START_TURN]

        async def attempt(conn: Connection) -> tuple[int | None, TurnStart] | None:
            row = await (await execute(conn, statement, params)).fetchone()
            return None if row is None else (row[0], turn_start(row[1:]))

        # Most threads are free: the first attempt without ``_acquire``'s frame, which
        # every statement's answer would resume, and its clock and poller bookkeeping.
        ahead = AHEAD.set(True)  # a start queues ahead for a session
        try:
            try:
                got = await leases._run(attempt)
            except BaseException:  # as ``_acquire`` does: a grant in flight is released
                leases._in_background(leases._release_owner(thread_id, "turn", owner))
                raise
            if got is None:
                got = await leases._acquire(
                    thread_id, "turn", owner, attempt, self._wait, tried=True
                )
        finally:
            AHEAD.reset(ahead)
        epoch, start = got
        if epoch is not None:  # else a committed turn, read without a lease
            lease = self._lease = Lease(thread_id, "turn", owner, epoch)
            self._token = leases._hold(lease, leases._leases)
        return start

    async def __aexit__(self, *exc: object) -> None:
        lease = self._lease
        if lease is not None:
            await self._leases._let_go(lease, self._leases._leases, self._token)


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
