"""What the framework bridges' tests share.

``tests/pydantic_ai_support.py`` and ``tests/openai_agents_support.py`` use it, and
so do the tests and workers that use those.

:data:`ORDERS` are the help desk's orders, and :func:`record_write` is its provider.
It writes one line of a ledger file per write, before the tool answers. So the line
outlives a process that dies right after the call. :func:`words` is a
``read_answer`` that reads ``"yes"`` and ``"no, <reason>"``. :class:`MovingClock` is
a clock that stands still until the test moves it. :func:`run_worker` runs one worker
process and returns its JSON lines; it never leaves it running. The crash rounds'
workers run through it too. :class:`Workers` runs turns of a thread in such processes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import prefork
from intention_kernel import Answer
from intention_kernel._effects import EffectAuthority
from intention_kernel.testing import faults
from proving_support import Store, read_ledger

__all__ = [
    "ORDERS",
    "PROCESS_TIMEOUT",
    "MovingClock",
    "Workers",
    "read_ledger",
    "record_write",
    "run_worker",
    "words",
]

ORDERS = {"42": 1250, "43": 800}
PROCESS_TIMEOUT = 120
#: The lease expiry of a worker process not meant to die (see ``run_worker``).
LIVE_LEASE_EXPIRY = 30.0


def record_write(
    ledger: str,
    authority: Callable[[], EffectAuthority],
    operation: str,
    order_id: str,
    **extra: Any,
) -> dict[str, str]:
    """The provider's side of a write: one synced line of ``ledger`` (the receipt's
    idempotency key, or ``None`` for the framework run alone), then the answer."""
    try:
        key: str | None = authority().idempotency_key
    except LookupError:  # the agent run by its framework alone, outside a turn
        key = None
    record = {"operation": operation, "order_id": order_id, "key": key}
    with open(ledger, "a", encoding="utf-8") as f:
        f.write(json.dumps({**record, **extra, "pid": os.getpid()}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    faults.reach(faults.IN_PROVIDER_AFTER_WRITE)  # applied; the answer is on its way
    return {"id": f"{operation}_{order_id}"}


def words(text: str) -> Answer | None:
    if text == "yes":
        return Answer(decision="accept")
    if text.startswith("no, "):
        return Answer(decision="reject", reason=text[4:])
    return None


class MovingClock:
    """A clock that stands still until the test moves it."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def run_worker(script: Path, config: dict[str, Any], status: int = 0) -> list[dict[str, Any]]:
    """Run ``script`` with ``config`` (JSON, its one argument) in a process of its own,
    expect it to exit with ``status``, and return the JSON lines it printed. A process
    that outlives :data:`PROCESS_TIMEOUT` is killed.

    A process expected to exit 0 holds its PostgreSQL leases for 30 s, unless
    ``config["store"]`` names an expiry. The crash tests' 2 s is for processes that die.
    Their successors then wait 2 s, not 30. A live turn on a loaded machine can
    stall its event loop past 2 s, though. It then loses its lease midway."""
    store = config.get("store")
    if status == 0 and isinstance(store, dict) and store.get("kind") == "postgres":
        config = {**config, "store": {"lease_expiry": LIVE_LEASE_EXPIRY, **store}}
    process = await prefork.spawn(script, json.dumps(config))
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), PROCESS_TIMEOUT)
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()
    assert process.returncode == status, (
        f"{script.name} exited with {process.returncode}, expected {status}:\n{stderr.decode()}"
    )
    return [json.loads(line) for line in stdout.decode().splitlines()]


@dataclass
class Workers:
    """Turns in worker processes of ``script``, on ``store``, writing to ``ledger``."""

    script: Path
    store: Store
    ledger: Path

    async def run(
        self, turns: list[dict[str, Any]], *, status: int = 0, **config: Any
    ) -> list[dict[str, Any]]:
        """One process that runs ``turns``; ``config`` holds the worker's other keys."""
        config.update(store=self.store.config(), ledger=str(self.ledger), turns=turns)
        return await run_worker(self.script, config, status)
