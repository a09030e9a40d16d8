"""The host speaks AG-UI at ``POST /v1/agui``: a run is a turn, its events are the
``ag-ui-protocol`` package's own, and a confirmation is AG-UI's human in the loop.

Every stream is parsed back into the package's pydantic event types and checked by
the ``ag-ui-validate`` conformance validator (its rule catalog, no warnings
allowed), on every store. Over real HTTP the validator's transport checks the framing
too. The browser and the official TypeScript client have tests of their own
(``test_agui_browser.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pydantic
import pytest
from ag_ui.core import Event, EventType, RunFinishedEvent
from ag_ui_validate.pytest_plugin import assert_valid_agui, validate_agui_endpoint

from host_support import asgi_client, serving_in_thread
from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel
from intention_kernel.durability import Durability
from intention_kernel.host import Principal, create_app
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import process_env

URL = "/v1/agui"
TOKENS = {
    "tok-ana": Principal("ana@acme.example", "acme"),
    "tok-bo": Principal("bo@acme.example", "acme"),
    "tok-eve": Principal("eve@globex.example", "globex"),
}
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(Event)


def user(text: str, id: str = "u1") -> dict[str, Any]:
    return {"id": id, "role": "user", "content": text}


def run_input(run_id: str, *messages: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"threadId": "acct-1", "runId": run_id, "messages": list(messages), **more}


def resume(interrupt_id: str, payload: Any = "accept", status: str = "resolved") -> list[Any]:
    return [{"interruptId": interrupt_id, "status": status, "payload": payload}]


def frames(text: str) -> list[tuple[str, str | None]]:
    """Each SSE frame's data and ``id`` (comments skipped)."""
    found = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line and not line.startswith(":")]
        if lines:
            assert lines[0].startswith("data: "), block
            ids = [line.removeprefix("id: ") for line in lines[1:] if line.startswith("id: ")]
            assert len(lines) == 1 + len(ids) <= 2, block
            found.append((lines[0].removeprefix("data: "), ids[0] if ids else None))
    return found


def parse(text: str) -> list[Any]:
    """Every event of an AG-UI stream, parsed back into the package's types."""
    return [EVENTS.validate_json(data) for data, _ in frames(text)]


