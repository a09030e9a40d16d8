"""MCP tools as capabilities, against a real MCP server process (``mcp_tickets_server.py``)
over stdio and over streamable HTTP (uvicorn): reads run in the turn, writes wait for
confirmation and run once, the idempotency key reaches the server in ``_meta``, and a
call whose answer was lost is uncertain and never sent again."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp
import pytest

from intention_kernel import (
    Agent,
    CompilationError,
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    Principal,
)
from intention_kernel.durability import Durability
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.integrations.mcp import (
    IDEMPOTENCY_KEY_META,
    default_key,
    mcp_capabilities,
)
from intention_kernel.interpreters.openai import OpenAIInterpreter
from intention_kernel.testing import faults
from openai_stub import OpenAIStub, completion

SERVER = Path(__file__).with_name("mcp_tickets_server.py")
TICKET = {"title": "Printer jam", "priority": 2}


# -- the server, as a real process ----------------------------------------------------------------


@dataclass
class Tickets:
    """A running tickets server and a client connected to it."""

    dir: Path
    client: mcp.Client
    killed: bool = False

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """The calls the server received (from every server run on ``dir``)."""
        log = self.dir / "calls.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        calls = [json.loads(line) for line in lines]
        return [c for c in calls if tool is None or c["tool"] == tool]

    def kill(self) -> None:
        self.killed = True
        os.kill(int((self.dir / "pid").read_text()), signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_for_port(port: int, proc: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"the MCP server exited with {proc.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise RuntimeError("the MCP server did not start listening")


async def _until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (what it watches is another process's file)."""
    async with asyncio.timeout(30):
        while not condition():  # noqa: ASYNC110 - no event to wait on across processes
            await asyncio.sleep(0.02)


@asynccontextmanager
async def tickets_server(transport: str, dir: Path) -> AsyncIterator[Tickets]:
    """A server process and a client for it. The client is entered and left in a task of
    its own: anyio refuses to leave a task group from another task than the one that
    entered it, and pytest-asyncio tears a fixture down in another task."""
    ready: asyncio.Future[Tickets] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def hold() -> None:
        server: Tickets | None = None
        try:
            async with _connected(transport, dir) as server:
                ready.set_result(server)
                await done.wait()
        except BaseExceptionGroup:
            # The SDK's HTTP client raises what broke its connection when it is closed;
            # after a test killed the server, that is expected.
            if server is None or not server.killed:
                raise

    holder = asyncio.create_task(hold())
    try:
        either: list[asyncio.Future[Any]] = [ready, holder]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            await holder  # it failed before the client was connected: raise why
        yield ready.result()
    finally:
        done.set()
        await holder


@asynccontextmanager
async def _connected(transport: str, dir: Path) -> AsyncIterator[Tickets]:
    if transport == "stdio":
        params = mcp.StdioServerParameters(
            command=sys.executable, args=[str(SERVER), "stdio", str(dir)]
        )
        async with mcp.Client(params) as client:
            yield Tickets(dir, client)
        return
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SERVER),
        "http",
        str(port),
        str(dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await _wait_for_port(port, proc)
        async with mcp.Client(f"http://127.0.0.1:{port}/mcp") as client:
            yield Tickets(dir, client)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


@pytest.fixture
async def tickets(transport: str, tmp_path: Path) -> AsyncIterator[Tickets]:
    async with tickets_server(transport, tmp_path) as server:
        yield server


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SQLiteDurability]:
    async with SQLiteDurability(tmp_path / "store.db") as store:
        yield store


# -- a model that works in rounds -----------------------------------------------------------------

SCRIPT = {
    "where is o1": Intent("tickets.lookup_order", {"order_id": "o1"}),
    "open a ticket": Intent("tickets.create_ticket", TICKET),
    "open a bad ticket": Intent("tickets.create_ticket", {"title": "Jam", "priority": "high"}),
    "close T-9": Intent("tickets.close_ticket", {"ticket_id": "T-9"}),
    "refund -5": Intent("tickets.refund", {"amount": -5}),
    "refund 13": Intent("tickets.refund", {"amount": 13}),
}


