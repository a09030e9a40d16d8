"""Calling user code that may be sync or async, without blocking the event loop."""

from __future__ import annotations

import inspect
from types import FunctionType
from typing import Any

__all__ = ["is_async_callable"]


def is_async_callable(fn: Any) -> bool:
    """Whether ``fn`` is an async function (or an object with an async ``__call__``):
    it runs on the event loop. Anything else may block, so callers run it in a thread."""
    # An ``async def`` function, the common case, is told by its code's flag alone.
    if type(fn) is FunctionType and fn.__code__.co_flags & inspect.CO_COROUTINE:
        return True
    if inspect.iscoroutinefunction(fn):
        return True
    call = type(fn).__call__  # a function's is a slot wrapper, never a coroutine function
    return inspect.iscoroutinefunction(call)
