"""A waiting event stream sends an SSE comment every ``keep_alive`` seconds, so a
proxy does not close an idle watch: a turn's ``/events`` and an AG-UI run.

Real HTTP (uvicorn in a thread) and a model whose round 2 sleeps: the comments
arrive while it sleeps, and the stream still ends with the turn's result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from host_support import serving_in_thread
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