class Desk:
    """Round 1 follows ``SCRIPT`` ("yes" accepts); a later round replies with what the
    earlier round's steps returned, as a model reads its tool results."""

    multi_round = True

    def __init__(self) -> None:
        self.requests: list[InterpretationRequest] = []

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        self.requests.append(request)
        if not request.rounds:
            if request.message == "yes":
                return Interpretation(answer="accept")
            intent = SCRIPT.get(request.message)
            return Interpretation(intents=[intent] if intent else [])
        last = request.rounds[-1]
        steps = [*last.steps, *([last.answer_step] if last.answer_step else [])]
        return Interpretation(
            reply=" | ".join(
                f"{s.status}: {s.error if s.error else json.dumps(s.value)}" for s in steps
            )
        )


async def desk_kernel(tickets: Tickets, store: Durability, **options: Any) -> tuple[Kernel, Desk]:
    capabilities = await mcp_capabilities(tickets.client, namespace="tickets", **options)
    desk = Desk()
    agent = Agent(name="desk", version="1", capabilities=capabilities, interpreter=desk)
    return Kernel(agent, store), desk


# -- reads ----------------------------------------------------------------------------------------


async def test_a_trusted_read_runs_in_the_turn_and_its_result_reaches_the_next_round(
    tickets: Tickets, sqlite: SQLiteDurability
) -> None:
    kernel, _ = await desk_kernel(tickets, sqlite, trusted=True)

    result = await kernel.turn("t1", "d1", "where is o1")

    [step] = result.steps
    assert step.status == "completed"
    assert step.value["structuredContent"] == {"order_id": "o1", "status": "shipped"}
    # Desk's second round wrote the reply from the step's value: the result reached it.
    assert result.reply.startswith("completed: ")
    assert '"structuredContent": {"order_id": "o1", "status": "shipped"}' in result.reply
    [call] = tickets.calls()
    assert call["tool"] == "lookup_order"
    assert IDEMPOTENCY_KEY_META not in call["meta"], "a read takes no receipt"
    assert await sqlite.list_receipts("t1") == []


async def test_an_untrusted_servers_read_only_tool_is_a_confirmed_write(
    tickets: Tickets, sqlite: SQLiteDurability
) -> None:
    kernel, _ = await desk_kernel(tickets, sqlite)  # trusted=False by default
    [lookup] = [c for c in kernel.agent.capabilities if c.id == "tickets.lookup_order"]
    assert (lookup.effect, lookup.confirmation) == ("write", "required")

    held = await kernel.turn("t1", "d1", "where is o1")

    assert held.steps[0].status == "awaiting_confirmation"
    assert held.interaction is not None
    assert held.interaction.capability_id == "tickets.lookup_order"
    assert tickets.calls() == []
    accepted = await kernel.turn("t1", "d2", "yes")
    assert accepted.steps[0].status == "completed"
    [call] = tickets.calls()
    assert call["meta"][IDEMPOTENCY_KEY_META] == (await sqlite.list_receipts("t1"))[0].key


# -- writes ---------------------------------------------------------------------------------------


async def test_a_write_waits_for_confirmation_and_runs_once_with_its_key_in_meta(
    tickets: Tickets, sqlite: SQLiteDurability
) -> None:
    kernel, _ = await desk_kernel(tickets, sqlite, trusted=True)

    held = await kernel.turn("t1", "d1", "open a ticket")
    assert held.steps[0].status == "awaiting_confirmation"
    assert held.interaction is not None and held.interaction.input == TICKET
    assert tickets.calls() == [], "a held write does not reach the server"

    accepted = await kernel.turn("t1", "d2", "yes")
    [step] = accepted.steps
    assert step.status == "completed"
    assert step.value["structuredContent"] == {"ticket_id": "T-1"}
    [receipt] = await sqlite.list_receipts("t1")
    assert receipt.status == "completed"
    assert receipt.key == "tickets.create_ticket:" + default_key("create_ticket", TICKET)
    [call] = tickets.calls()
    assert call["arguments"] == TICKET
    assert call["meta"][IDEMPOTENCY_KEY_META] == receipt.key

    redelivered = await kernel.turn("t1", "d2", "yes")
    assert redelivered.replayed
    assert redelivered.steps == accepted.steps
    assert len(tickets.calls()) == 1


