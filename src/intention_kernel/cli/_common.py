"""Conventions shared by every command: the store URL, refusals, exit codes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, NoReturn

import typer
from rich.console import Console

__all__ = [
    "DB_ENV_VAR",
    "DEFAULT_DB_URL",
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "DbOption",
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

stderr = Console(stderr=True)


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
    stderr.print(f"[bold red]refused:[/] {message}", highlight=False)
    raise typer.Exit(code)
