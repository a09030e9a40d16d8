"""The reply of a turn that only answers (issue 31): a sentence, not raw JSON.

A structured answer (``Kernel.turn(answer=...)``, the host's ``answer`` body) asks the
interpreter nothing, so no model words the outcome. When the accepted capability gives
no reply of its own, the kernel's ``Replies.done`` is the reply: it must read as a
sentence for a person, not as the capability's description and a JSON document.
"""

from __future__ import annotations

from typing import Any

import pytest

from intention_kernel import (
    Agent,
    Answer,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    Intent,
    Interpretation,
    Kernel,
    Replies,
    capability,
)
from intention_kernel.durability import Durability
from intention_kernel.testing import ScriptedInterpreter


def refund_kernel(store: Durability, value: Any) -> Kernel:
    @capability("shop.refund", effect="write", description="Refund an order")
    async def refund(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        async def provider(authority: EffectAuthority) -> Any:
            return value

        effect = await ctx.run_effect(f"refund:{input['order_id']}", provider)
        return CapabilityResult(value=effect.value)  # no reply of its own

    script = {"refund o1": Interpretation([Intent("shop.refund", {"order_id": "o1"})])}
    return Kernel(Agent("shop", "1", [refund], ScriptedInterpreter(script)), store)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "Done: Refund an order."),
        (
            {"refund_id": "r_1", "cents": 1250},
            "Done: Refund an order (refund_id: r_1, cents: 1250).",
        ),
        ("r_1", "Done: Refund an order (r_1)."),
        (
            {"content": [{"type": "text", "text": "Refunded"}], "structuredContent": {"id": "r_1"}},
            "Done: Refund an order (id: r_1).",
        ),
    ],
)
async def test_a_structured_accept_is_answered_with_a_sentence(
    store: Durability, value: Any, expected: str
) -> None:
    kernel = refund_kernel(store, value)
    proposed = await kernel.turn("t", "1", "refund o1")
    assert proposed.interaction is not None
    accepted = await kernel.turn("t", "2", answer=Answer(decision="accept", actor="ana"))
    assert accepted.steps[0].status == "completed" and accepted.steps[0].value == value
    assert accepted.reply == expected
    assert "{" not in accepted.reply and '"' not in accepted.reply


def test_a_long_or_nested_value_is_left_to_the_steps_value() -> None:
    replies = Replies()

    @capability("shop.lookup", description="Look an order up")
    async def lookup(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult()

    assert replies.done(lookup, "x" * 500) == "Done: Look an order up."
    assert replies.done(lookup, {str(n): n for n in range(10)}) == "Done: Look an order up."
    assert replies.done(lookup, [1, 2]) == "Done: Look an order up."
    assert replies.done(lookup, {"a": {"b": {"c": 1}}}) == "Done: Look an order up."
    assert replies.done(lookup, {"text": "two\nlines"}) == "Done: Look an order up."
    assert replies.done(lookup, True) == "Done: Look an order up (true)."
