"""Conventions shared by every command: the store URL, the agent, refusals, exit codes.

Operations commands (``check``, ``migrate``, ``prune``, ``outbox``, ``receipts``) open
their store with :func:`existing_store`, which refuses a store that does not exist yet
(exit status 2) instead of letting the adapter create one: a mistyped ``--db`` would
otherwise report an empty, healthy store. Only turns (``serve``, the application)
create a store.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sqlite3
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TextIO

import typer
from rich.text import Text

from intention_kernel.cli._render import console

if TYPE_CHECKING:
    from intention_kernel.agent import Agent
    from intention_kernel.durability import Durability

__all__ = [
    "DB_ENV_VAR",
    "DEFAULT_DB_URL",
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "AgentOption",
    "DbOption",
    "existing_store",
    "load_agent",
    "log_warnings_to_stderr",
    "refuse",
    "resolve_db_url",
    "sqlite_path",
    "stderr",
]

DB_ENV_VAR = "INTENTION_KERNEL_DB"
DEFAULT_DB_URL = "sqlite:///intention-kernel.db"

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
            "Store URL: sqlite:///relative.db, sqlite:////absolute.db or postgresql://... "
            f"(default: ${DB_ENV_VAR}, then {DEFAULT_DB_URL})"
        ),
        show_default=False,
    ),
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
    """Print the library's WARNING and ERROR records on stderr while a long-running
    command (``serve``, ``outbox relay``) runs: it is an application, and the package
    only installs a ``NullHandler``, so an uncertain write or a failing request would
    otherwise go unseen. Short commands report through their own output instead."""
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


def load_agent(spec: str, *, db_url: str | None = None) -> Agent:
    """The agent named by ``module:attribute`` (dotted attributes allowed).

    The attribute may be an ``Agent`` or a callable returning one, called without
    arguments, or with ``db_url=`` (the store the command uses) when it takes a
    parameter of that name: a factory that keeps files of its own can put them
    beside the store. The current directory is importable, as with ``python -m``.
    Raises ``ValueError`` with a message for a person on any problem.
    """
    from intention_kernel.agent import Agent

    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"--agent must look like module:attribute, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for --agent {spec}: {exc}") from exc
    for name in attribute.split("."):
        try:
            target = getattr(target, name)
        except AttributeError:
            raise ValueError(f"{spec}: {name!r} not found") from None
    if isinstance(target, Agent):
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
    built = target(**arguments)
    if not isinstance(built, Agent):
        raise ValueError(f"{spec}() returned a {type(built).__name__}, not an Agent")
    return built


_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def resolve_db_url(explicit: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The store a command uses: ``--db``, else ``$INTENTION_KERNEL_DB``, else the default."""
    if explicit:
        return explicit
    env = (os.environ if environ is None else environ).get(DB_ENV_VAR)
    return env or DEFAULT_DB_URL


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
    """Print ``message`` on stderr and exit non-zero."""
    stderr.print(Text.assemble(("refused:", "bold red"), " ", message))
    raise typer.Exit(code)


#: Whether a PostgreSQL schema holds an intention-kernel store: its migrations table,
#: the first thing an adapter creates. (Read here, before the adapter opens, because
#: opening creates the schema.)
HAS_POSTGRES_STORE = "SELECT to_regclass(format('%%I.ik_schema', %s::text)) IS NOT NULL"
#: The same for a SQLite file, read through a read-only connection.
HAS_SQLITE_STORE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ik_schema'"


def existing_store(url: str) -> Durability:
    """The adapter (not yet opened) for the store at ``url``; refuses (exit status 2) a
    URL that names no store yet: a SQLite file that does not exist or holds no
    intention-kernel tables, or a PostgreSQL schema the adapter never created.
    Nothing is created either way. (A PostgreSQL server that cannot be reached is
    left to the adapter to report.)"""
    from intention_kernel.durability import open_durability

    try:
        store = open_durability(url)
    except ValueError as exc:
        refuse(str(exc))
    problem = _missing_store(store, url)
    if problem is not None:
        refuse(f"{problem}; operations commands never create a store (check --db)")
    return store


def _missing_store(store: object, url: str) -> str | None:
    from intention_kernel.durability.sqlite import SQLiteDurability

    if isinstance(store, SQLiteDurability):
        path = store.path
        if path == ":memory:":
            return None
        if not os.path.isfile(path):
            return f"no SQLite store at {path!r}: the file does not exist"
        try:
            uri = Path(path).absolute().as_uri() + "?mode=ro"
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
                found = conn.execute(HAS_SQLITE_STORE).fetchone()
        except sqlite3.Error as exc:
            return f"{path!r} cannot be read as a SQLite store ({exc})"
        return None if found else f"{path!r} is not an intention-kernel store (no ik_schema table)"
    if url.partition("://")[0].lower() not in ("postgresql", "postgres"):
        return None
    import psycopg

    from intention_kernel.durability.postgres import PostgresDurability

    assert isinstance(store, PostgresDurability)
    try:
        with psycopg.connect(url, connect_timeout=10, autocommit=True) as conn:
            row = conn.execute(HAS_POSTGRES_STORE, (store.schema,)).fetchone()
    except psycopg.Error:
        return None  # unreachable, refused...: the adapter says so when it opens
    if row is None or not row[0]:
        return f"the PostgreSQL database has no intention-kernel store in schema {store.schema!r}"
    return None
