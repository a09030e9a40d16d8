"""``intention-kernel outbox relay|status``, ``check``, ``migrate`` and ``prune`` on a real
store, as an operator runs them. (The commands open the store with ``open_durability``;
the PostgreSQL paths below them are covered by ``test_outbox_relay.py`` and
``test_operations.py``.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cli_outbox_sink
import revision_two
from intention_kernel import Kernel, KernelCheckpoint, TurnExpiredError
from intention_kernel._turns import TurnCommit, TurnScope
from intention_kernel.cli._app import app
from intention_kernel.cli._prune import parse_duration
from intention_kernel.durability import TurnTransaction, open_durability
from intention_kernel.durability.abc import RecordedDurability
from intention_kernel.durability.postgres import PostgresDurability
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import (
    drop_schema,
    new_database,
    process_env,
    read_all_events,
    unpublished,
)

OLD_AGENT = "test_cli_operations:old_agent"
NEW_AGENT = "test_cli_operations:new_agent"


def old_agent() -> object:
    return billing_agent(FakeProvider())


def new_agent() -> object:
    return billing_agent(FakeProvider(), version="2")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[str]:
    """A SQLite store with two threads of three turns each."""
    path = tmp_path / "ops.db"

    async def prepare() -> None:
        async with SQLiteDurability(path) as store:
            kernel = Kernel(billing_agent(FakeProvider()), store)
            for thread in ("t1", "t2"):
                await kernel.turn(thread, "1", "balance 100")
                await kernel.turn(thread, "2", "charge pi_1 500")
                await kernel.turn(thread, "3", "yes")

    asyncio.run(prepare())
    yield f"sqlite:///{path}"
    cli_outbox_sink.received.clear()
    cli_outbox_sink.refused_types.clear()


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


def status(db: str) -> dict[str, object]:
    code, output = cli("outbox", "status", "--db", db, "--json")
    assert code == 0, output
    document: dict[str, object] = json.loads(output)
    return document


def test_relay_once_publishes_to_a_callable_and_status_shows_lag_and_failures(db: str) -> None:
    before = status(db)
    assert before["unpublished"] and before["failing"] == []
    assert isinstance(before["oldest_unpublished_age_seconds"], float)

    cli_outbox_sink.refused_types.add("interaction.opened")
    code, output = cli("outbox", "relay", "--db", db, "--to", "cli_outbox_sink:collect", "--once")
    assert code == 1 and "2 failed attempt(s)" in output  # one per thread, exit status 1
    assert output.count("WARNING intention_kernel.outbox: outbox event") == 2  # on stderr
    failing = status(db)["failing"]
    assert isinstance(failing, list)
    assert [(f["thread_id"], f["type"], f["attempts"]) for f in failing] == [
        ("t1", "interaction.opened", 1),
        ("t2", "interaction.opened", 1),
    ]
    assert failing[0]["last_error"] == "ConnectionError: interaction.opened refused"
    code, output = cli("outbox", "status", "--db", db)
    assert code == 0 and "failing event(s)" in output and "interaction.opened" in output

    published = len(cli_outbox_sink.received)
    assert [e.seq for e in cli_outbox_sink.received if e.thread_id == "t1"] == [1, 2]
    # A pass before the failing events are due again tries nothing: exit status 0.
    code, output = cli("outbox", "relay", "--db", db, "--to", "cli_outbox_sink:collect", "--once")
    if time.time() < min(datetime.fromisoformat(f["retry_at"]).timestamp() for f in failing):
        assert code == 0 and "published 0 event(s); 0 failed attempt(s)" in output, output
    # A loaded machine may have started that pass late, with an event due: read them again.
    failing = status(db)["failing"]
    assert isinstance(failing, list)
    tried = [f["attempts"] for f in failing]
    # Once they are due, a pass while the sink still refuses retries each, is refused
    # again (exit status 1), and sends nothing after them: they block their threads.
    due = max(datetime.fromisoformat(f["retry_at"]) for f in failing)
    time.sleep(max(0.0, due.timestamp() - time.time()) + 0.01)
    code, output = cli("outbox", "relay", "--db", db, "--to", "cli_outbox_sink:collect", "--once")
    assert code == 1 and "published 0 event(s); 2 failed attempt(s)" in output, output
    assert len(cli_outbox_sink.received) == published
    again = status(db)["failing"]
    assert isinstance(again, list) and [f["attempts"] for f in again] == [n + 1 for n in tried]


def relay_process(db: str, log: Path, errors: Path, *extra: str) -> subprocess.Popen[str]:
    """``intention-kernel outbox relay`` in a process of its own, delivering to ``log``,
    its stderr to ``errors``."""
    env = process_env(IK_RELAY_LOG=str(log))
    command = [sys.executable, "-m", "intention_kernel", "outbox", "relay", "--db", db]
    with errors.open("w") as stderr:  # the child keeps its own descriptor
        return subprocess.Popen(
            [*command, "--to", "relay_log_sink:deliver", "--poll", "0.05", *extra],
            env=env,
            stderr=stderr,
            stdout=subprocess.PIPE,
            text=True,
        )


def wait_until(condition: Callable[[], bool], process: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        if process.poll() is not None:
            out, _ = process.communicate()
            pytest.fail(f"the relay exited ({process.returncode}) before {what}:\n{out}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def logged(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.slow
def test_a_running_relay_survives_a_store_error_and_publishes_what_comes_after(
    db: str, tmp_path: Path
) -> None:
    path = db.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        (before,) = conn.execute("SELECT count(*) FROM ik_outbox").fetchone()
    log, errors = tmp_path / "delivered.jsonl", tmp_path / "relay.err"
    relay = relay_process(db, log, errors)
    try:
        # The sink logs an event before the relay records it as published.
        # A store error in between would deliver that event again: wait for both.
        wait_until(
            lambda: len(logged(log)) == before and unpublished(db) == 0,
            relay,
            "the backlog was published and recorded",
        )
        # The store fails under the relay: every pass now errors (no such table).
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("ALTER TABLE ik_outbox RENAME TO ik_outbox_away")
        wait_until(lambda: "pass failed" in errors.read_text(), relay, "the error was logged")
        time.sleep(0.2)
        assert relay.poll() is None, "the relay died on a store error"
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("ALTER TABLE ik_outbox_away RENAME TO ik_outbox")

        async def later_turn() -> int:
            async with SQLiteDurability(path) as store:
                await Kernel(billing_agent(FakeProvider()), store).turn("t1", "4", "balance 1")
                return len(await read_all_events(store))

        total = asyncio.run(later_turn())
        wait_until(
            lambda: len(logged(log)) == total and unpublished(db) == 0,
            relay,
            "the later turn was published and recorded",
        )
    finally:
        relay.send_signal(signal.SIGTERM)
        out, _ = relay.communicate(timeout=20)
    err = errors.read_text()
    assert relay.returncode == 0, err
    assert "outbox relay pass failed" in err and "no such table: ik_outbox" in err, err
    assert "recovered after" in err and "Traceback" not in err, err
    assert f"published {total} event(s); 0 failed attempt(s)" in out
    delivered = logged(log)
    assert len({d["id"] for d in delivered}) == len(delivered) == total  # each once


def test_relay_refuses_a_target_it_cannot_use(db: str) -> None:
    for target, why in [
        ("cli_outbox_sink:missing", "not found"),
        ("no_such_module_here:f", "cannot import"),
        ("ftp://example.com", "--to must be"),
        ("https://hooks.example.test/ik", "shared secret"),
    ]:
        code, output = cli("outbox", "relay", "--db", db, "--to", target, "--once")
        assert code == 2 and why in output, (target, output)


def test_relay_once_to_an_unreachable_nats_server_fails_in_seconds_without_tracebacks(
    db: str,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    code, output = cli("outbox", "relay", "--db", db, "--to", f"nats://127.0.0.1:{port}", "--once")
    elapsed = time.monotonic() - started
    assert elapsed < 15, f"took {elapsed:.1f}s"  # nats-py's defaults: four minutes
    assert code == 1 and "published 0 event(s); 2 failed attempt(s)" in output, output
    assert "Traceback" not in output
    failing = status(db)["failing"]
    assert isinstance(failing, list) and len(failing) == 2
    assert all(
        f["last_error"].startswith(f"NatsError: cannot connect to NATS at nats://127.0.0.1:{port}")
        for f in failing
    ), failing


def test_check_passes_for_the_agent_and_fails_listing_threads_for_a_changed_one(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    code, output = cli("check", "--db", db, "--agent", OLD_AGENT)
    assert code == 0, output
    assert "2 stored checkpoint(s)" in output and "accepts every stored thread" in output
    code, output = cli("check", "--db", db, "--agent", NEW_AGENT, "--json")
    assert code == 1
    report = json.loads(output)
    assert report["threads"] == 2 and report["revisions"] == {"1": 2}
    assert [(r["thread_id"], r["reason"]) for r in report["refused"]] == [
        ("t1", "foreign_fingerprint"),
        ("t2", "foreign_fingerprint"),
    ]
    code, output = cli("check", "--db", db, "--agent", "nowhere:agent")
    assert code == 2 and "cannot import" in output


def test_migrate_with_every_checkpoint_current_migrates_nothing(db: str) -> None:
    code, output = cli("migrate", "--db", db, "--batch", "1")
    assert code == 0 and "migrated 0 thread(s) to schema revision 1" in output


# -- migrate, with an injected newer revision (tests/revision_two.py) -------------------------


async def stored_checkpoints(url: str) -> dict[str, tuple[int, KernelCheckpoint]]:
    """Each thread's stored schema revision (as its row says) and its checkpoint, loaded
    as a worker loads it (with revision two installed in this process)."""
    async with open_durability(url) as store:
        assert isinstance(store, RecordedDurability)
        recorder = await store.recorder()
        rows = await recorder.scan_threads(None, 1000, None)
        found: dict[str, tuple[int, KernelCheckpoint]] = {}
        for thread_id, thread in rows:
            assert thread.checkpoint is not None
            revision = json.loads(thread.checkpoint)["schema_revision"]
            loaded = await store.load_checkpoint(thread_id)
            assert loaded is not None
            found[thread_id] = (revision, loaded)
        return found


def assert_tagged_once(checkpoint: KernelCheckpoint, old_turns: set[str]) -> None:
    """Messages of turns committed before the migration carry the tag exactly once; the
    others (committed at revision two) none."""
    assert checkpoint.messages
    for message in checkpoint.messages:
        tags = message.content.count(revision_two.TAG)
        assert tags == (1 if message.turn_id in old_turns else 0), message


def test_migrate_rewrites_the_older_revision_in_batches_and_the_threads_then_load(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    revision_two.install(monkeypatch.setattr)
    code, output = cli("check", "--db", db, "--agent", OLD_AGENT, "--json")
    assert code == 0 and json.loads(output)["revisions"] == {"1": 2}  # older, accepted
    code, output = cli("migrate", "--db", db, "--batch", "1")
    assert code == 0, output
    assert f"migrated 2 thread(s) to schema revision {revision_two.REVISION}" in output
    stored = asyncio.run(stored_checkpoints(db))
    assert {t: r for t, (r, _) in stored.items()} == {"t1": 2, "t2": 2}
    for _, checkpoint in stored.values():
        assert checkpoint.version == 3
        assert_tagged_once(checkpoint, {"1", "2", "3"})
    code, output = cli("migrate", "--db", db)
    assert code == 0 and "migrated 0 thread(s)" in output  # nothing twice
    code, output = cli("check", "--db", db, "--agent", OLD_AGENT, "--json")
    assert code == 0 and json.loads(output)["revisions"] == {"2": 2}

    async def next_turn() -> int:
        async with SQLiteDurability(db.removeprefix("sqlite:///")) as store:
            result = await Kernel(billing_agent(FakeProvider()), store).turn("t1", "4", "balance 1")
            return result.checkpoint_version

    assert asyncio.run(next_turn()) == 4


def revision_two_process(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).parent / "revision_two.py"), *args]


async def seed(url: str, threads: list[str], turns: int) -> None:
    async with open_durability(url) as store:
        kernel = Kernel(billing_agent(FakeProvider()), store)
        for thread in threads:
            for n in range(1, turns + 1):
                await kernel.turn(thread, str(n), f"balance {n}")


@pytest.mark.slow
def test_migrate_interrupted_after_a_batch_finishes_when_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    threads = [f"t-{n}" for n in range(5)]
    asyncio.run(seed(url, threads, 2))
    migrate = revision_two_process("cli", "migrate", "--db", url, "--batch", "2")
    killed = subprocess.run(
        migrate, env=process_env(IK_MIGRATE_KILL_AT="3"), capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # as it migrated the 3rd thread
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    revision_two.install(monkeypatch.setattr)
    halfway = asyncio.run(stored_checkpoints(url))
    assert {t: r for t, (r, _) in halfway.items()} == {
        "t-0": 2,
        "t-1": 2,  # the first batch was committed, thread by thread
        "t-2": 1,
        "t-3": 1,
        "t-4": 1,
    }
    resumed = subprocess.run(migrate, env=process_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "migrated 3 thread(s) to schema revision 2" in resumed.stdout
    for revision, checkpoint in asyncio.run(stored_checkpoints(url)).values():
        assert (revision, checkpoint.version) == (2, 2)
        assert_tagged_once(checkpoint, {"1", "2"})  # none migrated twice


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_migrate_beside_a_process_committing_turns_on_the_same_threads(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """The committing process meets the migration halfway through the threads: turns
    commit before, while and after their thread is migrated. Nothing is lost, each
    message is migrated once, every version follows the committed turns, and every
    thread loads."""
    with contextlib.ExitStack() as stack:
        if kind == "sqlite":
            url = f"sqlite:///{tmp_path / 'ops.db'}"
        else:
            url = stack.enter_context(new_database(request.getfixturevalue("postgres_dsn")))
        threads = [f"t-{n:02d}" for n in range(30)]
        asyncio.run(seed(url, threads, 2))
        ready, started, stop = tmp_path / "ready", tmp_path / "started", tmp_path / "stop"
        config = {
            "url": url,
            "wait_for": str(ready),
            "threads": threads,
            "first_turn": 3,
            "pause": 0.005,
            "started": str(started),
            "stop": str(stop),
        }
        committed_log = tmp_path / "committed.jsonl"
        with committed_log.open("w") as out:
            committer = subprocess.Popen(
                revision_two_process("turns", json.dumps(config)),
                env=process_env(),
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
            )
        migrate = subprocess.run(
            revision_two_process("cli", "migrate", "--db", url, "--batch", "4"),
            env=process_env(
                IK_MIGRATE_READY=str(ready),  # migrating t-00, and holding its lock
                IK_MIGRATE_WAIT_FOR=str(started),  # until a turn committed on t-29
                IK_MIGRATE_DELAY="0.005",
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        stop.touch()
        _, errors = committer.communicate(timeout=60)
        assert committer.returncode == 0, errors
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        migrated = int(migrate.stdout.split("migrated ")[1].split(" ")[0])
        # Turns migrated the threads they reached first; the command, the others.
        assert 0 < migrated < len(threads), migrate.stdout

        committed = [json.loads(line) for line in committed_log.read_text().splitlines()]
        monkeypatch.syspath_prepend(str(Path(__file__).parent))
        revision_two.install(monkeypatch.setattr)
        stored = asyncio.run(stored_checkpoints(url))
        assert sorted(stored) == threads
        for thread in threads:
            mine = [c for c in committed if c["thread_id"] == thread]
            # Each committed turn got the next version: none lost, none overwritten.
            assert [c["version"] for c in mine] == list(range(3, 3 + len(mine)))
            revision, checkpoint = stored[thread]
            assert (revision, checkpoint.version) == (2, 2 + len(mine))
            assert_tagged_once(checkpoint, {"1", "2"})
            assert [m.turn_id for m in checkpoint.messages if m.role == "user"] == [
                str(n) for n in range(1, 3 + len(mine))
            ]


def test_prune_keeps_turn_ids_so_a_late_retry_is_refused(db: str) -> None:
    code, output = cli("outbox", "relay", "--db", db, "--to", "cli_outbox_sink:collect", "--once")
    assert code == 0, output
    code, output = cli("prune", "--db", db, "--older-than", "30d")
    assert code == 0 and "pruned 0 published event(s) and 0 turn result(s)" in output
    code, output = cli("prune", "--db", db, "--older-than", "0s", "--batch", "2")
    events = len(cli_outbox_sink.received)
    assert code == 0 and f"pruned {events} published event(s) and 6 turn result(s)" in output
    path = db.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM ik_turns").fetchone() == (6,)
        assert conn.execute("SELECT count(*) FROM ik_outbox").fetchone() == (0,)

    async def late_retry() -> None:
        async with SQLiteDurability(path) as store:
            with pytest.raises(TurnExpiredError):
                await Kernel(billing_agent(FakeProvider()), store).turn("t1", "3", "yes")

    asyncio.run(late_retry())
    code, output = cli("prune", "--db", db, "--older-than", "soon")
    assert code == 2 and "not a duration" in output


def test_prune_prints_the_journal_entries_of_uncommitted_turns_it_removed(db: str) -> None:
    """A turn that recorded two values and died before its commit leaves two journal
    entries; ``prune`` deletes them and says so, and a second run finds none."""
    path = db.removeprefix("sqlite:///")

    async def dies_after_recording() -> None:
        async with SQLiteDurability(path) as store:

            async def operation(tx: TurnTransaction) -> TurnCommit:
                for key in ("app.first", "app.second"):
                    await tx.recorded(key, partial(asyncio.sleep, 0, {"seen": key}))
                raise RuntimeError("the process died before its commit")

            with pytest.raises(RuntimeError):
                await store.with_turn(TurnScope("t3", "1"), operation)

    asyncio.run(dies_after_recording())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM ik_journal").fetchone() == (2,)
    code, output = cli("prune", "--db", db, "--older-than", "0s")
    assert code == 0, output
    assert "and 2 journal entry(ies) of turns that never committed" in output
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM ik_journal").fetchone() == (0,)
    code, output = cli("prune", "--db", db, "--older-than", "0s")
    assert code == 0 and "and 0 journal entry(ies)" in output


# -- a store that does not exist --------------------------------------------------------------

OPERATIONS = {
    "check": ["check", "--agent", OLD_AGENT],
    "migrate": ["migrate"],
    "prune": ["prune", "--older-than", "30d"],
    "outbox status": ["outbox", "status"],
    "outbox relay": ["outbox", "relay", "--to", "cli_outbox_sink:collect", "--once"],
    "receipts list": ["receipts", "list"],
    "receipts resolve": [
        *("receipts", "resolve", "t1", "k", "--applied", "--value", "{}", "--note", "seen")
    ],
}


@pytest.mark.parametrize("command", list(OPERATIONS.values()), ids=list(OPERATIONS))
def test_operations_commands_refuse_a_sqlite_path_where_no_store_exists_and_create_nothing(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    typo = tmp_path / "typo.db"
    code, output = cli(*command, "--db", f"sqlite:///{typo}")
    assert code == 2, output
    assert f"no SQLite store at '{typo}': the file does not exist" in output
    assert "never create a store" in output
    assert list(tmp_path.iterdir()) == []  # no database, no lock file

    other = tmp_path / "other.db"  # another application's database
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    before = other.read_bytes()
    code, output = cli(*command, "--db", f"sqlite:///{other}")
    assert code == 2 and "is not an intention-kernel store" in output, output
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_check_of_a_store_without_checkpoints_warns_and_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = tmp_path / "empty.db"

    async def create() -> None:
        async with SQLiteDurability(path) as store:
            await store.list_receipts()  # opens it: the schema exists, no turn yet

    asyncio.run(create())
    code, output = cli("check", "--db", f"sqlite:///{path}", "--agent", OLD_AGENT)
    assert code == 0, output
    assert "0 stored checkpoint(s)" in output and "accepts every stored thread" not in output
    assert "warning: the store holds no checkpoint" in output
    code, output = cli("check", "--db", f"sqlite:///{path}", "--agent", OLD_AGENT, "--json")
    assert code == 0 and "warning" in output  # on stderr, beside the JSON


@pytest.mark.postgres
def test_operations_commands_refuse_a_postgres_database_without_a_store(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with new_database(postgres_dsn) as url:
        for label, command in OPERATIONS.items():
            code, output = cli(*command, "--db", url)
            assert code == 2, (label, output)
            assert "no intention-kernel store in schema 'intention_kernel'" in output, label
        with psycopg.connect(url) as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = 'intention_kernel'"
            ).fetchone()
        assert found == (0,)  # nothing was created

        async def create() -> None:
            async with PostgresDurability(url) as store:
                await store.list_receipts()

        asyncio.run(create())
        code, output = cli("check", "--db", url, "--agent", OLD_AGENT)
        assert code == 0 and "warning: the store holds no checkpoint" in output, output
        code, output = cli("outbox", "status", "--db", url)
        assert code == 0 and "unpublished: 0 event(s)" in output, output


def test_durations_read_as_an_operator_writes_them() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("1d12h") == timedelta(hours=36)
    assert parse_duration(" 90S ") == timedelta(seconds=90)
    for bad in ("", "30", "d", "1x", "1d 2h", "-1d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


def test_prune_refuses_an_age_that_reaches_back_before_year_one(db: str) -> None:
    for age in ("1000000000d", "999999999d", "3000000w"):
        code, output = cli("prune", "--db", db, "--older-than", age)
        assert code == 2, output
        assert f"not a duration: {age!r} reaches back before year 1" in output
        assert "Traceback" not in output and "OverflowError" not in output
    assert status(db)["unpublished"]  # nothing was pruned


@pytest.mark.postgres
def test_a_mistyped_postgres_schema_is_refused_and_never_created(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``?schema=`` is the adapter's, not libpq's: the probe used to hand it to libpq,
    took the refusal for an unreachable server, and the adapter then created the
    mistyped schema and reported an empty store."""
    import psycopg

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with new_database(postgres_dsn) as url:

        async def create() -> None:
            async with PostgresDurability(url, schema="billing") as store:
                await store.list_receipts()

        asyncio.run(create())
        for label, command in OPERATIONS.items():
            code, output = cli(*command, "--db", f"{url}?schema=biling")
            assert code == 2, (label, output)
            assert "no intention-kernel store in schema 'biling'" in output, label
        with psycopg.connect(url) as conn:
            schemas = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bil%' ORDER BY 1"
            ).fetchall()
        assert schemas == [("billing",)]  # nothing was created
        code, output = cli("outbox", "status", "--db", f"{url}?schema=billing")
        assert code == 0 and "unpublished: 0 event(s)" in output, output


