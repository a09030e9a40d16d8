"""``intention-kernel demo``: the billing agent's scenes, as a transcript a person can follow.

The scenes run in :func:`intention_kernel._demo.run_demo` and come back as data.
This module only renders them with rich, as they happen.

By default the demo keeps its data in a fresh temporary SQLite file.
The file is removed when the command ends.
So every run starts from the same state, and nothing is left in the working directory.
``--db PATH`` keeps the file for inspection.
The demo recreates it on each run.
It refuses to touch an existing file that it did not create.
Such a file has no demo provider tables.
The demo never uses ``$INTENTION_KERNEL_DB``.
It deletes and recreates its database.
That must never be the store the variable points at.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from intention_kernel import Receipt, StepResult, StepStatus
from intention_kernel._demo import (
    DemoRun,
    OperatorAction,
    Restart,
    Scene,
    SceneStep,
    TurnView,
    run_demo,
)
from intention_kernel._demo.billing import money
from intention_kernel._demo.database import prepare_demo_db
from intention_kernel.cli._common import EXIT_FAILED, refuse, sqlite_path
from intention_kernel.cli._help import Command

__all__ = ["demo", "prepare_demo_db", "register"]

#: A file holding this table was created by the demo and may be recreated.

STATUS_STYLE = {
    StepStatus.COMPLETED: "green",
    StepStatus.AWAITING_CONFIRMATION: "yellow",
    StepStatus.REJECTED: "dim",
    StepStatus.FAILED: "red",
    StepStatus.UNCERTAIN: "bold red",
}
RECEIPT_STYLE = {
    "completed": "green",
    "prepared": "yellow",
    "failed": "red",
    "uncertain": "bold red",
}


def register(app: typer.Typer) -> None:
    app.command("demo", cls=Command)(demo)


def demo(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="PATH",
            help=(
                "SQLite file to keep the demo's data in (a path or sqlite:///path.db); "
                "recreated on each run, and only if the demo created it. "
                "(default: a temporary file, removed afterwards)"
            ),
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the billing demo: confirmations, restarts, replays and a lost provider response.

    Every count in the transcript (provider calls, receipts, events) is read from the store.

    Exits 1 if any of the demo's checks fails, 2 if it refuses the --db file.
    """
    # Markup stays on for the transcript's own styling; data goes in as Text or escaped.
    console = Console(highlight=False, emoji=False)
    if db is None:
        with tempfile.TemporaryDirectory(prefix="intention-kernel-demo-") as directory:
            run = _play(console, os.path.join(directory, "demo.db"), kept=False)
    else:
        try:
            path = sqlite_path(db)
        except ValueError as exc:
            refuse(f"{exc}; the demo keeps its fake provider's ledger in the same SQLite file")
        problem = prepare_demo_db(path)
        if problem is not None:
            refuse(problem)
        run = _play(console, path, kept=True)
    if not run.ok:
        raise typer.Exit(EXIT_FAILED)


def _play(console: Console, path: str, *, kept: bool) -> DemoRun:
    renderer = TranscriptRenderer(console)
    renderer.header(path, kept=kept)
    run = asyncio.run(run_demo(path, observer=renderer))
    renderer.summary(run, kept=kept)
    return run


