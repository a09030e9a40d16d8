"""``SyncKernel`` across real processes: forks, SIGINT, and a WSGI server.

- A forked child (Celery's prefork pool, gunicorn's workers) never calls into the
  parent's loop thread, which does not exist there. A kernel built from a URL opens the
  store anew. One built over a store object the parent used is refused with
  ``ForkedKernelError``. One the parent never used just starts. The parent's own
  connections still work after the child exits (a child that closed them would end
  the parent's PostgreSQL sessions).
- SIGINT in a thread waiting for a turn cancels the turn before ``KeyboardInterrupt``
  reaches the caller: the write in flight is ``uncertain``, nothing is committed.
- gunicorn (``--preload``, two worker processes of eight threads) serves a Flask app
  over one SQLite file: concurrent requests, each turn delivered twice at once, commit
  each turn once and write once; the duplicates and later redeliveries are replays.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from intention_kernel import SyncKernel
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import drop_schema

HERE = Path(__file__).parent
WORKER = HERE / "sync_fork_worker.py"

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store that several processes can share: a SQLite file, a PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = "ik_sync_" + uuid.uuid4().hex[:12]
    try:
        yield f"{dsn}?schema={schema}"
    finally:
        drop_schema(dsn, schema)


def run_worker(scenario: str, url: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(WORKER), scenario, url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_a_forked_child_opens_a_url_built_kernels_store_anew(shared_url: str) -> None:
    report = run_worker("fork-url", shared_url)
    # The child ran its own turn and saw the parent's as committed.
    assert report["child"] == {"ok": {"version": 1, "replayed": True}, "exit": 0}
    # The parent's store, connections included, still serves it after the child left.
    assert report["parent_before"] == 1 and report["parent_after"] == 2
    assert report["child_seen_by_parent"] is True
    assert report["writes"] == 2  # the parent's two turns; the child's write was its own


def test_a_forked_child_is_refused_a_store_object_its_parent_used(shared_url: str) -> None:
    report = run_worker("fork-object", shared_url)
    assert report["child"]["error"] == "ForkedKernelError"
    assert "worker_process_init" in report["child"]["message"]
    assert report["child"]["exit"] == 0
    # Nothing ran in the child: the parent runs the child's turn as a new one.
    assert report["parent_after"] == 2 and report["child_seen_by_parent"] is False


def test_a_forked_child_starts_a_kernel_its_parent_never_used(shared_url: str) -> None:
    report = run_worker("fork-unused", shared_url)
    assert report["child"] == {"ok": {"version": 1, "replayed": None}, "exit": 0}
    assert report["parent_after"] == 1 and report["child_seen_by_parent"] is True


def test_sigint_cancels_the_waited_turn_before_keyboard_interrupt_reaches_the_caller(
    tmp_path: Path,
) -> None:
    report = run_worker("interrupt", f"sqlite:///{tmp_path / 'int.db'}")
    assert report["raised"] == "KeyboardInterrupt"
    # Already settled when the caller saw the interrupt: the write in flight was
    # cancelled (uncertain, never retried), and the turn committed nothing.
    assert report["receipts"] == ["uncertain"] and report["checkpoint"] is None
    assert report["again"] == "uncertain" and report["writes"] == 1


# -- a real WSGI server ------------------------------------------------------------------------


@pytest.fixture
def gunicorn(tmp_path: Path) -> Iterator[tuple[Callable[[], httpx.Client], Path, str]]:
    """gunicorn serving ``sync_wsgi_app`` on a Unix socket: a client factory, the
    ledger and the store's URL. Stopped with SIGTERM (a graceful shutdown)."""
    socket, ledger = tmp_path / "app.sock", tmp_path / "ledger.txt"
    url = f"sqlite:///{tmp_path / 'app.db'}"
    env = {
        **os.environ,
        "SYNC_APP_DB": url,
        "SYNC_APP_LEDGER": str(ledger),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--preload",
            "--workers=2",
            "--threads=8",
            "--worker-class=gthread",
            f"--bind=unix:{socket}",
            "--graceful-timeout=30",
            "sync_wsgi_app:app",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def client() -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://app", timeout=60
        )

    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[0]
            if socket.exists():
                try:
                    with client() as c:
                        if c.get("/health").status_code == 200:
                            break
                except httpx.TransportError:
                    pass
            assert time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.1)
        yield client, ledger, url
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
        assert "Traceback" not in output, output


def test_gunicorn_threads_commit_each_turn_once_and_replay_its_duplicates(
    gunicorn: tuple[Callable[[], httpx.Client], Path, str],
) -> None:
    client, ledger, url = gunicorn
    threads, turns = 8, 5
    deliveries = [(f"conv-{t}", f"turn-{n}") for t in range(threads) for n in range(turns)]
    requests = deliveries * 2  # each turn delivered twice, both at once in the same batch
    random.Random(7).shuffle(requests)
    local, clients = threading.local(), []

    def post(delivery: tuple[str, str]) -> tuple[tuple[str, str], dict[str, Any]]:
        if not hasattr(local, "client"):
            local.client = client()
            clients.append(local.client)
        thread_id, turn_id = delivery
        answer = local.client.post(
            f"/threads/{thread_id}/turns/{turn_id}", json={"message": f"{thread_id} {turn_id}"}
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return delivery, body

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, requests))
        # Every delivery again, later: all replays.
        later = list(pool.map(post, deliveries))
    for c in clients:
        c.close()

    first = Counter(d for d, body in answers if not body["result"]["replayed"])
    replayed = Counter(d for d, body in answers if body["result"]["replayed"])
    assert first == Counter(deliveries) and replayed == Counter(deliveries)
    assert all(body["result"]["replayed"] for _, body in later)
    # The same result each time a delivery was answered.
    results: dict[tuple[str, str], set[str]] = {}
    for delivery, body in answers + later:
        result = dict(body["result"], replayed=None)
        results.setdefault(delivery, set()).add(json.dumps(result, sort_keys=True))
    assert all(len(texts) == 1 for texts in results.values())
    # One write per turn, across both worker processes.
    lines = ledger.read_text().splitlines()
    keys = [line.split()[0] for line in lines]
    assert len(keys) == len(deliveries) and len(set(keys)) == len(deliveries)
    # Each conversation's turns serialized: versions 1..5, each once.
    for t in range(threads):
        versions = sorted(
            body["result"]["checkpoint_version"]
            for (thread_id, _), body in answers
            if thread_id == f"conv-{t}" and not body["result"]["replayed"]
        )
        assert versions == list(range(1, turns + 1))
    # Reading the outbox needs no agent of the app's: any agent reads the events.
    with SyncKernel(billing_agent(FakeProvider()), url) as reader:
        committed = [e for e in reader.read_outbox(limit=1000) if e.type == "turn.committed"]
    assert len(committed) == len(deliveries)
