"""The host's resumable streams and detached turns.

Server-sent events carry ``id:`` lines, and a retry with ``Last-Event-ID`` resumes after
that event. ``Prefer: respond-async`` answers 202 with the turn's URL; ``GET`` on it gives
the status and result, ``/events`` the stream, resumable. With real processes: a
detached turn whose host was killed (SIGKILL) mid-turn is finished by another host on
the same store, and its stream goes on there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from host_support import asgi_client, free_port, store_url_for
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability
from streams_support import SLOW_ENV, StreamingRounds, streams_kernel

URL = "/v1/threads/acct-1/turns"
SSE = {"Accept": "text/event-stream"}
ASYNC = {"Prefer": "respond-async"}
BODY = {"turn_id": "t1", "message": "what do I owe"}


def parse(text: str) -> list[dict[str, Any]]:
    """Each event of a server-sent stream: ``{"id", "event", "data"}``."""
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
        if fields:
            events.append({**fields, "data": json.loads(fields["data"])})
    return events


def texts(events: list[dict[str, Any]]) -> str:
    return "".join(e["data"]["text"] for e in events if e["event"] == "delta")


async def test_events_carry_ids_and_a_retry_resumes_after_last_event_id() -> None:
    app = create_app(streams_kernel(InMemoryDurability(), StreamingRounds()))
    async with asgi_client(app) as client:
        streamed = parse((await client.post(URL, json=BODY, headers=SSE)).text)
        retried = await client.post(
            URL, json=BODY, headers={**SSE, "Last-Event-ID": streamed[3]["id"]}
        )
        bad = await client.post(URL, json=BODY, headers={**SSE, "Last-Event-ID": "x"})
    assert [e["id"] for e in streamed][-1] == "result"
    assert len({e["id"] for e in streamed}) == len(streamed)
    assert texts(streamed) == "r1a r1b r2a r2b r3a r3b "
    # Committed: the retry after an event before ``result`` gets the result alone.
    assert [e["event"] for e in parse(retried.text)] == ["result"]
    assert retried.headers["idempotency-replayed"] == "true"
    assert bad.status_code == 422


async def test_respond_async_answers_202_and_the_turn_runs_to_its_commit() -> None:
    kernel = streams_kernel(InMemoryDurability(), StreamingRounds())
    async with asgi_client(create_app(kernel)) as client:
        accepted = await client.post(URL, json=BODY, headers={"Prefer": "wait=5, respond-async"})
        await kernel.drained()
        location = accepted.headers["location"]
        status = await client.get(location)
        events = await client.get(f"{location}/events")
        resumed = await client.get(
            f"{location}/events", headers={"Last-Event-ID": parse(events.text)[1]["id"]}
        )
        done = await client.get(f"{location}/events", headers={"Last-Event-ID": "result"})
        again = await client.post(URL, json=BODY, headers=ASYNC)
        unknown = await client.get(f"{URL}/nope")
        unknown_events = await client.get(f"{URL}/nope/events")
        wrong = await client.post(f"{location}/events")
    assert accepted.status_code == 202
    assert accepted.headers["preference-applied"] == "respond-async"
    assert location == f"{URL}/t1"
    assert accepted.json() == {
        "thread_id": "acct-1",
        "turn_id": "t1",
        "status": "queued",
        "result": None,
        "url": location,
        "events": f"{location}/events",
    }
    assert status.json()["status"] == "committed"
    assert status.json()["result"]["reply"]
    streamed = parse(events.text)
    assert texts(streamed) == "r1a r1b r2a r2b "
    assert streamed[-1]["event"] == "result"
    assert streamed[-1]["data"] == status.json()["result"]
    assert parse(resumed.text) == streamed[2:]
    assert done.status_code == 204
    # Already committed: the result at once (200), as without the preference.
    assert again.status_code == 200 and "preference-applied" not in again.headers
    assert again.headers["idempotency-replayed"] == "true"
    assert (unknown.status_code, unknown_events.status_code) == (404, 404)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"


# -- real processes -----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from store_url_for(request, tmp_path, "ik_test", "&lease_expiry=2")


@contextlib.contextmanager
def host(store_url: str, log: Path, slow: float) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``intention-kernel serve`` with :func:`streams_support.host_agent`."""
    port = free_port()
    environ = {**os.environ, SLOW_ENV: str(slow)}
    environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parent), environ.get("PYTHONPATH", "")]
    )
    command = [sys.executable, "-m", "intention_kernel", "serve", "--agent"]
    command += ["streams_support:host_agent", "--db", store_url, "--port", str(port)]
    with log.open("ab") as out:
        process = subprocess.Popen(command, env=environ, stdout=out, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield process, base_url
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)


def test_a_detached_turn_outlives_the_host_that_accepted_it(store_url: str, tmp_path: Path) -> None:
    log = tmp_path / "hosts.log"
    with host(store_url, log, slow=60) as (first, base_url):
        with httpx.Client(base_url=base_url, timeout=30) as client:
            accepted = client.post(URL, json=BODY, headers=ASYNC)
            assert accepted.status_code == 202, accepted.text
            location = accepted.headers["location"]
            # Round 1 is recorded, round 2 sleeps: the turn runs, and its host dies.
            deadline = time.monotonic() + 30
            while client.get(location).json()["status"] != "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            head: list[str] = []
            with client.stream("GET", f"{location}/events") as sse:
                for line in sse.iter_lines():
                    head.append(line)
                    if not line and texts(parse("\n".join(head))) == "r1a r1b ":
                        break
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    seen = parse("\n".join(head))
    assert texts(seen) == "r1a r1b "

    with (
        host(store_url, log, slow=0) as (_, base_url),
        httpx.Client(base_url=base_url, timeout=30) as client,
    ):
        # Asked about it, the new host drains the turn its dead peer accepted.
        deadline = time.monotonic() + 60
        while (status := client.get(location).json())["status"] != "committed":
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        rest = parse(
            client.get(f"{location}/events", headers={"Last-Event-ID": seen[-1]["id"]}).text
        )
        everything = parse(client.get(f"{location}/events").text)
    assert everything == seen + rest
    assert texts(everything) == "r1a r1b r2a r2b "
    assert rest[-1]["event"] == "result" and rest[-1]["data"] == status["result"]
    assert [e["event"] for e in rest].count("step") == 1  # round 1's step, run once
