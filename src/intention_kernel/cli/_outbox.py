"""``intention-kernel outbox``: relay committed events to a broker, and watch the lag.

::

    intention-kernel outbox relay --to nats://127.0.0.1:4222 --subject-prefix billing
    intention-kernel outbox relay --to https://hooks.example.com/ik --secret "$SECRET"
    intention-kernel outbox relay --to myapp.events:publish --once
    intention-kernel outbox status

A ``module:callable`` target is called once per event.
It is ``fn(event: OutboxEvent) -> None``, run in a worker thread.
Or it is ``async def fn(event) -> None``.
Returning acknowledges the event.
Raising fails the attempt, which is retried with backoff.
A failed attempt blocks only that thread.
Delivery is at least once, so the function dedupes on ``event.id``.
An object with ``async publish(event)`` and ``async aclose()`` is used as it is.
That is a :class:`~intention_kernel.outbox.Sink`.

``relay`` runs until interrupted.
SIGINT or SIGTERM let the pass in hand finish.
With ``--once`` it makes one pass (exit status 1 if an event failed).
A running relay outlives store errors (a database restart, say).
Each is logged, and the pass retried after a backoff.
Any number of relays may run on one database; they share the threads.
The database is PostgreSQL, or a SQLite file on one host.
``status`` shows how many events wait, since when, and the events that keep failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.text import Text

from intention_kernel._effects import utcnow
from intention_kernel.cli._agent import imported
from intention_kernel.cli._common import (
    EXIT_FAILED,
    DbOption,
    existing_store,
    fail,
    log_warnings_to_stderr,
    refuse,
    resolve_db_url,
    stderr,
)
from intention_kernel.cli._help import Command, Group
from intention_kernel.cli._render import console, print_records
from intention_kernel.durability._contract.records import OutboxBacklog
from intention_kernel.errors import KernelError
from intention_kernel.outbox import NatsSink, OutboxRelay, RelayReport, Sink, WebhookSink

__all__ = ["SECRET_ENV_VAR", "load_sink", "register"]

#: Where ``--secret`` comes from when not given: the webhook's shared signing secret.
SECRET_ENV_VAR = "INTENTION_KERNEL_WEBHOOK_SECRET"


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Relay committed outbox events to NATS, a webhook or a function; show the lag.",
        no_args_is_help=True,
        cls=Group,
    )
    group.command("relay", cls=Command)(relay)
    group.command("status", cls=Command)(status)
    app.add_typer(group, name="outbox")


def load_sink(
    target: str,
    *,
    subject_prefix: str = "intention_kernel",
    stream: str = "INTENTION_KERNEL",
    secret: str | None = None,
) -> Sink | Callable[[Any], Any]:
    """The sink a ``--to`` target names: ``nats://...``, ``http(s)://...`` or
    ``module:callable``. Raises ``ValueError`` with a message for a person."""
    scheme = target.partition("://")[0].lower() if "://" in target else ""
    if scheme in ("nats", "tls"):
        return NatsSink(target, subject_prefix=subject_prefix, stream=stream)
    if scheme in ("http", "https"):
        if not secret:
            raise ValueError(
                "a webhook needs a shared secret to sign its requests: "
                f"--secret or ${SECRET_ENV_VAR}"
            )
        return WebhookSink(target, secret=secret)
    module_name, sep, attribute = target.partition(":")
    if scheme or not sep or not module_name or not attribute:
        raise ValueError(
            f"--to must be nats://host:port, http(s)://url or module:callable, got {target!r}"
        )
    found = imported(target, "--to")
    if isinstance(found, Sink):
        return found
    if not callable(found):
        raise ValueError(f"{target} is a {type(found).__name__}, not a callable")
    return found


def relay(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="TARGET",
            help=(
                "nats://host:4222, http(s)://webhook or module:callable. The callable is "
                "def fn(event: intention_kernel.OutboxEvent) -> None (or async def), called "
                "once per event: returning acknowledges it, raising fails the attempt "
                "(retried later); it may see an event again, so dedupe on event.id. "
                "An object with async publish(event) and aclose() is used as a Sink."
            ),
            show_default=False,
        ),
    ],
    db: DbOption = None,
    subject_prefix: Annotated[
        str,
        typer.Option(
            "--subject-prefix", metavar="PREFIX", help="NATS: subjects are PREFIX.<event type>"
        ),
    ] = "intention_kernel",
    stream: Annotated[
        str,
        typer.Option(
            "--stream", metavar="NAME", help="NATS: the JetStream stream (created if missing)"
        ),
    ] = "INTENTION_KERNEL",
    secret: Annotated[
        str | None,
        typer.Option(
            "--secret",
            metavar="SECRET",
            envvar=SECRET_ENV_VAR,
            help=f"Webhook: the shared HMAC secret (default: ${SECRET_ENV_VAR})",
            show_default=False,
        ),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Publish what is due, then exit")] = False,
    batch: Annotated[
        int, typer.Option("--batch", metavar="N", min=1, help="Events per thread claim")
    ] = 100,
    concurrency: Annotated[
        int, typer.Option("--concurrency", metavar="N", min=1, help="Threads published at once")
    ] = 4,
    poll: Annotated[
        float,
        typer.Option("--poll", metavar="SECONDS", min=0.0, help="Seconds between polls when idle"),
    ] = 1.0,
) -> None:
    """Publish committed events, each thread in order, at least once."""
    opened = existing_store(resolve_db_url(db))
    try:
        sink = load_sink(to, subject_prefix=subject_prefix, stream=stream, secret=secret)
    except (ValueError, ImportError) as exc:
        refuse(str(exc))

    async def go() -> RelayReport:
        async with (
            opened as store,
            OutboxRelay(
                store,
                sink,
                batch_size=batch,
                concurrency=concurrency,
                poll_interval=poll,
            ) as outbox,
        ):
            if once:
                return await outbox.run_once()
            return await _run_until_stopped(outbox)

    try:
        with log_warnings_to_stderr():
            total = asyncio.run(go())
    except (KernelError, ValueError) as exc:
        fail(exc)
    console().print(f"published {total.published} event(s); {total.failed} failed attempt(s)")
    if once and total.failed:
        raise typer.Exit(EXIT_FAILED)


async def _run_until_stopped(outbox: OutboxRelay) -> RelayReport:
    """``OutboxRelay.run`` until SIGINT or SIGTERM, printing each busy pass. A store
    error does not end it: the relay logs it and tries again after its backoff."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)

    def progress(report: RelayReport) -> None:
        stderr.print(
            f"{utcnow().isoformat(timespec='seconds')} published {report.published}, "
            f"failed {report.failed}"
        )

    return await outbox.run(stop, on_pass=progress)


