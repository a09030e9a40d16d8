"""A retried AG-UI run (the same ``runId``) streams what the client missed, and runs
nothing twice.

On every store: a committed run sent again replays its recorded events, then the
result, with the text once; with ``Last-Event-ID`` it resumes after that frame, and
the two connections together show each piece of text once; a run still running is
followed from its record until its commit. With real processes: the serving process
is killed (SIGKILL) mid-run, and another process finishes the run it is asked again,
charging once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui_validate.pytest_plugin import assert_valid_agui

from agui_support import SLOW_ENV
from host_support import asgi_client, served, store_url_for
from intention_kernel import (
    Interpretation,
    InterpretationError,
    InterpretationRequest,
    Kernel,
)
from intention_kernel.durability import Durability
from intention_kernel.host import create_app
from streams_support import StreamingRounds, streams_kernel

URL = "/v1/agui"
TEXT = "r1a r1b r2a r2b r3a r3b "
SAID = {"id": "m1", "role": "user", "content": "what do I owe"}


def frames(text: str) -> list[tuple[dict[str, Any], str | None]]:
    """Each AG-UI event of an SSE body and its frame's ``id`` (comments skipped)."""
    found = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line and not line.startswith(":")]
        if lines:
            data = json.loads(lines[0].removeprefix("data: "))
            ids = [line.removeprefix("id: ") for line in lines[1:]]
            found.append((data, ids[0] if ids else None))
    return found


