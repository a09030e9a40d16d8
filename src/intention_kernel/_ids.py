"""The rules for thread, turn and tenant IDs, in one place.

Every entry that takes an ID from outside checks it here, once.
``with_turn`` checks the IDs of a turn.
The inspection methods of :class:`~intention_kernel.durability._engine.recorded.RecordedDurability`
check the IDs of a query.
The host checks the IDs of a request path.
The limits also shape the HTTP host's schema (``maxLength``).

The kernel makes some IDs itself: receipts (``rcpt_``) and outbox events (``evt_``).
They come from :func:`new_id`: a prefix and 32 hex digits.
That is 128 bits, ordered by time.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable

from intention_kernel.errors import InvalidRequestError

__all__ = ["MAX_ID_BYTES", "MAX_ID_LENGTH", "TimeOrderedIds", "check_id", "new_id"]

#: The longest ID a thread, turn or key may have, in characters.
MAX_ID_LENGTH = 512
#: The longest ID in bytes of UTF-8; IDs are keys of unique indexes.
#: PostgreSQL refuses a btree entry over 2,704 bytes.
#: Two 512-character IDs in ``(thread_id, turn_id)`` could reach 4,096.
MAX_ID_BYTES = 1024


def check_id(name: str, value: object) -> str:
    """Check a thread, turn or tenant ID, and return it.

    An ID is a non-empty string without NUL.
    It has at most 512 characters and 1,024 bytes of UTF-8.
    So it holds no lone surrogate, which UTF-8 cannot encode.
    """
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidRequestError(
            f"{name} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}"
        )
    if "\x00" in value:
        raise InvalidRequestError(f"{name} must not contain NUL characters")
    if not value.isascii():
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidRequestError(
                f"{name} is not valid Unicode text (it holds a lone surrogate)"
            ) from None
        if size > MAX_ID_BYTES:
            raise InvalidRequestError(
                f"{name} is {size} bytes long in UTF-8; the limit is {MAX_ID_BYTES}"
            )
    return value


class TimeOrderedIds:
    """Makes 128-bit IDs that sort by the time they were made, like a UUIDv7.

    An ID is the Unix time in milliseconds (48 bits), then 80 random bits.
    It is written as 32 hex digits.

    Why ordered by time?
    Receipt and event IDs are keys of unique indexes.
    These are ``ik_receipts.id`` and ``ik_outbox.id``, in PostgreSQL too.
    A random key lands on a random page of its index.
    So each commit dirties an old page, and writes it to the WAL.
    A time-ordered key lands on the index's last page.
    The previous commit dirtied that page already.

    Within one generator the IDs strictly increase, so they never repeat.
    An ID made in the millisecond of the one before is that one plus one.
    So is an ID made after the clock stepped back.
    Across processes they are unique by their random bits, as UUIDs are.
    Each millisecond starts with 80 fresh random bits.
    """

    __slots__ = ("__weakref__", "_clock", "_last", "_lock", "_pool", "_used")

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock  # nanoseconds since the Unix epoch
        self._last = 0
        # Turns of one process may run on several threads.
        # Each event loop has one, and so does the SQLite worker.
        # Without the lock, two threads could read the same ``_last``.
        # They would hand out the same ID, or the same random bits.
        self._lock = threading.Lock()
        # Random bits drawn ahead, 80 an ID, and how many IDs used them.
        # One ``urandom`` call fills a pool, instead of one call per ID.
        # Each call releases the GIL.
        # With turns in flight, the thread then waits for the SQLite worker to return it.
        # The pool holds each ID's bits as an int: no conversion per ID.
        # An empty pool counts as used up.
        self._pool: list[int] = []
        self._used = _POOL_IDS
        _generators.add(self)

    def __call__(self, prefix: str) -> str:
        millis = self._clock() // 1_000_000
        with self._lock:
            used = self._used
            if used == _POOL_IDS:
                self._pool = _draw()
                used = 0
            self._used = used + 1
            value = millis << 80 | self._pool[used]
            if value <= self._last:
                value = self._last + 1
            self._last = value
        return f"{prefix}{value:032x}"

    def _forget_pool(self) -> None:
        self._pool = []
        self._used = _POOL_IDS


#: The IDs whose random bits one ``urandom`` call draws.
_POOL_IDS = 64
_RANDOM_MASK = (1 << 80) - 1


def _draw() -> list[int]:
    """The random bits of :data:`_POOL_IDS` IDs, 80 each, from one ``urandom`` call."""
    bits = int.from_bytes(os.urandom(_POOL_IDS * 10))
    return [bits >> shift & _RANDOM_MASK for shift in range(0, _POOL_IDS * 80, 80)]


#: Every generator, so that a forked child drops the bytes drawn ahead.
#: The parent uses those bytes too.
#: The two would make IDs with the same random bits in one millisecond.
_generators: weakref.WeakSet[TimeOrderedIds] = weakref.WeakSet()


def _after_fork() -> None:
    for generator in list(_generators):
        generator._forget_pool()


os.register_at_fork(after_in_child=_after_fork)


#: The process's generator of receipt and event IDs: ``new_id("rcpt_")``.
new_id = TimeOrderedIds()
