"""The NATS JetStream sink (extra ``nats``).

Each event goes to ``<prefix>.<event type>``, so ``intention_kernel.turn.committed``.
The event ID goes in the ``Nats-Msg-Id`` header.
JetStream drops a message whose ID it saw within the stream's duplicate window.
That window is two minutes by default.
So a relay that republishes after a crash does not duplicate the message there.
``publish`` returns once the stream acknowledged the message.

Connections, and why they are bounded:
nats-py's defaults retry a connection 60 times, two seconds apart.
They also log a traceback per attempt.
A relay pointed at a server that is down would hang for minutes in one publish.
Here the relay owns the retrying.
Each failed attempt is recorded on the event and tried again with the relay's backoff.

- A connection is tried ``reconnect_attempts + 1`` times, ``reconnect_wait`` apart.
  Each try has ``connect_timeout``, and a failure raises :class:`NatsError`.
- After an outage longer than that, nats-py closes its client for good.
  The sink then drops it and connects anew on the next publish.
- The first connection error of an outage is logged once at WARNING.
  It goes to the ``intention_kernel.outbox`` logger, never as a traceback.
  The later ones go at DEBUG, until a connection succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from intention_kernel._turns import OutboxEvent
from intention_kernel.outbox._sinks import event_body

__all__ = ["NatsError", "NatsSink", "subject_for"]

logger = logging.getLogger("intention_kernel.outbox")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def subject_for(prefix: str, event_type: str) -> str:
    """The subject of an event type: its dot-separated tokens under ``prefix``, with any
    character NATS gives a meaning to (spaces, ``*``, ``>``, ...) replaced by ``_``."""
    tokens = [_UNSAFE.sub("_", token) or "_" for token in event_type.split(".")]
    return ".".join([prefix, *tokens])


class NatsError(Exception):
    """A publish attempt failed: the server unreachable, the connection lost, no
    acknowledgement in time, or no stream capturing the subject. The relay records
    it on the event and tries again with its backoff."""


class NatsSink:
    """Publishes to NATS JetStream at ``url`` (``nats://127.0.0.1:4222``).

    - ``subject_prefix``: subjects are ``<prefix>.<event type>``.
    - ``stream``: with ``ensure_stream``, the stream is created on first use if missing.
      It captures ``<prefix>.>``.
      A stream that already exists is used as it is.
      It must capture ``<prefix>.>``: JetStream acknowledges only messages a stream stores.
      An event no stream captures fails, and is retried, until one does.
    - ``timeout``: how long to wait for the acknowledgement.
    - ``connect_timeout``: each connection attempt's timeout, in seconds.
    - ``reconnect_attempts``: how many more attempts after the first.
      They apply when connecting, and when the connection drops.
      It is at least 1, as nats-py counts them.
    - ``reconnect_wait``: the pause between attempts, in seconds.
    """

    def __init__(
        self,
        url: str = "nats://127.0.0.1:4222",
        *,
        subject_prefix: str = "intention_kernel",
        stream: str = "INTENTION_KERNEL",
        ensure_stream: bool = True,
        timeout: float = 5.0,
        connect_timeout: float = 2.0,
        reconnect_attempts: int = 2,
        reconnect_wait: float = 1.0,
    ) -> None:
        if not subject_prefix or _UNSAFE.sub("", subject_prefix) != subject_prefix:
            raise ValueError(f"not a NATS subject prefix: {subject_prefix!r}")
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeout and connect_timeout must be positive")
        if reconnect_attempts < 1 or reconnect_wait < 0:
            # nats-py reads 0 attempts as "retry forever", the very thing bounded here.
            raise ValueError("reconnect_attempts must be at least 1, reconnect_wait not negative")
        try:
            import nats  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "NatsSink needs nats-py: pip install 'intention-kernel[nats]'"
            ) from exc
        self.url = url
        self.subject_prefix = subject_prefix
        self.stream = stream
        self.ensure_stream = ensure_stream
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.reconnect_attempts = reconnect_attempts
        self.reconnect_wait = reconnect_wait
        self._client: Any = None
        self._jetstream: Any = None
        # Threads publish side by side: they share one connection attempt (and its
        # failure) instead of queueing to try one each.
        self._connecting: asyncio.Future[Any] | None = None
        self._last_error: BaseException | None = None
        self._warned = False

    async def _connected(self) -> Any:
        client, jetstream = self._client, self._jetstream
        if jetstream is not None and not client.is_closed:
            return jetstream
        if client is not None:  # closed by nats-py after an outage: start again
            self._client = self._jetstream = None
        attempt = self._connecting
        if attempt is None:
            attempt = self._connecting = asyncio.ensure_future(self._connect())
            attempt.add_done_callback(self._connect_done)
        # Shielded: a publisher cancelled meanwhile leaves the attempt to the others.
        return await asyncio.shield(attempt)

    def _connect_done(self, attempt: asyncio.Future[Any]) -> None:
        self._connecting = None
        if not attempt.cancelled():
            attempt.exception()  # retrieved: the publishers awaiting it raise it

    async def _connect(self) -> Any:
        import nats
        from nats.js.errors import NotFoundError

        self._last_error = None
        try:
            client = await nats.connect(
                self.url,
                connect_timeout=self.connect_timeout,
                max_reconnect_attempts=self.reconnect_attempts,
                reconnect_time_wait=self.reconnect_wait,
                error_cb=self._on_error,
                reconnected_cb=self._on_reconnected,
            )
        except Exception as exc:
            cause = self._last_error or exc
            raise NatsError(
                f"cannot connect to NATS at {self.url} "
                f"({self.reconnect_attempts + 1} attempt(s)): {_describe(cause)}"
            ) from exc
        jetstream = client.jetstream(timeout=self.timeout)
        try:
            if self.ensure_stream:
                try:
                    await jetstream.stream_info(self.stream)
                except NotFoundError:
                    await jetstream.add_stream(
                        name=self.stream, subjects=[f"{self.subject_prefix}.>"]
                    )
        except BaseException:
            await client.close()
            raise
        self._warned = False
        self._client, self._jetstream = client, jetstream
        return jetstream

    async def _on_error(self, exc: Exception) -> None:
        # nats-py reports every failed connection attempt here.
        # By default each would be a logged traceback.
        # One line per outage is enough beside the relay's own.
        self._last_error = exc
        if self._warned:
            logger.debug("NATS at %s: %s", self.url, _describe(exc), extra={"url": self.url})
            return
        self._warned = True
        logger.warning(
            "NATS at %s: %s (further connection errors until it is reachable again are "
            "logged at DEBUG)",
            self.url,
            _describe(exc),
            extra={"url": self.url},
        )

    async def _on_reconnected(self) -> None:
        self._warned = False

    async def publish(self, event: OutboxEvent) -> None:
        """Publish to ``<prefix>.<type>``; returns once JetStream acknowledged it."""
        import nats.errors
        from nats.js.errors import NoStreamResponseError

        jetstream = await self._connected()
        subject = subject_for(self.subject_prefix, event.type)
        try:
            await jetstream.publish(
                subject,
                event_body(event),
                timeout=self.timeout,
                headers={"Nats-Msg-Id": event.id},
            )
        except NoStreamResponseError as exc:
            raise NatsError(
                f"no JetStream stream on {self.url} captures {subject!r}: the stream "
                f"{self.stream!r} must capture '{self.subject_prefix}.>'"
            ) from exc
        except nats.errors.ConnectionClosedError as exc:
            raise NatsError(
                f"the connection to NATS at {self.url} closed while publishing; the next "
                "attempt reconnects"
            ) from exc
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            raise NatsError(
                f"NATS at {self.url} did not acknowledge {subject!r} within {self.timeout}s"
            ) from exc

    async def aclose(self) -> None:
        """Close the connection, or stop the attempt to open one."""
        attempt, self._connecting = self._connecting, None
        if attempt is not None:
            attempt.cancel()
        client, self._client, self._jetstream = self._client, None, None
        if client is not None and not client.is_closed:
            await client.close()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
