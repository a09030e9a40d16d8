"""Resumable turn streams: each event's ID, its record by round, and watching a turn.

A streamed turn's events are cut into segments at its recorded rounds. Segment N holds
what happened after round N-1 was recorded (the steps it asked for) and the text of
round N. The journal entry of round N is written with segment N, in one transaction
(``tx.recorded(..., stream=...)``). A store keeps segments after the turn's commit.

An event's ID is ``"<segment>.<sequence>.<delivery>"``; ``delivery`` names the run of
the turn that produced it. The last event, ``result``, has the ID ``"result"``.

What happens after the last recorded round is recorded by the commit alone: the
``result`` holds its text and steps. A watcher so sees the recorded segments, then
``result``. A redelivery after a crash streams the recorded segments as they were
recorded, with their IDs. It does not stream the steps it runs again for them. The
text of a round its delivery never recorded was provisional. A resume from one of its
IDs gets that segment again from its start, as the next delivery recorded it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from intention_kernel._streaming import TurnEvent, TurnEventType, TurnSink
from intention_kernel._turns import TurnResult, decode_result
from intention_kernel.durability._contract.ownership import owns
from intention_kernel.durability._contract.records import StoredStream, StoredTurn
from intention_kernel.errors import InvalidRequestError, TenantMismatchError, TurnExpiredError

__all__ = ["After", "Recording", "TurnStatus", "decode_segment", "parse_after", "watch"]

#: Loads a turn's stored segments, by number: the delivery and its events.
Loader = Callable[[], Awaitable[dict[int, tuple[str, list[TurnEvent]]]]]


class Recording:
    """One delivery's side of a turn's stream: IDs, the current segment, its events.

    ``load`` reads the segments stored so far. It is called once, at the first round
    taken from the journal (a redelivery). A first delivery never calls it.
    """

    __slots__ = ("_load", "_pending", "_seq", "_stored", "segment", "token")

    def __init__(self, load: Loader | None = None) -> None:
        self._load = load
        self.token = os.urandom(4).hex()
        self.segment = 1
        self._seq = 0
        self._pending: list[TurnEvent] = []
        # The stored segments, once a redelivery read them; their events are not new.
        self._stored: dict[int, tuple[str, list[TurnEvent]]] | None = None

    def stamp(self, type: TurnEventType, data: Any) -> TurnEvent | None:
        """The event with its ID, kept for the record.

        It is ``None`` for an event of a segment already stored: a redelivery's step
        that ran again."""
        stored = self._stored
        if stored is not None and self.segment in stored:
            return None
        event = TurnEvent(type, data, f"{self.segment}.{self._seq}.{self.token}")
        self._seq += 1
        self._pending.append(event)
        return event

    def segment_text(self) -> tuple[int, str]:
        """The current segment as a store keeps it: its number and JSON text."""
        events = [{"id": e.id, "type": e.type, "data": e.data} for e in self._pending]
        text = json.dumps({"delivery": self.token, "events": events}, ensure_ascii=False)
        return self.segment, text

    def advance(self) -> None:
        """The current segment was recorded: the next one begins."""
        self.segment += 1
        self._seq = 0
        self._pending = []

    async def replay(self, sink: TurnSink, reply: str | None) -> None:
        """A round taken from the journal: stream its segment as recorded, then go on.

        A segment no one recorded (the round's delivery was not streamed) is shown as
        the round's text, one ``delta``."""
        if self._stored is None:
            self._stored = await self._load() if self._load is not None else {}
        found = self._stored.get(self.segment)
        if found is not None:
            for event in found[1]:
                sink.offer(event)
        elif reply:
            sink.delta(reply)
        self.advance()


def decode_segment(text: str) -> tuple[str, list[TurnEvent]]:
    """A stored segment's delivery and events."""
    doc = json.loads(text)
    events = [TurnEvent(e["type"], e["data"], e["id"]) for e in doc["events"]]
    return str(doc["delivery"]), events


@dataclass(frozen=True, slots=True)
class After:
    """Where a resumed stream starts: after the event with this ID."""

    segment: int
    seq: int
    delivery: str
    end: bool = False

    def before(self, event: TurnEvent) -> bool:
        """Whether ``event`` comes after this position in the stream."""
        if self.end:
            return False
        if event.id == "result" or event.id is None:
            return event.id == "result"
        segment, seq, delivery = _split(event.id)
        if segment != self.segment:
            return segment > self.segment
        # Another delivery's version of the segment: this client saw a provisional one.
        return delivery != self.delivery or seq > self.seq


def parse_after(after: str | None) -> After | None:
    """The position an event ID names, or ``InvalidRequestError`` for one that names
    none."""
    if after is None:
        return None
    if not isinstance(after, str):
        raise InvalidRequestError(f"an event ID must be a string, got {type(after).__name__}")
    if after == "result":
        return After(0, 0, "", end=True)
    try:
        segment, seq, delivery = _split(after)
    except ValueError:
        raise InvalidRequestError(
            f"{after[:80]!r} is not an event ID of a turn stream ('<round>.<seq>.<delivery>')"
        ) from None
    return After(segment, seq, delivery)


def _split(event_id: str) -> tuple[int, int, str]:
    segment, seq, delivery = event_id.split(".")
    if not (segment.isdigit() and seq.isdigit() and delivery.isalnum() and len(delivery) <= 32):
        raise ValueError(event_id)
    return int(segment), int(seq), delivery


async def watch(
    read: Callable[[], Awaitable[tuple[dict[str, Any] | None, tuple[tuple[int, str], ...]]]],
    after: After | None,
    *,
    poll: float,
    wake: Callable[[], asyncio.Event | None],
) -> AsyncIterator[TurnEvent]:
    """The turn's stream from the store, after ``after``: every recorded segment as it
    comes, then ``result`` once the turn committed.

    ``read()`` gives the committed result (``None`` before) and the stored segments.
    Between reads it waits ``poll`` seconds, or less when ``wake()`` (the event of a
    turn this process runs) is set. Nothing is buffered beyond one read."""
    next_segment = after.segment if after is not None and not after.end else 1
    if after is not None and after.end:
        return
    while True:
        woken = wake()  # taken before the read: a change after it sets this one
        result, segments = await read()
        for number, text in segments:
            if number < next_segment:
                continue
            _, events = decode_segment(text)
            for event in events:
                if after is None or after.before(event):
                    yield event
            next_segment = number + 1
        if result is not None:
            yield TurnEvent("result", result, "result")
            return
        if woken is None:
            await asyncio.sleep(poll)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), poll)


