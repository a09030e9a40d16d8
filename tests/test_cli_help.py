"""Every help page names what each option takes, shows no type placeholders, and
marks what is required."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner

from intention_kernel.cli._app import app

#: What Typer prints for an option without a metavar: ``<bool>``, ``<str>``,
#: ``<int range>``, ``<auto|asyncio|uvloop>``.
PLACEHOLDER = re.compile(r"<[a-z]+(?: range)?(?:\|[a-z]+)*>")


def _paths(command: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _paths(sub, (*path, name))


COMMANDS = sorted(_paths(typer.main.get_command(app)))


def help_page(*path: str) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def option_row(page: str, option: str) -> str:
    return next(line for line in page.splitlines() if re.search(rf"\s{option}\s", line))


def test_every_command_is_listed() -> None:
    assert {" ".join(p) for p in COMMANDS} >= {
        "",
        "demo",
        "serve",
        "receipts list",
        "receipts resolve",
        "outbox relay",
        "outbox status",
        "check",
        "migrate",
        "prune",
    }


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "root")
def test_help_shows_no_type_placeholders(path: tuple[str, ...]) -> None:
    page = help_page(*path)
    assert PLACEHOLDER.findall(page) == [], page


def test_help_marks_required_options_and_arguments() -> None:
    resolve = help_page("receipts", "resolve")
    # Typer braces required arguments in the usage line.
    assert "Usage: intention-kernel receipts resolve [OPTIONS] {THREAD} {KEY}" in resolve, resolve
    for option in ("THREAD", "KEY", "--applied", "--note"):
        assert "[required]" in option_row(resolve, option), option
    for option in ("--value", "--actor", "--db"):
        assert "required" not in option_row(resolve, option), option
    # Typer stars a required option at the start of its row.
    assert option_row(help_page("outbox", "relay"), "--to").startswith("│ *  --to ")
    assert option_row(help_page("serve"), "--agent").startswith("│ *  --agent ")
    assert option_row(help_page("prune"), "--older-than").startswith("│ *  --older-than ")


def test_relay_help_gives_the_function_sinks_signature() -> None:
    page = " ".join(help_page("outbox", "relay").replace("│", " ").split())
    assert "def fn(event: intention_kernel.OutboxEvent) -> None (or async def)" in page, page
    assert "dedupe on event.id" in page, page