async def test_a_write_tool_takes_the_approver_policy(
    tickets: Tickets, sqlite: SQLiteDurability
) -> None:
    kernel, _ = await desk_kernel(
        tickets, sqlite, trusted=True, approvers="operator", self_approval=False
    )
    customer = Principal("customer", "acme")
    await kernel.turn("t1", "d1", "open a ticket", principal=customer)
    refused = await kernel.turn("t1", "d2", "yes", principal=customer)
    assert refused.interaction is not None and "role 'operator'" in refused.reply
    assert tickets.calls() == []
    accepted = await kernel.turn("t1", "d3", "yes", principal=Principal("ops", "acme", "operator"))
    assert accepted.steps[0].status == "completed"
    assert len(tickets.calls("create_ticket")) == 1
    with pytest.raises(CompilationError, match="unknown roles"):
        await mcp_capabilities(tickets.client, namespace="tickets", approvers="admin")


async def test_a_retried_turn_that_died_before_commit_does_not_call_the_tool_again(
    store: Durability, tmp_path: Path
) -> None:
    async with tickets_server("stdio", tmp_path) as tickets:
        kernel, _ = await desk_kernel(tickets, store, trusted=True)
        await kernel.turn("t1", "d1", "open a ticket")
        with faults.injected(faults.BEFORE_COMMIT, "raise"), pytest.raises(faults.InjectedFault):
            await kernel.turn("t1", "d2", "yes")
        assert len(tickets.calls("create_ticket")) == 1

        retried = await kernel.turn("t1", "d2", "yes")

        assert not retried.replayed
        assert retried.steps[0].status == "completed"
        assert retried.steps[0].value["structuredContent"] == {"ticket_id": "T-1"}
        assert len(tickets.calls("create_ticket")) == 1


async def test_a_server_killed_mid_call_leaves_the_write_uncertain_and_never_resent(
    transport: str, tmp_path: Path, sqlite: SQLiteDurability
) -> None:
    (tmp_path / "hang").touch()
    async with tickets_server(transport, tmp_path) as tickets:
        kernel, _ = await desk_kernel(tickets, sqlite, trusted=True, call_timeout=30)
        await kernel.turn("t1", "d1", "open a ticket")
        accepting = asyncio.create_task(kernel.turn("t1", "d2", "yes"))
        await _until(lambda: bool(tickets.calls("create_ticket")))  # the call reached the tool
        tickets.kill()  # ... whose answer is now lost
        lost = await asyncio.wait_for(accepting, 30)

    assert lost.steps[0].status == "uncertain"
    [receipt] = await sqlite.list_receipts("t1")
    assert receipt.status == "uncertain"
    # On-call sees which tool the uncertain write called, and with what arguments.
    assert (receipt.capability_id, receipt.input) == ("tickets.create_ticket", TICKET)

    # A new server process, a new kernel on the same store: the same call asked and
    # accepted again is refused by its receipt, not sent.
    (tmp_path / "hang").unlink()
    async with tickets_server(transport, tmp_path) as tickets:
        kernel, _ = await desk_kernel(tickets, sqlite, trusted=True)
        await kernel.turn("t1", "d3", "open a ticket")
        again = await kernel.turn("t1", "d4", "yes")

        assert again.steps[0].status == "uncertain"
        assert len(tickets.calls("create_ticket")) == 1
    assert [r.status for r in await sqlite.list_receipts("t1")] == ["uncertain"]


