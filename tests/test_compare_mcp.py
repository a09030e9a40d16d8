"""MCP alone against MCP inside intention-kernel: the numbers of the MCP rows of the
table in docs/guides/frameworks-compared.md.

Both columns call the same server (``tests/mcp_tickets_server.py``, a real process over
stdio, which logs every call it receives before it acts). Alone, a plain ``mcp`` client
calls ``create_ticket``. It does not know whether a call whose response it lost ran.
So it calls it again. This is ``tests/mcp_alone_worker.py``, in its own process or in
this one. Inside, ``mcp_capabilities`` makes the tools capabilities of a kernel agent.
This is ``tests/mcp_desk_worker.py``, in its own process or in this one. Processes are real
and killed with SIGKILL. Each test asserts the numbers its table cells show.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp
import pytest
from mcp.shared.exceptions import MCPError

from intention_kernel import Agent, Answer, Intent, Interpretation, Kernel
from intention_kernel._checkpoint import operation_digest
from intention_kernel.durability import Durability
from intention_kernel.integrations.mcp import mcp_capabilities
from intention_kernel.testing import ScriptedInterpreter, faults

HERE = Path(__file__).parent
SERVER = HERE / "mcp_tickets_server.py"
ALONE = HERE / "mcp_alone_worker.py"
INSIDE = HERE / "mcp_desk_worker.py"
TICKET = {"title": "Printer jam", "priority": 2}
URGENT = {"title": "Printer jam", "priority": 9}
TIMEOUT = 120


def calls(dir: Path, tool: str = "create_ticket") -> list[dict[str, Any]]:
    """The calls of ``tool`` the server received, from every server run on ``dir``."""
    log = dir / "calls.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [c for c in map(json.loads, lines) if c["tool"] == tool]


def server(dir: Path) -> mcp.StdioServerParameters:
    return mcp.StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio", str(dir)])


def stop_server(dir: Path) -> None:
    """Kill the server a killed client left behind (it would finish the call first)."""
    # It may have exited already: it saw its client's pipe close.
    with contextlib.suppress(ProcessLookupError):
        os.kill(int((dir / "pid").read_text()), signal.SIGKILL)


def kill_during_the_call(argv: list[str], dir: Path) -> None:
    """Start ``argv`` while the server hangs in ``create_ticket``; SIGKILL it once the
    server has the call; let the server finish the call nobody hears any more."""
    (dir / "hang").touch()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not calls(dir) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert calls(dir), "the call never reached the server"
    finally:
        process.kill()  # SIGKILL
        process.wait()
    assert process.returncode == -signal.SIGKILL
    (dir / "hang").unlink()
    time.sleep(0.2)  # the orphaned server completes the call
    stop_server(dir)


def alone(dir: Path, **config: Any) -> list[str]:
    return [sys.executable, str(ALONE), json.dumps({"dir": str(dir), **config})]


def inside(store_url: str, dir: Path, turn_id: str, message: str, **config: Any) -> list[str]:
    config = {"db": store_url, "dir": str(dir), "turn_id": turn_id, "message": message, **config}
    return [sys.executable, str(INSIDE), json.dumps(config)]


def run(argv: list[str], status: int = 0) -> list[Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == status, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'desk.db'}"
        return
    import psycopg
    from psycopg import sql

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"ik_cmp_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    made = tmp_path / "alone", tmp_path / "inside"
    for dir in made:
        dir.mkdir()
    return made


# -- (a) one write whose response was lost, then the delivery made again ----------------------


@pytest.mark.slow
def test_a_client_killed_during_the_call_then_redelivered_twice_alone_once_inside(
    store_url: str, tmp_path: Path
) -> None:
    plain, kernel = dirs(tmp_path)
    kill_during_the_call(alone(plain), plain)
    assert run(alone(plain)) == [{"ticket_id": "T-1"}]  # a new server process counts anew
    assert len(calls(plain)) == 2

    run(inside(store_url, kernel, "turn-1", "open a ticket"))
    kill_during_the_call(inside(store_url, kernel, "turn-2", "yes"), kernel)
    [redelivered] = run(inside(store_url, kernel, "turn-2", "yes"))
    # The receipt was prepared by an attempt that died: uncertain, never sent again.
    assert [s["status"] for s in redelivered["steps"]] == ["uncertain"]
    assert len(calls(kernel)) == 1


@pytest.mark.slow
def test_a_client_killed_after_the_call_then_redelivered_twice_alone_once_inside(
    store_url: str, tmp_path: Path
) -> None:
    """Killed (SIGKILL) right after ``call_tool`` returned, before anything recorded
    the result; then an approval given after the restart (inside) is delivered again."""
    plain, kernel = dirs(tmp_path)
    run(alone(plain, die_after_call=True), -signal.SIGKILL)
    run(alone(plain))
    assert len(calls(plain)) == 2

    [asked] = run(inside(store_url, kernel, "turn-1", "open a ticket"))
    assert asked["steps"][0]["status"] == "awaiting_confirmation"
    killed = {"fault": faults.AFTER_RECEIPT_COMPLETED, "action": "sigkill"}
    run(inside(store_url, kernel, "turn-2", "yes", **killed), -signal.SIGKILL)
    [redelivered] = run(inside(store_url, kernel, "turn-2", "yes"))
    assert [s["status"] for s in redelivered["steps"]] == ["completed"]
    assert redelivered["steps"][0]["value"]["structuredContent"] == {"ticket_id": "T-1"}
    assert len(calls(kernel)) == 1


async def test_a_lost_response_retried_reaches_the_server_twice_alone_once_inside(
    store: Durability, tmp_path: Path
) -> None:
    """The server is slow; the client's read timeout loses the response; the call is
    made again once the server is quick again."""
    plain, inside_dir = dirs(tmp_path)
    (plain / "hang").touch()
    async with mcp.Client(server(plain)) as client:
        with pytest.raises(MCPError):
            await client.call_tool("create_ticket", TICKET, read_timeout_seconds=0.5)
        (plain / "hang").unlink()
        await client.call_tool("create_ticket", TICKET)
        # Both tickets exist: the lost call ran too. It ends within 50 ms of the unlink,
        # possibly after the second call, so its ticket is waited for (5 s at most).
        for ticket_id in ("T-1", "T-2"):
            for _ in range(100):
                closed = await client.call_tool("close_ticket", {"ticket_id": ticket_id})
                if not closed.is_error:
                    break
                await asyncio.sleep(0.05)
            assert not closed.is_error, closed
    assert len(calls(plain)) == 2

    (inside_dir / "hang").touch()
    async with mcp.Client(server(inside_dir)) as client:
        kernel = await ticket_kernel(client, store, call_timeout=0.5)
        await kernel.turn("t1", "turn-1", "open a ticket")
        lost = await kernel.turn("t1", "turn-2", "yes")
        assert [s.status for s in lost.steps] == ["uncertain"]
        (inside_dir / "hang").unlink()
        await kernel.turn("t1", "turn-3", "open a ticket")
        again = await kernel.turn("t1", "turn-4", "yes")
        assert [s.status for s in again.steps] == ["uncertain"]  # not sent again
    assert len(calls(inside_dir)) == 1


# -- (b), (c) approvals ------------------------------------------------------------------------

SCRIPT = {
    "open a ticket": Interpretation(intents=[Intent("tickets.create_ticket", TICKET)]),
    "open an urgent ticket": Interpretation(intents=[Intent("tickets.create_ticket", URGENT)]),
    "yes": Interpretation(answer="accept"),
}


async def ticket_kernel(client: mcp.Client, store: Durability, **options: Any) -> Kernel:
    tools = await mcp_capabilities(client, namespace="tickets", trusted=True, **options)
    script = ScriptedInterpreter(SCRIPT)
    return Kernel(Agent(name="desk", version="1", capabilities=tools, interpreter=script), store)


async def test_a_plain_client_holds_nothing_for_approval(tmp_path: Path) -> None:
    """The ``mcp`` SDK has no approval: a tool the server marks destructive runs on the
    first ``call_tool``; any confirmation is the host application's own code."""
    async with mcp.Client(server(tmp_path)) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        annotations = listed["close_ticket"].annotations
        assert annotations is not None and annotations.destructive_hint is True
        await client.call_tool("create_ticket", TICKET)
        closed = await client.call_tool("close_ticket", {"ticket_id": "T-1"})
        assert not closed.is_error
    assert len(calls(tmp_path, "close_ticket")) == 1


