"""One worker thread that runs blocking calls in order, handed off cheaply.

Why not ``loop.run_in_executor`` with a one-thread ``ThreadPoolExecutor``: that
wraps every call in a ``concurrent.futures.Future`` and then in an asyncio future
chained to it, which measured about twice the cost of this hand-off (a queue put,
and one ``call_soon_threadsafe`` back) on a two-core machine — and a turn makes a
hop per commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

__all__ = ["WorkerThread"]

T = TypeVar("T")
_Job = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class WorkerThread:
    """Runs submitted calls one at a time, in submission order, on its own thread.

    A submitted call always runs to its end, even if its future is cancelled.
    """

    def __init__(self, name: str) -> None:
        self._jobs: SimpleQueue[_Job | None] = SimpleQueue()
        # A daemon: an adapter that is never closed must not keep the process alive.
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, future, loop))
        return future

    def close(self) -> None:
        """Finish the calls already submitted, then stop the thread."""
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future, loop = job
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting task, not swallowed
                _settle(loop, future, None, exc)
            else:
                _settle(loop, future, result, None)


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    exc: BaseException | None,
) -> None:
    def settle() -> None:
        if future.done():  # cancelled by a caller that stopped waiting
            return
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        loop.call_soon_threadsafe(settle)
