"""Editing before approving (issue 21): ``Answer(decision="accept", input={...})``
replaces the held input of a ``confirmation="required"`` operation, on every store."""

from __future__ import annotations

import dataclasses
from typing import Any

from intention_kernel import Answer, Kernel, TurnResult
from intention_kernel._replies import Replies
from intention_kernel.durability import Durability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import read_all_events

PROPOSED = {"payment_intent_id": "pi_1", "amount": 500}
EDITED = {"payment_intent_id": "pi_1", "amount": 300}


async def resolved_events(store: Durability, thread_id: str) -> list[dict[str, Any]]:
    return [
        e.payload
        for e in await read_all_events(store, thread_id=thread_id)
        if e.type == "interaction.resolved"
    ]


async def test_an_edited_accept_runs_the_edited_input_once(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    proposed = await kernel.turn("t", "1", "charge pi_1 500")
    assert proposed.interaction is not None and proposed.interaction.input == PROPOSED
    answer = Answer(
        proposed.interaction.id, "accept", input=EDITED, digest=proposed.interaction.digest
    )
    accepted = await kernel.turn("t", "2", answer=answer)
    assert provider.calls() == 1
    [step] = accepted.steps
    assert step.status == "completed" and step.value["amount"] == 300
    assert (step.proposed_input, step.approved_input) == (PROPOSED, EDITED)
    assert accepted.reply == "Charged 300 to pi_1."
    assert TurnResult.from_dict(accepted.to_dict()) == accepted
    [resolved] = await resolved_events(store, "t")
    assert resolved["resolution"] == "accepted"
    assert (resolved["proposed_input"], resolved["approved_input"]) == (PROPOSED, EDITED)
    # The same delivery again is a replay: nothing runs twice.
    assert await kernel.turn("t", "2", answer=answer) == dataclasses.replace(
        accepted, replayed=True
    )
    assert provider.calls() == 1
    checkpoint = await kernel.checkpoint("t")
    assert checkpoint is not None and checkpoint.interaction is None and checkpoint.agenda == ()


async def test_an_edit_is_validated_and_stored_in_its_canonical_form(store: Durability) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", "charge pi_1 500")
    accepted = await kernel.turn(
        "t", "2", answer=Answer(None, "accept", input={"payment_intent_id": "pi_1", "amount": "7"})
    )
    [step] = accepted.steps
    assert step.approved_input == {"payment_intent_id": "pi_1", "amount": 7}
    assert step.value["amount"] == 7


async def test_an_invalid_edit_runs_nothing_and_leaves_the_question_open(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    proposed = await kernel.turn("t", "1", "charge pi_1 500")
    before = await kernel.checkpoint("t")
    assert proposed.interaction is not None and before is not None
    refused = await kernel.turn(
        "t", "2", answer=Answer(None, "accept", input={"payment_intent_id": "pi_1", "amount": -5})
    )
    assert provider.calls() == 0
    assert refused.reply == Replies().edit_refused(proposed.interaction, refused.steps[0])
    [step] = refused.steps
    assert step.status == "awaiting_confirmation" and step.step_id == proposed.steps[0].step_id
    assert step.error is not None and "amount" in step.error and "greater than 0" in step.error
    assert refused.interaction == proposed.interaction
    after = await kernel.checkpoint("t")
    assert after is not None
    assert (after.interaction, after.agenda) == (before.interaction, before.agenda)
    assert await resolved_events(store, "t") == []
    # The question is still the one proposed: a plain accept runs what was shown, once.
    accepted = await kernel.turn("t", "3", "yes")
    assert provider.calls() == 1 and accepted.steps[0].value["amount"] == 500
    assert accepted.steps[0].proposed_input is None


async def test_an_edit_is_bound_to_the_digest_of_the_proposed_operation(
    store: Durability,
) -> None:
    from intention_kernel._checkpoint import operation_digest

    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    proposed = await kernel.turn("t", "1", "charge pi_1 500")
    assert proposed.interaction is not None
    of_the_edit = operation_digest("confirmation", "payments.charge", EDITED)
    refused = await kernel.turn(
        "t", "2", answer=Answer(None, "accept", input=EDITED, digest=of_the_edit)
    )
    assert provider.calls() == 0 and refused.reply == Replies().request_changed(
        proposed.interaction
    )
    assert refused.interaction == proposed.interaction


async def test_an_operation_that_confirms_on_its_own_is_not_edited_by_the_kernel(
    store: Durability,
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    asked = await kernel.turn("t", "1", "refund pi_1 100")
    assert asked.interaction is not None and asked.interaction.kind == "capability"
    refused = await kernel.turn(
        "t", "2", answer=Answer(None, "accept", input={"payment_intent_id": "pi_1", "amount": 1})
    )
    assert provider.calls() == 0
    [step] = refused.steps
    assert step.status == "awaiting_confirmation"
    assert step.error is not None and "confirms on its own" in step.error
    assert refused.interaction == asked.interaction


async def test_the_host_passes_an_edited_input_to_the_kernel(store: Durability) -> None:
    from host_support import asgi_client
    from intention_kernel.host import Principal, create_app

    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider), store), tokens={"tok": Principal("ana")})
    auth = {"authorization": "Bearer tok"}
    async with asgi_client(app) as client:
        await client.post(
            "/v1/threads/t/turns",
            json={"turn_id": "d1", "message": "charge pi_1 500"},
            headers=auth,
        )
        answered = await client.post(
            "/v1/threads/t/turns",
            json={"turn_id": "d2", "answer": {"decision": "accept", "input": EDITED}},
            headers=auth,
        )
    assert answered.status_code == 200, answered.text
    [step] = answered.json()["steps"]
    assert (step["proposed_input"], step["approved_input"]) == (PROPOSED, EDITED)
    assert provider.calls() == 1
    [resolved] = await resolved_events(store, "t")
    assert resolved["actor"] == "ana" and resolved["approved_input"] == EDITED


async def test_the_host_refuses_an_input_on_a_reject_as_its_schema_says(store: Durability) -> None:
    from host_support import asgi_client
    from intention_kernel.host import Principal, create_app

    provider = FakeProvider()
    app = create_app(Kernel(billing_agent(provider), store), tokens={"tok": Principal("ana")})
    auth = {"authorization": "Bearer tok"}
    async with asgi_client(app) as client:
        await client.post(
            "/v1/threads/t/turns",
            json={"turn_id": "d1", "message": "charge pi_1 500"},
            headers=auth,
        )
        refused = await client.post(
            "/v1/threads/t/turns",
            json={"turn_id": "d2", "answer": {"decision": "reject", "input": EDITED}},
            headers=auth,
        )
        schema = (await client.get("/openapi.json")).json()["components"]["schemas"]
    assert refused.status_code == 422, refused.text
    assert ["answer", "AnswerBody", "input"] in [e["loc"] for e in refused.json()["errors"]]
    assert schema["AnswerBody"]["then"] == {"properties": {"input": {"type": "null"}}}
    checkpoint = await store.load_checkpoint("t")
    assert checkpoint is not None and checkpoint.version == 1 and checkpoint.interaction is not None
    assert provider.calls() == 0
