"""A fake airline: flight offers, fare quotes that expire, idempotent bookings.

It stands for the booking API a travel agent talks to, so it lives outside the
kernel and outlives a restart of the agent's process. Fares move: :meth:`reprice`
changes an offer's price, and a booking at a price that is no longer offered is
refused with :class:`FareChanged` (nothing is booked). ``calls`` lists every
booking request that reached the airline.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["FareChanged", "FakeAirline", "Offer", "UnknownOffer", "money"]

QUOTE_VALIDITY = dt.timedelta(minutes=15)


def money(cents: int) -> str:
    return f"€{cents / 100:,.2f}"


class UnknownOffer(LookupError):
    """No such offer: nothing can be quoted or booked."""


class FareChanged(Exception):
    """The airline refused the booking because the fare moved: nothing was booked."""


@dataclass(frozen=True, slots=True)
class Offer:
    offer_id: str
    origin: str
    destination: str
    date: str
    departs: str
    carrier: str
    price_cents: int

    def describe(self) -> str:
        return (
            f"{self.offer_id} {self.carrier} {self.origin}→{self.destination} "
            f"{self.date} {self.departs}, {money(self.price_cents)}"
        )


class FakeAirline:
    """Offers by ID; bookings keyed by the caller's idempotency key."""

    def __init__(self, offers: Iterable[Offer]) -> None:
        self._offers = {offer.offer_id: offer for offer in offers}
        self._bookings: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def search(self, origin: str, destination: str, date: str) -> list[Offer]:
        return [
            o
            for o in self._offers.values()
            if (o.origin, o.destination, o.date) == (origin, destination, date)
        ]

    def offer(self, offer_id: str) -> Offer:
        try:
            return self._offers[offer_id]
        except KeyError:
            raise UnknownOffer(f"there is no offer {offer_id!r}") from None

    def quote(self, offer_id: str, now: dt.datetime | None = None) -> dict[str, Any]:
        """A fare quote: the price now, guaranteed for :data:`QUOTE_VALIDITY`."""
        offer = self.offer(offer_id)
        now = now or dt.datetime.now(dt.UTC)
        return {
            "quote_id": f"q_{offer_id}_{offer.price_cents}",
            "offer": asdict(offer),
            "price_cents": offer.price_cents,
            "valid_until": (now + QUOTE_VALIDITY).isoformat(timespec="seconds"),
        }

    def reprice(self, offer_id: str, price_cents: int) -> None:
        self._offers[offer_id] = replace(self.offer(offer_id), price_cents=price_cents)

    async def book(
        self, offer_id: str, passenger: str, price_cents: int, idempotency_key: str
    ) -> dict[str, Any]:
        """Book once per ``idempotency_key``; a repeated key returns the same booking."""
        self.calls.append(offer_id)
        booking = self._bookings.get(idempotency_key)
        if booking is not None:
            return booking
        offer = self.offer(offer_id)
        if offer.price_cents != price_cents:
            raise FareChanged(
                f"{offer_id} now costs {money(offer.price_cents)}, not {money(price_cents)}"
            )
        booking = {
            "booking_ref": f"BK{len(self._bookings) + 1:04d}",
            "offer_id": offer_id,
            "passenger": passenger,
            "price_cents": price_cents,
        }
        self._bookings[idempotency_key] = booking
        return booking
