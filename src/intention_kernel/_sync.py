"""SyncKernel: the synchronous twin of :class:`~intention_kernel.Kernel`, for plain threads.

psycopg names its twins ``Connection`` and ``AsyncConnection``: one namespace, the same
methods, a prefix on one of the two. Here the async class came first, and SPEC fixes
its name, so the prefix goes on the twin: ``SyncKernel``, beside ``Kernel``. A module
``intention_kernel.sync`` with a second ``Kernel`` would give two classes one name. A
traceback, a type hint or an import would then not say which one it meant.

One engine, a thin facade. A ``SyncKernel`` holds an ordinary ``Kernel`` and one event
loop with a daemon thread of its own (:mod:`intention_kernel._loopthread`). Each call
runs the async method on that loop, as a task, and returns when the task ended. A
lone caller runs the loop in its own thread. While a call runs, others hand theirs to
it. The loop's thread takes over what is left when it ends. The store's connections,
locks and pools are made, used and closed on that loop. So a Django view, a Flask
handler or a Celery task calls ``turn`` with no event loop of its own. Many threads
may share one instance: their turns run concurrently on the loop. The store's
per-thread lock still serializes the turns of each conversation thread.

Forks: a child process inherits the parent's objects but not its threads. A kernel
that never ran in the parent starts its loop in the child. One that ran there and was
built from a URL opens the store anew in the child. One built over a store object
raises ``ForkedKernelError``, since that object holds the parent's connections.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

from intention_kernel._agent import Agent
from intention_kernel._authority import Principal
from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel._deadlines import Clock, system_clock
from intention_kernel._effects import Receipt, ReceiptStatus
from intention_kernel._inbox import Cancellation, Queued
from intention_kernel._interpretation import Answer
from intention_kernel._kernel import Kernel
from intention_kernel._loopthread import LoopThread
from intention_kernel._streaming import TurnEvent
from intention_kernel._timer_runner import TimerOutcome
from intention_kernel._turns import OutboxEvent, TurnResult
from intention_kernel._turnstream import TurnStatus
from intention_kernel.durability import Durability, open_durability
from intention_kernel.durability._contract.options import check_seconds
from intention_kernel.durability._contract.records import ThreadOwner, Timer
from intention_kernel.errors import (
    EventLoopRunningError,
    ForkedKernelError,
    KernelClosedError,
)

__all__ = ["SyncKernel", "TurnStream"]

T = TypeVar("T")

#: What forked children inherited from a parent that had used it: the parent's loop,
#: kernel and store. Kept referenced forever, so that no finalizer in the child closes
#: a connection or a file that the parent still uses. A PostgreSQL connection closed
#: in the child would send the server the parent's goodbye.
_INHERITED: list[object] = []


class _Engine:
    """A ``SyncKernel``'s state, apart from the object, so that its finalizer can close it.

    The state is the kernel, its loop thread, and the calls in flight."""

    def __init__(self, kernel: Kernel, url: str | None, timeout: float | None) -> None:
        self.kernel = kernel
        self.url = url
        self.timeout = timeout
        self.pid = os.getpid()
        self.loop: LoopThread | None = None
        # Guards ``loop``, ``active`` and ``closed``. ``close`` waits on it until the
        # calls in flight ended; without the count, it could close the store under one.
        self.state = threading.Condition()
        self.active = 0
        self.closed = False
        self.stopped = threading.Event()  # set once close() has closed everything
        self.forked_away = False  # a child of a parent that used a store object

    def call(self, fn: Callable[[Kernel], Coroutine[Any, Any, T]]) -> T:
        """Await ``fn(kernel)`` on the loop, from a thread that runs no event loop."""
        if asyncio._get_running_loop() is not None:
            # On the kernel's own loop this would deadlock; on another, stall it.
            raise EventLoopRunningError(
                "SyncKernel was called on a thread that runs an event loop: blocking "
                "there stalls the loop; await the methods of Kernel (SyncKernel.kernel) "
                "instead, or call SyncKernel from a plain thread"
            )
        with self.state:
            loop = self._loop()
            kernel = self.kernel
            self.active += 1
        try:
            return loop.call(fn, kernel, timeout=self.timeout)
        finally:
            with self.state:
                self.active -= 1
                if self.closed and not self.active:
                    self.state.notify_all()

    def _loop(self) -> LoopThread:
        """The loop to call on, started on first use; under ``state``."""
        if self.closed:
            raise KernelClosedError("this SyncKernel is closed")
        if self.pid != os.getpid():
            self._forked()
        if self.forked_away:
            raise ForkedKernelError(
                "this SyncKernel ran in the parent process before the fork, over a store "
                "object that holds the parent's connections; build the kernel in the "
                "child (Celery's worker_process_init, gunicorn's post_fork), or give it "
                "a URL, which each process opens anew"
            )
        if self.loop is None:
            self.loop = LoopThread(f"intention-kernel-{self.kernel.agent.name}")
        return self.loop

    def _forked(self) -> None:
        """First call in a forked child: the parent's loop thread does not exist here."""
        self.pid = os.getpid()
        if self.loop is None:
            return  # nothing ran in the parent: the store was never opened
        _INHERITED.append((self.loop, self.kernel))
        self.loop = None
        if self.url is None:
            self.forked_away = True
            return
        old = self.kernel
        self.kernel = Kernel(
            old.agent,
            open_durability(self.url),
            max_message_chars=old.max_message_chars,
            clock=old.clock,
        )

    def _close_from_the_loop(self, loop: LoopThread) -> None:
        with self.state:
            self.loop = None
        kernel = self.kernel

        async def last() -> None:
            try:
                # Calls in flight count down in their own threads, which cannot set an
                # asyncio.Event of this loop: poll.
                while self.active:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                await kernel._drain()
                await kernel.durability.aclose()
            finally:
                self.stopped.set()

        loop.stop_soon(last)

    def reset_after_fork(self) -> None:
        # A parent thread may have held the lock at the fork. That thread does not exist
        # in the child, so the child would wait on the lock forever. Its calls are gone too, and a
        # close() the parent had begun will not finish here.
        self.state = threading.Condition()
        self.active = 0
        self.stopped = threading.Event()
        if self.closed:
            self.stopped.set()

    def close(self) -> None:
        """Refuse new calls, wait for those in flight, then stop the loop.

        Streamed turns whose readers left run to their end. The store is closed last."""
        with self.state:
            closing = not self.closed
            self.closed = True
            loop = self.loop
        if loop is not None and loop.in_loop_thread():
            # The garbage collector ran the finalizer on the loop's own thread. Waiting
            # there for the calls in flight, or for the loop, would wait forever.
            if closing:
                self._close_from_the_loop(loop)
            return
        if not closing:
            self.stopped.wait()  # a second close() returns once the first one did
            return
        try:
            with self.state:
                while self.active:
                    self.state.wait()
                loop, kernel = self.loop, self.kernel
                self.loop = None
                inherited = self.pid != os.getpid() or self.forked_away
            if loop is None or inherited:
                return  # nothing runs, or what runs is the parent's

            async def last() -> None:
                await kernel._drain()
                await kernel.durability.aclose()

            loop.stop(last)
        finally:
            self.stopped.set()


