"""An event loop on a daemon thread of its own, for callers that run none.

:class:`LoopThread` is the engine room of :class:`~intention_kernel.SyncKernel`. Plain
threads hand it coroutine functions. Each call runs as a task on the one loop. The
calling thread blocks until the task ends. Everything bound to the loop (a store's
connections, its asyncio locks, a pool's workers) is made, used and closed there.

A call runs in a copy of the caller's ``contextvars`` context: ``call_soon_threadsafe``
copies it, and the task made in that callback copies it again. An OpenTelemetry span
active in a request handler is then the parent of the turn's span.

A caller that stops waiting (``KeyboardInterrupt``, a timeout) cancels its task and
waits for the task to end before it raises. Without that wait, the process could exit
while a cancelled turn still settles its receipts.

The caller drives the loop itself when nothing else runs on it. Handing each call to
the loop's thread costs two thread switches and a wake-up through the loop's
self-pipe. That is 45 to 80 µs of CPU a call, up to a fifth of a SQLite turn. So one
loop has one driver at a time, under a lock. The driver is the calling thread when
the loop was idle, else the loop's own thread. A caller that finds the loop idle runs
it in its own thread, until its task ends. Work may be left then: another caller's
task, a timer, a turn that runs on behind a closed stream. It goes to the loop's
thread, which runs it until the loop is idle again. Anything scheduled from another thread meanwhile
(``call_soon_threadsafe``) wakes the loop's thread if no one drives.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C functions, without its enums
import asyncio
import contextvars
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar, TypeVarTuple, Unpack

__all__ = ["LoopThread"]

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")


class _Call(Generic[T]):
    """One call's task and outcome, handed between the caller and the loop thread."""

    __slots__ = ("done", "error", "result", "task")

    def __init__(self) -> None:
        # Released by the loop thread when the task ended. A bare lock is the cheapest
        # thing a thread can block on. A signal interrupts the wait in the main thread.
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