class TranscriptRenderer:
    """Prints each scene and step as :func:`run_demo` reports it."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, item: Scene | SceneStep) -> None:
        if isinstance(item, Scene):
            self.scene(item)
        elif isinstance(item, TurnView):
            self.console.print(_turn_panel(item))
        elif isinstance(item, Restart):
            self.console.print(_restart_panel(item))
        else:
            self.console.print(_operator_panel(item))

    def header(self, path: str, *, kept: bool) -> None:
        where = "kept after the run" if kept else "temporary; pass --db PATH to keep it"
        self.console.print(
            Panel(
                Text.assemble(
                    ("A billing agent on intention-kernel, run against a real SQLite file.\n", ""),
                    ("store   ", "dim"),
                    (path, "bold"),
                    (f"  ({where})\n", "dim"),
                    ("thread  ", "dim"),
                    ("acct-acme", "bold"),
                    ("\nProvider calls are read from the fake provider's own ledger table.", "dim"),
                ),
                title="[bold]intention-kernel demo[/]",
                title_align="left",
            )
        )

    def scene(self, scene: Scene) -> None:
        self.console.print()
        self.console.print(Rule(f"[bold]({scene.key}) {escape(scene.title)}[/]", align="left"))
        self.console.print(Text(scene.narration, style="italic"))

    def summary(self, run: DemoRun, *, kept: bool) -> None:
        s = run.summary
        table = Table(
            title="Summary (read from the store)", title_justify="left", show_header=False
        )
        table.add_column(style="bold")
        table.add_column()
        table.add_row("deliveries", Text(str(s.deliveries)))
        table.add_row("turns committed", Text(str(s.turns_committed)))
        table.add_row("provider calls", Text(str(s.provider_calls)))
        table.add_row("charges applied", Text(str(s.charges)))
        table.add_row(
            "receipts by status",
            Text(", ".join(f"{k}: {v}" for k, v in sorted(s.receipts_by_status.items()))),
        )
        table.add_row(
            "outbox events by type",
            Text("\n".join(f"{k}: {v}" for k, v in s.events_by_type.items())),
        )
        checks = Table(title="Checks", title_justify="left", show_header=False)
        checks.add_column(no_wrap=True)
        checks.add_column()
        checks.add_column(style="dim")
        for check in run.checks:
            mark = Text("PASS", style="green") if check.passed else Text("FAIL", style="bold red")
            checks.add_row(mark, Text(check.name), Text(check.detail))
        self.console.print()
        self.console.print(table)
        self.console.print(checks)
        if kept:
            self.console.print(
                f"[dim]The store is kept at[/] {escape(run.db_path)} [dim](tables ik_turns, "
                "ik_receipts, ik_outbox, demo_provider_calls, demo_provider_charges).[/]"
            )
        verdict = "all checks passed" if run.ok else "SOME CHECKS FAILED"
        self.console.print(f"[bold]{verdict}[/]", style="green" if run.ok else "red")


def _turn_panel(view: TurnView) -> Panel:
    result = view.result
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column()
    grid.add_row("user", Text(view.message, style="bold cyan"))
    grid.add_row("agent", Text(result.reply))
    grid.add_row("steps", Group(*(_step(s) for s in result.steps)) if result.steps else "—")
    grid.add_row("receipts", Group(*(_receipt(r) for r in view.receipts)) if view.receipts else "—")
    interaction = result.interaction
    grid.add_row(
        "pending",
        Text(f"{_short(interaction.id)} {interaction.kind} for {interaction.capability_id}")
        if interaction
        else "—",
        style="yellow" if interaction else "",
    )
    grid.add_row(
        "provider",
        Text.assemble(
            (f"{view.provider_calls} calls ", "bold"),
            (
                f"({view.provider_calls_delta:+d} this turn)",
                "bold" if view.provider_calls_delta else "dim",
            ),
            f" · {view.charges} charges applied",
        ),
    )
    title = f"[bold]turn {escape(view.turn_id)}[/]"
    if result.replayed:
        title += " [bold magenta]replayed=True[/]"
    return Panel(
        grid,
        title=title,
        title_align="left",
        subtitle=f"checkpoint v{result.checkpoint_version} · outbox {view.outbox_delta:+d} events",
        subtitle_align="right",
        border_style="magenta" if result.replayed else "blue",
    )


def _step(step: StepResult) -> Text:
    status = StepStatus(step.status)
    text = Text.assemble(
        (step.capability_id, "bold"), "  ", (str(status), STATUS_STYLE.get(status, ""))
    )
    if step.error and status in (StepStatus.FAILED, StepStatus.UNCERTAIN):
        text.append(f"\n{step.error}", style="dim")
    return text


def _receipt(receipt: Receipt) -> Text:
    status = str(receipt.status)
    text = Text.assemble(
        receipt.key,
        "  ",
        (status, RECEIPT_STYLE.get(status, "")),
        (f"  {_short(receipt.id)}", "dim"),
    )
    if receipt.resolution is not None:
        text.append(f"  resolved by {receipt.resolution.actor}", style="dim")
    return text


def _restart_panel(restart: Restart) -> Panel:
    lines = Text("Adapter closed; kernel, agent and provider objects dropped; file reopened.\n")
    lines.append(f"checkpoint v{restart.checkpoint_version} loaded from disk · ", style="dim")
    if restart.interaction is not None:
        lines.append(
            f"pending confirmation survived: {_short(restart.interaction.id)} "
            f"{restart.interaction.prompt}",
            style="yellow",
        )
    else:
        lines.append("no pending confirmation", style="bold red")
    return Panel(lines, title="[bold]restart[/]", title_align="left", border_style="yellow")


def _operator_panel(action: OperatorAction) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column()
    grid.add_row(
        "list_receipts",
        Group(
            *(
                Text.assemble(r.key, "  ", ("uncertain", "bold red"), (f"  {r.error or ''}", "dim"))
                for r in action.uncertain
            )
        ),
    )
    record = action.provider_record
    grid.add_row(
        "provider ledger",
        Text(
            f"{record['charge_id']} {record['status']} "
            f"{money(record['amount_cents'], record['currency'])} for {record['payment_intent_id']}"
            if record
            else "no charge for this idempotency key"
        ),
    )
    resolved = action.resolved
    grid.add_row(
        "resolve_receipt",
        Text.assemble(
            f"applied={resolved.status == 'completed'} → ",
            (str(resolved.status), RECEIPT_STYLE.get(str(resolved.status), "")),
            (f'  note="{action.note}"', "dim"),
            (f"  actor={resolved.resolution.actor if resolved.resolution else None}", "dim"),
        ),
    )
    return Panel(
        grid,
        title="[bold]operator reconciles the uncertain receipt[/]",
        title_align="left",
        subtitle="emits receipt.resolved",
        subtitle_align="right",
        border_style="green",
    )


def _short(identifier: str) -> str:
    prefix, _, rest = identifier.partition("_")
    return f"{prefix}_{rest[:8]}…" if rest else identifier