async def run(client: httpx.AsyncClient, body: dict[str, Any]) -> list[Any]:
    """POST one run; its events, checked against the protocol's rules."""
    response = await client.post(URL, json=body, headers={"Accept": "text/event-stream"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert_valid_agui([data for data, _ in frames(response.text)], max_warnings=0)
    return parse(response.text)


def types(events: list[Any]) -> list[str]:
    return [event.type.value for event in events]


def step_of(events: list[Any]) -> dict[str, Any]:
    """The step the run's one tool call result reports."""
    [result] = [e for e in events if e.type == EventType.TOOL_CALL_RESULT]
    step: dict[str, Any] = json.loads(result.content)
    return step


def finished(events: list[Any]) -> RunFinishedEvent:
    last = events[-1]
    assert isinstance(last, RunFinishedEvent)
    return last


def result_of(events: list[Any]) -> dict[str, Any]:
    """The turn's result, which the run's RUN_FINISHED event carries."""
    result = finished(events).result
    assert isinstance(result, dict)
    return result


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
async def client(store: Durability, provider: FakeProvider) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Kernel(billing_agent(provider), store), tokens=TOKENS)
    async with asgi_client(app, token="tok-ana") as client:
        yield client


async def test_a_run_is_a_turn_whose_events_are_valid_agui(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    events = await run(client, run_input("r1", user("balance 7 and charge pi_1 7")))

    assert types(events) == [
        "RUN_STARTED",
        *("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"),  # read
        *("TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"),  # the reply
        *("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"),  # the confirmation
        "STATE_SNAPSHOT",
        "RUN_FINISHED",
    ]
    started, read, read_args, _, read_result = events[:5]
    assert (started.thread_id, started.run_id, started.protocol_version) == ("acct-1", "r1", "1.0")
    assert (read.tool_call_id, read.tool_call_name) == ("r1#1", "billing.balance")
    assert json.loads(read_args.delta) == {"due": 7}  # the input the read ran with
    result = result_of(events)
    assert json.loads(read_result.content) == result["steps"][0]  # the step as committed
    assert events[6].delta == result["reply"]
    confirm, args = events[8], events[9]
    interaction = result["interaction"]
    assert (confirm.tool_call_name, confirm.tool_call_id) == ("confirm", interaction["id"])
    shown = json.loads(args.delta)
    assert shown["input"] == {"payment_intent_id": "pi_1", "amount": 7}
    assert shown["digest"] == interaction["digest"]
    assert shown["input_schema"]["required"] == ["payment_intent_id", "amount"]
    assert events[-2].snapshot == {"version": 1, "facts": {"balance": 7}}
    outcome = finished(events).outcome
    assert outcome is not None and outcome.type == "interrupt"
    [interrupt] = outcome.interrupts
    assert (interrupt.id, interrupt.tool_call_id) == (interaction["id"], interaction["id"])
    assert interrupt.message == interaction["prompt"]
    assert provider.calls() == 0
    # The run's result is the turn's: the turn API replays it under the run ID.
    replay = await client.post(
        "/v1/threads/acct-1/turns",
        json={"turn_id": "r1", "message": "balance 7 and charge pi_1 7"},
    )
    assert replay.json() == {**result, "replayed": True}


async def test_a_resumed_interrupt_runs_the_write_once_and_names_the_tokens_principal(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    opened = await run(client, run_input("r1", user("charge pi_1 7")))
    [interrupt] = finished(opened).outcome.interrupts  # type: ignore[union-attr]

    answered = await run(
        client,
        run_input("r2", user("charge pi_1 7"), resume=resume(interrupt.id), parentRunId="r1"),
    )

    assert provider.calls() == 1
    assert answered[0].parent_run_id == "r1"  # echoed, as AG-UI's resumed runs show it
    assert types(answered) == [
        "RUN_STARTED",
        *("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"),
        *("TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"),
        "STATE_SNAPSHOT",
        "RUN_FINISHED",
    ]
    assert json.loads(answered[2].delta) == {"payment_intent_id": "pi_1", "amount": 7}
    step = json.loads(answered[4].content)
    assert (step["capability_id"], step["status"]) == ("payments.charge", "completed")
    assert step["actor"] == "ana@acme.example"
    done = finished(answered)
    assert done.outcome is not None and done.outcome.type == "success"
    assert result_of(answered)["interaction"] is None
    assert "charge.pi_1" in answered[-2].snapshot["facts"]

    # The client retries the answering run (its connection dropped): a replay.
    response = await client.post(
        URL, json=run_input("r2", user("charge pi_1 7"), resume=resume(interrupt.id))
    )
    assert response.headers["idempotency-replayed"] == "true"
    again = parse(response.text)
    assert result_of(again) == {**result_of(answered), "replayed": True}
    assert step_of(again) == step
    # The replay knows the write's input from its receipt: the same TOOL_CALL_ARGS.
    args = [e.delta for e in again if e.type == EventType.TOOL_CALL_ARGS]
    assert args == [answered[2].delta]
    assert provider.calls() == 1


async def test_concurrent_runs_answering_one_interrupt_charge_once(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    opened = await run(client, run_input("r1", user("charge pi_1 7")))
    [interrupt] = finished(opened).outcome.interrupts  # type: ignore[union-attr]
    same = run_input("r2", resume=resume(interrupt.id))
    others = [run_input(f"r{n}", resume=resume(interrupt.id)) for n in range(3, 7)]

    runs = await asyncio.gather(*(run(client, body) for body in [same] * 4 + others))

    assert provider.calls() == 1
    results = [result_of(events) for events in runs]
    # The same run ID four times: one ran, three replayed what it committed.
    assert sorted(r["replayed"] for r in results[:4]) == [False, True, True, True]
    assert {json.dumps({**r, "replayed": None}, sort_keys=True) for r in results[:4]} == {
        json.dumps({**results[0], "replayed": None}, sort_keys=True)
    }
    charged = [r for r in results if any(s["status"] == "completed" for s in r["steps"])]
    assert len({r["turn_id"] for r in charged}) == 1


async def test_a_tool_result_answers_the_confirmation_tool_call(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    opened = await run(client, run_input("r1", user("charge pi_1 7")))
    call_id = result_of(opened)["interaction"]["id"]
    assistant = {
        "id": "a1",
        "role": "assistant",
        "toolCalls": [
            {"id": call_id, "type": "function", "function": {"name": "confirm", "arguments": "{}"}}
        ],
    }
    rejected = {"decision": "reject", "reason": "wrong card"}
    tool = {"id": "t1", "role": "tool", "toolCallId": call_id, "content": json.dumps(rejected)}

    answered = await run(client, run_input("r2", user("charge pi_1 7"), assistant, tool))

    step = step_of(answered)
    assert (step["status"], step["actor"]) == ("rejected", "ana@acme.example")
    assert provider.calls() == 0
    # A bare word is an answer too; the rejected interaction is gone, so a new one is asked.
    reopened = await run(client, run_input("r3", user("charge pi_1 7", id="u2")))
    call_id = result_of(reopened)["interaction"]["id"]
    tool = {"id": "t2", "role": "tool", "toolCallId": call_id, "content": "accept"}
    await run(client, run_input("r4", tool))
    assert provider.calls() == 1


async def test_a_tool_result_for_another_call_answers_nothing_and_the_interrupt_stands(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    opened = await run(client, run_input("r1", user("charge pi_1 7")))
    [interrupt] = finished(opened).outcome.interrupts  # type: ignore[union-attr]
    other = {"id": "t1", "role": "tool", "toolCallId": "call_elsewhere", "content": "accept"}

    answered = await run(client, run_input("r2", other))

    assert provider.calls() == 0
    assert "earlier question" in result_of(answered)["reply"]
    outcome = finished(answered).outcome
    assert outcome is not None and outcome.type == "interrupt"
    assert [i.id for i in outcome.interrupts] == [interrupt.id]
    # Its tool call was shown by the run that opened it, not again.
    assert not any(e.type == EventType.TOOL_CALL_START for e in answered)


async def test_a_cancelled_interrupt_rejects_the_operation(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    opened = await run(client, run_input("r1", user("charge pi_1 7")))
    [interrupt] = finished(opened).outcome.interrupts  # type: ignore[union-attr]

    answered = await run(client, run_input("r2", resume=resume(interrupt.id, status="cancelled")))

    step = step_of(answered)
    assert step["status"] == "rejected"
    assert provider.calls() == 0


async def test_an_answer_to_an_interrupt_no_longer_pending_runs_nothing(
    client: httpx.AsyncClient, provider: FakeProvider
) -> None:
    opened = await run(client, run_input("r1", user("charge pi_1 7")))
    [interrupt] = finished(opened).outcome.interrupts  # type: ignore[union-attr]
    await run(client, run_input("r2", resume=resume(interrupt.id, "reject")))

    late = await run(client, run_input("r3", resume=resume(interrupt.id)))

    # As on the turn API: the kernel says there is nothing to answer, and runs nothing.
    assert not any(e.type == EventType.TOOL_CALL_START for e in late)
    assert result_of(late)["steps"] == []
    assert "nothing waiting" in result_of(late)["reply"]
    assert provider.calls() == 0


async def test_another_tenant_cannot_run_on_or_answer_for_a_thread(
    store: Durability, provider: FakeProvider
) -> None:
    app = create_app(Kernel(billing_agent(provider), store), tokens=TOKENS)
    async with asgi_client(app, token="tok-ana") as ana, asgi_client(app, token="tok-eve") as eve:
        opened = await run(ana, run_input("r1", user("charge pi_1 7")))
        [interrupt] = finished(opened).outcome.interrupts  # type: ignore[union-attr]

        for body in (
            run_input("e1", user("balance 1")),
            run_input("e2", resume=resume(interrupt.id)),
        ):
            refused = await eve.post(URL, json=body)
            assert refused.status_code == 404, refused.text
            assert refused.json()["type"] == "/problems/not-found"
            assert refused.json()["detail"] == "no thread 'acct-1'"
        async with asgi_client(app) as anonymous:
            unauthorized = await anonymous.post(URL, json=run_input("x", user("balance 1")))
        assert unauthorized.status_code == 401

    assert provider.calls() == 0
    checkpoint = await store.load_checkpoint("acct-1")
    assert checkpoint is not None and checkpoint.version == 1
    assert checkpoint.interaction is not None and checkpoint.interaction.id == interrupt.id


async def test_another_principal_of_the_tenant_answers_as_itself(
    store: Durability, provider: FakeProvider
) -> None:
    app = create_app(Kernel(billing_agent(provider), store), tokens=TOKENS)
    async with asgi_client(app, token="tok-ana") as ana, asgi_client(app, token="tok-bo") as bo:
        opened = await run(ana, run_input("r1", user("charge pi_1 7")))
        [interrupt] = finished(opened).outcome.interrupts  # type: ignore[union-attr]
        posing = {"decision": "accept", "actor": "ana@acme.example"}
        forbidden = await bo.post(URL, json=run_input("r2", resume=resume(interrupt.id, posing)))
        assert forbidden.status_code == 403, forbidden.text
        assert provider.calls() == 0
        answered = await run(
            bo, run_input("r3", resume=resume(interrupt.id, {"decision": "accept"}))
        )
    step = step_of(answered)
    assert step["actor"] == "bo@acme.example"
    assert provider.calls() == 1


BAD_INPUTS: dict[str, tuple[Any, int, str]] = {
    "no thread": ({"runId": "r", "messages": [user("balance 1")]}, 422, "threadId"),
    "messages not a list": ({"threadId": "t", "runId": "r", "messages": "hi"}, 422, "messages"),
    "no messages": (run_input("r"), 422, "messages"),
    "ends with the assistant": (
        run_input("r", user("hi"), {"id": "a", "role": "assistant", "content": "hello"}),
        422,
        "messages.1.role",
    ),
    "an image part": (
        run_input(
            "r",
            {
                "id": "u",
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "url", "value": "https://x.test/a.png"}}
                ],
            },
        ),
        422,
        "messages.0.content.0.type",
    ),
    "two resume entries": (run_input("r", resume=resume("a") + resume("b")), 422, "resume"),
    "a payload with no decision": (
        run_input("r", resume=resume("ix_1", {"value": 1})),
        422,
        "resume.0.payload",
    ),
    "a payload naming another interaction": (
        run_input("r", resume=resume("ix_1", {"decision": "accept", "interaction_id": "ix_2"})),
        422,
        "interaction_id",
    ),
    "an empty run ID": ({"threadId": "t", "runId": "", "messages": [user("hi")]}, 422, "turn_id"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
async def test_bad_input_is_a_typed_problem_and_changes_nothing(
    client: httpx.AsyncClient, store: Durability, case: str
) -> None:
    body, status, where = BAD_INPUTS[case]

    response = await client.post(URL, json=body)

    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "/problems/invalid-request"
    assert where in problem["detail"]
    assert await store.load_checkpoint("acct-1") is None
    assert await store.load_checkpoint("t") is None


async def test_a_body_that_is_not_json_or_not_sent_as_json_is_refused(
    client: httpx.AsyncClient,
) -> None:
    garbled = await client.post(
        URL, content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert (garbled.status_code, garbled.json()["type"]) == (400, "/problems/malformed-request")
    plain = await client.post(URL, content=b"{}", headers={"Content-Type": "text/plain"})
    assert (plain.status_code, plain.json()["type"]) == (415, "/problems/unsupported-media-type")
    wrong = await client.get(URL)
    assert (wrong.status_code, wrong.json()["type"]) == (405, "/problems/method-not-allowed")


class Streaming:
    """Streams its text in pieces, then fails on ``fail`` once the text is out, and
    waits for ``go`` (set from any thread) on ``hold``."""

    def __init__(self) -> None:
        self.go = threading.Event()

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        assert request.stream is not None
        for piece in ("You owe ", "7."):
            request.stream(piece)
        if request.message == "fail":
            raise RuntimeError("the model went away")
        if request.message == "hold":
            await asyncio.to_thread(self.go.wait, 30)
        return Interpretation(reply="You owe 7.", intents=[Intent("billing.balance", {"due": 7})])


@pytest.fixture
async def streaming(store: Durability) -> AsyncIterator[httpx.AsyncClient]:
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=Streaming())
    kernel = Kernel(agent, store)
    async with asgi_client(create_app(kernel)) as client:
        yield client


async def test_model_text_streams_as_it_comes_and_the_reply_follows(
    streaming: httpx.AsyncClient,
) -> None:
    events = await run(streaming, run_input("r1", user("what do I owe?")))

    content = [e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT]
    reply = result_of(events)["reply"]
    assert content[:2] == ["You owe ", "7."]
    # The kernel's own line for the step follows the model's text: nothing shown twice.
    assert reply == "You owe 7.\n" + content[2]
    assert types(events)[:4] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
    ]
    # A tool call's parent is the message streamed before it.
    call = next(e for e in events if e.type == EventType.TOOL_CALL_START)
    assert call.parent_message_id == events[1].message_id


class TwoRounds:
    """Round 1 says it looks and reads the balance; round 2 streams the answer."""

    multi_round = True

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        assert request.stream is not None
        if not request.rounds:
            request.stream("Let me look.")
            intents = [Intent("billing.balance", {"due": 7})]
            return Interpretation(reply="Let me look.", intents=intents)
        request.stream("You owe ")
        request.stream("7.")
        return Interpretation(reply="You owe 7.")


async def test_each_rounds_text_is_a_message_and_the_reply_is_not_shown_twice(
    store: Durability,
) -> None:
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=TwoRounds())
    async with asgi_client(create_app(Kernel(agent, store))) as client:
        events = await run(client, run_input("r1", user("what do I owe?")))

    assert types(events) == [
        "RUN_STARTED",
        *("TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"),
        *("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"),
        *("TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT"),
        "TEXT_MESSAGE_END",
        "STATE_SNAPSHOT",
        "RUN_FINISHED",
    ]
    assert result_of(events)["reply"] == "You owe 7."
    texts = [e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT]
    assert texts == ["Let me look.", "You owe ", "7."]


async def test_a_failure_after_the_run_started_is_run_error_and_commits_nothing(
    streaming: httpx.AsyncClient, store: Durability
) -> None:
    events = await run(streaming, run_input("r1", user("fail")))

    assert types(events)[-1] == "RUN_ERROR"
    error = events[-1]
    assert error.code == "interpretation-failed"
    assert error.raw_event["status"] == 502
    assert error.raw_event["turn_id"] == "r1"
    assert await store.load_checkpoint("acct-1") is None


def test_a_client_that_aborts_the_run_does_not_abort_the_turn() -> None:
    provider, interpreter = FakeProvider(), Streaming()
    agent = dataclasses.replace(billing_agent(provider), interpreter=interpreter)
    body = run_input("r1", user("hold"))
    with serving_in_thread(create_app(Kernel(agent, InMemoryDurability()))) as base:
        with httpx.stream("POST", f"{base}{URL}", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if "TEXT_MESSAGE_CONTENT" in line:
                    break  # the client goes away mid-run (HttpAgent.abortRun)
        interpreter.go.set()
        retried = httpx.post(f"{base}{URL}", json=body, timeout=30)
    done = result_of(parse(retried.text))
    # The turn ran on to its commit without its reader: the retry is its replay.
    assert done["replayed"] is True
    assert done["facts"][0]["key"] == "balance"


async def test_the_validators_transport_finds_the_endpoint_conformant_over_http(
    store: Durability,
) -> None:
    app = create_app(Kernel(billing_agent(FakeProvider()), store))
    with serving_in_thread(app) as base:
        report = await validate_agui_endpoint(
            f"{base}{URL}", input=run_input("r1", user("balance 7 and charge pi_1 7"))
        )
    assert report.summary.errors == 0, report.diagnostics
    assert report.summary.warnings == 0, report.diagnostics


def test_without_the_agui_extra_the_endpoint_names_it(tmp_path: Any) -> None:
    site = tmp_path / "no-ag-ui"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['ag_ui'] = None\n")
    probe = """
import asyncio, httpx
from intention_kernel import Kernel
from intention_kernel.host import create_app
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent
try:
    import intention_kernel.host._agui
except ImportError as exc:
    print(exc)
async def main():
    app = create_app(Kernel(billing_agent(FakeProvider()), InMemoryDurability()))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        response = await client.post("/v1/agui", json={})
        print(response.status_code, response.json()["detail"])
asyncio.run(main())
"""
    env = process_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    imported, answered = done.stdout.splitlines()
    assert "pip install 'intention-kernel[agui]'" in imported
    assert answered.startswith("404 ")
    assert "pip install 'intention-kernel[agui]'" in answered
