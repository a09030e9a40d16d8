"""``intention-kernel timers list`` and ``timers run`` (issue 37), run as real commands
against SQLite and PostgreSQL stores."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from intention_kernel import Kernel
from intention_kernel.durability import open_durability
from proving_support import new_database, process_env
from timer_worker import jobs_agent

AGENT = "timer_worker:jobs_agent"


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


def seed(url: str, *, due: datetime) -> None:
    async def go() -> None:
        async with open_durability(url) as store:
            kernel = Kernel(jobs_agent(), store)
            await kernel.schedule("a", "now", at=due, data={"n": 1})
            await kernel.schedule("b", "later", at=due + timedelta(days=1))

    asyncio.run(go())


def listed(url: str, *args: str) -> list[dict[str, object]]:
    done = cli("timers", "list", "--db", url, "--json", *args)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_timers_list_and_run_once_fire_what_is_due(store_url: str) -> None:
    seed(store_url, due=datetime.now(UTC) - timedelta(seconds=1))
    timers = listed(store_url)
    assert [(t["thread_id"], t["key"], t["status"]) for t in timers] == [
        ("a", "now", "pending"),
        ("b", "later", "pending"),
    ]
    assert timers[0]["data"] == {"n": 1}
    table = cli("timers", "list", "--db", store_url)
    assert table.returncode == 0 and "2 timer(s)" in table.stdout
    done = cli("timers", "run", "--db", store_url, "--agent", AGENT, "--once")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fired: a now timer:now@")
    assert [t["key"] for t in listed(store_url, "--status", "fired")] == ["now"]
    assert [t["key"] for t in listed(store_url, "--thread", "b")] == ["later"]
    again = cli("timers", "run", "--db", store_url, "--agent", AGENT, "--once")
    assert again.returncode == 0 and again.stdout == ""


def test_prune_removes_fired_timers_and_keeps_pending_ones(store_url: str) -> None:
    seed(store_url, due=datetime.now(UTC) - timedelta(seconds=1))
    done = cli("timers", "run", "--db", store_url, "--agent", AGENT, "--once")
    assert done.returncode == 0, done.stderr
    kept = cli("prune", "--db", store_url, "--older-than", "30d")
    assert kept.returncode == 0 and "0 settled timer(s)" in kept.stdout, kept.stderr
    pruned = cli("prune", "--db", store_url, "--older-than", "0s")
    assert pruned.returncode == 0 and "1 settled timer(s)" in pruned.stdout, pruned.stderr
    assert [(t["key"], t["status"]) for t in listed(store_url)] == [("later", "pending")]


def test_timers_run_once_reports_a_cancelled_timer_turn_and_exits_zero(store_url: str) -> None:
    """A stopped timer turn is no failure: the line names it, the exit code is 0."""
    due = datetime.now(UTC) - timedelta(seconds=1)

    async def cancel_ahead() -> str:
        async with open_durability(store_url) as store:
            kernel = Kernel(jobs_agent(), store)
            await kernel.schedule("a", "now", at=due)
            turn_id = f"timer:now@{due.strftime('%Y%m%dT%H%M%S.%fZ')}"  # as documented
            assert (await kernel.cancel("a", turn_id)).status == "requested"
            return turn_id

    turn_id = asyncio.run(cancel_ahead())
    done = cli("timers", "run", "--db", store_url, "--agent", AGENT, "--once")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"cancelled: a now {turn_id}\n"
    assert [t["key"] for t in listed(store_url, "--status", "void")] == ["now"]


def test_timers_run_fires_until_sigterm_then_exits_cleanly(store_url: str) -> None:
    seed(store_url, due=datetime.now(UTC) + timedelta(seconds=1))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "intention_kernel",
            "timers",
            "run",
            "--db",
            store_url,
            "--agent",
            AGENT,
            "--poll",
            "0.05",
        ],
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not listed(store_url, "--status", "fired"):
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker fired nothing"
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err


def test_timers_commands_refuse_a_store_that_does_not_exist(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    assert cli("timers", "list", "--db", url).returncode == 2
    assert cli("timers", "run", "--db", url, "--agent", AGENT, "--once").returncode == 2
    assert not (tmp_path / "missing.db").exists()


def test_timers_list_refuses_a_bad_status(store_url: str) -> None:
    seed(store_url, due=datetime.now(UTC))
    done = cli("timers", "list", "--db", store_url, "--status", "sleeping")
    assert done.returncode != 0 and "status must be" in done.stderr
