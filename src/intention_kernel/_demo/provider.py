"""A fake payment provider whose every call is recorded on disk.

It stands for the external system a write capability talks to.
Stripe, Adyen or a bank API would be one.
So it lives *outside* the kernel, with its own tables in the demo's SQLite file.
It opens its own connection per request.
It shares nothing with the durability adapter.
Two tables make its behaviour checkable after the fact:

- ``demo_provider_calls``: one row per request that reached the provider.
  A request gets its row whatever happened to it.
  This is the "provider calls" count of the transcript.
  A kernel that called the provider twice for one payment would show here.
  It would show even though the provider's own idempotency hid it from the customer.
- ``demo_provider_charges``: one row per charge actually applied (money moved).
  Each has a ``UNIQUE`` idempotency key, as Stripe has.
  A second request with the same key returns the stored charge.
  It does not charge again.

:meth:`FakePaymentProvider.simulate_lost_response` arms the failure that matters most.
The charge is applied and committed, then the response never arrives.
The caller sees a timeout.
Only the caller's receipt can tell what to do next.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from intention_kernel import CancellationSignal

__all__ = [
    "ChargeRejected",
    "FakePaymentProvider",
    "ProviderCall",
    "ProviderTimeout",
]

T = TypeVar("T")

CREATE_CALLS = """
    CREATE TABLE IF NOT EXISTS demo_provider_calls (
        call_no           INTEGER PRIMARY KEY AUTOINCREMENT,
        idempotency_key   TEXT NOT NULL,
        payment_intent_id TEXT NOT NULL,
        amount_cents      INTEGER NOT NULL,
        outcome           TEXT NOT NULL,
        charge_id         TEXT,
        called_at         TEXT NOT NULL
    )
"""
CREATE_CHARGES = """
    CREATE TABLE IF NOT EXISTS demo_provider_charges (
        charge_no         INTEGER PRIMARY KEY AUTOINCREMENT,
        charge_id         TEXT NOT NULL UNIQUE,
        idempotency_key   TEXT NOT NULL UNIQUE,
        payment_intent_id TEXT NOT NULL,
        amount_cents      INTEGER NOT NULL,
        currency          TEXT NOT NULL,
        created_at        TEXT NOT NULL
    )
"""
SELECT_CHARGE_BY_KEY = """
    SELECT charge_id, idempotency_key, payment_intent_id, amount_cents, currency
    FROM demo_provider_charges WHERE idempotency_key = ?
"""
SELECT_CHARGES = """
    SELECT charge_id, idempotency_key, payment_intent_id, amount_cents, currency
    FROM demo_provider_charges ORDER BY charge_no
"""
INSERT_CHARGE = """
    INSERT INTO demo_provider_charges
        (charge_id, idempotency_key, payment_intent_id, amount_cents, currency, created_at)
    VALUES ('pending', ?, ?, ?, ?, ?)
"""
NAME_CHARGE = "UPDATE demo_provider_charges SET charge_id = ? WHERE charge_no = ?"
INSERT_CALL = """
    INSERT INTO demo_provider_calls
        (idempotency_key, payment_intent_id, amount_cents, outcome, charge_id, called_at)
    VALUES (?, ?, ?, ?, ?, ?)
"""
SELECT_CALLS = """
    SELECT call_no, idempotency_key, payment_intent_id, amount_cents, outcome, charge_id
    FROM demo_provider_calls ORDER BY call_no