class _Loop(asyncio.SelectorEventLoop):
    """The standard selector loop, which wakes its owner's thread for work that another
    thread schedules while no thread drives it."""

    def __init__(self, owner: LoopThread) -> None:
        super().__init__()
        self._owner = owner

    def call_soon_threadsafe(
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        handle = super().call_soon_threadsafe(callback, *args, context=context)
        self._owner._wake()
        return handle


def _can_drive_in_caller() -> bool:
    """Whether the loop may be driven by its callers.

    The default policy's loop must be the selector loop this module extends. It is not
    on Windows, nor under uvloop's policy."""
    return sys.platform != "win32" and type(asyncio.get_event_loop_policy()) is (
        asyncio.DefaultEventLoopPolicy
    )


class LoopThread:
    """One event loop and a daemon thread started at construction, which runs the loop
    whenever no caller does (see the module's docstring)."""

    def __init__(self, name: str) -> None:
        # Guards ``_driver`` and ``_exit``; reentrant, since waking the loop thread
        # (``_wake``) may happen inside it, through ``call_soon_threadsafe``.
        self._state = threading.Condition(threading.RLock())
        self._driver: int | None = None  # the ident of the thread that runs the loop
        self._exit = False
        self._idle_check: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task[Any]] = []  # the loop's tasks, ended ones pruned
        self._borrowable = _can_drive_in_caller()
        self.loop: asyncio.AbstractEventLoop = (
            _Loop(self) if self._borrowable else asyncio.new_event_loop()
        )
        if self._borrowable:
            self.loop.set_task_factory(self._new_task)  # type: ignore[arg-type]
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ident = self._thread.ident
        _loop_threads.add(self)
        if not self._borrowable:
            self._wake()  # the loop's thread runs the loop forever, as it always did

    # -- the loop's own thread --------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        me = threading.get_ident()
        try:
            while True:
                with self._state:
                    while self._driver != me and not (self._exit and self._driver is None):
                        self._state.wait()
                    if self._driver != me or self._exit:
                        self._driver = me  # closing: no caller drives a closed loop
                        return
                if self._borrowable:
                    self.loop.call_soon(self._stop_when_idle)
                self.loop.run_forever()
                with self._state:
                    if self._exit:
                        return
                    if not self._has_work():
                        self._driver = None
        finally:
            self.loop.close()

    def _wake(self) -> None:
        """Work was scheduled: the loop's thread runs it, unless a thread drives."""
        with self._state:
            if self._driver is None:
                self._driver = self._ident
                self._state.notify_all()

    def _has_work(self) -> bool:
        """Whether anything is left to run: a task, a callback or a timer. Under
        ``_state``, by the thread that drives the loop, once it stopped."""
        loop: Any = self.loop
        if not self._borrowable or self._running_tasks() or loop._ready:
            return True
        return any(not timer.cancelled() for timer in loop._scheduled)

    def _running_tasks(self) -> list[asyncio.Task[Any]]:
        """The loop's tasks that have not ended; by the thread that drives the loop."""
        tasks = self._tasks
        if tasks:
            tasks = self._tasks = [task for task in tasks if not task.done()]
        return tasks

    def _new_task(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], **kwargs: Any
    ) -> asyncio.Task[T]:
        """The loop's task factory: a plain task, listed until it ended. Tasks are made
        on the thread that drives the loop, which alone lists them. No done callback:
        a finished task then leaves nothing to run, and its caller stops at once."""
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self._tasks.append(task)
        return task

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        if self._driver == self._ident:
            self._stop_when_idle()

    def _stop_when_idle(self) -> None:
        """On the loop's thread: stop the loop once nothing is left to run.

        This is checked again when the last task ends or the next timer is due."""
        loop: Any = self.loop
        if self._idle_check is not None:
            self._idle_check.cancel()
            self._idle_check = None
        tasks = self._running_tasks()
        if tasks:
            for task in tasks:  # each task's end checks again, once
                task.remove_done_callback(self._task_ended)
                task.add_done_callback(self._task_ended)
            return
        timers = [timer.when() for timer in loop._scheduled if not timer.cancelled()]
        if timers:
            self._idle_check = loop.call_at(min(timers), self._stop_when_idle)
        elif loop._ready:
            loop.call_soon(self._stop_when_idle)  # after what is ready now
        else:
            loop.stop()

    def in_loop_thread(self) -> bool:
        """Whether this thread runs the loop now: its own thread, or a caller driving it."""
        me = threading.get_ident()
        return me == self._ident or me == self._driver

    # -- the callers ------------------------------------------------------------------------

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
        # A thread that runs a loop of its own cannot drive this one too.
        if timeout is None and self._borrowable and asyncio._get_running_loop() is None:
            me = threading.get_ident()
            with self._state:
                idle = self._driver is None and not self._exit
                if idle:
                    self._driver = me
            if idle:
                return self._drive(fn, args)
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

    def _drive(self, fn: Callable[..., Coroutine[Any, Any, T]], args: tuple[Any, ...]) -> T:
        """Run the loop in the calling thread, which drives it, until ``fn(*args)`` ended."""
        loop = self.loop
        interrupted = False
        task: asyncio.Task[T] | None = None

        def on_sigint(signum: int, frame: Any) -> None:
            # As ``asyncio.Runner`` does: the first Ctrl-C cancels the call's task, a
            # second one raises at once.
            nonlocal interrupted
            if interrupted or task is None or task.done():
                raise KeyboardInterrupt
            interrupted = True
            task.cancel()
            loop.call_soon_threadsafe(_nothing)  # wakes a loop that waits in select()

        sigint = None
        if threading.current_thread() is threading.main_thread():
            sigint = _signal.getsignal(_SIGINT)
            if sigint is signal.default_int_handler:
                _signal.signal(_SIGINT, on_sigint)
            else:
                sigint = None  # the application's own handler stays in charge
        try:
            task = loop.create_task(fn(*args))
            try:
                # One pass of the loop first. A turn that never waits (SQLite, one
                # caller) ends within it. Nothing is left to run after it.
                loop.stop()
                loop.run_forever()
                if not task.done():
                    loop.run_until_complete(task)
                result = task.result()
            except BaseException:
                if not task.done():  # something outside the task stopped the loop
                    task.cancel()
                    loop.run_until_complete(_ended(task))
                if interrupted:
                    raise KeyboardInterrupt from None
                raise
            if interrupted:  # the task ended on its own before the cancel reached it
                raise KeyboardInterrupt
            return result
        finally:
            if sigint is not None:
                _signal.signal(_SIGINT, sigint)
            with self._state:
                if self._has_work() or self._exit:
                    self._driver = self._ident  # the loop's thread takes over
                    self._state.notify_all()
                else:
                    self._driver = None

    def stop(self, last: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Await ``last()`` on the loop (it closes what lives there), then stop the loop
        and join its thread. Called from another thread, at most once."""
        try:
            self.call(_last_rites, last)
        finally:
            with self._state:
                self._exit = True
                if self._driver == self._ident:
                    # Under the lock: the thread cannot close the loop before this.
                    self.loop.call_soon_threadsafe(self.loop.stop)
                self._state.notify_all()
            self._thread.join()

    def stop_soon(self, last: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """:meth:`stop` without waiting, from the thread that runs the loop.

        A finalizer that the garbage collector ran there calls it. Waiting would block
        the loop that must do the stopping. The loop's own thread stops the loop once
        ``last`` ran."""

        async def rites_then_stop() -> None:
            try:
                await _last_rites(last)
            finally:
                with self._state:
                    self._exit = True
                    if threading.get_ident() == self._ident:
                        self.loop.stop()

        self.loop.create_task(rites_then_stop())


def _outcome(call: _Call[T]) -> T:
    if call.error is not None:
        # The task's own exception object: its type and traceback reach the caller.
        raise call.error
    return call.result  # type: ignore[return-value]  # set together with error=None


_SIGINT = int(signal.SIGINT)


#: Every loop thread, so that a forked child drops what it inherited (see below).
_loop_threads: weakref.WeakSet[LoopThread] = weakref.WeakSet()


def _after_fork() -> None:
    # The child has none of the parent's threads: a lock one of them held at the fork
    # would stay held. An inherited loop is never driven in the child (``_sync``
    # starts a new one), and work scheduled on it there wakes nothing.
    for inherited in list(_loop_threads):
        inherited._state = threading.Condition(threading.RLock())
        inherited._driver = -1
        inherited._exit = True


os.register_at_fork(after_in_child=_after_fork)


def _nothing() -> None:
    pass


async def _ended(task: asyncio.Task[Any]) -> None:
    """Wait for ``task`` to end, whatever its outcome."""
    await asyncio.wait([task])


async def _last_rites(last: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``last``, then close the loop's async generators and its default executor.

    The executor holds the threads of sync effect functions. A cancelled turn may have
    left some."""
    await last()
    loop = asyncio.get_running_loop()
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
