"""How the engine calls an effect function and writes its outcome.

A sync function runs in a worker thread. A cancellation does not cut an outcome write
short."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from typing import Any

from intention_kernel._effects import EffectAuthority, EffectFn

__all__ = ["awaited", "call_in_thread", "shielded"]


class _ThreadCall:
    """A sync effect function's call in a worker thread, and whether it returned."""

    __slots__ = ("returned", "value")

    def __init__(self) -> None:
        self.returned = False
        self.value: Any = None

    def __call__(self, fn: EffectFn, authority: EffectAuthority) -> Any:
        value = fn(authority)
        self.value, self.returned = value, True  # ``value`` first: a reader checks ``returned``
        return value


async def call_in_thread(fn: EffectFn, authority: EffectAuthority) -> tuple[Any, bool]:
    """Call a sync effect function in the loop's default executor.

    It runs in a copy of the caller's context, as ``asyncio.to_thread`` does. Return its
    value, and whether the caller was cancelled after it returned.

    A blocking provider SDK would otherwise stall every turn of the process. A
    cancellation while the call runs raises at once. The thread runs on unheard. The
    receipt becomes ``uncertain``: whatever the call does later is never recorded, so it
    is never ``failed``. A cancellation may land after the call returned, before the
    loop took its value. It must not throw a known outcome away. So the value is
    returned, and the caller records it before it lets the cancellation through. A call still queued
    for a thread is cancelled with the future and never starts.
    """
    call = _ThreadCall()
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    try:
        return await loop.run_in_executor(None, context.run, call, fn, authority), False
    except asyncio.CancelledError:
        value = call.value
        if not call.returned or inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never started: nothing ran, and no "never awaited" warning
            raise
        return value, True


async def awaited(write: Any) -> None:
    """Persist a receipt transition in the calling task (for a recorder whose writes
    finish when cancelled)."""
    await write


async def shielded(write: Any) -> None:
    """Finish ``write`` even if the calling task is cancelled meanwhile, then honour the
    cancel.

    The caller leaves only once the write is done. The engine persists receipt
    transitions this way. Losing one would leave the receipt ``prepared``. That later
    fails closed anyway, so correctness never depends on this. It keeps the state
    precise. The outbox relay marks what its sink acknowledged this
    way before it gives up the thread's claim.
    """
    task = asyncio.ensure_future(write)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        # Wait without propagating further cancels into the write itself.
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        task.result()
        raise
