"""``intention-kernel threads show THREAD``: one thread, as an operator looks at it.

::

    intention-kernel threads show acct-42 --db postgresql://... [--steps 10] [--json]

Prints the thread's latest checkpoint, its recent steps and its receipts.
The checkpoint shows version, tenant, schema revision and agent fingerprint.
It shows how many messages, facts and agenda items it holds.
It shows the pending interaction.
The steps come from the thread's ``turn.committed`` events, newest last.
A retention ``prune`` may have removed older ones.
With ``--json``, one JSON document.
A thread with no committed turn is refused (exit status 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.text import Text

from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel._effects import Receipt
from intention_kernel._turns import OutboxEvent
from intention_kernel.cli._common import DbOption, refuse, resolve_db_url
from intention_kernel.cli._deploy import run_operation
from intention_kernel.cli._help import Command, Group
from intention_kernel.cli._interactions import may_answer, pending_as_dict
from intention_kernel.cli._receipts import receipt_as_dict
from intention_kernel.cli._render import console, print_records, status_text
from intention_kernel.durability._contract.records import PendingInteraction, ThreadOwner

__all__ = ["register"]

#: Outbox events read at a time while looking for a thread's steps.
_PAGE = 500


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Inspect one thread.", no_args_is_help=True, cls=Group)
    group.command("show", cls=Command)(show)
    app.add_typer(group, name="threads")


@dataclass(frozen=True, slots=True)
class _Thread:
    checkpoint: KernelCheckpoint
    owner: ThreadOwner | None
    steps: list[dict[str, Any]]
    receipts: list[Receipt]


def show(
    thread: Annotated[str, typer.Argument(metavar="THREAD", help="The thread ID")],
    db: DbOption = None,
    steps: Annotated[
        int,
        typer.Option("--steps", metavar="N", min=0, help="How many recent steps to show"),
    ] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
) -> None:
    """Show a thread: its checkpoint, its recent steps and its receipts."""

    async def read(store: Any) -> _Thread | None:
        checkpoint = await store.load_checkpoint(thread)
        if checkpoint is None:
            return None
        owner = await store.thread_owner(thread)
        recent = _recent_steps(await _turn_events(store, thread), steps)
        return _Thread(checkpoint, owner, recent, await store.list_receipts(thread_id=thread))

    found: _Thread | None = run_operation(resolve_db_url(db), read)
    if found is None:
        refuse(f"no thread {thread!r}: no turn was committed on it (check --db)")
    tenant = found.owner.tenant_id if found.owner is not None else None
    checkpoint = found.checkpoint
    pending = (
        PendingInteraction(thread, tenant, checkpoint.version, checkpoint.interaction)
        if checkpoint.interaction is not None
        else None
    )
    if as_json:
        document = {
            "thread_id": thread,
            "tenant_id": tenant,
            "version": checkpoint.version,
            "schema_revision": checkpoint.schema_revision,
            "agent_fingerprint": checkpoint.agent_fingerprint,
            "messages": len(checkpoint.messages),
            "facts": {key: record.value for key, record in checkpoint.facts.items()},
            "agenda": [
                {"step_id": a.step_id, "capability_id": a.capability_id, "turn_id": a.turn_id}
                for a in checkpoint.agenda
            ],
            "interaction": pending_as_dict(pending) if pending is not None else None,
            "recent_steps": found.steps,
            "receipts": [receipt_as_dict(r) for r in found.receipts],
        }
        typer.echo(json.dumps(document, ensure_ascii=False))
        return
    out = console()
    out.print(
        Text.assemble(
            ("thread ", "bold"),
            (thread, "bold"),
            f" · version {checkpoint.version} · tenant {tenant or '(none)'}"
            f" · schema revision {checkpoint.schema_revision}"
            f" · agent {checkpoint.agent_fingerprint}",
        )
    )
    out.print(
        f"{len(checkpoint.messages)} message(s) · {len(checkpoint.facts)} fact(s) · "
        f"{len(checkpoint.agenda)} agenda item(s)"
    )
    if pending is None:
        out.print("pending: nothing")
    else:
        interaction = pending.interaction
        deadline = (
            interaction.expires_at.isoformat(timespec="seconds")
            if interaction.expires_at is not None
            else "none"
        )
        out.print(
            Text(
                f"pending: {interaction.id} · {interaction.capability_id} · deadline {deadline}"
                f" · approvals {len(interaction.approved_by)}/{interaction.approvals}\n"
                f"  may answer: {may_answer(pending)}\n  {interaction.prompt}"
            )
        )
    print_records(
        out,
        f"{len(found.steps)} recent step(s)",
        ("turn", "step", "capability", "status"),
        [
            (
                Text(s["turn_id"] or ""),
                Text(s["step_id"]),
                Text(s["capability_id"]),
                status_text(s["status"]),
            )
            for s in found.steps
        ],
        whole=("turn", "step", "status"),
    )
    print_records(
        out,
        f"{len(found.receipts)} receipt(s)",
        ("key", "status", "attempt", "turn", "step", "updated"),
        [
            (
                Text(r.key),
                status_text(r.status),
                Text(str(r.attempt)),
                Text(r.turn_id),
                Text(r.step_id),
                Text(r.updated_at.isoformat(timespec="seconds") if r.updated_at else ""),
            )
            for r in found.receipts
        ],
        whole=("key", "status"),
    )


async def _turn_events(store: Any, thread_id: str) -> list[OutboxEvent]:
    """The thread's ``turn.committed`` events still in its outbox, oldest first."""
    events: list[OutboxEvent] = []
    after: int | None = None
    while True:
        page = await store.read_outbox(thread_id=thread_id, after=after, limit=_PAGE)
        events += [e for e in page if e.type == "turn.committed"]
        if len(page) < _PAGE:
            return events
        after = page[-1].position


def _recent_steps(events: list[OutboxEvent], wanted: int) -> list[dict[str, Any]]:
    """The last ``wanted`` steps of ``events``, oldest first, each with its turn."""
    steps: list[dict[str, Any]] = []
    for event in events:
        payload = event.payload if isinstance(event.payload, dict) else {}
        for step in payload.get("steps") or ():
            if isinstance(step, dict):
                steps.append(
                    {
                        "turn_id": event.turn_id,
                        "version": payload.get("version"),
                        "step_id": str(step.get("step_id", "")),
                        "capability_id": str(step.get("capability_id", "")),
                        "status": str(step.get("status", "")),
                    }
                )
    return steps[-wanted:] if wanted else []