async def test_a_call_that_times_out_is_uncertain_and_the_server_may_still_apply_it(
    tmp_path: Path, sqlite: SQLiteDurability
) -> None:
    (tmp_path / "hang").touch()
    async with tickets_server("stdio", tmp_path) as tickets:
        kernel, _ = await desk_kernel(tickets, sqlite, trusted=True, call_timeout=0.5)
        await kernel.turn("t1", "d1", "open a ticket")

        timed_out = await kernel.turn("t1", "d2", "yes")

        assert timed_out.steps[0].status == "uncertain"
        assert [r.status for r in await sqlite.list_receipts("t1")] == ["uncertain"]
        (tmp_path / "hang").unlink()  # the server goes on and opens the ticket after all
        await kernel.turn("t1", "d3", "open a ticket")
        again = await kernel.turn("t1", "d4", "yes")
        assert again.steps[0].status == "uncertain"
        assert len(tickets.calls("create_ticket")) == 1


@pytest.mark.parametrize(
    ("message", "status"),
    [("refund -5", "failed"), ("refund 13", "uncertain")],
    ids=["invalid-params-refuses", "internal-error-may-have-run"],
)
async def test_a_json_rpc_error_is_failed_only_for_codes_that_refuse_the_request(
    tmp_path: Path, sqlite: SQLiteDurability, message: str, status: str
) -> None:
    async with tickets_server("stdio", tmp_path) as tickets:
        kernel, _ = await desk_kernel(tickets, sqlite, trusted=True)
        await kernel.turn("t1", "d1", message)

        result = await kernel.turn("t1", "d2", "yes")

        assert result.steps[0].status == status
        assert [r.status for r in await sqlite.list_receipts("t1")] == [status]
        assert len(tickets.calls("refund")) == 1


async def test_an_error_result_is_a_failed_step_the_model_sees_and_may_be_asked_again(
    tickets: Tickets, sqlite: SQLiteDurability
) -> None:
    kernel, _ = await desk_kernel(tickets, sqlite, trusted=True)
    await kernel.turn("t1", "d1", "close T-9")

    refused = await kernel.turn("t1", "d2", "yes")

    [step] = refused.steps
    assert step.status == "failed"
    assert step.error is not None and "no ticket T-9" in step.error
    assert "no ticket T-9" in refused.reply, "the next round saw the tool's error"
    [receipt] = await sqlite.list_receipts("t1")
    assert receipt.status == "failed", "an error result says the tool did not run"
    # The server said it did not apply the call: asking again sends it again.
    await kernel.turn("t1", "d3", "close T-9")
    await kernel.turn("t1", "d4", "yes")
    assert len(tickets.calls("close_ticket")) == 2


async def test_arguments_that_do_not_match_the_input_schema_fail_before_the_call(
    tickets: Tickets, sqlite: SQLiteDurability
) -> None:
    kernel, desk = await desk_kernel(tickets, sqlite, trusted=True)

    result = await kernel.turn("t1", "d1", "open a bad ticket")

    [step] = result.steps
    assert step.status == "failed"
    assert step.error is not None and "priority" in step.error and "integer" in step.error
    assert result.interaction is None, "nothing is held for the person to accept"
    assert tickets.calls() == []
    listed = {t.name: t.input_schema for t in (await tickets.client.list_tools()).tools}
    catalog = {spec.id: spec.input_schema for spec in desk.requests[0].catalog}
    assert catalog["tickets.create_ticket"] == listed["create_ticket"]


async def test_an_application_key_function_names_the_receipt(
    tickets: Tickets, sqlite: SQLiteDurability
) -> None:
    kernel, _ = await desk_kernel(
        tickets, sqlite, trusted=True, key=lambda tool, args: f"ticket:{args['title']}"
    )
    await kernel.turn("t1", "d1", "open a ticket")
    await kernel.turn("t1", "d2", "yes")

    [receipt] = await sqlite.list_receipts("t1")
    assert receipt.key == "tickets.create_ticket:ticket:Printer jam"
    assert tickets.calls()[0]["meta"][IDEMPOTENCY_KEY_META] == receipt.key


