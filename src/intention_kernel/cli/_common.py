"""Conventions shared by every command: the store URL, the agent, refusals, exit codes.

Operations commands open their store with :func:`existing_store`.
They are ``check``, ``migrate``, ``prune``, ``outbox`` and ``receipts``.
:func:`existing_store` refuses a store that does not exist yet (exit status 2).
It does not let the adapter create one.
A mistyped ``--db`` would otherwise report an empty, healthy store.
Only turns (``serve``, the application) create a store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, NoReturn, TextIO

import typer
from rich.text import Text

from intention_kernel.cli._agent import entered_agent, load_agent
from intention_kernel.cli._render import console

if TYPE_CHECKING:
    from intention_kernel._agent import Agent
    from intention_kernel.durability import Durability
    from intention_kernel.durability._contract.recorders import Operable

__all__ = [
    "DB_ENV_VAR",
    "DEFAULT_DB_URL",
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "CONNECT_TIMEOUT",
    "AgentOption",
    "DbOption",
    "enter_agent",
    "existing_store",
    "fail",
    "load_agent",
    "log_warnings_to_stderr",
    "open_store",
    "refuse",
    "resolve_db_url",
    "sqlite_path",
    "stderr",
]

DB_ENV_VAR = "INTENTION_KERNEL_DB"
DEFAULT_DB_URL = "sqlite:///intention-kernel.db"

#: Seconds a command waits to reach a PostgreSQL server before it refuses the store.
#: A person at a terminal is waiting.
#: A server that does not answer in this time is not going to.
CONNECT_TIMEOUT = 5.0

#: A command ran and found a problem (a failed check, an error from the store).
EXIT_FAILED = 1
#: A command refused its arguments or its store before doing anything.
EXIT_REFUSED = 2

#: ``--db URL`` for commands that touch a store; pass the value to :func:`resolve_db_url`.
DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help=(
            "Store URL: sqlite:///relative.db, sqlite:////absolute.db, a plain path to a "
            "SQLite file, or postgresql://... "
            f"(default: ${DB_ENV_VAR}, then {DEFAULT_DB_URL})"
        ),
        show_default=False,
    ),
]

#: ``--batch N`` for commands that go through the store's threads a batch at a time.
ThreadBatchOption = Annotated[
    int, typer.Option("--batch", metavar="N", min=1, help="Threads selected at a time")
]

#: ``--agent module:attribute`` for commands that run an agent; pass it to :func:`load_agent`.
AgentOption = Annotated[
    str,
    typer.Option(
        "--agent",
        metavar="MODULE:ATTR",
        help="The agent: an Agent, or a zero-argument callable returning one (pkg.mod:agent)",
        show_default=False,
    ),
]

stderr = console(stderr=True)


@contextlib.contextmanager
def log_warnings_to_stderr() -> Iterator[None]:
    """Print the library's WARNING and ERROR records on stderr during a long-running command.

    Those commands are ``serve`` and ``outbox relay``.
    Such a command is an application, and the package only installs a ``NullHandler``.
    An uncertain write or a failing request would otherwise go unseen.
    Short commands report through their own output instead.
    """
    logger = logging.getLogger("intention_kernel")
    handler = _StderrHandler()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record arrives (as Python's own
    last-resort handler does), so a replaced stream is followed."""

    def __init__(self) -> None:
        super().__init__()
        self.setLevel(logging.WARNING)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always sys.stderr


def resolve_db_url(explicit: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The store a command uses: ``--db``, else ``$INTENTION_KERNEL_DB``, else the default;
    a plain path (``./app.db``, ``/tmp/x.db``: no ``scheme://``) is a SQLite file."""
    chosen = explicit or (os.environ if environ is None else environ).get(DB_ENV_VAR)
    if not chosen:
        return DEFAULT_DB_URL
    return chosen if "://" in chosen else f"sqlite:///{chosen}"


def sqlite_path(value: str) -> str:
    """A SQLite file from ``sqlite:///relative.db``, ``sqlite:////absolute.db`` or a plain path.

    Raises ``ValueError`` for another scheme. (The same rule as
    :func:`intention_kernel.durability.open_durability`.)
    """
    scheme, sep, rest = value.partition("://")
    if not sep:
        return value
    if scheme.lower() != "sqlite":
        raise ValueError(f"{value!r} is not a SQLite store (expected sqlite:///path.db or a path)")
    path = rest[1:] if rest.startswith("/") else rest
    if not path:
        raise ValueError(f"sqlite URL needs a path: {value!r} (sqlite:///file.db)")
    return path


def refuse(message: str, code: int = EXIT_REFUSED) -> NoReturn:
    """Print ``message`` on stderr, as one line, and exit non-zero."""
    # Not wrapped at the terminal's width: a refusal is one line for logs and for grep.
    stderr.print(Text.assemble(("refused:", "bold red"), " ", message), soft_wrap=True)
    raise typer.Exit(code)


async def enter_agent(stack: contextlib.AsyncExitStack, spec: str, *, db_url: str | None) -> Agent:
    """The agent ``spec`` names, entered on ``stack`` and exited with it.

    Any problem building or entering it is a refusal, as for a bad argument."""
    try:
        return await stack.enter_async_context(entered_agent(spec, db_url=db_url))
    except ValueError as exc:
        refuse(str(exc))


def fail(error: Exception) -> NoReturn:
    """Report an error a command met on its store.

    A damaged store is refused with exit status 2, as a store that does not exist is.
    So is a row no command can read.
    Running the command again cannot help with those.
    Any other error is exit status 1.
    """
    from intention_kernel.errors import CorruptRecordError

    refuse(str(error), EXIT_REFUSED if isinstance(error, CorruptRecordError) else EXIT_FAILED)


def existing_store(url: str) -> Operable:
    """The adapter (not yet opened) for the store at ``url``.

    It refuses (exit status 2) a URL that names no store yet.
    Such a URL names a SQLite file that does not exist or holds no intention-kernel tables.
    Or it names a PostgreSQL schema the adapter never created.
    It also refuses a store that cannot be reached or is damaged.
    Nothing is created either way.
    The adapter's own ``exists()`` asks, without opening it.
    """
    from intention_kernel.durability._contract.recorders import Operable
    from intention_kernel.errors import KernelError

    store = open_store(url)
    if not isinstance(store, Operable):  # pragma: no cover - every bundled one is
        refuse(f"{type(store).__name__} does not support operations commands")
    try:
        found = asyncio.run(store.exists())
    except KernelError as exc:
        refuse(str(exc))
    if not found:
        refuse(
            f"{store.missing_store_reason()}; operations commands never create a store (check --db)"
        )
    return store


def open_store(url: str, *, lock_timeout: float | None = None) -> Durability:
    """The adapter for ``url`` (see :func:`resolve_db_url`), built once, not opened.

    It has a short connect timeout (:data:`CONNECT_TIMEOUT`).
    It refuses (exit status 2) a URL or an option no adapter accepts.
    It also refuses an adapter whose extra is not installed.
    Every command opens its store here, so each says the same one line.
    """
    from intention_kernel.durability import open_durability
    from intention_kernel.errors import KernelError

    try:
        return open_durability(url, lock_timeout=lock_timeout, connect_timeout=CONNECT_TIMEOUT)
    except (KernelError, ValueError) as exc:
        refuse(str(exc))
    except ImportError as exc:
        # The adapter's module names its extra (``pip install 'intention-kernel[postgres]'``).
        refuse(str(exc))
