"""The bridges' approval tools take the capability's approver policy (issue 31): a
customer cannot approve the refund they asked for, through any framework."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge_support import read_ledger, words
from intention_kernel import Kernel, Principal
from intention_kernel.durability import Durability

CUSTOMER = Principal("customer", "acme")
OPERATOR = Principal("oncall", "acme", "operator")


def desk_of(framework: str, ledger: Path, **policy: Any) -> Any:
    if framework == "langgraph":
        import langgraph_support

        return langgraph_support.Desk(ledger, read_answer=words, **policy)
    if framework == "pydantic_ai":
        import pydantic_ai_support

        return pydantic_ai_support.Desk(ledger, read_answer=words, **policy)
    import openai_agents_support

    return openai_agents_support.Desk(ledger, read_answer=words, **policy)


@pytest.mark.parametrize("framework", ["pydantic_ai", "openai_agents", "langgraph"])
async def test_a_bridges_approval_refuses_the_customers_own_yes(
    store: Durability, tmp_path: Path, framework: str
) -> None:
    desk = desk_of(framework, tmp_path / "ledger", approvers="operator", self_approval=False)
    kernel = Kernel(desk.bridge.as_agent(version="1"), store)
    asked = await kernel.turn("t1", "turn-1", "refund 42", principal=CUSTOMER)
    assert asked.interaction is not None
    assert asked.interaction.proposed_by == CUSTOMER.name
    refused = await kernel.turn("t1", "turn-2", "yes", principal=CUSTOMER)
    assert refused.interaction == asked.interaction
    assert "role 'operator'" in refused.reply
    assert read_ledger(desk.ledger) == []
    accepted = await kernel.turn("t1", "turn-3", "yes", principal=OPERATOR)
    assert accepted.interaction is None
    assert [c["operation"] for c in read_ledger(desk.ledger)] == ["refund"]
    [receipt] = await store.list_receipts(thread_id="t1")
    assert receipt.actor == OPERATOR.name
