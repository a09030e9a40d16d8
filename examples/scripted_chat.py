"""A scripted chat-completions server: ``python -m examples.scripted_chat TRANSCRIPT``.

It answers ``POST /v1/chat/completions`` as an OpenAI-compatible server would, from a
transcript instead of a model, so that an example's ``--llm`` path runs offline, without
a key, and in tests, with the official ``openai`` client pointed at it by ``base_url``::

    .venv/bin/python -m examples.scripted_chat examples/billing/transcript.json --port 8765
    OPENAI_BASE_URL=http://127.0.0.1:8765/v1 OPENAI_MODEL=scripted \\
        .venv/bin/python -m examples.billing --llm

A transcript is JSON: the person's messages in order, each with the model's rounds
for it, tool calls first and the final text last::

    {"turns": [
      {"user": "please pay invoice 42", "rounds": [
        {"tool_calls": [{"name": "billing__balance", "arguments": {"invoice_id": "42"}}]},
        {"tool_calls": [{"name": "payments__charge",
                         "arguments": {"invoice_id": "42", "amount_cents": 12500}}]},
        {"text": "Invoice 42 has $125.00 due; I will charge it once you confirm."}]}]}

The server keeps no state between requests: it reads which answer a request asks for
from the request itself, as a model reads its context. The last ``user`` message
names the turn; the ``user`` messages before it with the same text say which
occurrence of that message this is (the second "yes" of a conversation is the
transcript's second ``"user": "yes"`` entry); the ``assistant`` messages after it say
which round. So a turn delivered again asks for, and gets, the same answers; a
request the transcript has no answer for gets a 400 that says which it was.

A request with ``"stream": true`` gets the same answer as server-sent events of
``chat.completion.chunk`` objects: the text a few words at a time, each tool call in
one chunk, the finish reason last, then ``data: [DONE]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["NoScriptedAnswer", "ScriptedChat", "Transcript", "load_transcript", "serve"]

#: The ``created`` stamp of every completion: the same transcript gives the same bytes.
CREATED = 1_767_225_600


class NoScriptedAnswer(LookupError):
    """The transcript has no answer for this request (it is told to the client as a 400)."""


@dataclass(frozen=True, slots=True)
class Transcript:
    """The model's rounds for each occurrence of each user message, in order."""

    turns: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]

    def answer(self, messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The assistant message for this request's turn, occurrence and round."""
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise NoScriptedAnswer("the request has no user message")
        last = users[-1]
        text = messages[last].get("content")
        occurrence = sum(messages[i].get("content") == text for i in users[:-1])
        round_ = sum(m.get("role") == "assistant" for m in messages[last + 1 :])
        occurrences = self.turns.get(text) if isinstance(text, str) else None
        if not occurrences or occurrence >= len(occurrences):
            raise NoScriptedAnswer(
                f"the transcript has no turn for occurrence {occurrence + 1} of the user "
                f"message {text!r}"
            )
        rounds = occurrences[occurrence]
        if round_ >= len(rounds):
            raise NoScriptedAnswer(
                f"the transcript's turn {text!r} (occurrence {occurrence + 1}) has "
                f"{len(rounds)} rounds; round {round_ + 1} was asked for"
            )
        return _assistant_message(rounds[round_], f"{text}|{occurrence}|{round_}")


def _assistant_message(scripted: Mapping[str, Any], where: str) -> dict[str, Any]:
    # A tool call's ID is unique within a conversation and the same on every request
    # for this round, so a redelivered turn's requests are the same bytes.
    stem = hashlib.sha256(where.encode()).hexdigest()[:12]
    message: dict[str, Any] = {"role": "assistant", "content": scripted.get("text")}
    calls = scripted.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{stem}_{k}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call.get("arguments", {})),
                },
            }
            for k, call in enumerate(calls)
        ]
    return message


def load_transcript(path: str | Path) -> Transcript:
    """Read a transcript file (see the module docstring)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    turns: dict[str, list[list[Mapping[str, Any]]]] = {}
    for turn in data["turns"]:
        rounds = list(turn["rounds"])
        if not rounds or rounds[-1].get("tool_calls"):
            raise ValueError(f"the turn {turn['user']!r} must end with a round of text only")
        turns.setdefault(turn["user"], []).append(rounds)
    return Transcript(turns)


def completion(message: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A ``chat.completion`` body with ``message`` as its only choice."""
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": dict(message),
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
    }


def chunks(message: Mapping[str, Any], model: str) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects a streaming server sends for ``message``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content")
    if isinstance(text, str) and text:
        words = text.split(" ")
        for start in range(0, len(words), 3):
            piece = " ".join(words[start : start + 3])
            out.append(chunk({"content": piece if start == 0 else " " + piece}))
    calls = message.get("tool_calls") or []
    for index, call in enumerate(calls):
        out.append(chunk({"tool_calls": [{"index": index, **call}]}))
    out.append(chunk({}, "tool_calls" if calls else "stop"))
    return out


class ScriptedChat:
    """The server on a loopback port, in a daemon thread; ``requests`` keeps every
    request body it was sent, in order, for a test to read."""

    def __init__(self, transcript: Transcript, host: str = "127.0.0.1", port: int = 0) -> None:
        self.transcript = transcript
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> ScriptedChat:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def wait(self) -> None:
        """Serve until interrupted (the command line)."""
        self._thread.join()

    def _record(self, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(body)


def _handler(chat: ScriptedChat) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._json(400, {"error": {"message": "the request body is not JSON"}})
                return
            chat._record(body)
            model = str(body.get("model", "scripted"))
            try:
                message = chat.transcript.answer(body.get("messages") or [])
            except NoScriptedAnswer as exc:
                self._json(400, {"error": {"message": str(exc), "type": "no_scripted_answer"}})
                return
            if body.get("stream") is True:
                self._events(chunks(message, model))
            else:
                self._json(200, completion(message, model))

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _events(self, events: list[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for event in events:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the example's own output is what a reader follows

    return Handler


@contextmanager
def serve(transcript: Transcript | str | Path, port: int = 0) -> Iterator[ScriptedChat]:
    """The server, started, for a ``with`` block; closed after it."""
    if not isinstance(transcript, Transcript):
        transcript = load_transcript(transcript)
    chat = ScriptedChat(transcript, port=port).start()
    try:
        yield chat
    finally:
        chat.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.scripted_chat", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument(
        "transcript", help="a transcript JSON file, e.g. examples/billing/transcript.json"
    )
    parser.add_argument("--port", type=int, default=8765, help="loopback port (default 8765)")
    args = parser.parse_args(argv)
    with serve(args.transcript, port=args.port) as chat:
        print(f"serving {args.transcript} at {chat.base_url} (Ctrl-C stops)", flush=True)
        with suppress(KeyboardInterrupt):
            chat.wait()


if __name__ == "__main__":
    main()
