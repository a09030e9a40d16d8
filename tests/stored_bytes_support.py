"""The workload of ``tests/fixtures/stores/*.sql``: turns whose values are hard to encode.

``python tests/stored_bytes_support.py OUT.sql`` runs it on a new SQLite store and
writes the store as SQL text. Run with an older tree first on ``PYTHONPATH`` (its
``src/``), it records the bytes that tree stored; ``tests/test_stored_bytes.py`` then
checks that this tree reads them and encodes them again to the very same bytes.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    Fact,
    Intent,
    Interpretation,
    Kernel,
    capability,
)
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel.durability.sqlite import SQLiteDurability

#: Values JSON encoders disagree on: non-ASCII, escapes, floats, big ints, key order.
TRICKY: dict[str, Any] = {
    "zeta": "Zoë ✓ 日本語 🎉",
    "alpha": 'tab\t"quoted" back\\slash \u2028 \x00\x1f',
    "floats": [0.1, 1e16, 1.5e-300, -0.0, 123456789.125, 1e22, 2.5],
    "ints": [2**53 + 1, -(2**63), 2**64 - 1, 0],
    "nested": {"b": [1, {"z": None, "a": True}], "a": {"é": [], "E": {}}},
    "10": "a numeric key",
    "": "an empty key",
}
#: (thread, turn, message): two threads, one of them with four turns.
TURNS: list[tuple[str, str, str]] = [
    ("t-ascii", "1", "record 1"),
    ("t-ascii", "2", "record 2"),
    ("t-unicode", "ü-1", "recörd 3 — “quoted” ✓"),
    ("t-ascii", "3", "record 4"),
    ("t-ascii", "4", "record 5 \t\\ \u2028"),
]


class Interpreter:
    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        n = request.message.split(" ", 2)[1]
        return Interpretation(intents=[Intent("store.record", {"n": n, "value": TRICKY})])


def agent() -> Agent:
    @capability("store.record", effect="write", confirmation="capability")
    async def record(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """Record a value through an effect, and as a fact."""
        n, value = input["n"], input["value"]

        async def call(authority: Any) -> dict[str, Any]:
            return {"n": n, "value": value, "key": authority.idempotency_key}

        effect = await ctx.run_effect(f"record:{n}", call)
        return CapabilityResult(
            value=effect.value,
            facts=[Fact(f"recorded.{n}", effect.value), Fact("last", {"n": n, "ü": 1.0})],
            reply=f"Recorded {n} — ✓.",
        )

    return Agent(name="stored-bytes", version="1", capabilities=[record], interpreter=Interpreter())


async def write(path: Path) -> None:
    async with SQLiteDurability(str(path)) as durability:
        kernel = Kernel(agent(), durability)
        for thread, turn, message in TURNS:
            result = await kernel.turn(thread, turn, message)
            assert result.steps[0].status == "completed", result


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "store.db"
        asyncio.run(write(path))
        conn = sqlite3.connect(path)
        dump = "\n".join(conn.iterdump()) + "\n"
        conn.close()
    Path(sys.argv[1]).write_text(dump, encoding="utf-8")


if __name__ == "__main__":
    main()
