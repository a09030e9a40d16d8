"""A worker process on a shared PostgreSQL store, driven by tests/test_postgres_processes.py.

Run as ``python tests/postgres_worker.py '<json config>'``. Config:

- ``dsn``, ``schema``: the store. ``ledger``: a schema holding the fake
  provider's ``calls`` table; every provider call inserts one row (autocommit)
  before it "answers", so the test counts real calls even when this process dies.
  ``ledger_dsn`` (default ``dsn``): where the ledger is, the server itself when
  ``dsn`` is a pooler's.
- ``mode``:
  - ``"turns"``: run ``turns`` (``[[thread_id, turn_id], ...]``) in order. Each
    turn runs two effects: ``charge:<turn_id>`` (its own write) and
    ``shared:<n>`` (a key several turns share, which must reach the provider
    once per thread), then commits one event per effect and ``turn.committed``.
    Every ``read_every`` turns it also reads the outbox (numbering events, as a
    relay would). Prints one JSON line per turn: ``{"turn", "replayed"}`` or
    ``{"turn", "error"}``. With ``pause_at`` (a turn's index) and ``paused`` (a
    path), the first provider call from that turn on is logged, creates ``paused``
    and stops the process there, to be killed mid-turn.
  - ``"hold"``: start a turn on ``thread``, create the ``ready`` file while
    holding the thread's lease, and wait forever (to be killed).
  - ``"open"``: open the store (creating the schema) once the ``barrier`` file
    exists, then exit.
  - ``"pause"``: one turn (``thread``, ``turn``) that runs the effect ``key``, then
    records a journal entry and commits. At ``where`` (``"before_effect"`` or
    ``"in_provider"``, after the provider call is logged) it creates ``ready`` and
    waits for ``go``: the test SIGSTOPs it there. Prints ``{"committed": true}`` or
    ``{"error": "<class name>"}``.
- ``lease_expiry``: the adapter's (seconds, default 30).
- ``arrived`` / ``barrier``: create ``arrived`` once ready (the store open, except
  in ``"open"`` mode) and wait for ``barrier``, so that processes start together.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from intention_kernel._effects import EffectAuthority
from intention_kernel._turns import EventDraft, TurnCommit, TurnResult, TurnScope
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability.postgres import PostgresDurability
from intention_kernel.errors import EffectUncertainError, KernelError
from intention_kernel.testing.conformance import commit_for


def exists(path: str) -> bool:
    return os.path.exists(path)


def touch(path: str) -> None:
    Path(path).touch()


async def wait_for_file(path: str) -> None:
    deadline = time.monotonic() + 30
    while not exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        await asyncio.sleep(0.002)


class Provider:
    """The fake payment provider: one committed row per call, then a slow answer. With
    ``pause``, the call stops the process once logged, after creating that file."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        thread_id: str,
        ledger: str,
        pause: str | None = None,
    ) -> None:
        self.conn = conn
        self.thread_id = thread_id
        self.pause = pause
        # Named in full: behind a transaction pooler no session's search_path holds.
        insert = sql.SQL("INSERT INTO {}.calls (thread_id, key, pid) VALUES (%s, %s, %s)")
        self.insert = insert.format(sql.Identifier(ledger))

    async def __call__(self, authority: EffectAuthority) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0, 0.003))
        await self.conn.execute(self.insert, (self.thread_id, authority.key, os.getpid()))
        if self.pause is not None:
            touch(self.pause)
            await asyncio.Event().wait()  # until the test's SIGKILL
        # The answer is on its way: a window in which a kill leaves the write applied and
        # its receipt prepared (the test kills victims as soon as their call is logged).
        await asyncio.sleep(random.uniform(0.002, 0.008))
        return {"charged": authority.key, "receipt": authority.receipt_id}


