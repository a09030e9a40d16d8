"""An event loop on a daemon thread of its own, for callers that run none.

:class:`LoopThread` is the engine room of :class:`~intention_kernel.SyncKernel`. Plain
threads hand it coroutine functions; each call runs as a task on the one loop, and the
calling thread blocks until the task ends. Everything bound to the loop (a store's
connections, its asyncio locks, a pool's workers) is made, used and closed there.

A call runs in a copy of the caller's ``contextvars`` context: ``call_soon_threadsafe``
copies it, and the task made in that callback copies it again. An OpenTelemetry span
active in a request handler is then the parent of the turn's span.

A caller that stops waiting (``KeyboardInterrupt``, a timeout) cancels its task and
waits for the task to end before it raises. Without that wait, the process could exit
while a cancelled turn still settles its receipts.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class _Call(Generic[T]):
    """One call's task and outcome, handed between the caller and the loop thread."""

    __slots__ = ("done", "error", "result", "task")

    def __init__(self) -> None:
        # Released by the loop thread when the task ended: a bare lock is the cheapest
        # thing a thread can block on, and a signal interrupts the wait in the main thread.
        self.done = threading.Lock()
        self.done.acquire()
        self.task: asyncio.Task[T] | None = None
        self.result: T | None = None
        self.error: BaseException | None = None

    def finish(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self.error = asyncio.CancelledError()
        else:
            # Reading the exception marks it retrieved: asyncio logs no lost exception.
            self.error = task.exception()
            if self.error is None:
                self.result = task.result()
        self.done.release()

    def cancel(self) -> None:
        """On the loop thread, after the call started: cancel its task, if it still runs."""
        if self.task is not None:
            self.task.cancel()


class LoopThread:
    """One event loop, run forever by a daemon thread started at construction."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        *args: Any,
        timeout: float | None = None,
    ) -> T:
        """Await ``fn(*args)`` on the loop and return its result, or raise its error.

        After ``timeout`` seconds the task is cancelled, and ``TimeoutError`` raised once
        it ended, unless it finished with a result meanwhile (as ``asyncio.wait_for``).
        Any ``BaseException`` raised in the wait (``KeyboardInterrupt``) cancels the
        task the same way and is raised again once the task ended.
        """
        call: _Call[T] = _Call()

        def start() -> None:
            try:
                call.task = self.loop.create_task(fn(*args))
            except BaseException as error:  # fn itself refused its arguments
                call.error = error
                call.done.release()
                return
            call.task.add_done_callback(call.finish)

        self.loop.call_soon_threadsafe(start)
        try:
            if not call.done.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError(f"the call did not end within {timeout} seconds")
        except BaseException as interrupted:
            # ``start`` was queued before this cancel, and the loop runs callbacks in
            # order: the cancel finds the task that ``start`` made.
            self.loop.call_soon_threadsafe(call.cancel)
            call.done.acquire()
            if isinstance(interrupted, TimeoutError) and not isinstance(
                call.error, asyncio.CancelledError
            ):
                return _outcome(call)  # it ended on its own at the deadline
            raise
        return _outcome(call)

    def stop(self, last: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Await ``last()`` on the loop (it closes what lives there), then stop the loop
        and join its thread. Called from another thread, at most once."""
        try:
            self.call(_last_rites, last)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()

    def stop_soon(self, last: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """:meth:`stop` without waiting, from the loop's own thread (a finalizer that the
        garbage collector ran there): waiting would block the loop that must do it."""

        async def rites_then_stop() -> None:
            try:
                await _last_rites(last)
            finally:
                self.loop.stop()

        self.loop.create_task(rites_then_stop())


def _outcome(call: _Call[T]) -> T:
    if call.error is not None:
        # The task's own exception object: its type and traceback reach the caller.
        raise call.error
    return call.result  # type: ignore[return-value]  # set together with error=None


async def _last_rites(last: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``last``, then close the loop's async generators and its default executor
    (the threads of sync effect functions, which a cancelled turn may have left)."""
    await last()
    loop = asyncio.get_running_loop()
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
