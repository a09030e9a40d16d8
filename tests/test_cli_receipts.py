"""``intention-kernel receipts``: listing and reconciling receipts from the command line."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intention_kernel import Answer, Kernel
from intention_kernel.cli._app import app
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import damage_sqlite_table

KEY = "payments.charge:charge:pi_lost"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store with one completed charge and one uncertain one (approved by ana) on
    thread t."""
    path = tmp_path / "ops.db"

    async def prepare() -> None:
        provider = FakeProvider(behaviour={"pi_lost": "lost_response"})
        async with SQLiteDurability(path) as durability:
            kernel = Kernel(billing_agent(provider), durability)
            for n, pi in enumerate(("pi_ok", "pi_lost")):
                await kernel.turn("t", f"propose-{n}", f"charge {pi} 500")
                answer = Answer(actor="ana") if pi == "pi_lost" else None
                await kernel.turn("t", f"accept-{n}", None if answer else "yes", answer=answer)

    asyncio.run(prepare())
    return path


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


def test_list_shows_every_receipt_and_filters_by_status(store: Path) -> None:
    code, output = _cli("receipts", "list", "--db", f"sqlite:///{store}", "--json")
    assert code == 0
    rows = [json.loads(line) for line in output.splitlines()]
    assert [(r["key"], r["status"], r["actor"]) for r in rows] == [
        ("payments.charge:charge:pi_ok", "completed", None),
        (KEY, "uncertain", "ana"),
    ]
    code, output = _cli("receipts", "list", "--db", f"sqlite:///{store}", "--status", "uncertain")
    assert code == 0
    assert "pi_lost" in output and "pi_ok" not in output
    assert "approved by ana; " in output
    code, output = _cli("receipts", "list", "--db", f"sqlite:///{store}", "--status", "weird")
    assert code == 2 and "unknown status" in output


def test_list_shows_what_each_write_was_and_who_approved_it(store: Path) -> None:
    code, output = _cli("receipts", "list", "--db", f"sqlite:///{store}", "--json")
    assert code == 0
    rows = [json.loads(line) for line in output.splitlines()]
    assert [(r["capability_id"], r["input"], r["approved_by"]) for r in rows] == [
        ("payments.charge", {"payment_intent_id": "pi_ok", "amount": 500}, []),
        ("payments.charge", {"payment_intent_id": "pi_lost", "amount": 500}, ["ana"]),
    ]
    code, output = _cli("receipts", "list", "--db", f"sqlite:///{store}", "--status", "uncertain")
    assert code == 0
    # The table folds a write at 48 characters: here, at the space after its capability.
    assert "| payments.charge " in output.replace("│", "|")
    assert '{"payment_intent_id":"pi_lost","amount":500}' in output


def test_a_receipt_resolved_not_applied_no_longer_says_it_may_have_applied(
    store: Path,
) -> None:
    db = f"sqlite:///{store}"
    code, output = _cli(
        "receipts",
        "resolve",
        "t",
        KEY,
        "--not-applied",
        "--note",
        "no charge",
        "--actor",
        "oz",
        "--db",
        db,
    )
    assert code == 0, output
    code, output = _cli("receipts", "list", "--db", db, "--json")
    [resolved] = [r for r in map(json.loads, output.splitlines()) if r["key"] == KEY]
    assert resolved["status"] == "failed"
    assert (
        resolved["error"] == "resolved by oz as not applied (the write did not happen): no charge"
    )


def test_resolve_applied_records_who_and_why_and_later_turns_reuse_the_value(
    store: Path,
) -> None:
    code, output = _cli(
        "receipts",
        "resolve",
        "t",
        KEY,
        "--applied",
        "--value",
        '{"charge_id": "ch_9"}',
        "--note",
        "seen in dashboard",
        "--actor",
        "ops@example.com",
        "--db",
        f"sqlite:///{store}",
    )
    assert code == 0, output
    assert "completed" in output

    async def check() -> None:
        provider = FakeProvider()
        async with SQLiteDurability(store) as durability:
            resolved = next(r for r in await durability.list_receipts() if r.key == KEY)
            assert resolved.resolution is not None
            assert (resolved.resolution.actor, resolved.resolution.note) == (
                "ops@example.com",
                "seen in dashboard",
            )
            events = await durability.read_outbox(thread_id="t", limit=1000)
            assert events[-1].type == "receipt.resolved"
            kernel = Kernel(billing_agent(provider), durability)
            await kernel.turn("t", "propose-again", "charge pi_lost 500")
            again = await kernel.turn("t", "accept-again", "yes")
            assert again.steps[0].value == {"charge_id": "ch_9"}
            assert provider.calls() == 0

    asyncio.run(check())


