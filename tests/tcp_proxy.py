"""A TCP proxy between an adapter and PostgreSQL, which a test makes misbehave.

The adapter connects to the proxy (:meth:`TcpProxy.dsn`); the proxy forwards bytes both
ways until told to:

- :meth:`TcpProxy.lose_reply_to` — forward the next client message containing a marker
  (say, the commit statement), let the server run it and answer, then drop the answer
  and cut that connection: the server did the work, the client never hears of it;
- :meth:`TcpProxy.down` / :meth:`TcpProxy.up` — cut every connection and refuse new ones
  (the port is closed, as while a server restarts), then listen again on the same port;
- :meth:`TcpProxy.cut` — cut every connection while still accepting new ones.

Unlike a monkeypatched driver call, the adapter sees what it would see from a real
network: a socket closed mid-reply, a refused connection, dead pooled sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["TcpProxy"]

# A ReadyForQuery message ('Z', length 5, one status byte): the server sends it once
# the statement's implicit transaction is over, committed or not.
_READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    swallowing: bool = False  # the reply to the marked message is being dropped
    tail: bytes = b""  # the end of what the client sent, for markers split across reads
    held_reply: bytearray = field(default_factory=bytearray)

    def cut(self) -> None:
        for writer in (self.client, self.server):
            with contextlib.suppress(Exception):
                writer.transport.abort()


class TcpProxy:
    """Listens on a free loopback port and forwards to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._marker: bytes | None = None
        self.port = 0
        #: How many replies :meth:`lose_reply_to` dropped.
        self.lost_replies = 0
        #: How many connections :meth:`cut` and :meth:`down` cut.
        self.cut_links = 0

    @classmethod
    def to(cls, dsn: str) -> TcpProxy:
        params = conninfo_to_dict(dsn)
        return cls(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))

    def dsn(self, dsn: str) -> str:
        """``dsn`` with its host and port replaced by the proxy's."""
        return make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    async def __aenter__(self) -> TcpProxy:
        await self.up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.down()

    async def up(self) -> None:
        """Listen (again, on the same port once it has one)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        """Stop listening and cut every connection: new connections are refused."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self.cut()

    def cut(self) -> None:
        """Cut every connection; new ones are accepted if the proxy is up."""
        for link in list(self._links):
            link.cut()
            self.cut_links += 1
        self._links.clear()

    def lose_reply_to(self, marker: bytes) -> None:
        """Drop the server's reply to the next client message containing ``marker``."""
        self._marker = marker

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, server_writer)
        self._links.add(link)
        try:
            await asyncio.gather(
                self._client_to_server(reader, link), self._server_to_client(server_reader, link)
            )
        finally:
            self._links.discard(link)
            link.cut()

    async def _client_to_server(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                seen = link.tail + data
                if self._marker is not None and self._marker in seen:
                    self._marker = None
                    link.swallowing = True
                link.tail = seen[-256:]
                link.server.write(data)
                await link.server.drain()
        link.cut()

    async def _server_to_client(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if link.swallowing:
                    link.held_reply += data
                    if link.held_reply[-6:-1] == _READY_FOR_QUERY:
                        # The server has finished the statement: the client never hears.
                        self.lost_replies += 1
                        break
                    continue
                link.client.write(data)
                await link.client.drain()
        link.cut()