"""
COUNT_CALLS = "SELECT COUNT(*) FROM demo_provider_calls"

Outcome = Literal["charged", "charged_response_lost", "idempotent_replay", "rejected"]


class ProviderTimeout(TimeoutError):
    """The provider did not answer in time. Whether it charged is unknown to the caller."""


class ChargeRejected(Exception):
    """The provider refused the request outright: nothing was charged."""


@dataclass(frozen=True, slots=True)
class ProviderCall:
    """One row of ``demo_provider_calls``."""

    call_no: int
    idempotency_key: str
    payment_intent_id: str
    amount_cents: int
    outcome: Outcome
    charge_id: str | None


class FakePaymentProvider:
    """A payment API with Stripe-like idempotency keys, recorded in ``path``.

    Every request opens its own connection, like an HTTP call would.
    It runs in a worker thread, so the event loop is never blocked on a disk flush.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lose_response_for: set[str] = set()
        self._opened = False

    async def open(self) -> None:
        """Create the provider's tables if they do not exist yet (also done on first use)."""
        await self._run(lambda conn: None)

    def simulate_lost_response(self, payment_intent_id: str) -> None:
        """Arm a one-shot failure for the next charge of this payment intent.

        The charge is applied and committed.
        Then :class:`ProviderTimeout` is raised instead of the response.
        """
        self._lose_response_for.add(payment_intent_id)

    async def create_charge(
        self,
        *,
        payment_intent_id: str,
        amount_cents: int,
        currency: str,
        idempotency_key: str,
        signal: CancellationSignal | None = None,
    ) -> dict[str, Any]:
        """Charge a payment intent once per ``idempotency_key``; return the charge."""
        if signal is not None and signal.cancelled:
            raise ChargeRejected("the request was cancelled before it was sent")
        lose_response = payment_intent_id in self._lose_response_for
        self._lose_response_for.discard(payment_intent_id)

        def charge(conn: sqlite3.Connection) -> dict[str, Any]:
            now = datetime.now(UTC).isoformat()
            conn.execute("BEGIN IMMEDIATE")
            existing = conn.execute(SELECT_CHARGE_BY_KEY, (idempotency_key,)).fetchone()
            if existing is not None:
                stored = _charge(existing)
                if (stored["payment_intent_id"], stored["amount_cents"]) != (
                    payment_intent_id,
                    amount_cents,
                ):
                    # Stripe answers 400 when a key is reused with other parameters.
                    conn.execute(
                        INSERT_CALL,
                        (idempotency_key, payment_intent_id, amount_cents, "rejected", None, now),
                    )
                    conn.execute("COMMIT")
                    raise ChargeRejected(
                        f"idempotency key {idempotency_key!r} was used for another request"
                    )
                outcome: Outcome = "idempotent_replay"
            else:
                cursor = conn.execute(
                    INSERT_CHARGE, (idempotency_key, payment_intent_id, amount_cents, currency, now)
                )
                charge_no = cursor.lastrowid
                assert charge_no is not None
                conn.execute(NAME_CHARGE, (f"ch_{charge_no:06d}", charge_no))
                stored = _charge(conn.execute(SELECT_CHARGE_BY_KEY, (idempotency_key,)).fetchone())
                outcome = "charged_response_lost" if lose_response else "charged"
            conn.execute(
                INSERT_CALL,
                (
                    idempotency_key,
                    payment_intent_id,
                    amount_cents,
                    outcome,
                    stored["charge_id"],
                    now,
                ),
            )
            conn.execute("COMMIT")
            return stored

        charge_record = await self._run(charge)
        if lose_response:
            # The money moved and the provider committed it; only the answer is lost.
            raise ProviderTimeout("no response from the payment provider within 10 seconds")
        return charge_record

    async def find_charge(self, idempotency_key: str) -> dict[str, Any] | None:
        """The provider's record for an idempotency key (what an operator looks up)."""

        def find(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute(SELECT_CHARGE_BY_KEY, (idempotency_key,)).fetchone()
            return None if row is None else _charge(row)

        return await self._run(find)

    async def charges(self) -> list[dict[str, Any]]:
        """Every charge applied, oldest first."""
        return await self._run(lambda conn: [_charge(r) for r in conn.execute(SELECT_CHARGES)])

    async def calls(self) -> list[ProviderCall]:
        """Every request that reached the provider, oldest first."""
        return await self._run(
            lambda conn: [ProviderCall(*row) for row in conn.execute(SELECT_CALLS)]
        )

    async def call_count(self) -> int:
        count: int = await self._run(lambda conn: conn.execute(COUNT_CALLS).fetchone()[0])
        return count

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with _connect(self.path) as conn:
                if not self._opened:
                    conn.execute(CREATE_CALLS)
                    conn.execute(CREATE_CHARGES)
                    self._opened = True
                return fn(conn)

        return await asyncio.to_thread(call)


@contextmanager
def _connect(path: str) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.rollback()
        conn.close()


def _charge(row: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "charge_id": row[0],
        "idempotency_key": row[1],
        "payment_intent_id": row[2],
        "amount_cents": row[3],
        "currency": row[4],
        "status": "succeeded",
    }
