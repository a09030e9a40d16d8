"""One delivery of a turn in model rounds, in its own OS process, for
tests/test_crash_rounds.py.

Run as ``python tests/rounds_worker.py '<json config>'``:

- ``store``: :meth:`proving_support.Store.config`;
- ``files``: ``{"asks", "tools", "ledger"}``: each ask of the model (one JSON line per
  round it is asked), each tool call, and the provider's ledger, as fsynced lines;
- ``turn``: ``{"thread_id", "turn_id", "message"}``, and optionally ``"tenant_id"``;
- ``die``: optional, where the process exits at once (``os._exit``, no cleanup):
  ``"in_balance"`` (round 1's first step starts), ``"in_pay"`` (round 2's first step
  starts, before its write), ``"asked_round_3"`` (the model is asked round 3: rounds 1
  and 2 answered and recorded, their steps done).

The model answers three rounds: read the balance, pay 100 on ``pi_1`` (a write that
pays at once), then the final text. It prints one JSON line with the result. A turn
refused as another tenant's prints ``{"refused": "<error class>"}`` and exits with
``REFUSED``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    Intent,
    Interpretation,
    InterpretationRequest,
    Kernel,
    capability,
)
from intention_kernel.errors import TenantMismatchError
from intention_kernel.testing import faults
from proving_support import LedgerProvider, PayInput, append_line, open_store

#: The exit status of a delivery refused with ``TenantMismatchError``.
REFUSED = 3


class CountingModel:
    """A model that works in rounds and writes down every request it is sent."""

    multi_round = True

    def __init__(self, asks: str, die: str | None) -> None:
        self.asks, self.die = asks, die

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        number = len(request.rounds) + 1
        append_line(self.asks, {"round": number, "pid": os.getpid()})
        if self.die == f"asked_round_{number}":
            os._exit(faults.EXIT_STATUS)
        if number == 1:
            return Interpretation([Intent("account.balance", {})], response={"round": 1})
        if number == 2:
            [balance] = request.rounds[0].steps
            pay = {"payment_intent_id": "pi_1", "amount": 100}
            return Interpretation(
                [Intent("payments.pay", pay)],
                reply=f"the balance is {balance.value['due']}",
                response={"round": 2},
            )
        [paid] = request.rounds[1].steps
        return Interpretation(reply=f"paid: {paid.value['charge_id']}")


def rounds_agent(files: dict[str, str], die: str | None) -> Agent:
    provider = LedgerProvider(path=files["ledger"])

    @capability("account.balance", description="The balance")
    async def balance(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        if die == "in_balance":
            os._exit(faults.EXIT_STATUS)
        append_line(files["tools"], {"tool": "account.balance", "pid": os.getpid()})
        return CapabilityResult(value={"due": 300})

    @capability("payments.pay", effect="write", confirmation="capability", description="Pay")
    async def pay(input: PayInput, ctx: CapabilityContext) -> CapabilityResult:
        if die == "in_pay":
            os._exit(faults.EXIT_STATUS)
        append_line(files["tools"], {"tool": "payments.pay", "pid": os.getpid()})
        pi = input.payment_intent_id
        effect = await ctx.run_effect(
            f"charge:{pi}", lambda authority: provider.charge(pi, input.amount, authority)
        )
        return CapabilityResult(value=effect.value)

    return Agent(
        name="rounds",
        version="1",
        capabilities=[balance, pay],
        interpreter=CountingModel(files["asks"], die),
    )


async def main(config: dict[str, Any]) -> None:
    agent = rounds_agent(config["files"], config.get("die"))
    async with open_store(config["store"]) as durability:
        turn = config["turn"]
        try:
            result = await Kernel(agent, durability).turn(
                turn["thread_id"],
                turn["turn_id"],
                turn["message"],
                tenant_id=turn.get("tenant_id"),
            )
        except TenantMismatchError as exc:
            print(json.dumps({"refused": type(exc).__name__}), flush=True)
            sys.exit(REFUSED)
        print(json.dumps(result.to_dict()), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
