"""The HTTP webhook sink (extra ``webhook``: httpx), and how a receiver verifies it.

Each event is one ``POST`` of :func:`~intention_kernel.outbox.event_body` (JSON) with:

- ``Intention-Kernel-Event-Id``: the event ID (dedupe on it: delivery is at least once).
- ``Intention-Kernel-Event-Type``: the event type, percent-encoded as UTF-8
  (:func:`encode_event_type`).
  Every character outside visible ASCII (``!`` to ``~``) becomes ``%XX`` per byte.
  So does ``%`` itself.
  So any type a capability emits fits in a header.
  The kernel's own types are sent unchanged.
  So are any made of letters, digits and ``._-:/``.
  ``urllib.parse.unquote`` gives the type back.
  The body's ``type`` field is the type as it is, for receivers that read only the body.
- ``Intention-Kernel-Signature: t=<unix seconds>,v1=<hex>``.
  ``v1`` is HMAC-SHA256 with the shared secret over ``"<t>." + body``.
  The body is the exact bytes sent.

A receiver recomputes the HMAC over the raw body, before parsing it.
It compares in constant time.
It refuses a timestamp older than its tolerance (five minutes by default).
So a captured request cannot be replayed later.
:func:`verify_signature` does all three.
Any 2xx answer acknowledges the event.
A connection error, a timeout, 408, 425, 429 or a 5xx is retried with exponential backoff.
``Retry-After`` is honoured, up to ``max_backoff``.
Other answers fail at once.
The relay then records the failure and tries again later.
The thread's later events wait behind it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

from intention_kernel._turns import OutboxEvent
from intention_kernel.outbox._sinks import event_body

__all__ = [
    "EVENT_ID_HEADER",
    "EVENT_TYPE_HEADER",
    "SIGNATURE_HEADER",
    "WebhookError",
    "WebhookSink",
    "encode_event_type",
    "sign",
    "verify_signature",
]

#: The header that carries ``t=<unix time>,v1=<HMAC-SHA256 hex>`` of a request.
SIGNATURE_HEADER = "Intention-Kernel-Signature"
#: The header that carries the event's ID: receivers dedupe on it.
EVENT_ID_HEADER = "Intention-Kernel-Event-Id"
#: The header that carries the event's type, percent-encoded as UTF-8.
EVENT_TYPE_HEADER = "Intention-Kernel-Event-Type"
_RETRYABLE = frozenset({408, 425, 429})


class WebhookError(Exception):
    """The endpoint did not acknowledge the event; ``status`` is its answer, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


#: What a header value may hold as it is: visible ASCII, less ``%`` (the escape itself).
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def encode_event_type(event_type: str) -> str:
    """The ``Intention-Kernel-Event-Type`` header value of ``event_type``.

    It is percent-encoded UTF-8 outside visible ASCII, and for ``%``.
    ``urllib.parse.unquote`` reverses it.
    Some types cannot be sent raw.
    A space at either end, a control character or a non-ASCII letter is one.
    The HTTP client refuses such a type, or it is mangled on the way.
    The relay would then retry that event for good.
    It would hold back its thread's later events for good, too.
    """
    return quote(event_type, safe=_HEADER_SAFE, errors="backslashreplace")


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def sign(secret: str | bytes, body: bytes, timestamp: int) -> str:
    """The signature header value for ``body`` sent at ``timestamp`` (Unix seconds)."""
    digest = hmac.new(_key(secret), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify_signature(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    *,
    tolerance: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether ``header`` is a valid signature of ``body`` made within ``tolerance``
    seconds of ``now`` (default: the current time). Use the raw request body."""
    if not header:
        return False
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        fields.setdefault(name, []).append(value)
    try:
        timestamp = int(fields["t"][0])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = sign(secret, body, timestamp).rpartition("v1=")[2]
    return any(hmac.compare_digest(expected, candidate) for candidate in fields.get("v1", ()))


class WebhookSink:
    """POSTs each event to ``url``, signed with ``secret``.

    - ``timeout``: per request, in seconds.
    - ``retries``: further attempts after a retryable failure, ``backoff`` seconds
      apart at first and doubling (with jitter) up to ``max_backoff``.
    - ``headers``: added to every request (an ``Authorization`` header, say).
    - ``transport``: an ``httpx`` transport (``httpx.MockTransport`` in tests).
    - ``sleep``: how the sink waits between attempts (``asyncio.sleep``; tests pass a
      function that records the delays instead).

    The n-th retry waits ``backoff * 2**(n-1)`` seconds, capped at ``max_backoff``.
    That wait is multiplied by a jitter in ``[0.5, 1]``.
    An answer with ``Retry-After`` waits what it says, capped at ``max_backoff`` too.
    """

    def __init__(
        self,
        url: str,
        *,
        secret: str | bytes,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        headers: Mapping[str, str] | None = None,
        transport: Any = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        try:
            import httpx
        except ImportError as exc:
            raise ImportError(
                "WebhookSink needs httpx: pip install 'intention-kernel[webhook]'"
            ) from exc
        if not secret:
            raise ValueError("a webhook needs a shared secret to sign its requests")
        if retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError("retries, backoff and max_backoff must not be negative")
        self.url = url
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._secret = _key(secret)
        self._headers = dict(headers or {})
        self._sleep = sleep
        self._client = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def publish(self, event: OutboxEvent) -> None:
        """POST the signed event; retry connection errors, 408, 425, 429 and 5xx."""
        import httpx

        body = event_body(event)
        wait = self.backoff
        for attempt in range(self.retries + 1):
            headers = {
                **self._headers,
                "Content-Type": "application/json",
                EVENT_ID_HEADER: event.id,
                EVENT_TYPE_HEADER: encode_event_type(event.type),
                SIGNATURE_HEADER: sign(self._secret, body, int(time.time())),
            }
            retry_after: float | None = None
            try:
                response = await self._client.post(self.url, content=body, headers=headers)
            except httpx.TransportError as exc:  # connection refused, reset, timed out
                failure = WebhookError(f"{self.url}: {type(exc).__name__}: {exc}")
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return
                failure = WebhookError(f"{self.url} answered {status}", status)
                if status not in _RETRYABLE and status < 500:
                    raise failure
                retry_after = _seconds(response.headers.get("Retry-After"))
            if attempt == self.retries:
                raise failure
            pause = retry_after if retry_after is not None else wait * random.uniform(0.5, 1.0)
            await self._sleep(min(pause, self.max_backoff))
            wait = min(wait * 2, self.max_backoff)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()


def _seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the HTTP-date form is not used by webhook receivers)."""
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None
