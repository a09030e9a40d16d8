"""A local OpenAI-compatible server that replays recorded chat completions.

``POST /v1/chat/completions`` answers with the next queued recording and keeps
every request body it received, so a test can assert on what the interpreter
sent (tools, names, messages) and on what the kernel did with the answer. A
recording is a JSON file under ``tests/fixtures/openai/``::

    {"status": 200, "body": {...a chat.completion...}}
    {"status": 500, "body": {"error": {...}}}
    {"delay_seconds": 5, "status": 200, "body": {...}}   # a server that is too slow

A request with ``"stream": true`` gets the same recording (a 200 one) as server-sent
events of ``chat.completion.chunk`` objects (:func:`stream_chunks`), as the API streams.
With nothing queued the stub answers 599 and counts it in ``unexpected``. It
listens on a random loopback port in a daemon thread of the test process; code
under test in a subprocess (the examples) reaches it there too.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).with_name("fixtures") / "openai"


def recording(name: str) -> dict[str, Any]:
    """The recording ``tests/fixtures/openai/<name>.json``."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


class OpenAIStub:
    """The replaying server; see the module docstring."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.unexpected = 0
        self._queue: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        # Set at shutdown so that a handler simulating a slow server stops waiting.
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def pending(self) -> int:
        """Recordings queued and not served yet."""
        with self._lock:
            return len(self._queue)

    def queue(self, *names: str) -> None:
        """Serve these recordings, in order, to the next requests."""
        with self._lock:
            self._queue.extend(recording(name) for name in names)

    def queue_data(self, recordings: Iterable[dict[str, Any]]) -> None:
        with self._lock:
            self._queue.extend(recordings)

    def start(self) -> OpenAIStub:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any] | None:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            if not self._queue:
                self.unexpected += 1
                return None
            return self._queue.popleft()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = json.loads(raw)
                answer = stub._next(request, headers)
                if answer is None:
                    self._send(599, {"error": {"message": "the stub has no recording queued"}})
                    return
                delay = float(answer.get("delay_seconds", 0))
                if delay and stub._closing.wait(delay):
                    return
                status = int(answer.get("status", 200))
                if request.get("stream") is True and status == 200:
                    self._send_events(stream_chunks(answer.get("body", {})))
                    return
                self._send(status, answer.get("body", {}))

            def _send_events(self, chunks: list[Any]) -> None:
                """Server-sent events, as the chat-completions API streams: one
                ``data:`` line per chunk, then ``data: [DONE]``."""
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for chunk in chunks:
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:
                    pass
                self.close_connection = True

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a timeout test): nobody is listening

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def stream_chunks(body: Any) -> list[Any]:
    """The ``chat.completion.chunk`` objects a streaming server sends for the completion
    ``body``: the role first, the text in pieces of a few words, each tool call opened
    (index, ID, name) and then its arguments in two pieces, and the finish reason last.
    A body that is not a completion is sent as it is, in one event."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or "message" not in choices[0]:
        return [body]
    head = {k: body[k] for k in ("id", "created", "model") if k in body}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    message = choices[0]["message"]
    chunks = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content")
    if isinstance(text, str):
        words = text.split(" ")
        for start in range(0, len(words), 3):
            piece = " ".join(words[start : start + 3])
            chunks.append(chunk({"content": piece if start == 0 else " " + piece}))
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function", {})
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        opened = {"name": function.get("name"), "arguments": ""}
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call.get("id"),
                            "type": "function",
                            "function": opened,
                        }
                    ]
                }
            )
        )
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, choices[0].get("finish_reason", "stop")))
    return chunks


@contextmanager
def running_stub() -> Iterator[OpenAIStub]:
    stub = OpenAIStub().start()
    try:
        yield stub
    finally:
        stub.close()


def completion(text: str | None = None, *calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    """A recording: a chat completion with ``text`` and tool calls ``(id, name, args)``."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(a)}}
            for cid, name, a in calls
        ]
    return {
        "status": 200,
        "body": {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": 1752140000,
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
        },
    }
