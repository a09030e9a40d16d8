"""The travel agent: search flights, book them; the booking capability asks on its own.

- ``travel.search`` (read) lists the offers and records them as a fact.
- ``travel.book`` (write, ``confirmation="capability"``): the kernel neither asks
  nor authorizes; the capability does. Called without an answer, it gets a fare
  quote from the airline and

  - books at once when the fare is at most ``auto_book_limit_cents`` (the
    small-operation policy: consent is the capability's to judge), or
  - records the quote as a fact and returns ``CapabilityResult.needs_confirmation``
    with the quote as details. Called again with ``ctx.answer``, it books only if
    the answer accepts, names no other quote, and the quote is unexpired and still
    the airline's fare. Only then does it call ``ctx.run_effect(f"book:{offer_id}")``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, Field

from examples.travel.provider import FakeAirline, FareChanged, money
from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    EffectAuthority,
    EffectNotAppliedError,
    Fact,
    Interpreter,
    Rule,
    RuleInterpreter,
    capability,
)

__all__ = ["AUTO_BOOK_LIMIT_CENTS", "build_agent", "quote_problem", "rules"]

#: Bookings up to this fare need no confirmation.
AUTO_BOOK_LIMIT_CENTS = 10_000


class SearchInput(BaseModel):
    origin: str = Field(pattern=r"^[A-Z]{3}$", description="IATA airport code, e.g. LIS")
    destination: str = Field(pattern=r"^[A-Z]{3}$", description="IATA airport code, e.g. BER")
    date: dt.date = Field(description="Departure date, YYYY-MM-DD")


class BookInput(BaseModel):
    offer_id: str = Field(min_length=1, description="An offer ID from travel.search, e.g. TP538")
    passenger: str = Field(min_length=1, description="The passenger's full name")


def quote_problem(
    shown: Mapping[str, Any],
    current: Mapping[str, Any],
    answer_value: Any,
    now: dt.datetime,
) -> str | None:
    """Why an accepted quote must not be booked, or ``None`` if it may."""
    if isinstance(answer_value, Mapping) and answer_value.get("quote_id") not in (
        None,
        shown["quote_id"],
    ):
        return (
            f"That answer accepts quote {answer_value['quote_id']}, not the fare you were "
            f"shown ({shown['quote_id']})"
        )
    if now > dt.datetime.fromisoformat(shown["valid_until"]):
        return f"The fare quote expired at {shown['valid_until']}"
    if current["price_cents"] != shown["price_cents"]:
        return (
            f"The fare changed from {money(shown['price_cents'])} to "
            f"{money(current['price_cents'])} since you were asked"
        )
    return None


def build_agent(
    airline: FakeAirline,
    interpreter: Interpreter | None = None,
    *,
    auto_book_limit_cents: int = AUTO_BOOK_LIMIT_CENTS,
) -> Agent:
    """The agent; ``interpreter`` defaults to :func:`rules`."""

    @capability("travel.search", description="Search flight offers for a route and date")
    async def search(input: SearchInput, ctx: CapabilityContext) -> CapabilityResult:
        offers = airline.search(input.origin, input.destination, input.date.isoformat())
        if not offers:
            return CapabilityResult(value=[], reply="No flights found for that route and date.")
        listed = [{"offer_id": o.offer_id, "price_cents": o.price_cents} for o in offers]
        return CapabilityResult(
            value=listed,
            facts=[Fact("travel.offers", listed)],
            reply="\n".join(["Offers:", *(f"  {o.describe()}" for o in offers)]),
        )

    @capability(
        "travel.book",
        effect="write",
        confirmation="capability",
        description="Book a flight offer for a passenger",
    )
    async def book(input: BookInput, ctx: CapabilityContext) -> CapabilityResult:
        quote_key = f"travel.quote.{input.offer_id}"
        if ctx.answer is None:
            quote = airline.quote(input.offer_id)
            if quote["price_cents"] <= auto_book_limit_cents:
                result = await _book(ctx, airline, input, quote, quote_key)
                note = f" No confirmation needed up to {money(auto_book_limit_cents)}."
                return replace(
                    result,
                    facts=[Fact(quote_key, quote), *result.facts],
                    reply=f"{result.reply}{note}",
                )
            until = dt.datetime.fromisoformat(quote["valid_until"]).strftime("%H:%M UTC")
            prompt = (
                f"Book {airline.offer(input.offer_id).describe()} for {input.passenger}? "
                f"The fare is guaranteed until {until}. Reply yes or no."
            )
            # The quote is recorded in this turn, so the answering turn can check it.
            return CapabilityResult.needs_confirmation(
                prompt, details=quote, facts=[Fact(quote_key, quote)]
            )
        if ctx.answer.decision != "accept":
            return CapabilityResult(reply=f"OK, {input.offer_id} was not booked.")
        shown = ctx.facts.get(quote_key)
        if shown is None:
            return _not_booked("There is no fare quote on record")
        now = dt.datetime.now(dt.UTC)
        current = airline.quote(input.offer_id, now)
        problem = quote_problem(shown.value, current, ctx.answer.value, now)
        if problem is not None:
            return _not_booked(problem)
        return await _book(ctx, airline, input, shown.value, quote_key)

    return Agent(
        name="travel-example",
        version="1",
        capabilities=[search, book],
        interpreter=interpreter or rules(),
    )


def _not_booked(problem: str) -> CapabilityResult:
    return CapabilityResult(
        value={"booked": False, "reason": problem},
        reply=f"{problem}; nothing was booked. Ask again to book at the current fare.",
    )


async def _book(
    ctx: CapabilityContext,
    airline: FakeAirline,
    input: BookInput,
    quote: Mapping[str, Any],
    quote_key: str,
) -> CapabilityResult:
    async def send(authority: EffectAuthority) -> dict[str, Any]:
        try:
            return await airline.book(
                input.offer_id, input.passenger, quote["price_cents"], authority.idempotency_key
            )
        except FareChanged as exc:
            # A definite refusal: nothing was booked, so a later turn may try again.
            raise EffectNotAppliedError(str(exc)) from exc

    effect = await ctx.run_effect(f"book:{input.offer_id}", send)
    booking = effect.value
    if effect.receipt.turn_id == ctx.turn_id:
        reply = (
            f"Booked {input.offer_id} for {booking['passenger']} at "
            f"{money(booking['price_cents'])} (booking {booking['booking_ref']})."
        )
    else:
        reply = (
            f"{input.offer_id} was already booked in {effect.receipt.turn_id} (booking "
            f"{booking['booking_ref']}); it was not booked again."
        )
    return CapabilityResult(
        value=booking,
        facts=[Fact(f"travel.booking.{input.offer_id}", booking, derived_from=(quote_key,))],
        reply=reply,
    )


def rules() -> RuleInterpreter:
    """Regular expressions standing in for a language model (``--llm`` uses one)."""
    return RuleInterpreter(
        [
            Rule(r"^\s*(yes|y|ok|okay|go ahead|book it)\b", answer="accept"),
            Rule(r"^\s*(no|n|cancel|stop)\b", answer="reject"),
            Rule(
                r"\bflights?\b.*\bfrom\s+(?P<origin>[a-z]{3})\s+to\s+(?P<destination>[a-z]{3})"
                r"\s+on\s+(?P<date>\d{4}-\d{2}-\d{2})",
                capability_id="travel.search",
                input=lambda m: {
                    "origin": m["origin"].upper(),
                    "destination": m["destination"].upper(),
                    "date": m["date"],
                },
            ),
            Rule(
                r"\bbook\s+(?P<offer_id>[a-z0-9]+)\s+for\s+(?P<passenger>.+?)\s*$",
                capability_id="travel.book",
                input=lambda m: {"offer_id": m["offer_id"].upper(), "passenger": m["passenger"]},
            ),
        ],
        fallback_reply="Ask 'find flights from LIS to BER on 2027-03-12' or 'book TP538 for Ada'.",
    )