@dataclass(frozen=True, slots=True)
class TurnStatus:
    """Where a turn is (:meth:`Kernel.turn_status <intention_kernel.Kernel.turn_status>`).

    ``status`` is one of:

    - ``"queued"``: accepted, waiting in its thread's inbox.
    - ``"running"``: a round of it is recorded, or this process runs it.
    - ``"committed"``: ``result`` holds its result.
    - ``"unknown"``: this store knows nothing of it yet. A turn of one round that runs
      in another process is not seen before its commit.
    """

    thread_id: str
    turn_id: str
    status: Literal["queued", "running", "committed", "unknown"]
    result: TurnResult | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict; ``result`` as ``TurnResult.to_dict()`` or ``None``."""
        return {
            "thread_id": self.thread_id,
            "turn_id": self.turn_id,
            "status": self.status,
            "result": self.result.to_dict() if self.result is not None else None,
        }


def stream_store(durability: Any) -> Any:
    """The durability if it keeps turn streams, else ``None``."""
    return durability if getattr(durability, "has_streams", False) is True else None


def loader(store: Any, thread_id: str, turn_id: str) -> Loader:
    """Reads the segments a turn's earlier deliveries stored (for :class:`Recording`)."""

    async def load() -> dict[int, tuple[str, list[TurnEvent]]]:
        found: StoredStream = await store.read_stream(thread_id, turn_id)
        return {number: decode_segment(text) for number, text in found.segments}

    return load


def committed_result(stored: StoredTurn, thread_id: str, turn_id: str) -> TurnResult:
    """A committed turn's result as a watcher reads it (``replayed=True``)."""
    if stored.expired:
        raise TurnExpiredError(
            f"turn {turn_id!r} of thread {thread_id!r} was committed, and its result has "
            "since been pruned",
            thread_id=thread_id,
            turn_id=turn_id,
        )
    return decode_result(stored.result, replayed=True, thread_id=thread_id)


async def check_owner(store: Any, thread_id: str, turn_id: str, tenant_id: str | None) -> None:
    """Refuse a watcher of another tenant's thread (``TenantMismatchError``)."""
    owner = await store.thread_owner(thread_id)
    if not owns(owner, tenant_id):
        raise TenantMismatchError(
            f"thread {thread_id!r} does not belong to tenant {tenant_id!r}",
            thread_id=thread_id,
            turn_id=turn_id,
        )


async def watch_store(
    store: Any,
    thread_id: str,
    turn_id: str,
    after: After | None,
    *,
    tenant_id: str | None,
    poll: float,
    wake: Callable[[], asyncio.Event | None],
) -> AsyncIterator[TurnEvent]:
    """:func:`watch` over a store's ``read_stream``, after the tenant check."""
    await check_owner(store, thread_id, turn_id, tenant_id)

    async def read() -> tuple[dict[str, Any] | None, tuple[tuple[int, str], ...]]:
        found: StoredStream = await store.read_stream(thread_id, turn_id)
        if found.turn is None:
            return None, found.segments
        return committed_result(found.turn, thread_id, turn_id).to_dict(), found.segments

    async for event in watch(read, after, poll=poll, wake=wake):
        yield event


async def status_of(
    store: Any, thread_id: str, turn_id: str, *, tenant_id: str | None, live: bool
) -> tuple[TurnStatus, bool]:
    """The turn's :class:`TurnStatus`, and whether it waits in its thread's inbox;
    ``live``: this process runs it now."""
    await check_owner(store, thread_id, turn_id, tenant_id)
    found: StoredStream = await store.read_stream(thread_id, turn_id)
    if found.turn is not None:
        result = committed_result(found.turn, thread_id, turn_id)
        return TurnStatus(thread_id, turn_id, "committed", result), False
    queued = False
    if getattr(store, "has_inbox", False) is True:
        entries = await store.read_inbox(thread_id)
        queued = any(entry.turn_id == turn_id for entry in entries)
    if found.segments or live:
        return TurnStatus(thread_id, turn_id, "running"), queued
    return TurnStatus(thread_id, turn_id, "queued" if queued else "unknown"), queued