async def test_a_model_is_offered_the_tools_schema_and_reads_the_result_in_round_two(
    tmp_path: Path, sqlite: SQLiteDurability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    async with tickets_server("stdio", tmp_path) as tickets:
        tools = await mcp_capabilities(tickets.client, namespace="tickets", trusted=True)
        agent = Agent(name="desk", version="1", capabilities=tools, interpreter=model)
        kernel = Kernel(agent, sqlite)
        stub.queue_data(
            [
                completion(None, ("call_1", "tickets__lookup_order", {"order_id": "o1"})),
                completion("Order o1 has shipped."),
            ]
        )

        result = await kernel.turn("t1", "d1", "where is o1?")

        assert result.reply == "Order o1 has shipped."
        listed = {t.name: t.input_schema for t in (await tickets.client.list_tools()).tools}
    functions = [tool["function"] for tool in stub.requests[0]["tools"]]
    offered = {function["name"]: function["parameters"] for function in functions}
    assert offered["tickets__lookup_order"] == listed["lookup_order"]
    [tool] = [m for m in stub.requests[1]["messages"] if m["role"] == "tool"]
    outcome = json.loads(tool["content"])
    assert outcome["status"] == "completed"
    assert outcome["value"]["structuredContent"] == {"order_id": "o1", "status": "shipped"}


# -- a real agent process killed mid-turn ---------------------------------------------------------

WORKER = Path(__file__).with_name("mcp_desk_worker.py")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'desk.db'}"
        return
    import psycopg
    from psycopg import sql

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"ik_mcp_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def deliver(
    store_url: str, dir: Path, turn_id: str, message: str, fault: str | None = None
) -> subprocess.CompletedProcess[str]:
    """One delivery in a new agent process (``mcp_desk_worker.py``), with its own server."""
    config = {"db": store_url, "dir": str(dir), "turn_id": turn_id, "message": message}
    return subprocess.run(
        [sys.executable, str(WORKER), json.dumps({**config, "fault": fault})],
        capture_output=True,
        text=True,
        timeout=120,
    )


def outcome(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "calls", "status"),
    [
        (faults.AFTER_RECEIPT_PREPARED, 0, "uncertain"),
        (faults.AFTER_RECEIPT_COMPLETED, 1, "completed"),
        (faults.BEFORE_COMMIT, 1, "completed"),
    ],
)
def test_an_agent_process_killed_mid_turn_never_calls_the_tool_twice_on_redelivery(
    store_url: str, tmp_path: Path, point: str, calls: int, status: str
) -> None:
    """The accepting turn's process dies at ``point``; the delivery, sent again to a new
    process (and a new server process), calls the tool at most once in all."""
    outcome(deliver(store_url, tmp_path, "turn-1", "open a ticket"))

    died = deliver(store_url, tmp_path, "turn-2", "yes", fault=point)
    assert died.returncode == faults.EXIT_STATUS, died.stderr

    redelivered = outcome(deliver(store_url, tmp_path, "turn-2", "yes"))
    assert not redelivered["replayed"]
    assert [s["status"] for s in redelivered["steps"]] == [status]
    log = tmp_path / "calls.jsonl"
    assert len(log.read_text().splitlines() if log.exists() else []) == calls
    again = outcome(deliver(store_url, tmp_path, "turn-2", "yes"))
    assert again["replayed"] and again["steps"] == redelivered["steps"]


@pytest.mark.slow
def test_an_agent_process_killed_during_the_call_leaves_it_uncertain(
    store_url: str, tmp_path: Path
) -> None:
    """Killed while the server runs the tool (which then completes it): the redelivery
    finds the receipt prepared by a dead attempt, fails closed, and sends nothing."""
    outcome(deliver(store_url, tmp_path, "turn-1", "open a ticket"))
    (tmp_path / "hang").touch()
    config = {"db": store_url, "dir": str(tmp_path), "turn_id": "turn-2", "message": "yes"}
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        log = tmp_path / "calls.jsonl"
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert log.exists(), "the call never reached the server"
    finally:
        worker.kill()
        worker.wait()
    (tmp_path / "hang").unlink()  # the server completes the call its client no longer hears

    redelivered = outcome(deliver(store_url, tmp_path, "turn-2", "yes"))

    assert [s["status"] for s in redelivered["steps"]] == ["uncertain"]
    assert len(log.read_text().splitlines()) == 1


# -- the policy -----------------------------------------------------------------------------------