async def test_an_approval_inside_is_bound_to_the_arguments_that_run(
    store: Durability, tmp_path: Path
) -> None:
    """An answer bound to other arguments runs nothing; the answer to one call does not
    run a second call with other arguments; what runs is what was shown."""
    async with mcp.Client(server(tmp_path)) as client:
        kernel = await ticket_kernel(client, store)
        held = await kernel.turn("t1", "turn-1", "open a ticket")
        assert held.interaction is not None and held.interaction.input == TICKET
        other = operation_digest("confirmation", "tickets.create_ticket", URGENT)
        assert other != held.interaction.digest
        refused = await kernel.turn("t1", "turn-2", answer=Answer(digest=other))
        assert refused.steps == ()
        assert calls(tmp_path) == []
        accepted = await kernel.turn("t1", "turn-3", answer=Answer(digest=held.interaction.digest))
        assert [s.status for s in accepted.steps] == ["completed"]

        second = await kernel.turn("t1", "turn-4", "open an urgent ticket")
        assert second.interaction is not None and second.interaction.input == URGENT
        replayed_answer = await kernel.turn(
            "t1", "turn-5", answer=Answer(digest=held.interaction.digest)
        )
        assert replayed_answer.steps == ()
        assert [c["arguments"] for c in calls(tmp_path)] == [TICKET]
        await kernel.turn("t1", "turn-6", answer=Answer(digest=second.interaction.digest))
    assert [c["arguments"] for c in calls(tmp_path)] == [TICKET, URGENT]
