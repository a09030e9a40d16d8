"""``intention-kernel timers``: a thread's turns set for later, and the worker firing them.

::

    intention-kernel timers list --db postgresql://... [--thread T] [--status pending] [--json]
    intention-kernel timers run --db postgresql://... --agent pkg.mod:agent [--once]

``list`` shows timers by thread and key: when each is due, what became of it, and the
turn that fired it. With ``--json``, one object a line.

``run`` fires due timers, each as a turn of ``--agent``, until interrupted (Ctrl-C or
SIGTERM). ``--once`` makes one pass, prints what it fired and exits. Any number of
workers may run at once, on any number of hosts: each timer fires once. A worker
killed while firing leaves its timers claimed for ``--claim-for`` seconds. Then
another worker fires them, under the same turn IDs. The HTTP host runs the same loop
in the background unless told not to. Exit status 1 if a pass of ``--once`` failed to
fire one (it is tried again by the next pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from typing import Annotated, Any

import typer
from rich.text import Text

from intention_kernel.cli._common import (
    EXIT_FAILED,
    AgentOption,
    DbOption,
    enter_agent,
    log_warnings_to_stderr,
    refuse,
    resolve_db_url,
)
from intention_kernel.cli._deploy import run_operation
from intention_kernel.cli._help import Command, Group
from intention_kernel.cli._render import console, print_records
from intention_kernel.durability._contract.records import Timer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="List timers (turns set for later), and run the worker that fires them.",
        no_args_is_help=True,
        cls=Group,
    )
    group.command("list", cls=Command)(list_timers)
    group.command("run", cls=Command)(run)
    app.add_typer(group, name="timers")


def list_timers(
    db: DbOption = None,
    thread: Annotated[
        str | None, typer.Option("--thread", metavar="THREAD", help="Only this thread's")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option("--status", metavar="STATUS", help="pending, fired or void (default: all)"),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", metavar="N", min=1, help="At most this many")
    ] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
) -> None:
    """List timers: when each is due, and what became of it."""
    from intention_kernel._timer_runner import list_timers as read
    from intention_kernel.durability._contract.recorders import TimerRecorder

    async def listed(store: Any) -> list[Timer]:
        recorder = await store.recorder()
        if not isinstance(recorder, TimerRecorder):  # pragma: no cover - every bundled one is
            refuse(f"{type(store).__name__} keeps no timers")
        return await read(recorder, thread, status=status, limit=limit)

    timers: list[Timer] = run_operation(resolve_db_url(db), listed)
    if as_json:
        for timer in timers:
            typer.echo(json.dumps(timer_as_dict(timer), ensure_ascii=False))
        return
    rows = [
        (
            Text(t.thread_id),
            Text(t.key),
            Text(t.status),
            Text(t.due_at.isoformat(timespec="seconds")),
            Text(t.cron or ("" if t.every is None else str(t.every))),
            Text(t.turn_id or ""),
        )
        for t in timers
    ]
    print_records(
        console(),
        f"{len(timers)} timer(s)",
        ("thread", "key", "status", "due", "every", "turn"),
        rows,
        whole=("thread", "key"),
        free="turn",
    )


def timer_as_dict(timer: Timer) -> dict[str, Any]:
    """A timer as ``list --json`` prints it."""

    def at(moment: Any) -> str | None:
        return None if moment is None else str(moment.isoformat())

    return {
        "thread_id": timer.thread_id,
        "key": timer.key,
        "tenant_id": timer.tenant_id,
        "status": timer.status,
        "due_at": at(timer.due_at),
        "every_seconds": None if timer.every is None else timer.every.total_seconds(),
        "cron": timer.cron,
        "unless_version_after": timer.unless_version_after,
        "message": timer.message,
        "data": timer.data,
        "turn_id": timer.turn_id,
        "settled_at": at(timer.settled_at),
        "claimed_until": at(timer.claimed_until),
    }


def run(
    agent: AgentOption,
    db: DbOption = None,
    once: Annotated[bool, typer.Option("--once", help="One pass, then exit")] = False,
    poll: Annotated[
        float,
        typer.Option(
            "--poll", metavar="SECONDS", min=0.01, help="Seconds between passes while idle"
        ),
    ] = 0.25,
    claim_for: Annotated[
        float,
        typer.Option(
            "--claim-for",
            metavar="SECONDS",
            min=0.1,
            help="Seconds a claim keeps other workers off",
        ),
    ] = 60.0,
) -> None:
    """Fire due timers as turns of AGENT, once each, until interrupted."""
    from intention_kernel import Kernel

    url = resolve_db_url(db)

    async def work(store: Any) -> int:
        async with contextlib.AsyncExitStack() as stack:
            loaded = await enter_agent(stack, agent, db_url=url)
            kernel = Kernel(loaded, store)
            if once:
                fired = await kernel.fire_due_timers(claim_for=claim_for)
                for outcome in fired:
                    line = f"{outcome.outcome}: {outcome.thread_id} {outcome.key} {outcome.turn_id}"
                    typer.echo(line + (f" ({outcome.error})" if outcome.error else ""))
                return sum(1 for o in fired if o.outcome == "failed")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await kernel.run_timers(poll_interval=poll, claim_for=claim_for, stop=stop)
            return 0

    with log_warnings_to_stderr():
        failed: int = run_operation(url, work)
    if failed:
        raise typer.Exit(EXIT_FAILED)
