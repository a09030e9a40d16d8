"""The agent loop: an interpreter that works in rounds is asked again within one turn.

The rounds protocol runs against a local chat-completions server (``openai_stub``).
The server answers with completions built here. The tests go through
``OpenAIInterpreter`` and real turns on every store. They check what each round's
request carries. That is round one's tool call, and a ``tool`` message with its step's
outcome. They check that a proposed write is held and the model's text is the reply.
They check that ``max_rounds`` stops a model that always wants one more tool. And
they check that answers come from the person only. A one-round interpreter is asked once.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from intention_kernel import Intent, Interpretation, InterpretationRequest, Kernel, StepStatus
from intention_kernel.durability import Durability
from intention_kernel.interpreters.openai import OpenAIInterpreter
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from openai_stub import OpenAIStub, completion

THREAD = "acct-1"


def kernel_for(
    store: Durability, interpreter: Any, provider: FakeProvider, **options: Any
) -> Kernel:
    agent = dataclasses.replace(billing_agent(provider), interpreter=interpreter, **options)
    return Kernel(agent, store)


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


async def test_round_two_carries_round_ones_read_result_as_a_tool_message(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    provider = FakeProvider()
    kernel = kernel_for(store, model, provider)
    stub.queue_data(
        [
            completion(None, ("call_b1", "billing__balance", {"due": 4200})),
            completion("You owe $42.00 on that invoice."),
        ]
    )
    result = await kernel.turn(THREAD, "d1", "what do I owe?")

    assert len(stub.requests) == 2
    second = stub.requests[1]["messages"]
    assistant = [m for m in second if m["role"] == "assistant" and m.get("tool_calls")]
    assert [c["id"] for c in assistant[0]["tool_calls"]] == ["call_b1"]
    [tool] = tool_messages(stub.requests[1])
    assert tool["tool_call_id"] == "call_b1"
    assert json.loads(tool["content"]) == {"status": "completed", "value": {"due": 4200}}
    # The tool message follows the assistant message that called it.
    assert second.index(tool) == second.index(assistant[0]) + 1
    assert result.reply == "You owe $42.00 on that invoice."
    assert [(s.capability_id, s.status) for s in result.steps] == [
        ("billing.balance", StepStatus.COMPLETED)
    ]
    assert result.checkpoint_version == 1
    checkpoint = await store.load_checkpoint(THREAD)
    assert checkpoint is not None and checkpoint.facts["balance"].value == 4200


async def test_a_proposed_charge_is_held_and_the_models_final_text_is_the_reply(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    provider = FakeProvider()
    kernel = kernel_for(store, model, provider)
    stub.queue_data(
        [
            completion(None, ("call_b1", "billing__balance", {"due": 150})),
            completion(
                None,
                ("call_c1", "payments__charge", {"payment_intent_id": "pi_1", "amount": 150}),
            ),
            completion("You owe 150; I will charge it once you confirm."),
        ]
    )
    proposed = await kernel.turn(THREAD, "d1", "what do I owe, and pay it if it is under 200")

    assert len(stub.requests) == 3
    held = json.loads(tool_messages(stub.requests[2])[-1]["content"])
    assert held["status"] == "awaiting_confirmation"
    assert "confirm" in held["note"]
    # Later rounds offer no answer tools: only the person answers the pending charge.
    assert "answer_accept" not in [t["function"]["name"] for t in stub.requests[2]["tools"]]
    assert proposed.interaction is not None
    assert proposed.reply.startswith("You owe 150; I will charge it once you confirm.")
    assert proposed.interaction.prompt in proposed.reply
    assert [s.status for s in proposed.steps] == [
        StepStatus.COMPLETED,
        StepStatus.AWAITING_CONFIRMATION,
    ]
    assert provider.calls() == 0

    accepted = await kernel.turn(THREAD, "d2", answer="accept")
    assert [s.status for s in accepted.steps] == [StepStatus.COMPLETED]
    assert provider.calls("payments.charge:charge:pi_1") == 1
    assert len(stub.requests) == 3  # an answer alone asks the model nothing


async def test_max_rounds_stops_a_model_that_always_wants_one_more_tool(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    provider = FakeProvider()
    kernel = kernel_for(store, model, provider, max_rounds=3)
    stub.queue_data(
        [completion(None, (f"call_{n}", "billing__balance", {"due": n})) for n in (1, 2, 3)]
    )
    result = await kernel.turn(THREAD, "d1", "keep checking")

    assert len(stub.requests) == 3
    assert [s.value for s in result.steps] == [{"due": 1}, {"due": 2}, {"due": 3}]
    assert "stopped after 3 rounds" in result.reply
    assert result.checkpoint_version == 1
    replayed = await kernel.turn(THREAD, "d1", "keep checking")
    assert replayed.replayed and replayed.reply == result.reply
    assert len(stub.requests) == 3  # a replay asks the model nothing


async def test_an_unknown_tool_reaches_the_model_as_a_failed_tool_result(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    kernel = kernel_for(store, model, FakeProvider())
    stub.queue_data(
        [
            completion(None, ("call_x", "billing__ghost", {}), ("call_b", "billing__balance", {})),
            completion("Sorry, I cannot do that, but you owe 4200."),
        ]
    )
    result = await kernel.turn(THREAD, "d1", "ghost it")

    ghost, balance = tool_messages(stub.requests[1])
    assert (ghost["tool_call_id"], balance["tool_call_id"]) == ("call_x", "call_b")
    failed = json.loads(ghost["content"])
    assert failed["status"] == "failed"
    assert "billing.ghost" in failed["error"]
    assert json.loads(balance["content"])["status"] == "completed"
    assert result.reply == "Sorry, I cannot do that, but you owe 4200."


async def test_the_models_answer_in_round_one_runs_the_pending_charge_and_it_hears_the_outcome(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    provider = FakeProvider()
    kernel = kernel_for(store, model, provider)
    stub.queue_data(
        [
            completion(
                None,
                ("call_c1", "payments__charge", {"payment_intent_id": "pi_1", "amount": 500}),
            ),
            completion("Please confirm the charge."),
            completion(None, ("call_a", "answer_accept", {})),
            completion("Charged 500 to pi_1."),
        ]
    )
    await kernel.turn(THREAD, "d1", "charge pi_1 500")
    paid = await kernel.turn(THREAD, "d2", "yes, go ahead")

    assert len(stub.requests) == 4
    assert "answer_accept" in [t["function"]["name"] for t in stub.requests[2]["tools"]]
    [told] = tool_messages(stub.requests[3])
    assert told["tool_call_id"] == "call_a"
    assert json.loads(told["content"])["status"] == "completed"
    assert paid.reply == "Charged 500 to pi_1."
    assert paid.interaction is None
    assert provider.calls("payments.charge:charge:pi_1") == 1


async def test_an_answer_from_a_later_round_is_refused_and_runs_nothing(
    store: Durability,
) -> None:
    """A model that proposes a charge and then 'accepts' it itself, in the same turn,
    never gets it run: consent comes from the person's message, in round one."""
    provider = FakeProvider()

    def script(request: InterpretationRequest) -> Interpretation:
        if not request.rounds:
            return Interpretation(
                intents=[Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 9})]
            )
        return Interpretation(answer="accept", reply="Done!")

    interpreter = ScriptedInterpreter(script, multi_round=True)
    kernel = kernel_for(store, interpreter, provider)
    result = await kernel.turn(THREAD, "d1", "charge pi_1 9")

    assert len(interpreter.calls) == 2
    assert provider.calls() == 0
    assert result.interaction is not None
    assert [s.status for s in result.steps] == [StepStatus.AWAITING_CONFIRMATION]
    checkpoint = await store.load_checkpoint(THREAD)
    assert checkpoint is not None and checkpoint.interaction is not None


