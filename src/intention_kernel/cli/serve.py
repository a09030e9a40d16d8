"""``intention-kernel serve``: the HTTP host on uvicorn.

Loads the agent (``--agent module:attr``), opens the store (``--db URL``), and
serves :func:`intention_kernel.host.create_app` until interrupted; the store is
closed on the way out. Needs the ``http`` extra besides ``cli``.

The agent factory is called with ``db_url=`` when it takes that parameter (see
:func:`~intention_kernel.cli._common.load_agent`). ``--lock-timeout SECONDS`` bounds
how long a turn waits for a thread another turn holds before the host answers 503
``thread-busy`` with ``Retry-After`` (default: the store's, 30 s).

Tokens: ``--token SECRET=TENANT`` (repeatable) turns authentication on; each
token's turns run under its tenant and it sees only that tenant's threads.
``--token SECRET=`` is a token without a tenant (an operator of tenant-less
threads). Tokens on a command line are visible to local users (``ps``): prefer
``$INTENTION_KERNEL_TOKENS`` (the same ``SECRET=TENANT`` pairs, comma-separated).

Event loop: ``--loop auto`` (the default) runs the host on uvloop where it is
installed (the ``http`` extra installs it, except on Windows), else on asyncio's;
``--loop asyncio`` and ``--loop uvloop`` choose. On uvloop, psycopg's asyncio driver
costs markedly less CPU per statement (see README.md, "Benchmarks").
"""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from intention_kernel.cli._common import (
    AgentOption,
    DbOption,
    load_agent,
    log_warnings_to_stderr,
    refuse,
    resolve_db_url,
    sqlite_path,
    stderr,
)
from intention_kernel.cli._help import Command

if TYPE_CHECKING:
    from intention_kernel.agent import Agent
    from intention_kernel.durability import Durability

__all__ = [
    "TOKENS_ENV_VAR",
    "Loop",
    "loop_runner",
    "open_store",
    "parse_tokens",
    "register",
    "serve",
]

TOKENS_ENV_VAR = "INTENTION_KERNEL_TOKENS"


class Loop(enum.StrEnum):
    """The event loop ``serve`` runs on."""

    AUTO = "auto"
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


def loop_runner(loop: Loop) -> Callable[[Coroutine[Any, Any, None]], None]:
    """What runs a coroutine to completion on ``loop``: ``auto`` is uvloop where it
    imports, else asyncio's. Refuses ``uvloop`` when it is not installed."""
    if loop is not Loop.ASYNCIO:
        try:
            import uvloop
        except ImportError as exc:
            if loop is Loop.UVLOOP:
                refuse(f"--loop uvloop needs uvloop ({exc}): pip install uvloop")
        else:
            return uvloop.run
    return asyncio.run


def register(app: typer.Typer) -> None:
    app.command("serve", cls=Command)(serve)


def serve(
    agent: AgentOption,
    db: DbOption = None,
    port: Annotated[
        int, typer.Option("--port", metavar="PORT", min=0, max=65535, help="TCP port")
    ] = 8000,
    host: Annotated[
        str, typer.Option("--host", metavar="HOST", help="Interface to listen on")
    ] = "127.0.0.1",
    token: Annotated[
        list[str] | None,
        typer.Option(
            "--token",
            metavar="TOKEN=TENANT",
            help=f"A bearer token and its tenant (repeatable; also ${TOKENS_ENV_VAR})",
            show_default=False,
        ),
    ] = None,
    lock_timeout: Annotated[
        float | None,
        typer.Option(
            "--lock-timeout",
            metavar="SECONDS",
            min=0.0,
            help="How long a turn waits for a busy thread before 503 thread-busy "
            "(default: the store's, 30)",
            show_default=False,
        ),
    ] = None,
    loop: Annotated[
        Loop,
        typer.Option(
            "--loop",
            metavar="auto|asyncio|uvloop",
            case_sensitive=False,
            help="The event loop: uvloop where installed (auto), or asyncio's",
        ),
    ] = Loop.AUTO,
) -> None:
    """Serve the agent over HTTP: turns, threads, receipts, /openapi.json and /console."""
    run = loop_runner(loop)
    try:
        from intention_kernel.host import create_app  # noqa: F401
    except ImportError as exc:
        refuse(
            f"serve needs the http extra ({exc.name} is missing): pip install "
            "'intention-kernel[http]'"
        )
    url = resolve_db_url(db)
    try:
        loaded = load_agent(agent, db_url=url)
        pairs = list(token or [])
        pairs += [p for p in os.environ.get(TOKENS_ENV_VAR, "").split(",") if p.strip()]
        tokens = parse_tokens(pairs) if pairs else None
    except ValueError as exc:
        refuse(str(exc))
    with log_warnings_to_stderr():
        run(_serve(loaded, url, host, port, tokens, lock_timeout))


def parse_tokens(pairs: list[str]) -> dict[str, str | None]:
    """``["s3cret=acme", "ops="]`` → ``{"s3cret": "acme", "ops": None}``."""
    tokens: dict[str, str | None] = {}
    for pair in pairs:
        secret, sep, tenant = pair.strip().partition("=")
        if not sep or not secret:
            raise ValueError(f"--token must look like TOKEN=TENANT, got {pair.split('=')[0]!r}=…")
        if secret in tokens:
            raise ValueError("a token is given twice")
        tokens[secret] = tenant or None
    return tokens


def open_store(url: str, lock_timeout: float | None = None) -> Durability:
    """The store at ``url``, as ``open_durability`` opens it, with ``lock_timeout`` if
    given: a PostgreSQL URL takes it as its ``lock_timeout=`` parameter (so the URL
    may not give one too); the other adapters take it as an argument."""
    from intention_kernel.durability import open_durability

    durability = open_durability(url)
    if lock_timeout is None:
        return durability
    from intention_kernel.durability.memory import InMemoryDurability
    from intention_kernel.durability.sqlite import SQLiteDurability

    if isinstance(durability, SQLiteDurability):
        return SQLiteDurability(sqlite_path(url), lock_timeout=lock_timeout)
    if isinstance(durability, InMemoryDurability):
        return InMemoryDurability(lock_timeout=lock_timeout)
    return open_durability(f"{url}{'&' if '?' in url else '?'}lock_timeout={lock_timeout}")


async def _serve(
    agent: Agent,
    url: str,
    host: str,
    port: int,
    tokens: dict[str, str | None] | None,
    lock_timeout: float | None,
) -> None:
    import uvicorn

    from intention_kernel.errors import KernelError
    from intention_kernel.host import create_app
    from intention_kernel.kernel import Kernel

    try:
        durability = open_store(url, lock_timeout)
        await durability.__aenter__()
    except (KernelError, ValueError) as exc:
        refuse(f"cannot open the store {url}: {exc}")
    try:
        try:
            kernel = Kernel(agent, durability)
            app = create_app(kernel, tokens=tokens)
        except (KernelError, TypeError, ValueError) as exc:
            refuse(str(exc))
        auth = f"{len(tokens)} token(s)" if tokens else "no authentication"
        loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # uvloop, asyncio
        stderr.print(
            Text.assemble(
                "serving ",
                (agent.name, "bold"),
                f" v{agent.version} ({kernel.fingerprint}) from {url} on http://{host}:{port}"
                f" · {auth} · {loop} event loop · console at /console",
            )
        )
        config = uvicorn.Config(app, host=host, port=port, lifespan="off", log_level="info")
        await uvicorn.Server(config).serve()
    finally:
        await durability.aclose()