async def test_the_policy_decides_per_tool_by_name_or_by_a_callable(
    tickets: Tickets, sqlite: SQLiteDurability
) -> None:
    by_name = {
        c.id: (c.effect, c.confirmation)
        for c in await mcp_capabilities(
            tickets.client, namespace="tickets", trusted=True, policy={"lookup_order": "write"}
        )
    }
    assert by_name["tickets.lookup_order"] == ("write", "required")

    def reads(tool: mcp.types.Tool) -> str | None:
        return "read" if tool.name == "lookup_order" else None

    kernel, _ = await desk_kernel(tickets, sqlite, policy=reads)  # untrusted
    effects = {c.id: (c.effect, c.confirmation) for c in kernel.agent.capabilities}
    assert effects == {
        "tickets.lookup_order": ("read", "none"),
        "tickets.create_ticket": ("write", "required"),
        "tickets.close_ticket": ("write", "required"),
        "tickets.refund": ("write", "required"),
    }
    result = await kernel.turn("t1", "d1", "where is o1")
    assert result.steps[0].status == "completed"
    assert len(tickets.calls("lookup_order")) == 1


async def test_a_policy_naming_an_unknown_tool_or_a_bad_namespace_is_refused(
    tickets: Tickets,
) -> None:
    with pytest.raises(CompilationError, match="lookup_orders"):
        await mcp_capabilities(
            tickets.client, namespace="tickets", policy={"lookup_orders": "read"}
        )
    with pytest.raises(CompilationError, match="namespace"):
        await mcp_capabilities(tickets.client, namespace="Tickets")


def test_importing_without_the_sdk_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "try:\n"
        "    import intention_kernel.integrations.mcp\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'intention-kernel[mcp]'" in out


def test_the_guides_mcp_example_runs_as_shown_and_replays(tmp_path: Path) -> None:
    """The two blocks of the guide docs/guides/mcp.md, saved as it says and run twice."""
    guide = Path(__file__).parents[1] / "docs" / "guides" / "mcp.md"
    server, desk = re.findall(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.S)
    (tmp_path / "tickets_server.py").write_text(server)
    (tmp_path / "desk.py").write_text(desk)

    def run() -> list[str]:
        done = subprocess.run(
            [sys.executable, "desk.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    order, held, opened = run()
    assert order == "Done: Look up an order's status (order_id: 7, status: shipped)."
    assert held == "Open a support ticket (title: Printer jam, priority: 2)? Reply yes or no."
    assert opened == "Done: Open a support ticket (ticket_id: T-1, title: Printer jam)."
    assert run() == [order, held, opened], "a second run replays every turn"


@pytest.fixture
def example_store(store_url: str) -> Iterator[list[str]]:
    """``--db`` and ``--thread`` for the example: a unique thread (its ledger file, named
    after it, is removed afterwards) on each store."""
    thread = f"example-{uuid.uuid4().hex[:12]}"
    try:
        yield ["--db", store_url, "--thread", thread]
    finally:
        Path(tempfile.gettempdir(), f"intention-kernel-{thread}.tickets.jsonl").unlink(
            missing_ok=True
        )


@pytest.mark.slow
def test_the_desk_example_opens_the_ticket_once_across_a_killed_worker(
    example_store: list[str],
) -> None:
    """``python -m examples.mcp_desk``: the worker that delivered the "yes" died after the
    tool's call; the delivery made again is answered by the receipt (one server call)."""

    def run() -> str:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        done = subprocess.run(
            [sys.executable, "-m", "examples.mcp_desk", *example_store],
            cwd=Path(__file__).parents[1],
            env=clean,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        return done.stdout

    first = run()
    assert "[turn-3] the worker delivering 'yes' died (exit 137)" in first
    assert "[turn-3] step tickets.create_ticket: completed" in first
    assert first.splitlines()[-1] == (
        "summary: committed=5 replayed=1 failed_steps=0 provider_calls=1"
    )
    again = run()
    assert again.splitlines()[-1] == (
        "summary: committed=0 replayed=6 failed_steps=0 provider_calls=0"
    )
