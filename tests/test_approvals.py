"""Approvals as execution permits (issue 21): the answer's new fields, on every store."""

from __future__ import annotations

import hashlib
import json

import pytest

from intention_kernel import Answer, Interaction, InvalidRequestError, Kernel
from intention_kernel._turns import request_digest
from intention_kernel.durability import Durability
from intention_kernel.testing._agents import FakeProvider, billing_agent


def test_an_answer_without_the_new_fields_digests_as_it_did_before_they_existed() -> None:
    # The literal values were computed on main before Answer had reason, actor, digest
    # and input: a committed turn delivered again after an upgrade must match them.
    assert request_digest(None, Answer(None, "accept").to_dict()) == (
        "182f23755245a9cc16c1f5c8e6c7b05d79e5466a2f153ce87c67d35a67322683"
    )
    assert request_digest("hi", Answer("i-1", "reject", {"a": 1}).to_dict()) == (
        "12378358a483abc4d5e279ed91bab1064dc6b2ce9486d3dcd09fd443d2f71d57"
    )
    assert set(Answer(None, "accept").to_dict()) == {"interaction_id", "decision", "value"}


def test_an_answer_with_a_reason_digests_differently() -> None:
    plain = request_digest(None, Answer(None, "reject").to_dict())
    assert request_digest(None, Answer(None, "reject", reason="too much").to_dict()) != plain
    assert request_digest(None, Answer(None, "reject", actor="ana").to_dict()) != plain


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (Answer(None, "reject", input={"amount": 1}), "it goes with an accept"),
        (Answer(None, "accept", input=[1]), "input must be an object"),  # type: ignore[arg-type]
        (Answer(None, "reject", reason=42), "reason must be a string"),  # type: ignore[arg-type]
        (Answer(None, "accept", actor="x" * 5000), "actor is 5000 characters"),
        (Answer(None, "accept", digest="\ud800"), "lone surrogate"),
    ],
)
async def test_an_answer_with_a_bad_new_field_is_refused_and_changes_nothing(
    store: Durability, answer: Answer, match: str
) -> None:
    provider = FakeProvider()
    kernel = Kernel(billing_agent(provider), store)
    await kernel.turn("t", "1", "charge pi_1 500")
    before = await kernel.checkpoint("t")
    with pytest.raises(InvalidRequestError, match=match):
        await kernel.turn("t", "2", answer=answer)
    assert provider.ledger == []
    after = await kernel.checkpoint("t")
    assert before is not None and after is not None
    assert after.version == before.version
    assert after.interaction == before.interaction


def test_a_checkpoint_stored_before_interactions_had_a_digest_loads_with_it() -> None:
    from intention_kernel._checkpoint import (
        KernelCheckpoint,
        decode_checkpoint,
        encode_checkpoint,
        operation_digest,
    )

    interaction = Interaction(
        "ix_1", "confirmation", "payments.charge", {"amount": 5}, "Charge 5?", step_id="s1"
    )
    document = json.loads(encode_checkpoint(KernelCheckpoint(1, "fp", 1, interaction=interaction)))
    del document["interaction"]["digest"]  # as a release without digests stored it
    loaded = decode_checkpoint(json.dumps(document))
    assert loaded.interaction is not None
    assert loaded.interaction.digest == operation_digest(
        "confirmation", "payments.charge", {"amount": 5}
    )
    assert loaded.interaction == interaction


def test_an_operation_digest_is_the_sha256_of_its_canonical_json() -> None:
    from intention_kernel._checkpoint import operation_digest

    canonical = '{"capability_id":"payments.charge","input":{"a":1,"b":"é"},"kind":"confirmation"}'
    assert operation_digest("confirmation", "payments.charge", {"b": "é", "a": 1}) == (
        hashlib.sha256(canonical.encode()).hexdigest()
    )