def texts(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def checked(body: str) -> list[dict[str, Any]]:
    """The events of one response, valid AG-UI by themselves."""
    assert_valid_agui([json.dumps(event) for event, _ in frames(body)], max_warnings=0)
    return [event for event, _ in frames(body)]


async def post(client: httpx.AsyncClient, run_id: str, after: str | None = None) -> httpx.Response:
    headers = {"Accept": "text/event-stream"}
    if after is not None:
        headers["Last-Event-ID"] = after
    body = {"threadId": "acct-1", "runId": run_id, "messages": [SAID]}
    response = await client.post(URL, json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response


@pytest.fixture
async def kernel(store: Durability) -> Kernel:
    return streams_kernel(store, StreamingRounds())


@pytest.fixture
async def client(kernel: Kernel) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(create_app(kernel)) as client:
        yield client


async def test_a_committed_run_sent_again_replays_its_recorded_events_once(
    client: httpx.AsyncClient,
) -> None:
    live = checked((await post(client, "r1")).text)
    again = await post(client, "r1")

    assert again.headers["idempotency-replayed"] == "true"
    replayed = checked(again.text)
    assert texts(live) == texts(replayed) == TEXT
    # A recorded step has its arguments; the last round's is in the result alone.
    calls = [e for e in replayed if e["type"] == "TOOL_CALL_ARGS"]
    assert [json.loads(e["delta"]) for e in calls] == [{"due": 7}]
    assert [e["toolCallId"] for e in replayed if e["type"] == "TOOL_CALL_START"] == [
        "r1#1",
        "r1#2",
    ]
    assert replayed[-1]["result"] == {**live[-1]["result"], "replayed": True}


async def test_a_run_resumed_after_any_frame_shows_each_text_once(
    client: httpx.AsyncClient,
) -> None:
    live = frames((await post(client, "r1")).text)
    ids = [frame_id for _, frame_id in live if frame_id is not None]
    assert ids[-1] == "result" and len(set(ids)) == len(ids)
    recorded = {frame_id for _, frame_id in frames((await post(client, "r1")).text)}
    recorded -= {None, "result"}
    # Round 3 was never recorded: the result alone holds its step and text.
    tail = 1 + max(i for i, (_, frame_id) in enumerate(live) if frame_id in recorded)

    for index, (_, frame_id) in enumerate(live):
        if frame_id is None or frame_id == "result":
            continue
        resumed = checked((await post(client, "r1", after=frame_id)).text)
        assert resumed[0]["type"] == "RUN_STARTED"
        # After a recorded event: exactly the rest. In the tail: the tail from its start.
        seen = [event for event, _ in live[: min(index + 1, tail)]]
        assert texts(seen) + texts(resumed) == TEXT, frame_id
        # Each tool call the client saw is not shown again, the rest once.
        before = {e["toolCallId"] for e in seen if e["type"] == "TOOL_CALL_START"}
        after = [e["toolCallId"] for e in resumed if e["type"] == "TOOL_CALL_START"]
        assert not before & set(after) and len(set(after)) == len(after)
        assert sorted(before | set(after)) == ["r1#1", "r1#2"]


async def test_a_run_still_running_is_followed_until_its_commit(
    store: Durability,
) -> None:
    gate = asyncio.Event()
    model = StreamingRounds(gate=gate)
    kernel = streams_kernel(store, model)
    started = kernel.stream_turn("acct-1", "r1", "what do I owe")
    first = [await anext(started) for _ in range(6)]  # rounds 1 and 2, and a step
    assert (first[-1].type, first[-1].data["step_id"]) == ("step", "r1#2")
    async with asgi_client(create_app(kernel)) as client:
        retried = asyncio.create_task(post(client, "r1"))
        await asyncio.sleep(0.3)
        assert not retried.done()  # it follows the turn, which waits at round 3
        gate.set()
        followed = checked((await retried).text)
    rest = [event async for event in started]

    assert rest[-1].type == "result" and rest[-1].data["replayed"] is False
    assert texts(followed) == TEXT
    assert followed[-1]["type"] == "RUN_FINISHED"
    assert followed[-1]["result"]["steps"] == rest[-1].data["steps"]


async def test_a_bad_last_event_id_is_refused_before_anything_runs(
    client: httpx.AsyncClient, store: Durability
) -> None:
    body = {"threadId": "acct-1", "runId": "r1", "messages": [SAID]}
    response = await client.post(URL, json=body, headers={"Last-Event-ID": "nope"})

    assert response.status_code == 422
    assert response.json()["type"].endswith("invalid-request")
    assert await store.load_checkpoint("acct-1") is None


# -- real processes -------------------------------------------------------------------------


AGENT = "agui_support:charging_agent"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from store_url_for(request, tmp_path, "ik_aguir")


def charges(provider: Path) -> int:
    with sqlite3.connect(provider) as db:
        count: int = db.execute("SELECT COUNT(*) FROM demo_provider_calls").fetchone()[0]
    return count


def server_pid(base_url: str) -> int:
    """The PID of the ``serve`` process listening at ``base_url``."""
    port = base_url.rsplit(":", 1)[1]
    out = subprocess.run(
        ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split("pid=", 1)[1].split(",", 1)[0])


def read_until_charged(
    base_url: str, body: dict[str, Any]
) -> list[tuple[dict[str, Any], str | None]]:
    """The frames of a run, read until the charge's tool call result."""
    seen: list[tuple[dict[str, Any], str | None]] = []
    with httpx.stream("POST", f"{base_url}{URL}", json=body, timeout=30) as response:
        assert response.status_code == 200
        buffered = ""
        for line in response.iter_lines():
            buffered += line + "\n"
            if line == "":
                seen += frames(buffered)
                buffered = ""
                if seen and seen[-1][0]["type"] == "TOOL_CALL_RESULT":
                    return seen
    raise AssertionError(f"the run ended before its charge: {seen}")


@pytest.mark.slow
def test_a_run_whose_process_was_killed_is_resumed_by_another_showing_text_once(
    store_url: str, tmp_path: Path
) -> None:
    provider = tmp_path / "provider.db"
    opening = {"threadId": "acct", "runId": "r1", "messages": [{**SAID, "content": "charge"}]}
    body = {"threadId": "acct", "runId": "r2", "messages": [{**SAID, "id": "m2", "content": "yes"}]}
    with served(store_url, provider=provider, agent=AGENT, env={SLOW_ENV: "60"}) as base_url:
        httpx.post(f"{base_url}{URL}", json=opening, timeout=30).raise_for_status()
        pid = server_pid(base_url)
        # The accepting run charges, then its last round sleeps: the process dies there.
        seen = read_until_charged(base_url, body)
        os.kill(pid, signal.SIGKILL)
    shown = [event for event, _ in seen]
    assert "RUN_FINISHED" not in [event["type"] for event in shown]
    assert texts(shown) == "r2a r2b "
    assert charges(provider) == 1
    last_id = [frame_id for _, frame_id in seen if frame_id is not None][-1]

    with served(store_url, provider=provider, agent=AGENT) as base_url:
        # Its first round is recorded; nobody runs it now.
        status = httpx.get(f"{base_url}/v1/threads/acct/turns/r2", timeout=30).json()
        assert status["status"] == "running"
        headers = {"Last-Event-ID": last_id}
        response = httpx.post(f"{base_url}{URL}", json=body, headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        resumed = checked(response.text)
        again = checked(httpx.post(f"{base_url}{URL}", json=body, timeout=60).text)

    assert texts(shown) + texts(resumed) == "r2a r2b r3a r3b "
    finished = resumed[-1]
    assert (finished["type"], finished["outcome"]["type"]) == ("RUN_FINISHED", "success")
    [step] = finished["result"]["steps"]
    assert (step["capability_id"], step["status"]) == ("payments.charge", "completed")
    assert texts(again) == "r2a r2b r3a r3b "  # the whole run, from its record
    assert again[-1]["result"] == {**finished["result"], "replayed": True}
    assert charges(provider) == 1


class FailingRounds(StreamingRounds):
    """:class:`StreamingRounds` whose round 3 fails while ``failing`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if len(request.rounds) == 2 and self.failing:
            raise RuntimeError("the model went away")
        return await super().interpret(request)


async def test_a_retried_run_whose_redelivery_fails_ends_in_run_error(store: Durability) -> None:
    model = FailingRounds()
    kernel = streams_kernel(store, model)
    with pytest.raises(InterpretationError):
        async for _ in kernel.stream_turn("acct-1", "r1", "what do I owe"):
            pass
    assert (await kernel.turn_status("acct-1", "r1")).status == "running"  # rounds recorded

    async with asgi_client(create_app(kernel)) as client:
        failed = checked((await asyncio.wait_for(post(client, "r1"), 20)).text)
        assert failed[-1]["type"] == "RUN_ERROR"
        assert failed[-1]["code"] == "interpretation-failed"
        assert texts(failed) == "r1a r1b r2a r2b "  # the recorded rounds, once
        model.failing = False
        finished = checked((await asyncio.wait_for(post(client, "r1"), 20)).text)

    assert texts(finished) == TEXT
    assert finished[-1]["type"] == "RUN_FINISHED"
    assert await store.load_checkpoint("acct-1") is not None
