"""The rules for thread, turn and tenant IDs, in one place.

Every entry that takes an ID from outside checks it here once: ``with_turn`` and the
inspection methods of :class:`~intention_kernel.durability.engine.RecordedDurability`
for the IDs of a turn or a query, the host for the IDs of a request path. The limits
also shape the HTTP host's schema (``maxLength``).

The IDs the kernel makes itself (receipts ``rcpt_``, outbox events ``evt_``) come from
:func:`new_id`: a prefix and 32 hex digits, 128 bits, time-ordered.
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
#: IDs are keys of unique indexes; PostgreSQL refuses a btree entry over 2,704 bytes,
#: and ``(thread_id, turn_id)`` of two 512-character IDs could reach 4,096.
MAX_ID_BYTES = 1024


def check_id(name: str, value: object) -> str:
    """Thread, turn and tenant IDs: non-empty strings without NUL, at most 512 characters
    and 1,024 bytes of UTF-8 (so no lone surrogate, which UTF-8 cannot encode)."""
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
    """Makes 128-bit IDs that sort by the time they were made, like a UUIDv7: the
    Unix time in milliseconds (48 bits), then 80 random bits, as 32 hex digits.

    Why time-ordered: receipt and event IDs are keys of unique indexes (``ik_receipts.id``,
    ``ik_outbox.id``, PostgreSQL's too). A random key lands on a random page of its
    index, so each commit dirties (and writes to the WAL) an old page; a time-ordered
    one lands on the index's last page, which the previous commit dirtied already.

    Within one generator the IDs strictly increase, so they never repeat: an ID made
    in the millisecond of the one before (or after the clock stepped back) is that
    one plus one. Across processes they are unique by their random bits, as UUIDs are:
    80 fresh random bits start each millisecond.
    """

    __slots__ = ("__weakref__", "_clock", "_last", "_lock", "_pool", "_used")

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock  # nanoseconds since the Unix epoch
        self._last = 0
        # Turns of one process may run on several threads (an event loop each, the
        # SQLite worker). Without the lock, two threads could read the same ``_last``
        # and hand out the same ID in one millisecond, or the same random bits.
        self._lock = threading.Lock()
        # Random bytes drawn ahead, 10 an ID, and how many are used. One ``urandom``
        # call per pool, not per ID: each call releases the GIL, and with turns in
        # flight the thread then waits for the SQLite worker to hand it back.
        self._pool = b""
        self._used = 0
        _generators.add(self)

    def __call__(self, prefix: str) -> str:
        millis = self._clock() // 1_000_000
        with self._lock:
            used, pool = self._used, self._pool
            if used == len(pool):
                pool = self._pool = os.urandom(_POOL_BYTES)
                used = 0
            self._used = used + 10
            value = millis << 80 | int.from_bytes(pool[used : used + 10])
            if value <= self._last:
                value = self._last + 1
            self._last = value
        return f"{prefix}{value:032x}"

    def _forget_pool(self) -> None:
        self._pool = b""
        self._used = 0


#: The random bytes one ``urandom`` call draws: the random bits of 64 IDs.
_POOL_BYTES = 640

#: Every generator, so that a forked child drops the bytes drawn ahead: the parent uses
#: them too, and the two would make IDs with the same random bits in one millisecond.
_generators: weakref.WeakSet[TimeOrderedIds] = weakref.WeakSet()


def _after_fork() -> None:
    for generator in list(_generators):
        generator._forget_pool()


os.register_at_fork(after_in_child=_after_fork)


#: The process's generator of receipt and event IDs: ``new_id("rcpt_")``.
new_id = TimeOrderedIds()
