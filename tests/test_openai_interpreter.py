"""OpenAIInterpreter against a local OpenAI-compatible server replaying recorded responses.

Each test queues recordings (``tests/fixtures/openai/*.json``) on a stub server on
loopback. It runs real turns of the demo billing agent through a ``Kernel`` on
``InMemoryDurability``. It asserts on what the stub received and on what the turn
did: what was offered to the model, what ran, what was committed.

These tests hold the interpreter to one request per turn (``multi_round=False``): each
turn's one recording is the whole conversation with the model. The rounds protocol
(the model asked again with its tools' results) is tested in ``tests/test_agent_loop.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Interaction,
    InterpretationError,
    Kernel,
    StepStatus,
    capability,
)
from intention_kernel._demo.billing import BalanceInput, ChargeInput, build_agent
from intention_kernel._demo.provider import FakePaymentProvider
from intention_kernel._facts import Evidence, FactRecord
from intention_kernel._interpretation import CapabilitySpec, InterpretationRequest
from intention_kernel.interpreters._chat import MAX_ARGUMENTS_DEPTH, chat_messages, toolset
from intention_kernel.interpreters.openai import OpenAIInterpreter, function_name
from intention_kernel.testing import InMemoryDurability
from openai_stub import OpenAIStub, recording, running_stub

MODEL = "gpt-4o-mini"
THREAD = "acct-acme"
PROMPT_42 = "Charge $125.00 to payment intent pi_demo_42 for invoice 42? Reply yes or no."


class Billing:
    """The demo billing agent, interpreted by the model behind the stub."""

    def __init__(self, stub: OpenAIStub, tmp_path: Path, interpreter: OpenAIInterpreter) -> None:
        self.stub = stub
        self.provider = FakePaymentProvider(tmp_path / "provider.db")
        self.interpreter = interpreter
        self.durability = InMemoryDurability()
        agent = dataclasses.replace(build_agent(self.provider), interpreter=interpreter)
        self.kernel = Kernel(agent, self.durability)

    async def turn(self, turn_id: str, message: str, *recordings: str) -> Any:
        self.stub.queue(*recordings)
        return await self.kernel.turn(THREAD, turn_id, message)

    async def charges(self) -> int:
        return len(await self.provider.charges())

    def sent(self, index: int = -1) -> dict[str, Any]:
        return self.stub.requests[index]


def tool_names(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools", [])]


def system_message(request: dict[str, Any]) -> str:
    first = request["messages"][0]
    assert first["role"] == "system"
    content: str = first["content"]
    return content


@pytest.fixture
async def billing(stub: OpenAIStub, tmp_path: Path) -> AsyncIterator[Billing]:
    interpreter = OpenAIInterpreter(
        MODEL,
        base_url=stub.base_url,
        api_key="test-key",
        max_retries=0,
        timeout=5,
        multi_round=False,
    )
    async with interpreter:
        world = Billing(stub, tmp_path, interpreter)
        await world.provider.open()
        yield world


# -- what is offered to the model ----------------------------------------------------------


async def test_the_catalog_is_offered_as_tools_named_without_dots(billing: Billing) -> None:
    result = await billing.turn("d1", "what do I owe on invoice 42?", "balance_42")

    request = billing.sent()
    assert request["model"] == MODEL
    assert request["temperature"] == 0
    assert tool_names(request) == ["billing__balance", "payments__charge"]
    balance, charge = (tool["function"] for tool in request["tools"])
    assert balance["parameters"] == BalanceInput.model_json_schema()
    assert charge["parameters"] == ChargeInput.model_json_schema()
    assert "read-only" in balance["description"]
    assert "confirm" in charge["description"]
    assert request["messages"][-1] == {"role": "user", "content": "what do I owe on invoice 42?"}
    assert billing.stub.headers[-1]["authorization"] == "Bearer test-key"

    assert [(s.capability_id, s.status) for s in result.steps] == [
        ("billing.balance", StepStatus.COMPLETED)
    ]
    assert "Invoice 42 (Acme Corp): $125.00 due." in result.reply


async def test_recent_messages_and_facts_are_sent_as_context(billing: Billing) -> None:
    await billing.turn("d1", "what do I owe on invoice 42?", "balance_42")
    await billing.turn("d2", "hello?", "plain_text")

    messages = billing.sent()["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == "what do I owe on invoice 42?"
    assert "$125.00 due" in messages[2]["content"]
    assert '"invoice.42.amount_due_cents": 12500' in system_message(billing.sent())


async def test_answer_tools_are_offered_only_while_an_interaction_is_active(
    billing: Billing,
) -> None:
    await billing.turn("d1", "pay invoice 42", "charge_42")
    assert tool_names(billing.sent()) == ["billing__balance", "payments__charge"]

    pending = await billing.turn("d2", "how much is invoice 42 again?", "balance_42")
    offered = billing.sent()
    assert tool_names(offered) == [
        "billing__balance",
        "payments__charge",
        "answer_accept",
        "answer_reject",
    ]
    assert PROMPT_42 in system_message(offered)
    assert pending.interaction is not None
    assert pending.interaction.id in system_message(offered)
    accept_tool, reject_tool = (t["function"] for t in offered["tools"][2:])
    # A kernel-held confirmation takes no value; its accept may carry an edited input,
    # checked against the held capability's schema, and its reject a reason.
    assert list(accept_tool["parameters"]["properties"]) == ["input"]
    edit = accept_tool["parameters"]["properties"]["input"]
    assert edit["properties"] == ChargeInput.model_json_schema()["properties"]
    assert "only when the user accepts with a change" in edit["description"]
    assert list(reject_tool["parameters"]["properties"]) == ["reason"]

    rejected = await billing.turn("d3", "no, not now", "answer_reject")
    assert [s.status for s in rejected.steps] == [StepStatus.REJECTED]
    assert rejected.interaction is None

    await billing.turn("d4", "thanks", "plain_text")
    assert "answer_accept" not in tool_names(billing.sent())
    assert "waiting for the user's answer" not in system_message(billing.sent())
    assert await billing.charges() == 0


# -- end-to-end outcomes -------------------------------------------------------------------


async def test_a_recorded_confirm_flow_charges_exactly_once(billing: Billing) -> None:
    proposed = await billing.turn("d1", "please pay invoice 42", "charge_42")
    assert [s.status for s in proposed.steps] == [StepStatus.AWAITING_CONFIRMATION]
    assert proposed.interaction is not None
    assert proposed.interaction.prompt == PROMPT_42
    assert await billing.charges() == 0

    accepted = await billing.turn("d2", "yes, go ahead", "answer_accept")
    assert [(s.capability_id, s.status) for s in accepted.steps] == [
        ("payments.charge", StepStatus.COMPLETED)
    ]
    assert accepted.interaction is None
    assert await billing.charges() == 1

    served = len(billing.stub.requests)
    again = await billing.kernel.turn(THREAD, "d2", "yes, go ahead")
    assert again.replayed
    assert again.steps == accepted.steps
    assert len(billing.stub.requests) == served, "a replay must not call the model"
    assert await billing.charges() == 1


async def test_parallel_tool_calls_become_intents_in_order(billing: Billing) -> None:
    result = await billing.turn("d1", "what do I owe on 42 and 43?", "balance_42_and_43")
    assert [s.capability_id for s in result.steps] == ["billing.balance", "billing.balance"]
    assert result.reply.index("Invoice 42") < result.reply.index("Invoice 43")


async def test_plain_text_is_the_reply(billing: Billing) -> None:
    result = await billing.turn("d1", "what can you do?", "plain_text")
    assert result.steps == ()
    assert result.reply.startswith("I can look up what you owe on an invoice")


async def test_an_answer_when_nothing_is_pending_runs_nothing(billing: Billing) -> None:
    result = await billing.turn("d1", "yes", "answer_accept")
    assert "answer_accept" not in tool_names(billing.sent())
    assert result.steps == ()
    assert "nothing waiting for an answer" in result.reply


async def test_accepting_and_declining_at_once_answers_neither(billing: Billing) -> None:
    await billing.turn("d1", "pay invoice 42", "charge_42")
    both = recording("answer_accept")
    calls = both["body"]["choices"][0]["message"]["tool_calls"]
    calls.append(recording("answer_reject")["body"]["choices"][0]["message"]["tool_calls"][0])
    billing.stub.queue_data([both])

    result = await billing.kernel.turn(THREAD, "d2", "yes no")
    assert result.steps == ()
    assert result.interaction is not None, "the charge must still be pending"
    assert "could not tell whether you accept" in result.reply
    assert await billing.charges() == 0


# -- what the model gets wrong: failed steps, and the turn commits -------------------------


async def test_an_unknown_function_is_a_failed_step_naming_the_capability(
    billing: Billing,
) -> None:
    result = await billing.turn("d1", "refund everything", "unknown_function")
    (step,) = result.steps
    assert step.capability_id == "billing.refund_everything"
    assert step.status == StepStatus.FAILED
    assert step.error is not None
    assert "unknown capability 'billing.refund_everything'" in step.error
    assert "billing.balance, payments.charge" in step.error
    assert result.checkpoint_version == 1


async def test_arguments_that_are_not_json_are_a_failed_step(billing: Billing) -> None:
    result = await billing.turn("d1", "pay invoice 42", "arguments_not_json")
    (step,) = result.steps
    assert step.capability_id == "payments.charge"
    assert step.status == StepStatus.FAILED
    assert step.error is not None
    assert step.error.startswith(
        "invalid input for payments.charge: the model's arguments are not valid JSON:"
    )
    assert result.interaction is None, "nothing may be proposed from unreadable arguments"
    assert result.checkpoint_version == 1
    assert await billing.charges() == 0


async def test_arguments_that_fail_the_schema_are_a_failed_step(billing: Billing) -> None:
    result = await billing.turn("d1", "pay invoice 42", "arguments_invalid")
    (step,) = result.steps
    assert step.status == StepStatus.FAILED
    assert step.error is not None
    assert re.search(
        r"invalid input for payments\.charge: amount_cents: .*greater than 0", step.error
    )
    assert result.interaction is None
    assert await billing.charges() == 0


async def test_a_tool_call_without_a_function_is_a_failed_step(billing: Billing) -> None:
    result = await billing.turn("d1", "what do I owe on 43?", "tool_call_without_function")
    nameless, balance = result.steps
    assert nameless.status == StepStatus.FAILED
    assert nameless.capability_id == ""
    assert nameless.error == (
        "the model's tool call call_11Xq3VfJ8bR2nT5kLw9pYcZ has no function (nothing to run) "
        "(this agent has: billing.balance, payments.charge)"
    )
    # The person reads what happened; the tool call's ID and the reason stay in the step.
    assert result.reply.splitlines()[0] == (
        "Sorry, I could not work out what to do for that, so nothing was done."
    )
    assert "call_11Xq3VfJ8bR2nT5kLw9pYcZ" not in result.reply
    assert (balance.capability_id, balance.status) == ("billing.balance", StepStatus.COMPLETED)
    assert result.checkpoint_version == 1


def with_arguments(arguments: Any) -> dict[str, Any]:
    """The ``balance_42`` recording, its one tool call's arguments replaced."""
    data = recording("balance_42")
    data["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = arguments
    return data


def nested(depth: int) -> Any:
    value: Any = "42"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "arguments",
    [
        "[[" * 5000,  # the decoder's recursion gives out: formerly a RecursionError, a 502
        '{"invoice_id": ' + "[" * 100 + '"42"' + "]" * 100 + "}",
        {"invoice_id": nested(MAX_ARGUMENTS_DEPTH)},  # as an object, one level too deep
    ],
    ids=["string-5000", "string-101", "object-65"],
)
async def test_arguments_nested_too_deep_are_a_failed_step(
    billing: Billing, arguments: Any
) -> None:
    billing.stub.queue_data([with_arguments(arguments)])
    result = await billing.kernel.turn(THREAD, "d1", "what do I owe on invoice 42?")
    (step,) = result.steps
    assert (step.capability_id, step.status) == ("billing.balance", StepStatus.FAILED)
    assert step.error == (
        "invalid input for billing.balance: "
        f"the model's arguments are nested more than {MAX_ARGUMENTS_DEPTH} deep"
    )
    assert result.checkpoint_version == 1


