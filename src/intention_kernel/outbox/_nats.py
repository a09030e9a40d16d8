"""The NATS JetStream sink (extra ``nats``).

Each event goes to ``<prefix>.<event type>`` (so ``intention_kernel.turn.committed``)
with the event ID as the ``Nats-Msg-Id`` header: JetStream drops a message whose ID it
saw within the stream's duplicate window (two minutes by default), so a relay that
republishes after a crash does not duplicate it there. ``publish`` returns once the
stream acknowledged the message.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from intention_kernel.outbox._sinks import event_body
from intention_kernel.turns import OutboxEvent

__all__ = ["NatsSink", "subject_for"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def subject_for(prefix: str, event_type: str) -> str:
    """The subject of an event type: its dot-separated tokens under ``prefix``, with any
    character NATS gives a meaning to (spaces, ``*``, ``>``, ...) replaced by ``_``."""
    tokens = [_UNSAFE.sub("_", token) or "_" for token in event_type.split(".")]
    return ".".join([prefix, *tokens])


class NatsSink:
    """Publishes to NATS JetStream at ``url`` (``nats://127.0.0.1:4222``).

    - ``subject_prefix``: subjects are ``<prefix>.<event type>``.
    - ``stream``: with ``ensure_stream``, the stream is created on first use if it does
      not exist, capturing ``<prefix>.>``; otherwise a stream capturing the subjects
      must exist (JetStream acknowledges only messages a stream stores).
    - ``timeout``: how long to wait for the acknowledgement.
    """

    def __init__(
        self,
        url: str = "nats://127.0.0.1:4222",
        *,
        subject_prefix: str = "intention_kernel",
        stream: str = "INTENTION_KERNEL",
        ensure_stream: bool = True,
        timeout: float = 5.0,
    ) -> None:
        if not subject_prefix or _UNSAFE.sub("", subject_prefix) != subject_prefix:
            raise ValueError(f"not a NATS subject prefix: {subject_prefix!r}")
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
        self._client: Any = None
        self._jetstream: Any = None
        self._connecting = asyncio.Lock()  # threads publish side by side: connect once

    async def _connected(self) -> Any:
        if self._jetstream is not None:
            return self._jetstream
        async with self._connecting:
            if self._jetstream is not None:
                return self._jetstream
            import nats
            from nats.js.errors import NotFoundError

            client = await nats.connect(self.url, connect_timeout=self.timeout)
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
            self._client, self._jetstream = client, jetstream
            return jetstream

    async def publish(self, event: OutboxEvent) -> None:
        jetstream = await self._connected()
        await jetstream.publish(
            subject_for(self.subject_prefix, event.type),
            event_body(event),
            timeout=self.timeout,
            headers={"Nats-Msg-Id": event.id},
        )

    async def aclose(self) -> None:
        client, self._client, self._jetstream = self._client, None, None
        if client is not None:
            await client.close()
