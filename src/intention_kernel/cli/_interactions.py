"""``intention-kernel interactions``: the confirmations waiting for a person.

::

    intention-kernel interactions list --db postgresql://... [--tenant acme] [--json]
    intention-kernel interactions expire --db postgresql://...

``list`` shows every pending interaction, one per thread.
It shows its thread and tenant, its ID, and the capability it would run.
It shows the prompt the person was shown and its deadline.
It shows the approvals it has and needs, and who may answer it.
With ``--json``, one object a line.

``expire``:

Closes every interaction whose ``expires_at`` has passed.
Only a capability that declared ``confirm_within`` sets one.
It closes them as the next turn on the thread would.
The held operation is dropped unrun, and ``interaction.expired`` is emitted.
Each is closed by a turn of its own under the thread's lock, beside live turns.
Running the command again, or two at once, closes each interaction once.
No agent is needed: no agent code runs.
Run it from cron (every minute, say) in one case.
That is when consumers of ``interaction.expired`` must hear of an abandoned confirmation.
They then hear before someone writes to its thread again.
A thread it cannot close is listed, and every other thread is still closed.
It may be busy past the lock timeout, or unreadable.
Or a client turn may have taken its expiry turn ID.
Exit status 1 if any was listed.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.text import Text

from intention_kernel.cli._common import (
    EXIT_FAILED,
    DbOption,
    ThreadBatchOption,
    refuse,
    resolve_db_url,
)
from intention_kernel.cli._deploy import refusals, run_operation
from intention_kernel.cli._help import Command, Group
from intention_kernel.cli._render import console, print_records
from intention_kernel.durability._contract.records import PendingInteraction, ThreadOwner
from intention_kernel.operations import ExpiryReport, expire_interactions

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Operate on pending interactions (confirmations).",
        no_args_is_help=True,
        cls=Group,
    )
    group.command("list", cls=Command)(list_interactions)
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


#: How many pending interactions one ``list`` reads from the store at a time.
_PAGE = 100


def list_interactions(
    db: DbOption = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant", metavar="TENANT", help="Only this tenant's (default: every tenant's)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
) -> None:
    """List pending interactions: what waits for whom, and until when."""
    from intention_kernel.durability._contract.recorders import InteractionQueue

    owner = ThreadOwner(tenant) if tenant is not None else None

    async def read(store: Any) -> list[PendingInteraction]:
        if not isinstance(store, InteractionQueue):  # pragma: no cover - every bundled one is
            refuse(f"{type(store).__name__} cannot list interactions across threads")
        found: list[PendingInteraction] = []
        after: str | None = None
        while True:
            page = await store.pending_interactions(owner=owner, after=after, limit=_PAGE)
            found += page
            if len(page) < _PAGE:
                return found
            after = page[-1].thread_id

    pending: list[PendingInteraction] = run_operation(resolve_db_url(db), read)
    if as_json:
        for item in pending:
            typer.echo(json.dumps(pending_as_dict(item), ensure_ascii=False))
        return
    rows = [
        (
            Text(p.thread_id),
            Text(p.tenant_id if p.tenant_id is not None else "(none)"),
            Text(p.interaction.id),
            Text(p.interaction.capability_id),
            Text(_deadline(p)),
            Text(f"{len(p.interaction.approved_by)}/{p.interaction.approvals}"),
            Text(may_answer(p)),
            Text(p.interaction.prompt),
        )
        for p in pending
    ]
    print_records(
        console(),
        f"{len(pending)} pending interaction(s)",
        ("thread", "tenant", "id", "capability", "deadline", "approvals", "may answer", "prompt"),
        rows,
        whole=("thread", "id"),
        free="prompt",
    )


def pending_as_dict(pending: PendingInteraction) -> dict[str, Any]:
    """A pending interaction as ``list --json`` (and ``threads show --json``) print it."""
    interaction = pending.interaction
    return {
        "thread_id": pending.thread_id,
        "tenant_id": pending.tenant_id,
        "version": pending.version,
        "id": interaction.id,
        "kind": interaction.kind,
        "capability_id": interaction.capability_id,
        "prompt": interaction.prompt,
        "input": interaction.input,
        "step_id": interaction.step_id,
        "turn_id": interaction.turn_id,
        "expires_at": (
            interaction.expires_at.isoformat() if interaction.expires_at is not None else None
        ),
        "approvals": interaction.approvals,
        "approved_by": list(interaction.approved_by),
        # Who may answer: ``null`` is anyone who may post to the thread.
        "may_answer": interaction.who_may_answer,
        "proposed_by": interaction.proposed_by,
    }


def may_answer(pending: PendingInteraction) -> str:
    """Who may answer ``pending``, for a person: the policy stored with it.
    No stored policy means anyone who may post to its thread."""
    return pending.interaction.who_may_answer or "anyone on the thread"


def _deadline(pending: PendingInteraction) -> str:
    expires_at = pending.interaction.expires_at
    return "none" if expires_at is None else expires_at.isoformat(timespec="seconds")
