"""What the framework help desks share (``examples/pydantic_ai_desk``,
``examples/openai_agents_desk``, ``examples/langgraph_desk``): the orders, the shop,
how the person's reply reads as an answer to the refund's question, the conversation
they play (:func:`play`) and the crash script (:func:`crash_turn`). Each desk keeps
its own agent, tools and scripted model, written in its framework's terms.
"""

from __future__ import annotations

import argparse
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
    Tally,
    parse_args,
    print_provider,
    print_summary,
    run,
)
from intention_kernel import Agent, Answer, Kernel
from intention_kernel.durability import open_durability
from intention_kernel.testing import faults

__all__ = [
    "ORDERS",
    "SCRIPT",
    "FakeShop",
    "crash_turn",
    "play",
    "read_answer",
    "refund_question",
]

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


async def crash_turn(name: str, build_agent: Callable[[FakeShop, Path], Agent]) -> None:
    """The crash script of a desk whose model logs its asks (``examples/<name>/crash.py``).

    With ``--die`` the process exits after the cancel's receipt completed, before the
    commit. Run again without it, the same turn is delivered again and commits.
    """
    parser = argparse.ArgumentParser(prog=f"python -m examples.{name}.crash")
    parser.add_argument("--db", default=f"sqlite:///{name}.db")
    parser.add_argument("--thread", default=f"{name}-crash")
    parser.add_argument("--ledger", type=Path, default=Path(f"{name}.ledger"))
    parser.add_argument("--model-log", type=Path, default=Path(f"{name}.model.log"))
    parser.add_argument("--die", action="store_true", help="exit after the write, before commit")
    args = parser.parse_args()
    shop = FakeShop(ledger=args.ledger)
    async with open_durability(args.db) as store:
        kernel = Kernel(build_agent(shop, args.model_log), store)
        if args.die:
            # The fault kit's named point: after the receipt is completed, before commit.
            faults.inject(faults.AFTER_RECEIPT_COMPLETED, "exit")
        result = await kernel.turn(args.thread, "crash-1", "cancel order 42")
    print(f"[crash-1] agent: {result.reply}")
    for step in result.steps:
        print(f"[crash-1] step {step.capability_id}: {step.status}")
    calls = args.ledger.read_text().splitlines() if args.ledger.exists() else []
    # A model call is told by how many messages it carried; a model asked again for
    # one it answered would show more asks than calls.
    asks = args.model_log.read_text().split() if args.model_log.exists() else []
    print(f"model: requests={len(set(asks))} asked={len(asks)}")
    print_summary(Tally.of(result), len(calls))