async def effect_event(tx: TurnTransaction, key: str, provider: Provider) -> EventDraft:
    try:
        effect = await tx.run_effect(key, provider, step_id=key)
    except EffectUncertainError as exc:
        return EventDraft("effect.uncertain", {"key": key, "error": str(exc)[:80]})
    return EventDraft("effect.completed", {"key": key, "value": effect.value})


async def run_turns(config: dict[str, Any], durability: PostgresDurability) -> None:
    # The ledger is the test's own bookkeeping: on the server directly (``ledger_dsn``)
    # when the store is reached through a pooler. Its statements name their schema.
    ledger = await psycopg.AsyncConnection.connect(
        config.get("ledger_dsn", config["dsn"]), autocommit=True, prepare_threshold=None
    )
    pause_at = config.get("pause_at")
    for i, (thread_id, turn_id) in enumerate(config["turns"]):
        pause = config["paused"] if pause_at is not None and i >= pause_at else None
        provider = Provider(ledger, thread_id, config["ledger"], pause)

        async def operation(tx: TurnTransaction, provider: Provider = provider) -> TurnCommit:
            turn_id = tx.scope.turn_id
            events = [
                await effect_event(tx, f"charge:{turn_id}", provider),
                await effect_event(tx, f"shared:{int(turn_id.split('-')[1]) % 4}", provider),
            ]
            version = (tx.checkpoint.version if tx.checkpoint else 0) + 1
            events.append(EventDraft("turn.committed", {"version": version}))
            return commit_for(tx, events)

        outcome: dict[str, Any] = {"turn": [thread_id, turn_id]}
        try:
            result = await durability.with_turn(TurnScope(thread_id, turn_id), operation)
            outcome["replayed"] = result.replayed
        except KernelError as exc:
            outcome["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(outcome), flush=True)
        if config.get("read_every") and i % config["read_every"] == 0:
            await durability.read_outbox(limit=50)
    await ledger.close()


async def run_paused(config: dict[str, Any], durability: PostgresDurability) -> None:
    ledger = await psycopg.AsyncConnection.connect(
        config["dsn"], autocommit=True, prepare_threshold=None
    )
    where = config["where"]
    log_call = Provider(ledger, config["thread"], config["ledger"])

    async def stop_here() -> None:
        touch(config["ready"])
        await wait_for_file(config["go"])

    async def provider(authority: EffectAuthority) -> dict[str, Any]:
        await ledger.execute(log_call.insert, (config["thread"], authority.key, os.getpid()))
        if where == "in_provider":
            await stop_here()
        return {"charged": authority.key}

    async def one() -> int:
        return 1

    async def operation(tx: TurnTransaction) -> TurnCommit:
        if where == "before_effect":
            await stop_here()
        await tx.run_effect(config["key"], provider, step_id="s")
        await tx.recorded("after", one)
        return commit_for(tx, [EventDraft("turn.committed", {"by": os.getpid()})])

    try:
        result: TurnResult = await durability.with_turn(
            TurnScope(config["thread"], config["turn"]), operation
        )
        print(json.dumps({"committed": not result.replayed}), flush=True)
    except KernelError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    await ledger.close()


async def arrive(config: dict[str, Any]) -> None:
    if config.get("arrived"):
        touch(config["arrived"])
        await wait_for_file(config["barrier"])


async def main(config: dict[str, Any]) -> None:
    if config["mode"] == "open":
        await arrive(config)
    durability = PostgresDurability(
        config["dsn"],
        schema=config["schema"],
        lock_timeout=config.get("lock_timeout", 20.0),
        lease_expiry=config.get("lease_expiry", 30.0),
    )
    async with durability:
        if config["mode"] != "open":
            await arrive(config)
        if config["mode"] == "turns":
            await run_turns(config, durability)
        elif config["mode"] == "pause":
            await run_paused(config, durability)
        elif config["mode"] == "hold":

            async def hold(tx: TurnTransaction) -> TurnCommit:
                touch(config["ready"])
                await asyncio.Event().wait()
                raise AssertionError("unreachable")

            await durability.with_turn(TurnScope(config["thread"], "held"), hold)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
