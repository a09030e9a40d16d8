"""``--agent module:attribute``: find the agent, build it, and enter it if it needs to.

The attribute may be:

- an ``Agent``.
- a factory returning one, called without arguments.
  If it takes a parameter named ``db_url``, it gets the store the command uses.
  A factory that keeps files of its own can then put them beside the store.
- an async factory (``async def``) returning one, awaited.
- an async context manager yielding one.
  That is an ``@asynccontextmanager`` function, a factory returning such a manager,
  or the manager itself.
  It suits an agent that needs async set-up and tear-down.
  An MCP client needs that, and so does an interpreter to close.

:func:`entered_agent` accepts them all.
It runs on the command's event loop.
So a client the agent opens belongs to the loop that serves it.
It enters a manager before the command starts, and exits it when the command ends.
:func:`load_agent` builds without a loop, for code that cannot await.
It refuses the async forms.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from intention_kernel._agent import Agent

__all__ = ["entered_agent", "imported", "load_agent"]

_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def load_agent(spec: str, *, db_url: str | None = None) -> Agent:
    """The agent named by ``spec``, built now.

    Any problem raises ``ValueError`` with a message for a person.
    An async factory or context manager is such a problem here."""
    built = _build(spec, db_url)
    if inspect.isawaitable(built) or _is_async_manager(built):
        if inspect.iscoroutine(built):
            built.close()  # never awaited: close it, or Python warns when it is collected
        raise ValueError(
            f"{spec} needs async set-up (an async factory or context manager); this "
            "command can only use an Agent or a plain factory"
        )
    return _agent_or_refusal(spec, built)


@contextlib.asynccontextmanager
async def entered_agent(spec: str, *, db_url: str | None = None) -> AsyncIterator[Agent]:
    """The agent named by ``spec`` for the block, exited after it.

    It is built, awaited or entered, as its form asks.
    Any problem raises ``ValueError`` with a message for a person.
    An exception raised while it is built or entered is such a problem."""
    built = _build(spec, db_url)
    try:
        if inspect.isawaitable(built):
            built = await built
    except Exception as exc:
        raise ValueError(f"{spec} failed to build the agent: {type(exc).__name__}: {exc}") from exc
    if not _is_async_manager(built):
        yield _agent_or_refusal(spec, built)
        return
    manager: Any = built
    try:
        entered = await manager.__aenter__()
    except Exception as exc:
        raise ValueError(f"{spec} failed to enter: {type(exc).__name__}: {exc}") from exc
    try:
        agent = _agent_or_refusal(spec, entered, "yielded")
    except BaseException:
        await manager.__aexit__(*sys.exc_info())
        raise
    # Exited with the block's exception, as ``async with`` would: the manager may act
    # on it (roll back, say) or suppress it.
    async with _exiting(manager):
        yield agent


@contextlib.asynccontextmanager
async def _exiting(manager: Any) -> AsyncIterator[None]:
    try:
        yield
    except BaseException:
        if not await manager.__aexit__(*sys.exc_info()):
            raise
    else:
        await manager.__aexit__(None, None, None)


def _build(spec: str, db_url: str | None) -> object:
    """The attribute ``spec`` names, called if it is a factory (not yet awaited)."""
    from intention_kernel._agent import Agent

    target = _target(spec)
    if isinstance(target, Agent) or _is_async_manager(target):
        return target
    if not callable(target):
        raise ValueError(f"{spec} is a {type(target).__name__}, not an Agent or a factory")
    arguments: dict[str, str] = {}
    try:
        signature = inspect.signature(target)
    except ValueError:  # no signature to inspect (a builtin): just call it
        pass
    else:
        parameter = signature.parameters.get("db_url")
        if db_url is not None and parameter is not None and parameter.kind in _BY_KEYWORD:
            arguments["db_url"] = db_url
        try:
            signature.bind(**arguments)
        except TypeError as exc:
            raise ValueError(
                f"{spec} must be callable without arguments (or with db_url only): {exc}"
            ) from None
    return target(**arguments)


def _target(spec: str) -> object:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"--agent must look like module:attribute, got {spec!r}")
    return imported(spec, "--agent")


def imported(spec: str, option: str) -> object:
    """The object ``module:attribute`` names, the attribute dotted or not.

    The caller checked the spec's shape. ``option`` names the flag in the
    ``ValueError`` a person reads when the module or an attribute is missing."""
    module_name, _, attribute = spec.partition(":")
    # The current directory is importable, as with ``python -m``.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for {option} {spec}: {exc}") from exc
    for name in attribute.split("."):
        try:
            target = getattr(target, name)
        except AttributeError:
            raise ValueError(f"{spec}: {name!r} not found") from None
    return target


def _is_async_manager(value: object) -> bool:
    """Whether ``value`` is an async context manager (an instance, not its class)."""
    return (
        not isinstance(value, type) and hasattr(value, "__aenter__") and hasattr(value, "__aexit__")
    )


def _agent_or_refusal(spec: str, built: object, how: str = "returned") -> Agent:
    from intention_kernel._agent import Agent

    if not isinstance(built, Agent):
        raise ValueError(f"{spec} {how} a {type(built).__name__}, not an Agent")
    return built
