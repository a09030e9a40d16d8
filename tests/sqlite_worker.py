"""A billing agent in its own OS process, driven by tests/test_sqlite_processes.py.

Run as ``python tests/sqlite_worker.py '<json config>'``. The config names the
SQLite file, a provider ledger and the turns to run, and the fault to inject:

- ``db``, ``ledger``: paths. Every provider call appends one JSON line to the
  ledger (``O_APPEND``, fsync'd), so the test counts real provider calls by key
  even when this process dies right after the call.
- ``turns``: ``[{"thread_id", "turn_id", "message"}]``, run in order. A message
  is ``"charge <payment_intent_id> <amount>"``.
- ``arrived`` / ``barrier``: after opening the store, create ``arrived`` and wait
  for ``barrier`` to exist, so that several processes start their turns together.
- ``started``: created just before the first turn.
- ``ready``: created when the capability starts (the thread lock is then held).
- ``hold_until``: the capability waits for this file before its effect.
- ``marker``: overlap detector: created with ``O_EXCL`` when the capability
  starts and removed when it ends; finding it already there means another turn
  of the thread is running concurrently, which is appended to ``marker + ".overlaps"``.
- ``crash``: ``"in_provider"`` (the provider records its call, then the process
  dies) or ``"after_effect"`` (the effect completed, the process dies before
  the capability returns, so before the turn commits). Exit status 137.
- ``provider_delay``: seconds the provider takes.
- ``lock_timeout``: passed to ``SQLiteDurability``.
- ``on_busy``: passed to ``Agent`` (``"wait"``, the default, or ``"reject"``).

Each finished turn prints one JSON line on stdout: ``{"turn_id", "result"}``
with ``TurnResult.to_dict()``, or ``{"turn_id", "error", "message",
"error_thread_id"}`` for a ``KernelError``; both with ``started_at`` and
``finished_at`` (``time.time()``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    Fact,
    Intent,
    Interpretation,
    Kernel,
    KernelError,
    capability,
)
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing import ScriptedInterpreter

CRASH_STATUS = 137
POLL_SECONDS = 0.002
MAX_WAIT_SECONDS = 25.0


class ChargeInput(BaseModel):
    payment_intent_id: str
    amount: int


def append_line(path: str, record: dict[str, Any]) -> None:
    """Append one line and make it durable before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def touch(path: str | None) -> None:
    if path:
        Path(path).touch()


def exists(path: str) -> bool:
    return os.path.exists(path)


async def wait_for_file(path: str) -> None:
    deadline = time.monotonic() + MAX_WAIT_SECONDS
    while not exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {MAX_WAIT_SECONDS}s")
        await asyncio.sleep(POLL_SECONDS)


def build_agent(config: dict[str, Any]) -> Agent:
    ledger: str = config["ledger"]
    crash: str | None = config.get("crash")
    marker: str | None = config.get("marker")
    provider_delay: float = config.get("provider_delay", 0.0)

    def create_charge(
        request: ChargeInput, idempotency_key: str, receipt_id: str
    ) -> dict[str, Any]:
        """The fake payment provider: each call is one durable ledger line."""
        if provider_delay:
            time.sleep(provider_delay)
        append_line(
            ledger,
            {"key": idempotency_key, "receipt_id": receipt_id, "pid": os.getpid()},
        )
        if crash == "in_provider":
            os._exit(CRASH_STATUS)  # the charge went through, its response is lost
        return {"charge_id": f"ch_{request.payment_intent_id}", "amount": request.amount}

    # "capability" mode: consent is this capability's decision, and its policy is
    # that these small test charges need none; it writes in the proposing turn.
    @capability(
        "payments.charge",
        effect="write",
        confirmation="capability",
        description="Charge a payment intent",
    )
    async def charge(input: ChargeInput, ctx: CapabilityContext) -> CapabilityResult:
        owned_marker = None
        if marker:
            try:
                os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                owned_marker = marker
            except FileExistsError:
                append_line(marker + ".overlaps", {"turn_id": ctx.turn_id, "pid": os.getpid()})
        try:
            touch(config.get("ready"))
            if config.get("hold_until"):
                await wait_for_file(config["hold_until"])
            effect = await ctx.run_effect(
                f"charge:{input.payment_intent_id}",
                lambda authority: create_charge(
                    input, authority.idempotency_key, authority.receipt_id
                ),
            )
            if crash == "after_effect":
                os._exit(CRASH_STATUS)  # the effect is completed, the turn never commits
            return CapabilityResult(
                value=effect.value,
                facts=[Fact(f"charge.{input.payment_intent_id}", effect.value)],
            )
        finally:
            if owned_marker:
                os.unlink(owned_marker)

    def interpret(request: InterpretationRequest) -> Interpretation:
        verb, payment_intent_id, amount = request.message.split()
        assert verb == "charge"
        return Interpretation(
            intents=[
                Intent(
                    "payments.charge",
                    {"payment_intent_id": payment_intent_id, "amount": int(amount)},
                )
            ]
        )

    return Agent(
        name="billing",
        version="1",
        capabilities=[charge],
        interpreter=ScriptedInterpreter(interpret),
        on_busy=config.get("on_busy", "wait"),
    )


async def main(config: dict[str, Any]) -> None:
    durability = SQLiteDurability(config["db"], lock_timeout=config.get("lock_timeout", 30.0))
    async with durability:
        kernel = Kernel(build_agent(config), durability)
        touch(config.get("arrived"))
        if config.get("barrier"):
            await wait_for_file(config["barrier"])
        touch(config.get("started"))
        for turn in config["turns"]:
            outcome: dict[str, Any] = {"turn_id": turn["turn_id"], "started_at": time.time()}
            try:
                result = await kernel.turn(turn["thread_id"], turn["turn_id"], turn["message"])
            except KernelError as exc:
                outcome.update(
                    error=type(exc).__name__, message=str(exc), error_thread_id=exc.thread_id
                )
            else:
                outcome["result"] = result.to_dict()
            outcome["finished_at"] = time.time()
            print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