def test_resolve_refuses_bad_requests_and_changes_nothing(store: Path) -> None:
    db = f"sqlite:///{store}"
    cases = [
        (
            ["receipts", "resolve", "t", KEY, "--note", "x", "--db", db],
            "--applied or --not-applied",
        ),
        (["receipts", "resolve", "t", KEY, "--applied", "--db", db], "--note is required"),
        (
            [
                "receipts",
                "resolve",
                "t",
                KEY,
                "--applied",
                "--note",
                "x",
                "--value",
                "{",
                "--db",
                db,
            ],
            "not JSON",
        ),
        (
            [
                "receipts",
                "resolve",
                "t",
                "payments.charge:charge:pi_ok",
                "--not-applied",
                "--note",
                "x",
                "--db",
                db,
            ],
            "is completed; only an uncertain receipt, or a prepared one left by an attempt "
            "that did not finish, can be resolved",
        ),
        (
            ["receipts", "resolve", "t", "nope", "--not-applied", "--note", "x", "--db", db],
            "no receipt",
        ),
        (
            ["receipts", "resolve", "t", KEY, "--applied", "--note", "x", "--db", db],
            "--applied needs --value JSON",
        ),
        (
            ["receipts", "resolve", "t", KEY, "--not-applied", "--note", " \t", "--db", db],
            "--note is required",
        ),
        (
            ["receipts", "resolve", "t", KEY, "--not-applied", "--value", "1", "--note", "x"],
            "--value only makes sense with --applied",
        ),
    ]
    for args, message in cases:
        code, output = _cli(*args)
        assert code == 2, (args, output)
        assert message in " ".join(output.split()), (args, output)
    code, output = _cli("receipts", "list", "--db", db, "--status", "uncertain", "--json")
    assert [json.loads(line)["key"] for line in output.splitlines()] == [KEY]


def test_resolve_of_a_key_without_its_capability_prefix_suggests_the_stored_key(
    store: Path,
) -> None:
    args = ["receipts", "resolve", "t", "charge:pi_lost", "--not-applied", "--note", "none"]
    code, output = _cli(*args, "--db", f"sqlite:///{store}")
    assert code == 2, output
    assert f"did you mean {KEY!r}?" in " ".join(output.split())
    code, output = _cli("receipts", "list", "--db", f"sqlite:///{store}", "--json")
    assert [json.loads(line)["status"] for line in output.splitlines() if KEY in line] == [
        "uncertain"
    ]


def test_resolve_applied_with_an_explicit_null_value_is_recorded(store: Path) -> None:
    args = ["receipts", "resolve", "t", KEY, "--applied", "--value", "null", "--note", "none"]
    code, output = _cli(*args, "--db", f"sqlite:///{store}")
    assert code == 0, output
    code, output = _cli("receipts", "list", "--db", f"sqlite:///{store}", "--json")
    [resolved] = [json.loads(line) for line in output.splitlines() if KEY in line]
    assert (resolved["status"], resolved["value"]) == ("completed", None)


def test_list_filters_by_tenant(tmp_path: Path) -> None:
    path = tmp_path / "tenants.db"

    async def prepare() -> None:
        async with SQLiteDurability(path) as durability:
            kernel = Kernel(billing_agent(FakeProvider()), durability)
            for thread, tenant in (("a", "acme"), ("g", "globex")):
                await kernel.turn(thread, "1", "charge pi_1 5", tenant_id=tenant)
                await kernel.turn(thread, "2", "yes", tenant_id=tenant)

    asyncio.run(prepare())
    db = f"sqlite:///{path}"
    code, output = _cli("receipts", "list", "--db", db, "--json")
    assert code == 0
    assert [json.loads(line)["tenant_id"] for line in output.splitlines()] == ["acme", "globex"]
    code, output = _cli("receipts", "list", "--db", db, "--tenant", "globex", "--json")
    assert code == 0
    assert [json.loads(line)["thread_id"] for line in output.splitlines()] == ["g"]


@pytest.mark.parametrize("damage", ["page", "not utf-8"])
def test_a_damaged_store_is_refused_with_one_message(damage: str, store: Path) -> None:
    """Not exit status 1 as for a passing store failure, nor a traceback: the store needs
    repair, and running the command again cannot help."""
    if damage == "page":
        damage_sqlite_table(store, "ik_receipts")
        expected = "is damaged"
    else:
        with sqlite3.connect(store) as conn:
            conn.execute("UPDATE ik_receipts SET error = CAST(X'ff' AS TEXT) WHERE key = ?", (KEY,))
        expected = "of thread 't' in SQLite database"
    for command in (["list"], ["list", "--json"], ["list", "--thread", "t"]):
        code, output = _cli("receipts", *command, "--db", f"sqlite:///{store}")
        if damage == "not utf-8" and "--thread" not in command:
            expected_here = "holds text that is not UTF-8"  # every thread was read
        else:
            expected_here = expected
        assert code == 2, output
        assert expected_here in output and "Traceback" not in output
        assert output.count("refused:") == 1
