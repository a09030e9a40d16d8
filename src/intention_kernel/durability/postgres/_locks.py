"""PostgreSQL thread locks and relay claims: session-level advisory locks, held on
one pooled session from a turn's start to its commit."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from intention_kernel.durability.abc import TurnStart
from intention_kernel.durability.postgres._schema import START_TURN, turn_start
from intention_kernel.durability.postgres._sessions import (
    IDLE,
    Claim,
    Connection,
    Held,
    PostgresSessions,
    advisory_key,
    execute,
    fetch_value,
    translated,
)
from intention_kernel.durability.postgres._statements import TRY_LOCK, UNLOCK
from intention_kernel.errors import ThreadBusyError, ThreadLockTimeoutError

__all__ = ["PostgresLocks"]

T = TypeVar("T")

_FIRST_WAIT = 0.001
_MAX_WAIT = 0.01


class PostgresLocks(PostgresSessions):
    """The sessions, and the thread locks and relay claims held on them."""

    # -- the thread lock -----------------------------------------------------------------------

    def _thread_key(self, thread_id: str) -> int:
        return advisory_key("thread", self._schema, thread_id)

    @asynccontextmanager
    async def lock(self, thread_id: str, *, wait: bool = True) -> AsyncIterator[object]:
        key = self._thread_key(thread_id)

        async def try_lock(conn: Connection) -> tuple[bool, None] | None:
            return (True, None) if await fetch_value(conn, TRY_LOCK, key) else None

        with translated():
            conn, _ = await self._acquire(thread_id, try_lock, wait)
        assert conn is not None  # try_lock answers only once it holds the lock
        async with self._holding(thread_id, key, conn) as held:
            yield held

    @asynccontextmanager
    async def start_turn(
        self, thread_id: str, turn_id: str, known_version: int | None, *, wait: bool = True
    ) -> AsyncIterator[TurnStart]:
        """The thread lock and ``begin_turn`` in one statement (see START_TURN_FUNCTION);
        a committed turn comes back without the lock (so a replay is answered even with
        ``wait=False`` on a busy thread)."""
        key = self._thread_key(thread_id)
        params = {
            "lock": key,
            "thread_id": thread_id,
            "turn_id": turn_id,
            "known_version": known_version,
        }

        async def attempt(conn: Connection) -> tuple[bool, TurnStart] | None:
            row = await (await execute(conn, START_TURN, params)).fetchone()
            return None if row is None else (row[0], turn_start(row[1:]))

        with translated():
            conn, start = await self._acquire(thread_id, attempt, wait)
        if conn is None:  # a committed turn, read without the lock
            yield start
            return
        async with self._holding(thread_id, key, conn):
            yield start

    @asynccontextmanager
    async def _holding(self, thread_id: str, key: int, conn: Connection) -> AsyncIterator[Held]:
        """Hold the thread lock that ``conn`` was granted for the block, then release it."""
        held = self._held[thread_id] = Held(conn, key)
        interrupted = True  # by a cancellation (or an exit): anything but an Exception
        try:
            yield held
            interrupted = False
        except Exception:
            interrupted = False
            raise
        finally:
            # Another turn of this process may hold the thread already, if the commit
            # statement released it: only this turn's entry goes.
            if self._held.get(thread_id) is held:
                del self._held[thread_id]
            if not interrupted and not held.mutex.locked():
                # The usual end: no hop is running, so nothing here waits but UNLOCK,
                # and a cancellation during it makes ``_release`` close the session.
                await self._release(held, key, unlock=True)
            else:
                # Shielded, so that a cancelled turn (or one whose hops still run, which
                # the release waits for) still closes or unlocks the session before
                # anything else can borrow it. An interrupted turn's session is closed,
                # not unlocked: nothing is sent on behalf of a task being cancelled.
                release = asyncio.ensure_future(self._release(held, key, unlock=not interrupted))
                try:
                    await asyncio.shield(release)
                except asyncio.CancelledError:
                    await asyncio.wait([release])  # unlike ``await``, never cancels it
                    raise

    async def _acquire(
        self,
        thread_id: str,
        attempt: Callable[[Connection], Awaitable[tuple[bool, T] | None]],
        queue: bool = True,
    ) -> tuple[Connection | None, T]:
        """Poll ``attempt`` (a statement that tries ``pg_try_advisory_lock``) with backoff.

        ``attempt`` answers ``None`` while another session holds the lock, else
        whether it took the lock and what it read. Returns the session holding the
        lock, or ``None`` (back in the pool) if ``attempt`` had no need of it.
        ``queue=False`` makes one attempt: ``ThreadBusyError`` once it answers ``None``.

        Polling, not a blocking ``pg_advisory_lock``: an abandoned wait can never
        leave a lock granted behind our back. Between polls the session goes back
        to the pool, so turns queued on a hot thread cannot drain it.
        """
        deadline, wait = time.monotonic() + self._lock_timeout, _FIRST_WAIT
        seen_busy = False
        while True:
            # The wait for a session has its own bound, ``pool_timeout``: were it the
            # lock's, a short ``lock_timeout`` would fail turns on idle threads while
            # the pool opens a session for them. Once the thread was seen busy, a poll
            # waits for a session only until the lock's deadline, which then means busy.
            remaining = deadline - time.monotonic()
            bounded = seen_busy and remaining < self._pool_timeout
            try:
                conn = await self._pool.getconn(
                    max(remaining, 0.001) if bounded else self._pool_timeout
                )
            except PoolTimeout:
                if bounded:
                    raise self._busy(thread_id) from None
                raise
            try:
                got = await attempt(conn)
            except BaseException as exc:
                dead = isinstance(exc, psycopg.OperationalError) and conn.broken
                if not dead:
                    # Interrupted mid-statement, the lock may have been granted: only a
                    # closed session surely holds none, so this one never goes back.
                    await conn.close()
                await self._pool.putconn(conn)
                if dead:  # a dead idle session (server restart) held no lock: try again
                    continue
                raise
            if got is not None and got[0]:
                return conn, got[1]
            await self._pool.putconn(conn)
            if got is not None:
                return None, got[1]
            if not queue:
                raise ThreadBusyError(
                    f"thread {thread_id!r} is busy: another turn holds it", thread_id=thread_id
                )
            seen_busy = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._busy(thread_id)
            await asyncio.sleep(min(wait * random.uniform(0.5, 1.0), remaining))
            wait = min(wait * 2, _MAX_WAIT)

    def _busy(self, thread_id: str) -> ThreadLockTimeoutError:
        return ThreadLockTimeoutError(
            f"thread {thread_id!r} stayed locked by another turn for {self._lock_timeout}s",
            thread_id=thread_id,
        )

    async def _give_back_dead(self, held: Held) -> bool:
        """Whether the lock's session died; if so, give it back to the pool now (closed),
        so that its slot can serve another session even when the pool is full."""
        async with held.mutex:
            conn = held.conn
            if conn is None or held.returned or not conn.broken:
                return held.returned
            held.returned = True
            await conn.close()
            await self._pool.putconn(conn)
            return True

    async def _release(self, held: Held, key: int, *, unlock: bool) -> None:
        """Give the session back to the pool without the thread lock: unlocked, or else
        closed (the server drops a closed session's locks and rolls back whatever it
        left open)."""
        async with held.mutex:  # after any hop still running on the session
            conn, held.conn = held.conn, None
            assert conn is not None
            if held.returned:
                return
            clean = False
            try:
                if unlock:
                    if not held.committed:
                        # False if the session did not hold it any more (a failed commit
                        # may have released it): either way, it holds no lock now.
                        await fetch_value(conn, UNLOCK, key)
                    clean = conn.info.transaction_status == IDLE
            except psycopg.Error:
                pass  # the session is gone, and its lock with it
            finally:
                if not clean:
                    # A session that may still hold the lock must never go back to the
                    # pool: its next borrower would own this thread for as long as it
                    # lives. (Neither closing nor returning a closed session waits.)
                    await conn.close()
                await self._pool.putconn(conn)

    # -- the outbox relay ----------------------------------------------------------------------

    @asynccontextmanager
    async def claim_outbox(self, thread_id: str) -> AsyncIterator[bool]:
        # A session advisory lock in a key space of its own ("relay", not "thread"):
        # relays exclude each other on every host, never a turn, and the server drops
        # a dead relay's claims with its session.
        #
        # The claim's reads and marks run on the session holding it (``_on_claim``):
        # were they to borrow other sessions, claims holding every pooled session
        # would wait on one another for a session none gives back, until PoolTimeout.
        # And at most max_pool_size - 1 claims hold sessions at once (the rest queue
        # here, without a timeout), leaving one for the relay's polls and the turns
        # of an application sharing the adapter, whatever the relay's concurrency.
        key = advisory_key("relay", self._schema, thread_id)
        async with self._claim_slots:
            with translated():
                conn = await self._pool.getconn()
                try:
                    claimed = bool(await fetch_value(conn, TRY_LOCK, key))
                except BaseException:
                    await conn.close()  # interrupted mid-statement: it may hold the lock
                    await self._pool.putconn(conn)
                    raise
            if not claimed:
                await self._pool.putconn(conn)
                yield False
                return
            claim = self._claims[thread_id] = Claim(conn)
            try:
                yield True
            finally:
                if self._claims.get(thread_id) is claim:
                    del self._claims[thread_id]
                release = asyncio.ensure_future(self._unclaim(claim, key))
                try:
                    await asyncio.shield(release)
                except asyncio.CancelledError:
                    await asyncio.wait([release])
                    raise

    async def _unclaim(self, claim: Claim, key: int) -> None:
        async with claim.mutex:  # after a read or mark still running on the session
            conn, claim.conn = claim.conn, None
            assert conn is not None
            try:
                unlocked = await fetch_value(conn, UNLOCK, key)
                clean = unlocked and conn.info.transaction_status == IDLE
            except psycopg.Error:
                clean = False
            if not clean:  # never pool a session that may still hold the claim
                await conn.close()
            await self._pool.putconn(conn)

    async def _on_claim(self, thread_id: str, hop: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``hop`` on the session holding this adapter's claim of ``thread_id``; if
        there is none (or it was just released), on a pooled one."""
        claim = self._claims.get(thread_id)
        if claim is not None:
            with translated():
                async with claim.mutex:
                    if claim.conn is not None:
                        return await hop(claim.conn)
        return await self._run(None, hop)
