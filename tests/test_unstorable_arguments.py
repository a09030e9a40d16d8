"""A model's tool arguments that no store can hold (issue 31, N4), on every store.

NaN, infinity and a lone surrogate decode from a model's JSON arguments, but no store
holds them. In a one-round turn such a tool call is a failed step. A turn in rounds
records each round in its journal before its steps run. It must record what it can:
the call, marked with why its arguments were not kept. That makes the call a failed
step there too, and the model hears so. It also makes a redelivery take the same
decisions.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from intention_kernel import (
    Intent,
    Interpretation,
    InterpretationError,
    InterpretationRequest,
    Kernel,
    StepStatus,
)
from intention_kernel.durability import Durability
from intention_kernel.interpreters.openai import OpenAIInterpreter
from intention_kernel.testing import ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from openai_stub import OpenAIStub, completion

THREAD = "acct-1"

UNSTORABLE: dict[str, Any] = {
    "nan": {"due": math.nan},
    "infinity": {"due": math.inf},
    "minus-infinity": {"due": [1, -math.inf]},
    "lone-surrogate": {"note": "\ud800"},
    "lone-surrogate-key": {"\udfff": 1},
}


def kernel_for(store: Durability, interpreter: Any, provider: FakeProvider) -> Kernel:
    agent = dataclasses.replace(billing_agent(provider), interpreter=interpreter)
    return Kernel(agent, store)


class Rounds:
    """Round 1 asks for the balance with ``arguments`` and a charge that can be stored;
    round 2 reads the outcomes and answers. Round 2 fails while ``fail`` is set."""

    multi_round = True

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.arguments = arguments
        self.asked: list[int] = []
        self.seen: list[Any] = []
        self.fail = False

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        self.asked.append(len(request.rounds) + 1)
        if not request.rounds:
            return Interpretation(
                intents=[
                    Intent("billing.balance", self.arguments),
                    Intent("payments.charge", {"payment_intent_id": "pi_1", "amount": 5}),
                ]
            )
        if self.fail:
            raise ConnectionError("the model went away")
        self.seen = [(s.capability_id, s.status, s.error) for s in request.rounds[0].steps]
        return Interpretation(reply="The balance could not be read.")


@pytest.mark.parametrize("case", UNSTORABLE)
async def test_unstorable_arguments_in_a_round_are_a_failed_step_and_the_turn_commits(
    store: Durability, case: str
) -> None:
    provider = FakeProvider()
    rounds = Rounds(UNSTORABLE[case])
    result = await kernel_for(store, rounds, provider).turn(THREAD, "d1", "what do I owe?")

    assert result.reply.startswith("The balance could not be read.")
    balance, charge = result.steps
    assert (balance.capability_id, balance.status) == ("billing.balance", StepStatus.FAILED)
    assert balance.error is not None and "no store can hold" in balance.error
    assert charge.status == StepStatus.AWAITING_CONFIRMATION
    assert rounds.seen[0] == ("billing.balance", StepStatus.FAILED, balance.error)
    assert result.interaction is not None and result.interaction.input["payment_intent_id"] == (
        "pi_1"
    )
    assert (await kernel_for(store, rounds, provider).turn(THREAD, "d1", "what do I owe?")).replayed
    assert rounds.asked == [1, 2] and provider.calls() == 0


@pytest.mark.parametrize("case", ["nan", "lone-surrogate"])
async def test_a_redelivery_goes_on_from_the_recorded_round_with_the_same_failed_step(
    store: Durability, case: str
) -> None:
    provider = FakeProvider()
    rounds = Rounds(UNSTORABLE[case])
    rounds.fail = True
    kernel = kernel_for(store, rounds, provider)
    with pytest.raises(InterpretationError, match="went away"):
        await kernel.turn(THREAD, "d1", "what do I owe?")
    assert await store.load_checkpoint(THREAD) is None

    rounds.fail = False
    redelivered = await kernel.turn(THREAD, "d1", "what do I owe?")
    assert rounds.asked == [1, 2, 2]  # round 1 came from the journal
    [(_, status, error), _] = rounds.seen
    assert status == StepStatus.FAILED and error is not None and "no store can hold" in error
    assert [s.status for s in redelivered.steps] == [
        StepStatus.FAILED,
        StepStatus.AWAITING_CONFIRMATION,
    ]
    assert redelivered.steps[0].error == error


async def test_a_one_round_turn_fails_the_same_step(store: Durability) -> None:
    interpreter = ScriptedInterpreter(
        {"go": Interpretation([Intent("billing.balance", UNSTORABLE["nan"])])}
    )
    result = await kernel_for(store, interpreter, FakeProvider()).turn(THREAD, "d1", "go")
    [step] = result.steps
    assert step.status == StepStatus.FAILED and step.error is not None


# -- through a model's chat completions ------------------------------------------------------------


def raw_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A recording whose one tool call carries ``arguments`` exactly as given: a JSON
    text the model wrote, or an object (some servers send one)."""
    recorded = completion(None, (call_id, name, {}))
    recorded["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = arguments
    return recorded


MODEL_ARGUMENTS: dict[str, Any] = {
    "nan-text": '{"due": NaN}',
    "infinity-text": '{"due": Infinity}',
    "lone-surrogate-text": '{"due": 5, "note": "\\ud800"}',
    "lone-surrogate-object": {"due": 5, "note": "\ud800"},
}


@pytest.mark.parametrize("case", MODEL_ARGUMENTS)
async def test_a_models_unstorable_arguments_are_a_failed_tool_result_in_rounds(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter, case: str
) -> None:
    kernel = kernel_for(store, model, FakeProvider())
    stub.queue_data(
        [
            raw_call("call_b1", "billing__balance", MODEL_ARGUMENTS[case]),
            completion("I could not read your balance."),
        ]
    )
    result = await kernel.turn(THREAD, "d1", "what do I owe?")

    assert result.reply == "I could not read your balance."
    [step] = result.steps
    assert step.status == StepStatus.FAILED and "no store can hold" in (step.error or "")
    [tool] = [m for m in stub.requests[1]["messages"] if m["role"] == "tool"]
    assert tool["tool_call_id"] == "call_b1"
    assert json.loads(tool["content"])["status"] == "failed"
    assert (await kernel.turn(THREAD, "d1", "what do I owe?")).replayed
    assert len(stub.requests) == 2


@pytest.mark.parametrize(
    "arguments", ['{"input": {"amount": NaN}}', '{"reason": 1, "value": "\\ud800"}']
)
async def test_an_answer_with_unstorable_arguments_answers_nothing_in_rounds(
    store: Durability, stub: OpenAIStub, model: OpenAIInterpreter, arguments: str
) -> None:
    provider = FakeProvider()
    kernel = kernel_for(store, model, provider)
    charge = {"payment_intent_id": "pi_1", "amount": 5}
    stub.queue_data(
        [completion(None, ("call_c1", "payments__charge", charge)), completion("Confirm?")]
    )
    proposed = await kernel.turn(THREAD, "d1", "pay 5 on pi_1")
    assert proposed.interaction is not None

    stub.queue_data([raw_call("call_a1", "answer_accept", arguments)])
    answered = await kernel.turn(THREAD, "d2", "yes, but make it a lot")
    assert answered.steps == () and provider.calls() == 0
    assert "could not tell whether you accept" in answered.reply
    assert answered.interaction == proposed.interaction
