"""The CLI prints stored data verbatim: keys, thread IDs, errors and notes are never read
as Rich markup or emoji codes, and the keys and statuses an operator copies stay whole
on an 80-column terminal."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    Intent,
    Interpretation,
    Kernel,
    capability,
)
from intention_kernel.cli._app import app
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing import ScriptedInterpreter

#: Text that Rich would read as a closing tag (a crash), a style tag (dropped) and an
#: emoji code (replaced), if it were printed as markup.
HOSTILE = "[/red] [bold]x[/bold] :ticket:"
THREAD = f"acct-{HOSTILE}"
COMPLETED_KEY = f"ops.write:charge:{HOSTILE}"
UNCERTAIN_KEY = f"ops.write:lost:{HOSTILE}"
ERROR = f"provider said {HOSTILE}"
#: A key longer than an 80-column line.
LONG_KEY = "ops.write:charge:pi_" + "0123456789abcdef" * 5


class Lost(Exception):
    pass


def _agent() -> Agent:
    @capability("ops.write", effect="write", confirmation="capability")
    async def write(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        def call(authority: Any) -> dict[str, str]:
            if input["lose"]:
                raise Lost(ERROR)
            return {"id": HOSTILE}

        effect = await ctx.run_effect(input["key"], call)
        return CapabilityResult(value=effect.value)

    script = {
        f"write {n}": Interpretation([Intent("ops.write", {"key": key, "lose": lose})])
        for n, (key, lose) in enumerate(
            [
                (COMPLETED_KEY.removeprefix("ops.write:"), False),
                (UNCERTAIN_KEY.removeprefix("ops.write:"), True),
                (LONG_KEY.removeprefix("ops.write:"), True),
            ]
        )
    }
    return Agent("ops", "1", [write], ScriptedInterpreter(script))


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "ops.db"

    async def prepare() -> None:
        async with SQLiteDurability(path) as store:
            kernel = Kernel(_agent(), store)
            for n in range(3):
                await kernel.turn(THREAD, f"turn-{n}", f"write {n}")

    asyncio.run(prepare())
    return f"sqlite:///{path}"


def cli(*args: str, columns: int = 250) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    return result.exit_code, result.output


def test_receipts_list_prints_keys_threads_and_errors_verbatim(db: str) -> None:
    code, output = cli("receipts", "list", "--db", db, columns=400)
    assert code == 0, output
    for text in (COMPLETED_KEY, UNCERTAIN_KEY, THREAD, f"Lost: {ERROR}"):
        assert text in output, text


def test_receipts_list_keeps_keys_and_statuses_whole_at_80_columns(db: str) -> None:
    code, output = cli("receipts", "list", "--db", db, "--status", "uncertain", columns=80)
    assert code == 0, output
    lines = output.splitlines()
    assert all(len(line) <= 80 for line in lines), output
    # Each key on one line with its status, as the operator copies it.
    assert f"{UNCERTAIN_KEY}  uncertain" in lines, output
    # Longer than a line: folded at the line's end, every character kept, nothing else
    # mixed in.
    start = next(n for n, line in enumerate(lines) if line.startswith(LONG_KEY[:80]))
    assert "".join(lines[start : start + 2]) == f"{LONG_KEY}  uncertain", output
    assert f"Lost: {ERROR}" in output


def test_receipts_list_is_a_table_where_it_fits(db: str) -> None:
    code, output = cli("receipts", "list", "--db", db, "--thread", THREAD, columns=400)
    assert code == 0, output
    rows = [line for line in output.splitlines() if COMPLETED_KEY in line]
    assert len(rows) == 1 and "completed" in rows[0] and THREAD in rows[0], output


def test_a_resolution_prints_its_key_and_note_verbatim(db: str) -> None:
    note = f"seen in dashboard {HOSTILE}"
    code, output = cli(
        "receipts",
        "resolve",
        THREAD,
        UNCERTAIN_KEY,
        "--not-applied",
        "--note",
        note,
        "--actor",
        HOSTILE,
        "--db",
        db,
    )
    assert code == 0, output
    assert UNCERTAIN_KEY in output and THREAD in output and f"by {HOSTILE}" in output
    code, output = cli("receipts", "list", "--db", db, columns=400)
    assert code == 0 and f"resolved by {HOSTILE}: {note}" in output, output


def test_a_refusal_prints_the_store_error_verbatim(db: str) -> None:
    code, output = cli(
        "receipts", "resolve", THREAD, COMPLETED_KEY, "--not-applied", "--note", "n", "--db", db
    )
    assert code == 2, output
    assert "refused:" in output and COMPLETED_KEY in output, output


def test_outbox_status_prints_failing_events_and_errors_verbatim(db: str) -> None:
    import cli_outbox_sink

    cli_outbox_sink.refused_types.add("turn.committed")
    try:
        code, output = cli(
            "outbox", "relay", "--db", db, "--to", "cli_outbox_sink:collect", "--once"
        )
    finally:
        cli_outbox_sink.refused_types.clear()
        cli_outbox_sink.received.clear()
    assert code == 1, output
    code, output = cli("outbox", "status", "--db", db, columns=400)
    assert code == 0, output
    assert THREAD in output and "ConnectionError: turn.committed refused" in output, output


def test_check_prints_refused_thread_ids_verbatim(db: str, tmp_path: Path) -> None:
    code, output = cli(
        "check", "--agent", "test_cli_rendering:changed_agent", "--db", db, columns=400
    )
    assert code == 1, output
    assert THREAD in output, output


def changed_agent() -> Agent:
    agent = _agent()
    return Agent("ops", "2", agent.capabilities, agent.interpreter)