def status(
    db: DbOption = None,
    failing: Annotated[
        int, typer.Option("--failing", metavar="N", min=0, help="How many failing events to list")
    ] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
) -> None:
    """Show the relay's lag: unpublished events, the oldest one's age, failing events."""
    opened = existing_store(resolve_db_url(db))

    async def go() -> OutboxBacklog:
        async with opened as store:
            recorder = await store.recorder()
            return await recorder.outbox_backlog(failing)

    try:
        backlog = asyncio.run(go())
    except (KernelError, ValueError) as exc:
        fail(exc)
    now = utcnow()
    oldest = backlog.oldest_unpublished_at
    age = (now - oldest).total_seconds() if oldest is not None else None
    if as_json:
        document = {
            "unpublished": backlog.unpublished,
            "oldest_unpublished_at": oldest.isoformat() if oldest else None,
            "oldest_unpublished_age_seconds": age,
            "failing": [
                {
                    "event_id": d.event.id,
                    "thread_id": d.event.thread_id,
                    "seq": d.event.seq,
                    "type": d.event.type,
                    "attempts": d.attempts,
                    "last_error": d.last_error,
                    "retry_at": d.retry_at.isoformat() if d.retry_at else None,
                }
                for d in backlog.failing
            ],
        }
        typer.echo(json.dumps(document, ensure_ascii=False))
        return
    out = console()
    lag = "none" if age is None else f"oldest {_age(age)} old ({_when(oldest)})"
    out.print(f"unpublished: {backlog.unpublished} event(s); {lag}")
    if not backlog.failing:
        out.print("failing: none")
        return
    print_records(
        out,
        f"{len(backlog.failing)} failing event(s)",
        ("thread", "seq", "type", "attempts", "next try", "last error"),
        [
            (
                Text(d.event.thread_id),
                Text(str(d.event.seq)),
                Text(d.event.type),
                Text(str(d.attempts)),
                Text(_when(d.retry_at)),
                Text(d.last_error or ""),
            )
            for d in backlog.failing
        ],
        whole=("thread", "seq", "type"),
        free="last error",
    )


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else ""


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"
