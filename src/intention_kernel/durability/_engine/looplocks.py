"""Thread locks of a store private to one event loop: the in-memory adapter's, and a
SQLite ``:memory:`` database's. One ``asyncio.Lock`` per thread, and a count of the
turns that hold or wait for it, for the one-attempt acquire of ``wait=False``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from intention_kernel.errors import ThreadBusyError, ThreadLockTimeoutError

__all__ = ["LoopLocks"]


class LoopLocks:
    """Per-thread locks; see the module docstring."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        # Turns holding or queued for each thread's lock. ``Lock.locked()`` alone is not
        # enough for ``wait=False``. A released lock with queued turns is promised to
        # the first of them. An acquire would queue behind them all.
        self._wanted: dict[str, int] = {}

    @asynccontextmanager
    async def hold(
        self, thread_id: str, wait_seconds: float | None, *, wait: bool = True
    ) -> AsyncIterator[asyncio.Lock]:
        """Hold the thread's lock for the block. ``ThreadBusyError`` after ``wait_seconds``
        seconds of waiting (``None``: no bound), or at once with ``wait=False`` while
        another turn holds or waits for it."""
        if not wait and self._wanted.get(thread_id):
            raise ThreadBusyError(
                f"thread {thread_id!r} is busy: another turn holds it", thread_id=thread_id
            )
        lock = self._locks.setdefault(thread_id, asyncio.Lock())
        self._wanted[thread_id] = self._wanted.get(thread_id, 0) + 1
        try:
            try:
                if wait_seconds is not None and lock.locked():
                    # ``wait_for`` runs the wait in a task: only when there is a wait.
                    await asyncio.wait_for(lock.acquire(), wait_seconds)
                else:
                    await lock.acquire()  # at once when nobody wants it (``wait=False``)
            except TimeoutError:
                raise ThreadLockTimeoutError(
                    f"thread {thread_id!r} stayed busy for {wait_seconds}s", thread_id=thread_id
                ) from None
            try:
                yield lock
            finally:
                lock.release()
        finally:
            left = self._wanted[thread_id] - 1
            if left:
                self._wanted[thread_id] = left
            else:
                del self._wanted[thread_id]
