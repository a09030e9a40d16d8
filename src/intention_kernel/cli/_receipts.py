"""``intention-kernel receipts``: inspect effect receipts and reconcile uncertain ones.

An ``uncertain`` receipt is a write that may or may not have happened.
The provider's answer was lost, say, or the process died mid-call.
The kernel refuses to retry it.
An operator checks the provider and records the truth::

    intention-kernel receipts list --status uncertain
    intention-kernel receipts resolve THREAD KEY --applied --value '{"charge_id": "ch_1"}' \
        --note "found in the provider dashboard"
    intention-kernel receipts resolve THREAD KEY --not-applied --note "provider has no record"

``--applied`` makes later calls return the value without calling the provider.
So it needs ``--value`` (``--value null`` if the provider returned nothing).
``--not-applied`` lets a later call retry.
``--note`` is required.
The resolution is recorded on the receipt with who, when and why.
It is emitted as a ``receipt.resolved`` event.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import socket
from typing import Annotated, Any

import typer
from rich.text import Text

from intention_kernel._effects import Receipt, ReceiptStatus
from intention_kernel._json import dump_value
from intention_kernel.cli._common import (
    DbOption,
    existing_store,
    fail,
    refuse,
    resolve_db_url,
)
from intention_kernel.cli._help import Command, Group
from intention_kernel.cli._render import console, print_records, status_text
from intention_kernel.errors import KernelError, ReceiptError

__all__ = ["register"]

#: The width at which a table folds a receipt's write (its capability and input JSON).
#: A long input then leaves the note its room.
#: ``--json`` has the input whole.
WRITE_WIDTH = 48


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Inspect effect receipts and reconcile uncertain ones.",
        no_args_is_help=True,
        cls=Group,
    )
    group.command("list", cls=Command)(list_receipts)
    group.command("resolve", cls=Command)(resolve_receipt)
    app.add_typer(group, name="receipts")


def list_receipts(
    db: DbOption = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help="Only this status: prepared, completed, failed, uncertain",
        ),
    ] = None,
    thread: Annotated[
        str | None, typer.Option("--thread", metavar="THREAD", help="Only this thread")
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant", metavar="TENANT", help="Only this tenant's (default: every tenant's)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
) -> None:
    """List the current receipt of every effect key, oldest first, with what each
    write was (its capability and input) and who approved it."""
    wanted = _status(status)
    receipts = _run(
        resolve_db_url(db), lambda store: store.list_receipts(thread, wanted, tenant_id=tenant)
    )
    if as_json:
        for receipt in receipts:
            typer.echo(json.dumps(receipt_as_dict(receipt), ensure_ascii=False))
        return
    rows = []
    for r in receipts:
        note = r.error or ""
        if r.resolution is not None:
            note = f"resolved by {r.resolution.actor or '?'}: {r.resolution.note or ''}"
        approvers = ", ".join(r.approved_by) or r.actor
        if approvers:
            note = f"approved by {approvers}" + (f"; {note}" if note else "")
        rows.append(
            (
                Text(r.thread_id),
                Text(r.key),
                Text(_write_of(r)),
                status_text(r.status),
                Text(str(r.attempt)),
                Text(r.turn_id),
                Text(r.step_id),
                Text(r.updated_at.isoformat(timespec="seconds") if r.updated_at else ""),
                Text(note),
            )
        )
    print_records(
        console(),
        f"{len(receipts)} receipt(s)",
        ("thread", "key", "write", "status", "attempt", "turn", "step", "updated", "note"),
        rows,
        whole=("key", "status"),
        free="note",
        narrow={"write": WRITE_WIDTH},
    )


def resolve_receipt(
    thread: Annotated[str, typer.Argument(metavar="THREAD", help="The thread ID")],
    key: Annotated[
        str, typer.Argument(metavar="KEY", help="The stored effect key (capability_id:key)")
    ],
    applied: Annotated[
        bool | None,
        typer.Option(
            "--applied/--not-applied",
            help="Whether the write happened (check the provider first) \\[required]",
            show_default=False,
        ),
    ] = None,
    note: Annotated[
        str | None,
        typer.Option("--note", metavar="TEXT", help="Why: what the provider shows \\[required]"),
    ] = None,
    value: Annotated[
        str | None,
        typer.Option(
            "--value",
            metavar="JSON",
            help="With --applied (required there): the provider's result; null if none",
        ),
    ] = None,
    actor: Annotated[
        str | None,
        typer.Option("--actor", metavar="WHO", help="Who resolves it (default: user@host)"),
    ] = None,
    db: DbOption = None,
) -> None:
    """Record whether an uncertain write happened; later turns act on it."""
    if applied is None:
        refuse("say whether the write happened: --applied or --not-applied")
    if not note or not note.strip():
        refuse("--note is required: record why, for whoever looks at this receipt next")
    if value is not None and not applied:
        refuse("--value only makes sense with --applied")
    if applied and value is None:
        # Later uses of the receipt get this value in place of a provider call, for good.
        refuse(
            "--applied needs --value JSON: the provider's result, which later uses of this "
            "receipt get instead of a call (--value null if it returned nothing)"
        )
    parsed: Any = None
    if value is not None:
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            refuse(f"--value is not JSON: {exc}")
    who = actor or f"{getpass.getuser()}@{socket.gethostname()}"
    receipt = _run(
        resolve_db_url(db),
        lambda store: store.resolve_receipt(
            thread, key, applied=applied, value=parsed, note=note, actor=who
        ),
    )
    console().print(
        Text.assemble(
            ("resolved", "green"),
            f" {receipt.key} on {receipt.thread_id}: now ",
            status_text(receipt.status),
            f" (by {who})",
        )
    )


def _status(status: str | None) -> ReceiptStatus | None:
    if status is None:
        return None
    try:
        return ReceiptStatus(status)
    except ValueError:
        choices = ", ".join(s.value for s in ReceiptStatus)
        refuse(f"unknown status {status!r}; use one of {choices}")


def _run(url: str, action: Any) -> Any:
    opened = existing_store(url)

    async def go() -> Any:
        async with opened as store:
            return await action(store)

    try:
        return asyncio.run(go())
    except ReceiptError as exc:
        refuse(str(exc))
    except (KernelError, ValueError) as exc:
        fail(exc)


def _write_of(r: Receipt) -> str:
    """What the write was, for a person: its capability and the input that ran.

    The input is as stored, so redacted.
    It is empty for a receipt stored before receipts recorded it.
    """
    if r.capability_id is None:
        return ""
    return r.capability_id if r.input is None else f"{r.capability_id} {dump_value(r.input)}"


def receipt_as_dict(r: Receipt) -> dict[str, Any]:
    """A receipt as ``receipts list --json`` (and ``threads show --json``) print it."""
    return {
        "thread_id": r.thread_id,
        "tenant_id": r.tenant_id,
        "key": r.key,
        "id": r.id,
        "status": str(r.status),
        "attempt": r.attempt,
        "turn_id": r.turn_id,
        "step_id": r.step_id,
        "value": r.value,
        "error": r.error,
        "announced": r.announced,
        "actor": r.actor,
        "capability_id": r.capability_id,
        "input": r.input,
        "approved_by": list(r.approved_by),
        "created_at": r.created_at.isoformat() if r.created_at else None,
        "updated_at": r.updated_at.isoformat() if r.updated_at else None,
        "resolution": None
        if r.resolution is None
        else {
            "applied": r.resolution.applied,
            "note": r.resolution.note,
            "actor": r.resolution.actor,
            "at": r.resolution.at.isoformat(),
        },
    }
