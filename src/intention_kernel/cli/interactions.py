"""``intention-kernel interactions expire``: close confirmations nobody answered in time.

::

    intention-kernel interactions expire --db postgresql://...

Closes every interaction whose ``expires_at`` has passed (a capability declared
``confirm_within``), as the next turn on its thread would: its held operation is
dropped unrun, and ``interaction.expired`` is emitted. Each is closed by a turn of its
own under the thread's lock, beside live turns; running the command again, or two at
once, closes each interaction once. No agent is needed: no agent code runs. Run it
from cron (every minute, say) when consumers of ``interaction.expired`` must hear of
an abandoned confirmation before someone writes to its thread again. A thread it cannot
close (busy past the lock timeout, unreadable, or its expiry turn ID taken by a client
turn) is listed, and every other thread is still closed. Exit status 1 if any was listed.
"""

from __future__ import annotations

import typer

from intention_kernel.cli._common import EXIT_FAILED, DbOption, ThreadBatchOption, resolve_db_url
from intention_kernel.cli._help import Command, Group
from intention_kernel.cli._render import console
from intention_kernel.cli.deploy import refusals, run_operation
from intention_kernel.operations import ExpiryReport, expire_interactions

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Operate on pending interactions (confirmations).",
        no_args_is_help=True,
        cls=Group,
    )
    group.command("expire", cls=Command)(expire)
    app.add_typer(group, name="interactions")


def expire(
    db: DbOption = None,
    batch: ThreadBatchOption = 100,
) -> None:
    """Close every interaction past its deadline; its operation never runs."""
    report: ExpiryReport = run_operation(
        resolve_db_url(db), lambda s: expire_interactions(s, batch=batch)
    )
    out = console()
    out.print(
        f"expired {report.expired} interaction(s) overdue at "
        f"{report.now.isoformat(timespec='seconds')}"
    )
    if report.failed:
        refusals(out, report.failed, "left as they were (run again to retry)")
        raise typer.Exit(EXIT_FAILED)