_engines: weakref.WeakSet[_Engine] = weakref.WeakSet()


def _after_fork() -> None:
    for engine in list(_engines):
        engine.reset_after_fork()


os.register_at_fork(after_in_child=_after_fork)


class SyncKernel:
    """Runs an agent's turns durably, for callers without an event loop.

    The same arguments, results and errors as :class:`~intention_kernel.Kernel`, as
    blocking methods. ``durability`` is a store object (``SQLiteDurability(path)``,
    ``PostgresDurability(dsn)``, ...) that nothing opened yet, or a URL for
    :func:`~intention_kernel.durability.open_durability`. The kernel opens it on first
    use and owns it: :meth:`close` closes it.

    ``timeout`` (seconds, ``None`` for no bound) bounds each call. A turn still running
    then is cancelled, as ``asyncio.wait_for`` cancels it: nothing commits, and a write
    in flight leaves its receipt ``uncertain``. ``TimeoutError`` is raised once the
    cancelled turn ended. ``KeyboardInterrupt`` in a waiting thread cancels the same way.

    Safe to share between threads. Every method refuses a thread that runs an event
    loop with ``EventLoopRunningError``: async code awaits :attr:`kernel` instead.
    """

    def __init__(
        self,
        agent: Agent,
        durability: Durability | str,
        *,
        max_message_chars: int = 32_000,
        clock: Clock = system_clock,
        timeout: float | None = None,
    ) -> None:
        if timeout is not None and not check_seconds("timeout", timeout):
            raise ValueError("timeout must be more than 0 seconds")
        url = durability if isinstance(durability, str) else None
        store = open_durability(durability) if isinstance(durability, str) else durability
        kernel = Kernel(agent, store, max_message_chars=max_message_chars, clock=clock)
        self._engine = _Engine(kernel, url, timeout)
        _engines.add(self._engine)
        # Closes a kernel dropped unclosed, at collection or at exit. It holds nothing
        # but the engine, so the kernel object itself can be collected.
        self._finalizer = weakref.finalize(self, self._engine.close)

    # -- what the kernel is ------------------------------------------------------------------

    @property
    def kernel(self) -> Kernel:
        """The async kernel underneath. Its store lives on this object's event loop:
        await its methods only through :meth:`run`."""
        return self._engine.kernel

    @property
    def agent(self) -> Agent:
        return self._engine.kernel.agent

    @property
    def durability(self) -> Durability:
        """The store; await its methods only through :meth:`run`."""
        return self._engine.kernel.durability

    @property
    def fingerprint(self) -> str:
        """Stable hash of the agent's name, version and capability definitions."""
        return self._engine.kernel.fingerprint

    @property
    def timeout(self) -> float | None:
        return self._engine.timeout

    # -- turns -------------------------------------------------------------------------------

    def turn(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None = None,
        answer: Answer | str | None = None,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
    ) -> TurnResult:
        """Run (or replay) one turn: :meth:`Kernel.turn <intention_kernel.Kernel.turn>`."""
        return self._engine.call(
            lambda k: k.turn(
                thread_id, turn_id, message, answer, tenant_id=tenant_id, principal=principal
            )
        )

    def stream_turn(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None = None,
        answer: Answer | str | None = None,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
        after: str | None = None,
    ) -> TurnStream:
        """Run (or replay) one turn, iterating its events as they happen:
        :meth:`Kernel.stream_turn <intention_kernel.Kernel.stream_turn>` as a plain
        iterator (:class:`TurnStream`). The last event is ``result``.

        The turn starts at the first ``next()``. Closing the iterator early does not
        abort the turn: it runs on to its commit, as on the async kernel.
        ``after`` (an event's ID) resumes the stream after that event."""
        return TurnStream(
            self,
            lambda k: k.stream_turn(
                thread_id,
                turn_id,
                message,
                answer,
                tenant_id=tenant_id,
                principal=principal,
                after=after,
            ),
        )

    def watch_turn(
        self,
        thread_id: str,
        turn_id: str,
        *,
        after: str | None = None,
        tenant_id: str | None = None,
        principal: Principal | None = None,
        poll: float = 0.1,
    ) -> TurnStream:
        """The recorded events of a turn run anywhere, as a plain iterator:
        :meth:`Kernel.watch_turn <intention_kernel.Kernel.watch_turn>`. It runs nothing."""
        return TurnStream(
            self,
            lambda k: k.watch_turn(
                thread_id, turn_id, after=after, tenant_id=tenant_id, principal=principal, poll=poll
            ),
        )

    def turn_status(
        self,
        thread_id: str,
        turn_id: str,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
    ) -> TurnStatus:
        """Where a turn is: :meth:`Kernel.turn_status <intention_kernel.Kernel.turn_status>`."""
        return self._engine.call(
            lambda k: k.turn_status(thread_id, turn_id, tenant_id=tenant_id, principal=principal)
        )

    def detach_turn(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None = None,
        answer: Answer | str | None = None,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
    ) -> TurnStatus:
        """Accept a turn that runs on in the background: :meth:`Kernel.detach_turn
        <intention_kernel.Kernel.detach_turn>`. This kernel's loop runs it."""
        return self._engine.call(
            lambda k: k.detach_turn(
                thread_id, turn_id, message, answer, tenant_id=tenant_id, principal=principal
            )
        )

    def submit(
        self,
        thread_id: str,
        turn_id: str,
        message: str | None = None,
        answer: Answer | str | None = None,
        *,
        tenant_id: str | None = None,
        principal: Principal | None = None,
    ) -> TurnResult | Queued:
        """Deliver one turn and answer at once: :meth:`Kernel.submit
        <intention_kernel.Kernel.submit>`. A ``"queue"`` agent's turn on a busy thread
        answers a :class:`~intention_kernel.Queued`; this kernel's loop runs it later."""
        return self._engine.call(
            lambda k: k.submit(
                thread_id, turn_id, message, answer, tenant_id=tenant_id, principal=principal
            )
        )

    def cancel(
        self,
        thread_id: str,
        turn_id: str,
        *,
        reason: str | None = None,
        owner: ThreadOwner | None = None,
    ) -> Cancellation:
        """Stop turn ``turn_id`` of the thread: :meth:`Kernel.cancel
        <intention_kernel.Kernel.cancel>`. Any plain thread may cancel a turn that
        another thread runs on this kernel: the call does not wait for it."""
        return self._engine.call(lambda k: k.cancel(thread_id, turn_id, reason=reason, owner=owner))

    def drain(self, thread_id: str) -> list[TurnResult]:
        """Run the thread's queued turns now, in order: :meth:`Kernel.drain
        <intention_kernel.Kernel.drain>`."""
        return self._engine.call(lambda k: k.drain(thread_id))

    # -- inspection and operations -----------------------------------------------------------

    def checkpoint(self, thread_id: str) -> KernelCheckpoint | None:
        """The thread's latest committed checkpoint, or ``None``."""
        return self._engine.call(lambda k: k.checkpoint(thread_id))

    def list_receipts(
        self,
        thread_id: str | None = None,
        status: ReceiptStatus | str | None = None,
        *,
        tenant_id: str | None = None,
    ) -> list[Receipt]:
        """The current receipt per ``(thread_id, key)``, oldest first (operator-level:
        every tenant's unless ``tenant_id`` filters)."""
        return self._engine.call(
            lambda k: k.durability.list_receipts(thread_id, status, tenant_id=tenant_id)
        )

    def resolve_receipt(
        self,
        thread_id: str,
        key: str,
        *,
        applied: bool,
        value: Any = None,
        note: str | None = None,
        actor: str | None = None,
    ) -> Receipt:
        """Reconcile an uncertain receipt: the write was ``applied`` (with ``value``) or
        not. Emits ``receipt.resolved``; anything but an unsettled receipt is an error."""
        return self._engine.call(
            lambda k: k.durability.resolve_receipt(
                thread_id, key, applied=applied, value=value, note=note, actor=actor
            )
        )

    def read_outbox(
        self, thread_id: str | None = None, after: int | None = None, limit: int = 100
    ) -> list[OutboxEvent]:
        """Committed events in ``position`` order, after the given position."""
        return self._engine.call(lambda k: k.durability.read_outbox(thread_id, after, limit))

    # -- timers ------------------------------------------------------------------------------

    def schedule(
        self,
        thread_id: str,
        key: str,
        *,
        at: datetime | None = None,
        after: timedelta | None = None,
        message: str | None = None,
        data: Any = None,
        unless_version_after: int | None = None,
        every: timedelta | None = None,
        cron: str | None = None,
        tenant_id: str | None = None,
    ) -> Timer:
        """Set timer ``key`` of the thread: :meth:`Kernel.schedule
        <intention_kernel.Kernel.schedule>`."""
        return self._engine.call(
            lambda k: k.schedule(
                thread_id,
                key,
                at=at,
                after=after,
                message=message,
                data=data,
                unless_version_after=unless_version_after,
                every=every,
                cron=cron,
                tenant_id=tenant_id,
            )
        )

    def cancel_timer(self, thread_id: str, key: str) -> bool:
        """Cancel the thread's pending timer ``key``; whether there was one."""
        return self._engine.call(lambda k: k.cancel_timer(thread_id, key))

    def timers(
        self, thread_id: str | None = None, *, status: str | None = None, limit: int = 100
    ) -> list[Timer]:
        """Up to ``limit`` timers (of one thread, of one status if given), by thread and key."""
        return self._engine.call(lambda k: k.timers(thread_id, status=status, limit=limit))

    def fire_due_timers(self, *, limit: int = 100, claim_for: float = 60.0) -> list[TimerOutcome]:
        """Claim up to ``limit`` due timers and run each as its turn, once:
        :meth:`Kernel.fire_due_timers <intention_kernel.Kernel.fire_due_timers>`. A
        long-running worker is :meth:`Kernel.run_timers`, on an event loop of its own."""
        return self._engine.call(lambda k: k.fire_due_timers(limit=limit, claim_for=claim_for))

    def run(self, fn: Callable[[Kernel], Coroutine[Any, Any, T]]) -> T:
        """Await ``fn(kernel)`` on this object's event loop and return its result.

        It is for what the facade does not wrap, as in
        ``sync.run(lambda k: k.durability.pending_interactions())``."""
        return self._engine.call(fn)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse new calls, and wait for the calls in flight.

        Streamed turns whose readers left reach their commit. Then the store is closed
        and the loop stopped. Calling it again does nothing."""
        if asyncio._get_running_loop() is not None:
            raise EventLoopRunningError(
                "SyncKernel.close() was called on a thread that runs an event loop"
            )
        self._finalizer.detach()  # a finalizer runs once: a second close() must wait
        self._engine.close()

    @property
    def closed(self) -> bool:
        return self._engine.closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class TurnStream:
    """The events of one streamed turn as a plain iterator (``SyncKernel.stream_turn``),
    and a context manager that closes it. One thread at a time reads it."""

    def __init__(
        self,
        kernel: SyncKernel,
        start: Callable[[Kernel], AsyncIterator[TurnEvent]],
    ) -> None:
        # The kernel, not its engine: a stream still read keeps its kernel open.
        self._kernel = kernel
        self._start: Callable[[Kernel], AsyncIterator[TurnEvent]] | None = start
        self._events: AsyncIterator[TurnEvent] | None = None
        self._lock = threading.Lock()

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> TurnEvent:
        with self._lock:
            event = self._kernel._engine.call(self._advance)
        if event is None:
            raise StopIteration
        return event

    async def _advance(self, kernel: Kernel) -> TurnEvent | None:
        """The next event, or ``None`` at the end (a coroutine cannot raise
        ``StopIteration``: Python turns it into ``RuntimeError``)."""
        # On the loop: the generator is made there, on the engine's current kernel.
        if self._events is None:
            if self._start is None:
                return None
            self._events, self._start = self._start(kernel), None
        try:
            return await self._events.__anext__()
        except StopAsyncIteration:
            self._events = None
            return None
        except BaseException:
            self._events = None  # a generator that raised has ended
            raise

    def close(self) -> None:
        """Stop reading. The turn itself runs on to its commit (or its failure)."""
        with self._lock:
            self._start = None
            if self._events is None or self._kernel.closed:
                return  # never started, ended, or closed with the kernel's loop
            self._kernel._engine.call(self._aclose)

    async def _aclose(self, kernel: Kernel) -> None:
        events, self._events = self._events, None
        aclose = getattr(events, "aclose", None)  # a generator's; a plain iterator has none
        if aclose is not None:
            await aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