async def test_each_round_sees_what_the_earlier_rounds_asked_and_produced(
    store: Durability,
) -> None:
    def script(request: InterpretationRequest) -> Interpretation:
        if len(request.rounds) == 0:
            return Interpretation(intents=[Intent("billing.balance", {"due": 7})])
        if len(request.rounds) == 1:
            [step] = request.rounds[0].steps
            due = step.value["due"]
            return Interpretation(intents=[Intent("billing.balance", {"due": due * 2})])
        return Interpretation(reply=f"rounds saw {[r.steps[0].value for r in request.rounds]}")

    interpreter = ScriptedInterpreter(script, multi_round=True)
    result = await kernel_for(store, interpreter, FakeProvider()).turn(THREAD, "d1", "go")

    assert len(interpreter.calls) == 3
    assert [r.interpretation.intents[0].input for r in interpreter.calls[2].rounds] == [
        {"due": 7},
        {"due": 14},
    ]
    assert result.reply == "rounds saw [{'due': 7}, {'due': 14}]"


async def test_each_step_says_the_round_it_ran_in(store: Durability) -> None:
    def script(request: InterpretationRequest) -> Interpretation:
        if len(request.rounds) < 2:
            due = 7 * (len(request.rounds) + 1)
            return Interpretation(intents=[Intent("billing.balance", {"due": due})] * 2)
        return Interpretation(reply="done")

    interpreter = ScriptedInterpreter(script, multi_round=True)
    result = await kernel_for(store, interpreter, FakeProvider()).turn(THREAD, "d1", "go")

    assert [(s.round, s.value) for s in result.steps] == [
        (1, {"due": 7}),
        (1, {"due": 7}),
        (2, {"due": 14}),
        (2, {"due": 14}),
    ]
    assert [s["round"] for s in result.to_dict()["steps"]] == [1, 1, 2, 2]
    # The stored result keeps them: the replay answers the same rounds.
    replayed = await kernel_for(store, interpreter, FakeProvider()).turn(THREAD, "d1", "go")
    assert replayed.replayed and replayed.steps == result.steps


