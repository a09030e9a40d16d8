"""What the two framework help desks share (``examples/pydantic_ai_desk``,
``examples/openai_agents_desk``): the orders, the shop, and how the person's reply
reads as an answer to the refund's question, and the conversation both play
(:func:`play`). Each desk keeps its own agent, tools and
scripted model, written in its framework's terms.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples._conversation import (
    Redeliver,
    Restart,
    Say,
    Step,
    parse_args,
    print_provider,
    print_summary,
    run,
)
from intention_kernel import Agent, Answer

__all__ = ["ORDERS", "SCRIPT", "FakeShop", "play", "read_answer", "refund_question"]

ORDERS = {"42": 1250, "43": 800}


@dataclass
class FakeShop:
    """The outside world: every cancel and refund it applied, by idempotency key.

    With a ``ledger`` file, each applied call is also a line of it, which outlives a
    process that dies (each desk's ``crash.py``)."""

    calls: list[str] = field(default_factory=list)
    ledger: Path | None = None

    def apply(self, operation: str, order_id: str, key: str) -> dict[str, str]:
        """Apply ``operation``; ``key`` is the receipt's idempotency key, which a real
        shop would deduplicate on."""
        self.calls.append(key)
        if self.ledger is not None:
            with self.ledger.open("a", encoding="utf-8") as f:
                f.write(key + "\n")
                f.flush()
                os.fsync(f.fileno())
        return {"id": f"{operation}_{order_id}"}


def read_answer(text: str) -> Answer | None:
    """``yes`` accepts the pending refund; ``no, <reason>`` rejects it with the reason."""
    words = text.strip().lower()
    if words in ("yes", "y", "ok"):
        return Answer(decision="accept")
    if words.startswith("no"):
        reason = text.strip()[2:].lstrip(" ,:") or None
        return Answer(decision="reject", reason=reason)
    return None


def refund_question(tool: str, args: dict[str, Any]) -> str:
    """The question the person is asked before a refund."""
    return f"Refund {args['cents']} cents for order {args['order_id']}? Reply yes, or no and why."


#: A read, a cancel delivered twice, a refund asked for, a restart, the "yes" that
#: runs it, delivered twice.
SCRIPT: list[Step] = [
    Say("status of order 42"),
    Say("cancel order 43"),
    Redeliver(),
    Say("refund order 42"),
    Restart(),
    Say("yes"),
    Redeliver(),
]


async def play(
    name: str, description: str, model: str, build_agent: Callable[[FakeShop], Agent]
) -> None:
    """Play :data:`SCRIPT` on the desk ``name`` (its command line: ``--db``,
    ``--thread``); ``model`` says why ``--llm`` does not apply."""
    options = parse_args(name, description)
    if options.llm:
        sys.exit(f"this example's model is {model}: --llm does not apply")
    shop = FakeShop()  # the outside world: it outlives the restart
    tally = await run(options, SCRIPT, lambda interpreter: build_agent(shop))
    print_summary(tally, len(shop.calls))
    print_provider(shop.calls, "applied")
