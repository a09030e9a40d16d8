"""Relays in real OS processes sharing one store (SQLite file or PostgreSQL database)
while another process commits turns, and one relay killed with SIGKILL mid-batch.

Exclusion between relays then comes from the operating system (a byte of the SQLite
lock file) or the server (an advisory lock), not from anything in one process; and
the killed relay's claims must be released by its death alone. Each relay is the
operator's command, ``intention-kernel outbox relay --to relay_log_sink:deliver``,
whose sink keeps a durable delivery log per process (``tests/relay_log_sink.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import Kernel
from intention_kernel.durability import open_durability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import new_database, process_env, read_all_events, unpublished

pytestmark = pytest.mark.slow

THREADS = [f"t-{n:02d}" for n in range(12)]
BATCH = 5
CONCURRENCY = 2
HANG_AFTER = 6  # the victim's sink stops answering at its 6th delivery
DEADLINE = 45.0


class Fleet:
    """The relay and producer processes of one test, killed if the test fails."""

    def __init__(self, url: str, root: Path) -> None:
        self.url, self.root = url, root
        self.processes: list[subprocess.Popen[str]] = []

    def relay(self, name: str, **env: str) -> tuple[subprocess.Popen[str], Path]:
        log = self.root / f"{name}.jsonl"
        command = [sys.executable, "-m", "intention_kernel", "outbox", "relay", "--db", self.url]
        options = ["--to", "relay_log_sink:deliver", "--poll", "0.05"]
        options += ["--batch", str(BATCH), "--concurrency", str(CONCURRENCY)]
        with (
            (self.root / f"{name}.out").open("w") as output,
            (self.root / f"{name}.err").open("w") as errors,
        ):  # files, not pipes: nothing to drain while the processes run
            process = subprocess.Popen(
                [*command, *options],
                env=process_env(IK_RELAY_LOG=str(log), IK_RELAY_DELAY="0.002", **env),
                stdout=output,
                stderr=errors,
                text=True,
            )
        self.processes.append(process)
        return process, log

    def producer(self, stop: Path) -> subprocess.Popen[str]:
        config = {"url": self.url, "threads": THREADS, "stop": str(stop), "pause": 0.002}
        script = str(Path(__file__).parent / "turn_producer.py")
        process = subprocess.Popen(
            [sys.executable, script, json.dumps(config)],
            env=process_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.communicate()


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def seed(url: str) -> None:
    async with open_durability(url) as store:
        kernel = Kernel(billing_agent(FakeProvider()), store)
        for thread in THREADS:
            await kernel.turn(thread, "1", "balance 1")


async def committed_events(url: str) -> list[Any]:
    async with open_durability(url) as store:
        return await read_all_events(store)


def wait(condition: Any, what: str, deadline: float) -> None:
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_relay_processes_share_a_store_and_a_killed_one_only_repeats_its_batch(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    deadline = started + DEADLINE
    with contextlib.ExitStack() as stack:
        if kind == "sqlite":
            url = f"sqlite:///{tmp_path / 'kernel.db'}"
        else:
            url = stack.enter_context(new_database(request.getfixturevalue("postgres_dsn")))
        asyncio.run(seed(url))
        # A killed relay's claims lapse after the lease expiry: 3 s here, not 30.
        fleet = Fleet(url if kind == "sqlite" else f"{url}?lease_expiry=3", tmp_path)
        stack.callback(fleet.stop)

        stop = tmp_path / "stop"
        producer = fleet.producer(stop)  # commits turns until the end of the test
        victim, victim_log = fleet.relay("victim", IK_RELAY_HANG_AFTER=str(HANG_AFTER))
        # The victim's sink got its HANG_AFTER-th event and never answered: the relay
        # holds its claims, with acknowledged events of the batch in hand not yet marked.
        wait(lambda: len(read_log(victim_log)) >= HANG_AFTER, "the victim hung", deadline)
        survivors = [fleet.relay(f"relay-{n}") for n in range(2)]
        wait(
            lambda: all(read_log(log) for _, log in survivors),
            "both other relays published beside the hung one",
            deadline,
        )
        killed_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        time.sleep(0.5)  # turns still commit after the kill
        stop.touch()
        out, err = producer.communicate(timeout=max(1.0, deadline - time.monotonic()))
        assert producer.returncode == 0, err
        assert int(out) >= 2 * len(THREADS)
        wait(lambda: unpublished(url) == 0, "every event was published", deadline)
        for process, _ in survivors:
            process.send_signal(signal.SIGTERM)
        for process, _ in survivors:
            assert process.wait(timeout=20) == 0
        committed = asyncio.run(committed_events(url))

    logs = {"victim": read_log(victim_log)} | {path.stem: read_log(path) for _, path in survivors}
    deliveries = [dict(d, relay=name) for name, log in logs.items() for d in log]
    by_id = {e.id: e for e in committed}
    seqs_of = {(e.thread_id, e.seq) for e in committed}
    # Every committed event reached the sinks; nothing else did.
    assert {d["id"] for d in deliveries} == set(by_id)
    assert all((d["thread_id"], d["seq"]) in seqs_of for d in deliveries)
    # Each relay published each thread in seq order.
    for name, log in logs.items():
        per_thread: dict[str, list[int]] = defaultdict(list)
        for d in log:
            per_thread[d["thread_id"]].append(d["seq"])
        for thread, seqs in per_thread.items():
            assert seqs == sorted(set(seqs)), f"{name} published {thread} out of order: {seqs}"
    # Across the relays too: the first delivery of each event follows the one before it.
    first: dict[str, list[int]] = defaultdict(list)
    seen: set[str] = set()
    for d in sorted(deliveries, key=lambda d: d["at"]):
        if d["id"] not in seen:
            seen.add(d["id"])
            first[d["thread_id"]].append(d["seq"])
    for thread, seqs in first.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"{thread} out of order: {seqs}"
    # Duplicates: only events the victim had in hand, unmarked, when it was killed.
    counts = Counter(d["id"] for d in deliveries)
    repeated = {event_id for event_id, n in counts.items() if n > 1}
    assert all(counts[event_id] == 2 for event_id in repeated)
    victim_ids = [d["id"] for d in logs["victim"]]
    assert repeated <= set(victim_ids)
    # ...and published again only once the victim was dead: its claims held until then.
    again_at = [d["at"] for d in deliveries if d["id"] in repeated and d["relay"] != "victim"]
    assert again_at and min(again_at) > killed_at
    hung = set(victim_ids[HANG_AFTER - 1 :])  # handed to the sink, never answered
    assert hung and hung <= repeated
    repeated_threads = {by_id[event_id].thread_id for event_id in repeated}
    assert len(repeated_threads) <= CONCURRENCY  # one batch per claim in hand
    for thread in repeated_threads:
        mine = [d for d in logs["victim"] if d["thread_id"] == thread]
        again = [d["id"] in repeated for d in mine]
        # The repeated events are the victim's last ones of the thread: its batch in hand.
        assert again == sorted(again) and 1 <= sum(again) <= BATCH, (thread, again)
    assert {d["relay"] for d in deliveries} - {"victim"}, "no survivor published anything"
    assert time.monotonic() - started < 60
