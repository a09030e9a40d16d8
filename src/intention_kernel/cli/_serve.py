"""``intention-kernel serve``: the HTTP host on uvicorn.

It loads the agent (``--agent module:attr``) and opens the store (``--db URL``).
It serves :func:`intention_kernel.host.create_app` until interrupted.
The store is closed on the way out.
It needs the ``http`` extra besides ``cli``.

``--agent`` names an ``Agent``, a factory, an async factory, or an async context manager.
A factory is called with ``db_url=`` when it takes that parameter.
A context manager suits an agent that needs async set-up, such as an MCP client.
It is entered on the serving loop before the host starts, and exited on shutdown.
See :mod:`~intention_kernel.cli._agent`.
``--lock-timeout SECONDS`` bounds how long a turn waits for a thread another turn holds.
After it, the host answers 503 ``lock-timeout`` with ``Retry-After``.
The default is the store's, 30 s.

On SIGTERM (or SIGINT) the host drains (``Kernel.begin_shutdown``).
New turns answer 503 ``shutting-down`` with ``Retry-After``.
Running turns stop at their next safe point, committing nothing.
``--grace SECONDS`` (default 30) is how long uvicorn then waits for them.
What still runs after that is cancelled, and fails closed as well.

``--keep-alive SECONDS`` (default 15) paces the ``: ping`` comments of a waiting stream.
A turn's ``/events`` and an AG-UI run send one whenever that long passes without an event.
A proxy that closes idle connections then keeps them open.

Tokens (repeatable) turn authentication on.
Each stands for a principal with a name, a tenant and a role
(see :class:`intention_kernel.host.Principal`)::

    --token SECRET=TENANT                                 a user of TENANT
    --token 'SECRET=TENANT;role=operator;principal=NAME'  an operator of TENANT
    --token 'SECRET=;role=operator;principal=NAME'        an operator without a tenant

A ``user`` (a chat front end) posts turns under its tenant.
It reads that tenant's threads.
An ``operator`` also lists and resolves its receipts, recorded as NAME.
After the tenant come ``;``-separated attributes.
``role`` is ``user`` (the default) or ``operator``.
``principal`` is the name; a user's defaults to its tenant.
A token without a tenant must name its principal.
``SECRET=`` alone once was a tenant-less operator.
It is now refused, rather than silently made a user.
A tenant ID that holds ``;`` cannot be given this way (use ``create_app``).
Tokens on a command line are visible to local users (``ps``).
Prefer ``$INTENTION_KERNEL_TOKENS``: the same specifications, comma-separated.

Who may call: without tokens, the host trusts every caller that reaches it.
So it listens only on a loopback address unless ``--insecure`` says that this is meant.
``--host 0.0.0.0`` without ``--token`` refuses to start.
It answers only requests whose ``Host`` is one of three kinds of name.
A loopback name is one, and the address it listens on is another.
The third is a name given with ``--allowed-host``.
That option is repeatable: ``*.example.com`` for subdomains, ``*`` for any.
A DNS-rebinding page sends its own name.
Browser requests from another origin need a bearer token
(see :mod:`intention_kernel.host._guard`).

Event loop: ``--loop auto`` (the default) runs the host on uvloop where it is installed.
The ``http`` extra installs it, except on Windows.
Elsewhere it runs on asyncio's loop.
``--loop asyncio`` and ``--loop uvloop`` choose.
On uvloop, the PostgreSQL adapter's asyncio driver costs markedly less CPU per statement.
See docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import ipaddress
import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from intention_kernel.cli._common import (
    AgentOption,
    DbOption,
    enter_agent,
    log_warnings_to_stderr,
    open_store,
    refuse,
    resolve_db_url,
    stderr,
)
from intention_kernel.cli._help import Command

if TYPE_CHECKING:
    from intention_kernel._agent import Agent
    from intention_kernel.host import Principal

__all__ = [
    "TOKENS_ENV_VAR",
    "Loop",
    "allowed_hosts",
    "loop_runner",
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
            metavar="TOKEN=TENANT[;role=operator;principal=NAME]",
            help="A bearer token, its tenant and, after ';', its role (user, the default, "
            "or operator: may list and resolve receipts) and principal (the name recorded "
            f"as actor). Repeatable; also ${TOKENS_ENV_VAR}, comma-separated",
            show_default=False,
        ),
    ] = None,
    lock_timeout: Annotated[
        float | None,
        typer.Option(
            "--lock-timeout",
            metavar="SECONDS",
            min=0.0,
            help="How long a turn waits for a busy thread before 503 lock-timeout "
            "(default: the store's, 30)",
            show_default=False,
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME",
            help="Another name clients reach the host by (repeatable; *.example.com, or * "
            "for any); loopback names are always allowed",
            show_default=False,
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Listen on a non-loopback address without --token (anyone who reaches it "
            "may run turns and resolve receipts)",
        ),
    ] = False,
    loop: Annotated[
        Loop,
        typer.Option(
            "--loop",
            metavar="auto|asyncio|uvloop",
            case_sensitive=False,
            help="The event loop: uvloop where installed (auto), or asyncio's",
        ),
    ] = Loop.AUTO,
    no_timers: Annotated[
        bool,
        typer.Option("--no-timers", help="Do not fire timers here (run timers run elsewhere)"),
    ] = False,
    grace: Annotated[
        int,
        typer.Option(
            "--grace",
            metavar="SECONDS",
            min=0,
            help="On SIGTERM or SIGINT: new turns answer 503 shutting-down, running ones "
            "stop at their next safe point; after this long, what still runs is cancelled",
        ),
    ] = 30,
    keep_alive: Annotated[
        float,
        typer.Option(
            "--keep-alive",
            metavar="SECONDS",
            help="A waiting event stream (a turn's /events, an AG-UI run) sends ': ping' "
            "this often, so a proxy does not close it as idle",
        ),
    ] = 15.0,
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
    from intention_kernel.host._turnstreams import check_keep_alive

    url = resolve_db_url(db)
    try:
        check_keep_alive(keep_alive, "--keep-alive")
    except ValueError as exc:
        refuse(str(exc))
    try:
        pairs = list(token or [])
        pairs += [p for p in os.environ.get(TOKENS_ENV_VAR, "").split(",") if p.strip()]
        tokens = parse_tokens(pairs) if pairs else None
        hosts = allowed_hosts(host, allowed_host or [])
    except ValueError as exc:
        refuse(str(exc))
    from intention_kernel.host._guard import is_loopback

    if tokens is None and not insecure and not is_loopback(host):
        refuse(
            f"--host {host} is not a loopback address and no --token is given: anyone who "
            "can reach it could run turns and resolve receipts. Give tokens (--token or "
            f"${TOKENS_ENV_VAR}), or --insecure if a gateway in front authenticates callers."
        )
    with log_warnings_to_stderr():
        run(
            _serve(
                agent,
                url,
                host,
                port,
                tokens,
                lock_timeout,
                hosts,
                not no_timers,
                grace,
                keep_alive,
            )
        )


def allowed_hosts(bound: str, given: list[str]) -> list[str]:
    """The names the host answers to besides the loopback ones.

    Those are ``given``, and the address it listens on when that is one address.
    ``0.0.0.0`` and ``::`` are not one address.
    Clients reaching the host by that address send it as their ``Host``.
    """
    from intention_kernel.host._guard import check_host_patterns

    hosts = list(check_host_patterns(given))
    try:
        address = ipaddress.ip_address(bound.strip("[]"))
    except ValueError:
        address = None
    if address is not None and not address.is_unspecified:
        hosts += check_host_patterns([str(address)])
    return hosts


def parse_tokens(specs: list[str]) -> dict[str, Principal]:
    """``["s3cret=acme", "k7=acme;role=operator;principal=alice"]`` → ``{"s3cret":
    Principal("acme", "acme", "user"), "k7": Principal("alice", "acme", "operator")}``.

    Error messages never repeat a secret."""
    from intention_kernel.host import Principal

    tokens: dict[str, Principal] = {}
    for spec in specs:
        secret, sep, rest = spec.strip().partition("=")
        if not sep or not secret:
            raise ValueError(
                "--token must look like TOKEN=TENANT or "
                f"'TOKEN=TENANT;role=operator;principal=NAME', got {secret[:2]!r}…"
            )
        if secret in tokens:
            raise ValueError("a token is given twice")
        tenant, *attributes = rest.split(";")
        given: dict[str, str] = {}
        for attribute in attributes:
            name, has_value, value = attribute.partition("=")
            name = name.strip()
            if name not in ("role", "principal") or not has_value:
                raise ValueError(
                    f"--token {secret[:2]}…: unknown attribute {attribute!r} after the tenant "
                    "(only role=user|operator and principal=NAME; a tenant ID holding ';' "
                    "cannot be given on the command line)"
                )
            if name in given:
                raise ValueError(f"--token {secret[:2]}…: {name}= is given twice")
            given[name] = value.strip()
        if given.get("principal") == "":
            raise ValueError(f"--token {secret[:2]}…: principal= needs a name")
        role = given.get("role", "user")
        principal = given.get("principal") or tenant
        if not principal:
            raise ValueError(
                f"--token {secret[:2]}…= has no tenant and names no principal: say whom it "
                "stands for, e.g. 'TOKEN=;role=operator;principal=NAME' (a token without a "
                "tenant used to be an operator; roles are now explicit)"
            )
        if role == "operator" and "principal" not in given:
            raise ValueError(
                f"--token {secret[:2]}…: an operator names its principal (principal=NAME), "
                "the person recorded as the actor of what it resolves"
            )
        if role not in ("user", "operator"):
            raise ValueError(f"--token {secret[:2]}…: role is user or operator, not {role!r}")
        tokens[secret] = Principal(
            principal, tenant or None, "operator" if role == "operator" else "user"
        )
    return tokens


async def _serve(
    spec: str,
    url: str,
    host: str,
    port: int,
    tokens: dict[str, Principal] | None,
    lock_timeout: float | None,
    hosts: list[str],
    timers: bool = True,
    grace: int = 30,
    keep_alive: float = 15.0,
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        # On the serving loop: a client the agent opens (an MCP session) belongs to it.
        # Entered first, so exited last: after the server stopped and the store closed.
        agent = await enter_agent(stack, spec, db_url=url)
        await _serve_agent(
            agent, url, host, port, tokens, lock_timeout, hosts, timers, grace, keep_alive
        )


async def _serve_agent(
    agent: Agent,
    url: str,
    host: str,
    port: int,
    tokens: dict[str, Principal] | None,
    lock_timeout: float | None,
    hosts: list[str],
    timers: bool = True,
    grace: int = 30,
    keep_alive: float = 15.0,
) -> None:
    import uvicorn

    from intention_kernel._kernel import Kernel
    from intention_kernel.durability._contract.recorders import Operable
    from intention_kernel.errors import KernelError
    from intention_kernel.host import create_app

    durability = open_store(url, lock_timeout=lock_timeout)
    try:
        # One connection first: an unreachable server is one message at once, not the
        # pool's retries (each logged) until its connect timeout.
        if isinstance(durability, Operable):
            await durability.exists()
        await durability.__aenter__()
    except KernelError as exc:
        refuse(f"cannot open the store {url}: {exc}")
    try:
        try:
            kernel = Kernel(agent, durability)
            app = create_app(
                kernel, tokens=tokens, allowed_hosts=hosts, timers=timers, keep_alive=keep_alive
            )
        except (KernelError, TypeError, ValueError) as exc:
            refuse(str(exc))
        if tokens:
            operators = sum(1 for p in tokens.values() if p.role == "operator")
            auth = f"{len(tokens)} token(s), {operators} of them operator(s)"
        else:
            auth = "no authentication"
        names = ", ".join(["loopback", *hosts])
        loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # uvloop, asyncio
        stderr.print(
            Text.assemble(
                "serving ",
                (agent.name, "bold"),
                f" v{agent.version} ({kernel.fingerprint}) from {url} on http://{host}:{port}"
                f" · {auth} · answers Host {names} · {loop} event loop · console at /console",
            )
        )
        # The lifespan runs the timer loop beside the requests (``create_app(timers=)``).
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="on",
            log_level="info",
            timeout_graceful_shutdown=grace,
        )

        class DrainingServer(uvicorn.Server):
            """On the first SIGTERM or SIGINT, drain the kernel first: new turns answer
            503 ``shutting-down``, running ones stop at their next safe point. uvicorn
            then waits up to ``timeout_graceful_shutdown`` and cancels the rest."""

            def handle_exit(self, sig: int, frame: Any) -> None:
                kernel.begin_shutdown()
                super().handle_exit(sig, frame)

        await DrainingServer(config).serve()
    finally:
        await durability.aclose()
