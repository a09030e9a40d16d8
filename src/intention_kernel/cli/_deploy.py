"""``intention-kernel check`` and ``migrate``: is the stored state safe for this deploy?

::

    intention-kernel check --agent myapp.agents:agent --db postgresql://...
    intention-kernel migrate --db postgresql://... --batch 200

``check`` reads every stored checkpoint.
It counts them by schema revision and agent fingerprint.
It lists each thread the agent would refuse.
The agent refuses a newer schema revision and a fingerprint it does not declare compatible.
It also refuses a record that does not decode.
The exit status is 1 if there is any.
Run it against the new agent before rolling it out.
A store without any checkpoint passes with a warning (exit status 0).
A store that does not exist is refused (exit status 2), as by every operations command.

``migrate`` rewrites checkpoints of older schema revisions as the current one.
It works in batches, one thread at a time.
It holds the thread's own lock only for a read and a short write, so live turns go on.
It is resumable: run it again after an interruption.
Run it once every worker runs the library that knows the new revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from intention_kernel.cli._common import (
    EXIT_FAILED,
    AgentOption,
    DbOption,
    ThreadBatchOption,
    enter_agent,
    existing_store,
    fail,
    resolve_db_url,
    stderr,
)
from intention_kernel.cli._help import Command
from intention_kernel.cli._render import console, print_records, table
from intention_kernel.errors import KernelError
from intention_kernel.operations import (
    CheckReport,
    MigrationReport,
    check_checkpoints,
    migrate_checkpoints,
)

__all__ = ["refusals", "register", "run_operation"]

REASONS = {
    "newer_revision": "newer schema revision",
    "foreign_fingerprint": "undeclared fingerprint",
    "corrupt": "corrupt",
    "busy": "thread stayed busy",
    "moved": "a turn committed meanwhile",
    "conflict": "turn ID taken by another request",
    "failed": "refused by the store",
}


def register(app: typer.Typer) -> None:
    app.command("check", cls=Command)(check)
    app.command("migrate", cls=Command)(migrate)


def check(
    agent: AgentOption,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
) -> None:
    """Report stored checkpoints by revision and fingerprint, and the threads AGENT refuses."""
    url = resolve_db_url(db)

    async def checked(store: Any) -> CheckReport:
        # The agent is entered on the operation's loop, as ``serve`` enters it.
        # So an agent that needs async set-up is checked too.
        # An MCP client listing its tools is one.
        async with contextlib.AsyncExitStack() as stack:
            loaded = await enter_agent(stack, agent, db_url=url)
            return await check_checkpoints(store, loaded)

    report: CheckReport = run_operation(url, checked)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "fingerprint": report.fingerprint,
                    "threads": report.threads,
                    "revisions": {str(k): v for k, v in report.revisions.items()},
                    "fingerprints": {str(k): v for k, v in report.fingerprints.items()},
                    "refused": [
                        {"thread_id": r.thread_id, "reason": r.reason, "detail": r.detail}
                        for r in report.refused
                    ],
                },
                ensure_ascii=False,
            )
        )
    else:
        out = console()
        out.print(f"{report.threads} stored checkpoint(s); agent fingerprint {report.fingerprint}")
        counts = table(
            "by schema revision and fingerprint",
            "schema revision / fingerprint",
            whole=("schema revision / fingerprint",),
        )
        counts.add_column(Text("threads"), justify="right", no_wrap=True)
        for revision, n in sorted(report.revisions.items(), key=lambda kv: str(kv[0])):
            counts.add_row(Text(f"revision {revision}"), Text(str(n)))
        for fingerprint, n in sorted(report.fingerprints.items(), key=lambda kv: str(kv[0])):
            mark = " (this agent)" if fingerprint == report.fingerprint else ""
            counts.add_row(Text(f"{fingerprint}{mark}"), Text(str(n)))
        out.print(counts)
        if not report.ok:
            refusals(out, report.refused, "refused by this agent")
        elif report.threads:
            out.print(Text.assemble(("ok:", "green"), " the agent accepts every stored thread"))
    if report.threads == 0:  # the store exists (see existing_store), but is it the right one?
        stderr.print(
            Text.assemble(
                ("warning:", "bold yellow"),
                " the store holds no checkpoint: nothing was checked "
                "(is --db the store your workers use?)",
            )
        )
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def migrate(
    db: DbOption = None,
    batch: ThreadBatchOption = 100,
) -> None:
    """Upgrade checkpoints of older schema revisions in place, in batches, resumably."""
    report: MigrationReport = run_operation(
        resolve_db_url(db), lambda s: migrate_checkpoints(s, batch=batch)
    )
    out = console()
    out.print(f"migrated {report.migrated} thread(s) to schema revision {report.revision}")
    if report.failed:
        refusals(out, report.failed, "left as they were (run again to retry)")
        raise typer.Exit(EXIT_FAILED)


def refusals(out: Console, refused: Any, title: str) -> None:
    print_records(
        out,
        f"{len(refused)} thread(s) {title}",
        ("thread", "reason", "detail"),
        [
            (Text(r.thread_id), Text(REASONS.get(r.reason, r.reason)), Text(r.detail))
            for r in refused
        ],
        whole=("thread", "reason"),
        free="detail",
    )


def run_operation(url: str, action: Any) -> Any:
    opened = existing_store(url)

    async def go() -> Any:
        async with opened as store:
            return await action(store)

    try:
        return asyncio.run(go())
    except (KernelError, ValueError) as exc:
        fail(exc)
