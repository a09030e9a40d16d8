"""``intention-kernel prune``: retention for the outbox and turn results.

::

    intention-kernel prune --older-than 30d --db postgresql://...

Three things created more than the given time ago are pruned.
Published outbox events are deleted, and the stored results of turns are dropped.
The journal entries (recorded model rounds) of turns that never committed are deleted.
The time is ``90s``, ``15m``, ``12h``, ``30d``, ``2w``, or a sum such as ``1d12h``.
It works ``--batch`` rows per transaction, beside live turns.
Each committed ``(thread_id, turn_id)`` is kept.
So a very late retry of a pruned turn is refused, never run again.
It gets ``TurnExpiredError``, or HTTP 409 ``turn-expired``.
Unpublished events and effect receipts are never pruned.
A turn's journal goes whole, once all of its entries are older than the cutoff.
Otherwise none of it goes.
A thread busy with a turn keeps its journal until a later run.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from intention_kernel.cli._common import (
    DbOption,
    existing_store,
    fail,
    refuse,
    resolve_db_url,
)
from intention_kernel.cli._help import Command
from intention_kernel.cli._render import console
from intention_kernel.errors import KernelError
from intention_kernel.operations import PruneReport
from intention_kernel.operations import prune as prune_store

__all__ = ["parse_duration", "register"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``1d12h``... as a ``timedelta``; ``ValueError`` otherwise."""
    cleaned = text.strip().lower()
    parts = _PART.findall(cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m, 1d12h)")
    try:
        age = timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in parts))
        datetime.now(UTC) - age  # the cutoff must be a date: not before year 1
    except OverflowError:  # also past timedelta's 999,999,999 days
        raise ValueError(f"not a duration: {text!r} reaches back before year 1") from None
    return age


def register(app: typer.Typer) -> None:
    app.command("prune", cls=Command)(prune)


def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", metavar="AGE", help="e.g. 30d, 12h, 1d12h", show_default=False
        ),
    ],
    db: DbOption = None,
    batch: Annotated[
        int, typer.Option("--batch", metavar="N", min=1, help="Rows per transaction")
    ] = 1000,
) -> None:
    """Delete published events, old turn results and journal entries of turns that
    never committed; committed turn IDs are kept."""
    try:
        age = parse_duration(older_than)
    except ValueError as exc:
        refuse(str(exc))
    opened = existing_store(resolve_db_url(db))

    async def go() -> PruneReport:
        async with opened as store:
            return await prune_store(store, older_than=age, batch=batch)

    try:
        report = asyncio.run(go())
    except (KernelError, ValueError) as exc:
        fail(exc)
    console().print(
        f"pruned {report.events} published event(s) and {report.turns} turn result(s) "
        f"created before {report.cutoff.isoformat(timespec='seconds')}, and "
        f"{report.journal} journal entry(ies) of turns that never committed, and "
        f"{report.timers} settled timer(s)"
    )