async def test_arguments_sent_as_an_object_are_accepted(billing: Billing) -> None:
    sent = recording("arguments_object")["body"]["choices"][0]["message"]["tool_calls"][0]
    assert sent["function"]["arguments"] == {"invoice_id": "42"}, "some servers send an object"
    result = await billing.turn("d1", "what do I owe on invoice 42?", "arguments_object")
    assert [(s.capability_id, s.status) for s in result.steps] == [
        ("billing.balance", StepStatus.COMPLETED)
    ]
    assert "Invoice 42 (Acme Corp): $125.00 due." in result.reply


async def test_an_answer_whose_arguments_cannot_be_read_answers_nothing(
    billing: Billing,
) -> None:
    await billing.turn("d1", "pay invoice 42", "charge_42")
    garbled = recording("answer_accept")
    garbled["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "{oops"
    billing.stub.queue_data([garbled])
    result = await billing.kernel.turn(THREAD, "d2", "yes")
    assert result.steps == ()
    assert result.interaction is not None, "the charge must still be pending"
    assert "could not tell whether you accept" in result.reply
    assert await billing.charges() == 0


# -- an accept with an edit, a reject with a reason -------------------------------------------


def answering(tool: str, arguments: Any) -> dict[str, Any]:
    """The recorded ``tool`` answer, its arguments replaced by ``arguments``."""
    answer = recording(tool)
    call = answer["body"]["choices"][0]["message"]["tool_calls"][0]
    call["function"]["arguments"] = json.dumps(arguments)
    return answer


async def test_an_accept_with_an_edited_input_runs_the_edited_input_once(
    billing: Billing,
) -> None:
    proposed = await billing.turn("d1", "please pay invoice 42", "charge_42")
    assert proposed.interaction is not None
    held = proposed.interaction.input
    edited = {**held, "amount_cents": 10000}
    billing.stub.queue_data([answering("answer_accept", {"input": edited})])
    accepted = await billing.kernel.turn(THREAD, "d2", "yes, but only $100")
    [step] = accepted.steps
    assert step.status == StepStatus.COMPLETED
    assert (step.proposed_input, step.approved_input) == (held, edited)
    [charge] = await billing.provider.charges()
    assert charge["amount_cents"] == 10000
    [resolved] = [
        e.payload
        for e in await billing.durability.read_outbox(thread_id=THREAD)
        if e.type == "interaction.resolved"
    ]
    assert (resolved["proposed_input"], resolved["approved_input"]) == (held, edited)


async def test_an_accept_whose_edit_fails_the_schema_runs_nothing_and_stays_open(
    billing: Billing,
) -> None:
    proposed = await billing.turn("d1", "please pay invoice 42", "charge_42")
    assert proposed.interaction is not None
    bad = {**proposed.interaction.input, "amount_cents": -1}
    billing.stub.queue_data([answering("answer_accept", {"input": bad})])
    refused = await billing.kernel.turn(THREAD, "d2", "yes, but minus one cent")
    [step] = refused.steps
    assert step.status == StepStatus.AWAITING_CONFIRMATION
    assert step.error is not None and "amount_cents" in step.error
    assert refused.interaction == proposed.interaction
    assert await billing.charges() == 0


@pytest.mark.parametrize("edit", [[1, 2], "amount 100", 5])
async def test_an_accept_whose_edit_is_not_an_object_answers_nothing(
    billing: Billing, edit: Any
) -> None:
    await billing.turn("d1", "pay invoice 42", "charge_42")
    billing.stub.queue_data([answering("answer_accept", {"input": edit})])
    result = await billing.kernel.turn(THREAD, "d2", "yes")
    assert result.steps == ()
    assert result.interaction is not None, "the charge must still be pending"
    assert "could not tell whether you accept" in result.reply
    assert await billing.charges() == 0


async def test_an_accept_that_repeats_the_held_input_is_no_edit(billing: Billing) -> None:
    proposed = await billing.turn("d1", "pay invoice 42", "charge_42")
    assert proposed.interaction is not None
    billing.stub.queue_data(
        [answering("answer_accept", {"input": dict(proposed.interaction.input)})]
    )
    accepted = await billing.kernel.turn(THREAD, "d2", "yes")
    [step] = accepted.steps
    assert step.status == StepStatus.COMPLETED
    assert (step.proposed_input, step.approved_input) == (None, None)


async def test_a_reject_with_a_reason_records_it(billing: Billing) -> None:
    await billing.turn("d1", "pay invoice 42", "charge_42")
    billing.stub.queue_data([answering("answer_reject", {"reason": "wrong invoice"})])
    rejected = await billing.kernel.turn(THREAD, "d2", "no, that is the wrong invoice")
    assert [(s.status, s.error) for s in rejected.steps] == [
        (StepStatus.REJECTED, "rejected by the person: wrong invoice")
    ]
    assert await billing.charges() == 0


def test_a_quorums_accept_offers_no_edit() -> None:
    """A quorum refuses edits (every approver approves the same operation): its
    ``answer_accept`` takes no ``input``."""
    spec = CapabilitySpec(
        "payments.charge", "write", "required", "Charge", ChargeInput.model_json_schema()
    )
    quorum = Interaction("ix_1", "confirmation", "payments.charge", {}, "Charge?", approvals=2)
    accept = toolset([spec], quorum).tools[1]["function"]
    assert accept["name"] == "answer_accept" and accept["parameters"]["properties"] == {}
    single = dataclasses.replace(quorum, approvals=1)
    accept = toolset([spec], single).tools[1]["function"]
    assert list(accept["parameters"]["properties"]) == ["input"]


# -- answers with a value, for a capability that confirms on its own -----------------------


class TripInput(BaseModel):
    offer_id: str


def trips_agent(interpreter: OpenAIInterpreter, booked: list[Any]) -> Agent:
    """``trips.book`` asks on its own and books only the quote the answer names."""

    @capability(
        "trips.book", effect="write", confirmation="capability", description="Book an offer"
    )
    async def book(input: TripInput, ctx: CapabilityContext) -> CapabilityResult:
        quote = {"quote_id": f"q_{input.offer_id}_18900", "price_cents": 18_900}
        if ctx.answer is None:
            return CapabilityResult.needs_confirmation(
                f"Book {input.offer_id} at €189.00?", details=quote
            )
        named = ctx.answer.value.get("quote_id") if isinstance(ctx.answer.value, dict) else None
        if ctx.answer.decision != "accept" or named != quote["quote_id"]:
            return CapabilityResult(value={"booked": False, "answer": ctx.answer.value})

        def send(authority: EffectAuthority) -> dict[str, Any]:
            booked.append(named)
            return {"booked": True, "quote_id": named}

        effect = await ctx.run_effect(f"book:{input.offer_id}", send)
        return CapabilityResult(value=effect.value, reply=f"Booked {input.offer_id}.")

    return Agent(name="trips", version="1", capabilities=[book], interpreter=interpreter)


async def test_an_answer_tool_carries_a_value_to_a_capability_that_asks_itself(
    stub: OpenAIStub,
) -> None:
    booked: list[Any] = []
    async with OpenAIInterpreter(
        MODEL, base_url=stub.base_url, api_key="k", max_retries=0, timeout=5, multi_round=False
    ) as interpreter:
        kernel = Kernel(trips_agent(interpreter, booked), InMemoryDurability())
        stub.queue("book_tp538")
        proposed = await kernel.turn("trip-1", "d1", "book TP538")
        assert proposed.interaction is not None
        assert proposed.interaction.kind == "capability"

        stub.queue("answer_accept_with_value")
        accepted = await kernel.turn("trip-1", "d2", "yes, at that fare")
        offered = stub.requests[-1]
        tools = {tool["function"]["name"]: tool["function"] for tool in offered["tools"]}
        for name, properties in (
            ("answer_accept", {"value"}),
            ("answer_reject", {"value", "reason"}),
        ):
            assert set(tools[name]["parameters"]["properties"]) == properties
            assert "quote ID" in tools[name]["description"]
        assert '"quote_id": "q_TP538_18900"' in system_message(offered), "details are context"

        wrong = recording("answer_accept_with_value")
        call = wrong["body"]["choices"][0]["message"]["tool_calls"][0]
        call["function"]["arguments"] = '{"value": {"quote_id": "q_TP538_9900"}}'
        stub.queue("book_tp538")
        await kernel.turn("trip-2", "d1", "book TP538")
        stub.queue_data([wrong])
        refused = await kernel.turn("trip-2", "d2", "yes, the cheaper one")

    assert [(s.capability_id, s.status) for s in accepted.steps] == [
        ("trips.book", StepStatus.COMPLETED)
    ]
    assert accepted.steps[0].value == {"booked": True, "quote_id": "q_TP538_18900"}
    assert refused.steps[0].value == {"booked": False, "answer": {"quote_id": "q_TP538_9900"}}
    assert booked == ["q_TP538_18900"]


# -- what the server gets wrong: nothing commits, the delivery can be retried --------------


async def test_a_server_error_commits_nothing_and_the_delivery_can_be_retried(
    billing: Billing,
) -> None:
    with pytest.raises(InterpretationError, match="InternalServerError"):
        await billing.turn("d1", "what do I owe on invoice 42?", "server_error_500")
    assert await billing.durability.load_checkpoint(THREAD) is None
    assert await billing.durability.read_outbox() == []

    retried = await billing.turn("d1", "what do I owe on invoice 42?", "balance_42")
    assert not retried.replayed
    assert retried.steps[0].status == StepStatus.COMPLETED
    assert retried.checkpoint_version == 1


async def test_a_timeout_commits_nothing(stub: OpenAIStub, tmp_path: Path) -> None:
    async with OpenAIInterpreter(
        MODEL, base_url=stub.base_url, api_key="k", timeout=0.5, max_retries=0, multi_round=False
    ) as interpreter:
        world = Billing(stub, tmp_path, interpreter)
        with pytest.raises(InterpretationError, match="APITimeoutError"):
            await world.turn("d1", "what do I owe on invoice 42?", "timeout")
        assert await world.durability.load_checkpoint(THREAD) is None


async def test_the_sdk_retries_a_transient_server_error(stub: OpenAIStub, tmp_path: Path) -> None:
    async with OpenAIInterpreter(
        MODEL, base_url=stub.base_url, api_key="k", max_retries=1, multi_round=False
    ) as interpreter:
        world = Billing(stub, tmp_path, interpreter)
        result = await world.turn("d1", "invoice 42?", "server_error_500", "balance_42")
    assert len(stub.requests) == 2
    assert result.steps[0].status == StepStatus.COMPLETED


async def test_an_unreachable_server_is_an_interpretation_error(tmp_path: Path) -> None:
    with running_stub() as gone:
        url = gone.base_url
    async with OpenAIInterpreter(
        MODEL, base_url=url, api_key="k", max_retries=0, multi_round=False
    ) as interpreter:
        world = Billing(gone, tmp_path, interpreter)
        with pytest.raises(InterpretationError, match="APIConnectionError"):
            await world.kernel.turn(THREAD, "d1", "hello")


@pytest.mark.parametrize(
    "body", [{"object": "list", "data": []}, {"choices": []}, "hello", [1, 2]], ids=repr
)
async def test_a_body_that_is_not_a_completion_is_an_interpretation_error(
    billing: Billing, body: Any
) -> None:
    billing.stub.queue_data([{"status": 200, "body": body}])
    with pytest.raises(InterpretationError, match="not a chat completion"):
        await billing.kernel.turn(THREAD, "d1", "hello")
    assert await billing.durability.load_checkpoint(THREAD) is None


# -- construction --------------------------------------------------------------------------


async def test_a_given_client_is_used_and_left_open(stub: OpenAIStub, tmp_path: Path) -> None:
    client = openai.AsyncOpenAI(base_url=stub.base_url, api_key="from-client", max_retries=0)
    with pytest.raises(ValueError, match="not both"):
        OpenAIInterpreter(MODEL, client=client, base_url=stub.base_url)
    async with OpenAIInterpreter(MODEL, client=client, multi_round=False) as interpreter:
        world = Billing(stub, tmp_path, interpreter)
        await world.turn("d1", "hello", "plain_text")
    assert stub.headers[-1]["authorization"] == "Bearer from-client"
    assert not client.is_closed()
    await client.close()


def test_function_names_map_back_to_capability_ids() -> None:
    def spec(capability_id: str) -> CapabilitySpec:
        return CapabilitySpec(capability_id, "read", "none", "", {"type": "object"})

    long_id = "ops." + "x" * 80
    ids = ["payments.charge", "a.b__c", "a.b.c", long_id]
    tools = toolset([spec(i) for i in ids], None)
    names = [tool["function"]["name"] for tool in tools.tools]

    assert names[0] == function_name("payments.charge") == "payments__charge"
    assert len(set(names)) == len(ids), "colliding names must be told apart"
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name) for name in names)
    assert [tools.capability_id(name) for name in names] == ids
    assert tools.capability_id("billing__ghost") == "billing.ghost"


def test_importing_without_the_sdk_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['openai'] = None\n"
        "try:\n"
        "    import intention_kernel.interpreters.openai\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'intention-kernel[openai]'" in out


def test_the_facts_sent_as_context_are_bounded_newest_first() -> None:
    evidence = Evidence(capability_id="billing.balance", turn_id="t", step_id="t#1")
    facts = {
        f"invoice.{n}.note": FactRecord(f"invoice.{n}.note", "x" * 100, 1, evidence)
        for n in range(1000)
    }
    request = InterpretationRequest("t", "d1", "hi", (), facts, None, ())
    system = chat_messages(request, "Be brief.")[0]["content"]
    assert system.startswith("Be brief.")
    assert len(system) < 10_000
    assert '"invoice.999.note"' in system
    assert '"invoice.0.note"' not in system
    assert "older facts not shown" in system
