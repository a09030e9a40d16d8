"""A waiting event stream sends an SSE comment every ``keep_alive`` seconds, so a
proxy does not close an idle watch: a turn's ``/events`` and an AG-UI run.

Real HTTP (uvicorn in a thread) and a model whose round 2 sleeps: the comments
arrive while it sleeps, and the stream still ends with the turn's result.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from host_support import served, serving_in_thread
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability
from streams_support import StreamingRounds, streams_kernel

BODY = {"turn_id": "t1", "message": "what do I owe"}


@pytest.fixture
def base_url() -> Iterator[str]:
    kernel = streams_kernel(InMemoryDurability(), StreamingRounds(slow=1.5))
    with serving_in_thread(create_app(kernel, keep_alive=0.1)) as url:
        yield url


def read(response: httpx.Response) -> list[str]:
    """Every line of the stream, as it arrives."""
    return [line for line in response.iter_lines() if line]


def test_a_turns_event_stream_pings_while_the_turn_waits(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        accepted = client.post(
            "/v1/threads/acct-1/turns", json=BODY, headers={"Prefer": "respond-async"}
        )
        assert accepted.status_code == 202
        with client.stream("GET", accepted.json()["events"]) as response:
            lines = read(response)

    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[-1] == "result"
    # Round 2 sleeps 1.5 s: pings came between round 1's events and round 2's.
    first_ping = lines.index(": ping")
    assert "event: delta" in lines[:first_ping] and "event: delta" in lines[first_ping:]
    assert lines.count(": ping") >= 3


def test_an_agui_run_pings_while_its_turn_waits(base_url: str) -> None:
    run = {
        "threadId": "acct-1",
        "runId": "r1",
        "messages": [{"id": "m1", "role": "user", "content": "what do I owe"}],
    }
    with httpx.stream("POST", f"{base_url}/v1/agui", json=run, timeout=30) as response:
        assert response.status_code == 200
        lines = read(response)

    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert payloads[-1]["type"] == "RUN_FINISHED"
    first_ping = lines.index(": ping")
    before = [json.loads(line[6:])["type"] for line in lines[:first_ping] if line[:6] == "data: "]
    assert "TEXT_MESSAGE_CONTENT" in before and "RUN_FINISHED" not in before
    assert lines.count(": ping") >= 3


def test_a_stream_that_never_waits_sends_no_ping() -> None:
    kernel = streams_kernel(InMemoryDurability(), StreamingRounds())
    with serving_in_thread(create_app(kernel, keep_alive=30)) as url:
        with httpx.stream(
            "POST",
            f"{url}/v1/threads/acct-1/turns",
            json=BODY,
            headers={"Accept": "text/event-stream"},
            timeout=30,
        ) as response:
            lines = read(response)
        with httpx.stream("GET", f"{url}/v1/threads/acct-1/turns/t1/events", timeout=30) as again:
            watched = read(again)
    assert ": ping" not in lines + watched
    assert "event: result" in lines and "event: result" in watched


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_bad_keep_alive_is_refused(bad: object) -> None:
    kernel = streams_kernel(InMemoryDurability(), StreamingRounds())
    with pytest.raises(ValueError, match="keep_alive"):
        create_app(kernel, keep_alive=bad)  # type: ignore[arg-type]


async def test_keep_alive_never_cancels_the_chunk_it_waits_for() -> None:
    from intention_kernel.host._turnstreams import PING, keep_alive

    async def slow() -> AsyncIterator[str]:
        for chunk in ("a", "b"):
            await asyncio.sleep(0.05)
            yield chunk

    got = [chunk async for chunk in keep_alive(slow(), 0.01)]
    assert [c for c in got if c != PING] == ["a", "b"] and PING in got


def test_serve_sends_pings_at_the_interval_its_keep_alive_option_gives(tmp_path: Path) -> None:
    """``intention-kernel serve --keep-alive 0.1``: a real process, a turn held in its
    first round, and its ``/events`` stream read over a real connection. Pings arrive
    while the turn waits; the stream ends with the turn's result once it goes on."""
    root = tmp_path / "drain"
    root.mkdir()
    args = ["--keep-alive", "0.1"]
    env = {"DRAIN_DIR": str(root)}
    store = tmp_path / "app.db"
    with (
        served(store, agent="drain_agent:agent", args=args, env=env) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        body = {"turn_id": "t1", "message": "paint it"}
        accepted = client.post(
            "/v1/threads/acct-1/turns", json=body, headers={"Prefer": "respond-async"}
        )
        assert accepted.status_code == 202, accepted.text
        lines: list[str] = []
        with client.stream("GET", accepted.json()["events"]) as response:
            for line in response.iter_lines():
                lines.append(line)
                # Three pings while round 1 is held, then the turn may go on.
                if lines.count(": ping") == 3:
                    (root / "release").touch()
    assert (root / "entered").exists()
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[-1] == "result"
    assert lines.count(": ping") >= 3


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf"])
def test_serve_refuses_a_keep_alive_that_is_not_a_positive_number(bad: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "intention_kernel", "serve", "--agent", "x:y", "--keep-alive", bad],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--keep-alive must be positive and finite" in done.stderr
    assert not (tmp_path / "intention-kernel.db").exists()  # nothing opened or created