def test_a_result_stored_before_rounds_reads_its_steps_as_round_one() -> None:
    from intention_kernel import TurnResult

    step = {"step_id": "d1#1", "capability_id": "billing.balance", "status": "completed"}
    stored = {"thread_id": THREAD, "turn_id": "d1", "replayed": False, "reply": "", "steps": [step]}
    assert [s.round for s in TurnResult.from_dict(stored).steps] == [1]


async def test_an_interpreter_that_does_not_opt_in_is_asked_once(store: Durability) -> None:
    interpreter = ScriptedInterpreter(
        lambda request: Interpretation(intents=[Intent("billing.balance", {})])
    )
    kernel = kernel_for(store, interpreter, FakeProvider(), max_rounds=8)
    result = await kernel.turn(THREAD, "d1", "balance")

    assert len(interpreter.calls) == 1
    assert result.reply == "You owe 4200."  # the capability's own reply, as before


async def test_max_rounds_must_be_a_positive_integer() -> None:
    from intention_kernel import CompilationError

    for bad in (0, -1, True, 2.5):
        with pytest.raises(CompilationError, match="max_rounds"):
            kernel_for(
                InMemoryDurability(), ScriptedInterpreter({}), FakeProvider(), max_rounds=bad
            )


async def test_a_rejections_reason_reaches_the_models_next_round(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter
) -> None:
    provider = FakeProvider()
    kernel = kernel_for(store, model, provider)
    stub.queue_data(
        [
            completion(
                None,
                ("call_c1", "payments__charge", {"payment_intent_id": "pi_1", "amount": 500}),
            ),
            completion("I will charge 500 once you confirm."),
            completion(None, ("call_r1", "answer_reject", {"reason": "the amount is wrong"})),
            completion("Understood: what amount should I charge?"),
        ]
    )
    await kernel.turn(THREAD, "d1", "charge pi_1 500")
    rejected = await kernel.turn(THREAD, "d2", "no, the amount is wrong")

    assert len(stub.requests) == 4
    tools = {t["function"]["name"]: t["function"] for t in stub.requests[2]["tools"]}
    assert tools["answer_reject"]["parameters"]["properties"]["reason"]["type"] == "string"
    [tool] = tool_messages(stub.requests[3])
    assert tool["tool_call_id"] == "call_r1"
    assert json.loads(tool["content"]) == {
        "status": "rejected",
        "error": "rejected by the person: the amount is wrong",
    }
    assert [(s.status, s.error) for s in rejected.steps] == [
        (StepStatus.REJECTED, "rejected by the person: the amount is wrong")
    ]
    assert provider.calls() == 0
    resolved = [
        e.payload
        for e in await store.read_outbox(thread_id=THREAD)
        if e.type == "interaction.resolved"
    ]
    assert [(p["resolution"], p.get("reason")) for p in resolved] == [
        ("rejected", "the amount is wrong")
    ]