@pytest.mark.postgres
async def test_exists_says_whether_the_schema_is_there_and_creates_nothing(
    postgres_dsn: str,
) -> None:
    schema = "ik_exists_" + uuid.uuid4().hex[:8]
    store = PostgresDurability(postgres_dsn, schema=schema)
    try:
        assert await store.exists() is False
        assert await store.exists() is False  # asking twice created nothing either
        async with store:
            assert await store.exists() is True
        assert await PostgresDurability(postgres_dsn, schema=schema).exists() is True
    finally:
        drop_schema(postgres_dsn, schema)


def test_sqlite_and_memory_stores_say_whether_they_exist(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    assert asyncio.run(SQLiteDurability(path).exists()) is False
    assert list(tmp_path.iterdir()) == []
    path.write_bytes(b"")  # an empty file is a database without tables
    assert asyncio.run(SQLiteDurability(path).exists()) is False
    path.unlink()

    async def create() -> None:
        async with SQLiteDurability(path):
            pass

    asyncio.run(create())
    assert asyncio.run(SQLiteDurability(path).exists()) is True
    assert asyncio.run(InMemoryDurability().exists()) is True


def test_a_plain_path_is_a_sqlite_store_for_every_command(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    absolute = db.removeprefix("sqlite:///")
    monkeypatch.chdir(tmp_path)
    relative = "./" + os.path.relpath(absolute, tmp_path)
    for path in (absolute, relative):
        for label, command in OPERATIONS.items():
            if label == "receipts resolve":
                continue  # no such receipt: refused with exit status 2 either way
            code, output = cli(*command, "--db", path)
            assert code in (0, 1), (label, path, output)  # relay: 1 if the sink refused
            assert "not a durability URL" not in output and "refused" not in output, output
    code, output = cli("receipts", "list", "--db", relative, "--json")
    assert code == 0 and len(output.splitlines()) == 2  # one charge on each thread


@pytest.mark.parametrize("server", ["refusing", "silent"])
def test_an_unreachable_postgres_server_is_one_message_and_exit_2(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed port and a server that accepts but never answers: one line, no
    traceback, no retry warnings, and bounded by the commands' short connect timeout
    (not the pool's 30 s)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        if server == "silent":
            listener.listen(8)  # the kernel completes handshakes; nobody ever speaks
        port = listener.getsockname()[1]
        url = f"postgresql://postgres@127.0.0.1:{port}/none"
        serve = ["serve", "--agent", OLD_AGENT, "--port", "0"]
        for command in (OPERATIONS["receipts list"], OPERATIONS["outbox status"], serve):
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "intention_kernel", *command, "--db", url],
                capture_output=True,
                text=True,
                timeout=60,
                env={**process_env(), "COLUMNS": "1000"},
                cwd=Path(__file__).parent,
                check=False,
            )
            assert done.returncode == 2, done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
            assert done.stderr.startswith("refused: "), done.stderr
            assert "cannot connect to PostgreSQL" in done.stderr
            assert time.monotonic() - started < 25  # the connect timeout, not a pool's 30 s
