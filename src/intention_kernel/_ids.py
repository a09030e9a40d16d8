"""The rules for thread, turn and tenant IDs, in one place.

Every entry that takes an ID from outside checks it here once: ``with_turn`` and the
inspection methods of :class:`~intention_kernel.durability.engine.RecordedDurability`
for the IDs of a turn or a query, the host for the IDs of a request path. The limits
also shape the HTTP host's schema (``maxLength``).
"""

from __future__ import annotations

from intention_kernel.errors import InvalidRequestError

__all__ = ["MAX_ID_BYTES", "MAX_ID_LENGTH", "check_id"]

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
