"""Draining on shutdown (issue 36): ``intention-kernel serve`` on SIGTERM takes no new
turn (503 ``shutting-down``) and lets a running turn reach its next safe point, where
it stops, committing nothing. Its journal keeps the rounds it ran: delivered again to
a new process, it goes on from there. A real uvicorn process gets a real SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from host_support import TESTS_DIR, asgi_client, free_port
from intention_kernel import Kernel, ShuttingDownError
from intention_kernel.durability import Durability
from intention_kernel.host import create_app
from intention_kernel.testing._agents import FakeProvider, billing_agent


def start(db: Path, root: Path, grace: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    environ = dict(os.environ, DRAIN_DIR=str(root))
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS_DIR), environ.get("PYTHONPATH")])
    )
    with (root / "serve.log").open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "intention_kernel",
                "serve",
                "--agent",
                "drain_agent:agent",
                "--db",
                f"sqlite:///{db}",
                "--port",
                str(port),
                "--grace",
                str(grace),
            ],
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return process, base
        except httpx.TransportError:
            pass
        assert process.poll() is None, (root / "serve.log").read_text()
        time.sleep(0.1)
    process.kill()
    raise AssertionError("the host did not start")


def asks(root: Path) -> list[dict[str, int]]:
    path = root / "asks"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_sigterm_stops_a_running_turn_at_its_next_safe_point_and_another_process_goes_on(
    tmp_path: Path,
) -> None:
    db, root = tmp_path / "host.db", tmp_path
    process, base = start(db, root, grace=20)
    answers: list[httpx.Response] = []
    turn = {"turn_id": "d1", "message": "paint it"}
    try:
        running = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{base}/v1/threads/t1/turns", json=turn, timeout=60)
            )
        )
        running.start()
        deadline = time.monotonic() + 30
        while not (root / "entered").exists():
            assert time.monotonic() < deadline, "the turn never reached its model"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the kernel drains before the held round goes on
        (root / "release").touch()
        running.join(60)
        # Well within the grace period. uvicorn raises the signal it caught again once
        # it has shut down: the process ends as SIGTERM ends it.
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    [answer] = answers
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "1"
    assert answer.json()["type"] == "/problems/shutting-down"
    first = {line["pid"] for line in asks(root)}
    assert [line["round"] for line in asks(root)] == [1]  # stopped before round 2

    # Nothing half-done: no turn committed, round 1 (and its step) kept in the journal.
    again, base = start(db, root, grace=20)
    try:
        redelivered = httpx.post(f"{base}/v1/threads/t1/turns", json=turn, timeout=60)
        late = httpx.post(
            f"{base}/v1/threads/t1/turns", json={"turn_id": "d2", "message": "hi"}, timeout=60
        )
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=30)
    assert redelivered.status_code == 200, redelivered.text
    result = redelivered.json()
    assert result["reply"] == "done" and result["checkpoint_version"] == 1
    assert [s["value"] for s in result["steps"]] == [{"due": 4}]
    # The new process asked the model round 2 only: round 1 came from the journal.
    assert [line["round"] for line in asks(root) if line["pid"] not in first] == [2, 1]
    assert late.status_code == 200 and late.json()["checkpoint_version"] == 2


async def test_a_draining_host_answers_503_and_keeps_queued_messages(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(dataclasses.replace(billing_agent(provider), on_busy="queue"), store)
    await kernel.turn("t", "1", "balance")
    kernel.begin_shutdown()
    assert kernel.shutting_down
    with pytest.raises(ShuttingDownError):
        await kernel.turn("t", "2", "balance")
    app = create_app(kernel)
    async with asgi_client(app) as client:
        refused = await client.post(
            "/v1/threads/t/turns", json={"turn_id": "3", "message": "balance"}
        )
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["type"] == "/problems/shutting-down"
    checkpoint = await store.load_checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 1  # nothing was taken
    # Another process (kernel) drains what waits; this one takes nothing more.
    other = Kernel(dataclasses.replace(billing_agent(provider), on_busy="queue"), store)
    assert (await other.turn("t", "3", "balance")).checkpoint_version == 2
