"""``intention-kernel interactions list`` and ``threads show`` (issue 31), run as real
commands against SQLite and PostgreSQL stores a kernel wrote."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from intention_kernel import Kernel
from intention_kernel.durability import open_durability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import new_database, process_env

NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with new_database(request.getfixturevalue("postgres_dsn")) as url:
        yield url


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "intention_kernel", *args],
        env=process_env(COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=60,
    )


def seed(url: str) -> None:
    """Thread ``a`` (no tenant): a balance, a charge accepted, a refund pending with a
    deadline. Thread ``b`` (tenant acme): a charge pending without one, which only an
    operator may answer. Thread ``c``: nothing pending."""

    async def go() -> None:
        async with open_durability(url) as store:
            provider = FakeProvider()
            timed = Kernel(
                billing_agent(provider, confirm_within=timedelta(minutes=15)),
                store,
                clock=lambda: NOW,
            )
            await timed.turn("a", "1", "balance")
            await timed.turn("a", "2", "charge pi_1 500")
            await timed.turn("a", "3", "yes")
            await timed.turn("a", "4", "refund pi_1 100")
            untimed = Kernel(billing_agent(provider, approvers="operator"), store)
            await untimed.turn("b", "1", "charge pi_2 300", tenant_id="acme")
            await untimed.turn("c", "1", "balance")

    asyncio.run(go())


def test_interactions_list_shows_what_waits_for_whom_and_until_when(store_url: str) -> None:
    seed(store_url)
    done = cli("interactions", "list", "--db", store_url, "--json")
    assert done.returncode == 0, done.stderr
    a, b = (json.loads(line) for line in done.stdout.splitlines())
    assert (a["thread_id"], a["tenant_id"], a["capability_id"]) == ("a", None, "payments.refund")
    assert a["prompt"] == "Refund 100 on pi_1?" and a["id"].startswith("ix_")
    assert a["expires_at"] == (NOW + timedelta(minutes=15)).isoformat()
    assert (a["approvals"], a["approved_by"], a["may_answer"]) == (1, [], None)
    assert a["input"] == {"payment_intent_id": "pi_1", "amount": 100}
    assert (b["thread_id"], b["tenant_id"], b["capability_id"]) == ("b", "acme", "payments.charge")
    assert b["expires_at"] is None
    assert "operator" in b["may_answer"] and b["proposed_by"] is None

    acme = cli("interactions", "list", "--db", store_url, "--json", "--tenant", "acme")
    assert [json.loads(line)["thread_id"] for line in acme.stdout.splitlines()] == ["b"]

    text = cli("interactions", "list", "--db", store_url)
    assert text.returncode == 0, text.stderr
    assert "2 pending interaction(s)" in text.stdout
    for shown in (a["id"], b["id"], "Refund 100 on pi_1?", "Charge 300 to pi_2?", "acme"):
        assert shown in text.stdout
    assert (NOW + timedelta(minutes=15)).isoformat() in text.stdout
    assert "anyone on the thread" in text.stdout
    assert b["may_answer"] in text.stdout


def test_threads_show_gives_the_checkpoint_recent_steps_and_receipts(store_url: str) -> None:
    seed(store_url)
    done = cli("threads", "show", "a", "--db", store_url, "--json")
    assert done.returncode == 0, done.stderr
    thread = json.loads(done.stdout)
    assert (thread["thread_id"], thread["tenant_id"], thread["version"]) == ("a", None, 4)
    assert thread["agent_fingerprint"].startswith("sha256:") and thread["messages"] == 8
    assert thread["facts"]["balance"] == 4200
    assert [i["capability_id"] for i in thread["agenda"]] == ["payments.refund"]
    assert thread["interaction"]["prompt"] == "Refund 100 on pi_1?"
    assert [(s["turn_id"], s["capability_id"], s["status"]) for s in thread["recent_steps"]] == [
        ("1", "billing.balance", "completed"),
        ("2", "payments.charge", "awaiting_confirmation"),
        ("3", "payments.charge", "completed"),
        ("4", "payments.refund", "awaiting_confirmation"),
    ]
    [receipt] = thread["receipts"]
    assert (receipt["key"], receipt["status"], receipt["turn_id"]) == (
        "payments.charge:charge:pi_1",
        "completed",
        "3",
    )

    last_two = json.loads(
        cli("threads", "show", "a", "--db", store_url, "--json", "--steps", "2").stdout
    )
    assert [s["turn_id"] for s in last_two["recent_steps"]] == ["3", "4"]
    acme = json.loads(cli("threads", "show", "b", "--db", store_url, "--json").stdout)
    assert acme["tenant_id"] == "acme" and acme["receipts"] == []
    quiet = json.loads(cli("threads", "show", "c", "--db", store_url, "--json").stdout)
    assert quiet["interaction"] is None and quiet["agenda"] == []

    text = cli("threads", "show", "a", "--db", store_url)
    assert text.returncode == 0, text.stderr
    for shown in (
        "version 4",
        "8 message(s) · 2 fact(s) · 1 agenda item(s)",
        "Refund 100 on pi_1?",
        "4 recent step(s)",
        "awaiting_confirmation",
        "payments.charge:charge:pi_1",
    ):
        assert shown in text.stdout, text.stdout


def test_threads_show_refuses_a_thread_that_has_no_turn(store_url: str) -> None:
    seed(store_url)
    done = cli("threads", "show", "nobody", "--db", store_url)
    assert done.returncode == 2 and "no thread 'nobody'" in done.stderr
    assert done.stdout == ""


def test_both_refuse_a_store_that_does_not_exist(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    for command in (["interactions", "list"], ["threads", "show", "a"]):
        done = cli(*command, "--db", missing)
        assert done.returncode == 2 and "refused" in done.stderr
    assert not (tmp_path / "missing.db").exists()
