"""The relay's sinks: NATS JetStream against the real server (subjects per event type,
the event ID as ``Nats-Msg-Id`` so the broker drops a republished event), and signed
HTTP webhooks with retries (through httpx's mock transport)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from intention_kernel import (
    Agent,
    CapabilityContext,
    Intent,
    Interpretation,
    Kernel,
    OutboxEvent,
    capability,
)
from intention_kernel.outbox import (
    EVENT_ID_HEADER,
    EVENT_TYPE_HEADER,
    SIGNATURE_HEADER,
    NatsError,
    NatsSink,
    OutboxRelay,
    RelayReport,
    WebhookError,
    WebhookSink,
    encode_event_type,
    event_document,
    sign,
    subject_for,
    verify_signature,
)
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import read_all_events

SECRET = "s3cret-shared-with-the-receiver"


async def committed_events(durability: InMemoryDurability) -> list[OutboxEvent]:
    kernel = Kernel(billing_agent(FakeProvider()), durability)
    await kernel.turn("t1", "1", "charge pi_1 500")
    await kernel.turn("t1", "2", "yes")
    await kernel.turn("t2", "1", "balance 3")
    return await read_all_events(durability)


# -- NATS JetStream ---------------------------------------------------------------------------


async def a_pass_the_broker_answers(relay: OutboxRelay) -> RelayReport:
    """One relay pass, repeated while JetStream answers with a server error.

    A loaded broker may fail once to create a stream's store (code 10049).
    The relay retries that attempt as it retries any failed attempt.
    Any other failure ends the loop, so the caller's assertions see it.
    The report counts what every pass published, and the last pass's failures.
    """
    published = 0
    for _ in range(20):
        report = await relay.run_once()
        published += report.published
        failing = (await relay.status()).failing
        if not any("ServerError" in (f.last_error or "") for f in failing):
            break
        await asyncio.sleep(0.25)
    return RelayReport(published, report.failed)


@pytest.fixture
async def jetstream(nats_url: str) -> AsyncIterator[tuple[Any, str, str]]:
    """A JetStream context, and a subject prefix and stream name of this test's own."""
    import nats
    from nats.js.errors import NotFoundError

    client = await nats.connect(nats_url)
    tag = uuid.uuid4().hex[:10]
    prefix, stream = f"ik_test_{tag}", f"IK_TEST_{tag}"
    try:
        yield client.jetstream(), prefix, stream
    finally:
        try:
            await client.jetstream().delete_stream(stream)
        except NotFoundError:
            pass  # the test never created it
        finally:
            await client.close()


def test_subjects_are_the_event_type_under_the_prefix() -> None:
    assert subject_for("billing", "turn.committed") == "billing.turn.committed"
    assert subject_for("billing", "my app.*>..x") == "billing.my_app.__._.x"


@pytest.mark.nats
async def test_the_relay_publishes_to_jetstream_one_subject_per_type_deduplicated_by_id(
    nats_url: str, jetstream: tuple[Any, str, str]
) -> None:
    js, prefix, stream = jetstream
    async with InMemoryDurability() as durability:
        events = await committed_events(durability)
        sink = NatsSink(nats_url, subject_prefix=prefix, stream=stream)  # creates the stream
        async with OutboxRelay(durability, sink, retry_base=0) as relay:
            assert (await a_pass_the_broker_answers(relay)).published == len(events)
            # A relay that crashed before marking republishes: the broker drops it.
            await sink.publish(events[0])
            await sink.publish(replace(events[1], payload={"changed": True}))
    info = await js.stream_info(stream)
    assert info.state.messages == len(events)
    subscription = await js.pull_subscribe(f"{prefix}.>", durable=None, stream=stream)
    messages = await subscription.fetch(len(events), timeout=5)
    for message in messages:
        await message.ack()
    received = [(m.subject, m.headers["Nats-Msg-Id"], json.loads(m.data)) for m in messages]
    for thread in ("t1", "t2"):  # each thread in its order; threads publish side by side
        assert [(s, i, b) for s, i, b in received if b["thread_id"] == thread] == [
            (f"{prefix}.{e.type}", e.id, event_document(e)) for e in events if e.thread_id == thread
        ]


@pytest.mark.nats
async def test_a_missing_stream_is_a_failed_attempt_not_a_lost_event(
    nats_url: str, jetstream: tuple[Any, str, str]
) -> None:
    _, prefix, stream = jetstream
    async with InMemoryDurability() as durability:
        events = await committed_events(durability)
        unrouted = NatsSink(nats_url, subject_prefix=prefix, stream=stream, ensure_stream=False)
        async with OutboxRelay(durability, unrouted, retry_base=0) as relay:
            report = await relay.run_once()
            assert (report.published, report.failed) == (0, 2)  # each thread's first event
            assert (await relay.status()).unpublished == len(events)
        async with OutboxRelay(
            durability, NatsSink(nats_url, subject_prefix=prefix, stream=stream), retry_base=0
        ) as relay:
            assert (await a_pass_the_broker_answers(relay)).published == len(events)


def free_port() -> int:
    """A TCP port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_an_unreachable_nats_server_fails_each_attempt_in_seconds_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    async with InMemoryDurability() as durability:
        events = await committed_events(durability)
        sink = NatsSink(url, reconnect_wait=0.2)
        with caplog.at_level(logging.DEBUG):
            async with OutboxRelay(durability, sink, retry_base=0) as relay:
                started = time.monotonic()
                report = await relay.run_once()
                elapsed = time.monotonic() - started
                failing = (await relay.status()).failing
    # nats-py's defaults took minutes here (60 attempts, 2 s apart, per thread).
    assert elapsed < 15, f"an unreachable server took {elapsed:.1f}s to fail"
    assert (report.published, report.failed) == (0, 2)  # each thread's first event
    assert {d.event.thread_id for d in failing} == {"t1", "t2"}
    for delivery in failing:
        assert delivery.attempts == 1
        assert delivery.last_error is not None
        assert delivery.last_error.startswith(f"NatsError: cannot connect to NATS at {url}")
        assert "ConnectionRefusedError" in delivery.last_error
    assert len(events) > 2
    assert [r for r in caplog.records if r.name.startswith("nats")] == []
    assert [r for r in caplog.records if r.exc_info] == []  # no tracebacks
    outbox = [r for r in caplog.records if r.name == "intention_kernel.outbox"]
    sink_warnings = [r for r in outbox if r.levelno == logging.WARNING and "NATS at" in r.msg]
    assert len(sink_warnings) == 1, [r.getMessage() for r in sink_warnings]
    assert sink_warnings[0].url == url  # type: ignore[attr-defined]
    relay_warnings = [r for r in outbox if r.levelno == logging.WARNING and r not in sink_warnings]
    assert len(relay_warnings) == 2  # one per failed event
    direct = NatsSink(url, reconnect_attempts=1, reconnect_wait=0)
    with pytest.raises(NatsError, match="cannot connect to NATS"):
        await direct.publish(events[0])  # every attempt tries again, and fails again
    with pytest.raises(NatsError, match="cannot connect to NATS"):
        await direct.publish(events[0])
    await direct.aclose()
    with pytest.raises(ValueError, match="reconnect_attempts"):
        NatsSink(url, reconnect_attempts=0)  # nats-py would read it as "forever"


class Proxy:
    """A TCP proxy in front of the NATS server, to cut the sink off and let it back."""

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("nats://").partition(":")
        self.target = (host, int(port))
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self.server is None:
            return  # stopped already: the test failed during its outage
        self.server.close()
        for writer in list(self.pipes):
            writer.close()
        await self.server.wait_closed()
        self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        self.pipes |= {writer, upstream_writer}

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))


@pytest.mark.nats
async def test_a_sink_whose_connection_nats_closed_reconnects_and_delivery_resumes(
    nats_url: str, jetstream: tuple[Any, str, str]
) -> None:
    js, prefix, stream = jetstream
    proxy = Proxy(nats_url)
    await proxy.start()
    sink = NatsSink(
        proxy.url,
        subject_prefix=prefix,
        stream=stream,
        timeout=1.0,
        reconnect_attempts=1,
        reconnect_wait=0.1,
    )
    try:
        async with InMemoryDurability() as durability:
            kernel = Kernel(billing_agent(FakeProvider()), durability)
            await kernel.turn("t1", "1", "balance 1")
            async with OutboxRelay(durability, sink, retry_base=0) as relay:
                first = (await a_pass_the_broker_answers(relay)).published
                assert first > 0
                # An outage longer than the sink's reconnection attempts: nats-py gives up
                # and closes its client for good.
                await proxy.stop()
                await kernel.turn("t1", "2", "balance 2")
                errors: list[str] = []
                for _ in range(50):
                    report = await relay.run_once()
                    assert report.published == 0
                    [failing] = (await relay.status()).failing
                    assert failing.last_error is not None
                    errors.append(failing.last_error)
                    if "cannot connect to NATS" in failing.last_error:
                        break  # the closed client was dropped and a new connection tried
                    await asyncio.sleep(0.1)
                assert "cannot connect to NATS" in errors[-1], errors
                assert all(e.startswith("NatsError: ") for e in errors), errors
                await proxy.start()  # the server is reachable again
                report = await relay.run_once()
                assert (report.published, report.failed) == (
                    len(await read_all_events(durability)) - first,
                    0,
                )
                assert (await relay.status()).unpublished == 0
                total = len(await read_all_events(durability))
    finally:
        await proxy.stop()  # a failed assertion must not leak its sockets into the next test
    info = await js.stream_info(stream)
    assert info.state.messages == total


# -- webhooks ----------------------------------------------------------------------------------


def test_a_signature_verifies_only_for_the_same_body_secret_and_recent_time() -> None:
    body = b'{"id":"evt_1"}'
    header = sign(SECRET, body, 1_700_000_000)
    assert verify_signature(SECRET, body, header, now=1_700_000_100)
    assert not verify_signature(SECRET, body + b" ", header, now=1_700_000_100)
    assert not verify_signature("another secret", body, header, now=1_700_000_100)
    assert not verify_signature(SECRET, body, header, now=1_700_000_000 + 301)  # a replay
    assert not verify_signature(SECRET, body, "t=oops,v1=00", now=1_700_000_000)
    assert not verify_signature(SECRET, body, None)


def test_the_signature_is_hmac_sha256_over_timestamp_dot_body_as_computed_independently() -> None:
    secret, t = b"whsec_test_vector", 1_700_000_000
    body = b'{"id":"evt_1","type":"turn.committed"}'
    digest = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    # The same vector from openssl: printf '1700000000.{"id":"evt_1","type":"turn.committed"}'
    #   | openssl dgst -sha256 -hmac whsec_test_vector
    assert digest == "28a7e19a02b8af95f8d7f3bfbba4bf0a4b8b00eb240f06fc3c8eaead33796543"
    header = f"t={t},v1={digest}"
    assert sign(secret, body, t) == header
    assert sign(secret.decode(), body, t) == header  # a str secret is its UTF-8 bytes
    assert verify_signature(secret, body, header, now=t)
    assert verify_signature(secret, body, header, now=t + 300)  # within the tolerance
    assert verify_signature(secret, body, f"t={t},v1={'0' * 64},v1={digest}", now=t)  # rotation


def test_an_altered_timestamp_or_body_or_an_old_timestamp_is_refused() -> None:
    secret, t = b"whsec_test_vector", 1_700_000_000
    body = b'{"id":"evt_1","type":"turn.committed"}'
    digest = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    # The timestamp moved (a replay made to look fresh), with the captured signature:
    assert not verify_signature(secret, body, f"t={t + 60},v1={digest}", now=t + 60)
    # The body changed by one byte, or was re-serialized:
    header = f"t={t},v1={digest}"
    assert not verify_signature(secret, body.replace(b"evt_1", b"evt_2"), header, now=t)
    assert not verify_signature(secret, json.dumps(json.loads(body)).encode(), header, now=t)
    # A genuine signature, too old (or from too far ahead): refused.
    assert not verify_signature(secret, body, header, now=t + 301)
    assert not verify_signature(secret, body, header, now=t - 301)
    assert not verify_signature(secret, body, header, now=t + 3600, tolerance=600)
    assert not verify_signature(secret, body, f"v1={digest}", now=t)  # no timestamp


async def test_the_sink_signs_the_exact_bytes_it_posts() -> None:
    seen: list[httpx.Request] = []

    def receive(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    sink = WebhookSink(
        "https://hooks.example.test/ik", secret=SECRET, transport=httpx.MockTransport(receive)
    )
    async with InMemoryDurability() as durability:
        events = await committed_events(durability)
    before = int(time.time())
    await sink.publish(events[0])
    await sink.aclose()
    [request] = seen
    fields = dict(part.split("=", 1) for part in request.headers[SIGNATURE_HEADER].split(","))
    t = int(fields["t"])
    assert before <= t <= time.time()
    expected = hmac.new(SECRET.encode(), f"{t}.".encode() + request.content, hashlib.sha256)
    assert fields["v1"] == expected.hexdigest()
    assert json.loads(request.content) == event_document(events[0])


class Endpoint:
    """A webhook receiver behind httpx's mock transport: it answers from a script, and
    verifies what it accepts as a real receiver would."""

    def __init__(self, answers: list[int] | None = None) -> None:
        self.answers = list(answers or [])
        self.accepted: list[dict[str, Any]] = []
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.answers:
            status = self.answers.pop(0)
            return httpx.Response(status, headers={"Retry-After": "0"} if status == 429 else {})
        body = request.content
        assert verify_signature(SECRET, body, request.headers[SIGNATURE_HEADER])
        document = json.loads(body)
        assert request.headers[EVENT_ID_HEADER] == document["id"]
        self.accepted.append(document)
        return httpx.Response(204)


def webhook(endpoint: Endpoint) -> WebhookSink:
    return WebhookSink(
        "https://hooks.example.test/ik",
        secret=SECRET,
        backoff=0.0,
        transport=httpx.MockTransport(endpoint),
    )


class Pauses:
    """The ``sleep`` of a sink under test: records each delay instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def scripted(*answers: int | Exception, retry_after: str | None = None) -> httpx.MockTransport:
    """A transport answering from a script: a status, or an exception raised instead."""
    script = list(answers)

    def answer(request: httpx.Request) -> httpx.Response:
        step = script.pop(0) if script else 204
        if isinstance(step, Exception):
            raise step
        headers = {"Retry-After": retry_after} if retry_after is not None and step != 204 else {}
        return httpx.Response(step, headers=headers)

    return httpx.MockTransport(answer)


async def an_event() -> OutboxEvent:
    async with InMemoryDurability() as durability:
        return (await committed_events(durability))[0]


async def test_a_connection_error_is_retried_after_a_backoff() -> None:
    pauses = Pauses()
    refused = httpx.ConnectError("connection refused")
    sink = WebhookSink(
        "https://hooks.example.test/ik",
        secret=SECRET,
        backoff=2.0,
        transport=scripted(refused, refused),
        sleep=pauses,
    )
    await sink.publish(await an_event())  # the third attempt is acknowledged
    await sink.aclose()
    assert len(pauses.delays) == 2
    assert 1.0 <= pauses.delays[0] <= 2.0 and 2.0 <= pauses.delays[1] <= 4.0


async def test_retries_back_off_exponentially_with_jitter_up_to_max_backoff() -> None:
    pauses = Pauses()
    sink = WebhookSink(
        "https://hooks.example.test/ik",
        secret=SECRET,
        retries=6,
        backoff=1.0,
        max_backoff=10.0,
        transport=scripted(503, 500, 502, 504, 503, 408),
        sleep=pauses,
    )
    await sink.publish(await an_event())
    await sink.aclose()
    ceilings = [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]  # doubling, then capped
    assert len(pauses.delays) == len(ceilings)
    for delay, ceiling in zip(pauses.delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling, pauses.delays


async def test_retry_after_is_honoured_and_capped_at_max_backoff() -> None:
    pauses = Pauses()
    event = await an_event()
    for retry_after, expected in (("3", 3.0), ("120", 10.0), ("0", 0.0)):
        sink = WebhookSink(
            "https://hooks.example.test/ik",
            secret=SECRET,
            max_backoff=10.0,
            transport=scripted(429, retry_after=retry_after),
            sleep=pauses,
        )
        await sink.publish(event)
        await sink.aclose()
        assert pauses.delays.pop() == expected and pauses.delays == []


async def test_the_last_failure_is_raised_once_the_retries_are_spent_and_a_4xx_at_once() -> None:
    pauses = Pauses()
    event = await an_event()
    sink = WebhookSink(
        "https://hooks.example.test/ik",
        secret=SECRET,
        retries=2,
        transport=scripted(500, 500, 503),
        sleep=pauses,
    )
    with pytest.raises(WebhookError) as failed:
        await sink.publish(event)
    assert failed.value.status == 503 and len(pauses.delays) == 2
    await sink.aclose()
    sink = WebhookSink(
        "https://hooks.example.test/ik", secret=SECRET, transport=scripted(404), sleep=pauses
    )
    with pytest.raises(WebhookError, match="answered 404"):
        await sink.publish(event)
    assert len(pauses.delays) == 2  # no retry of a refusal
    await sink.aclose()


async def test_the_relay_posts_each_event_signed_and_retries_server_errors() -> None:
    endpoint = Endpoint(answers=[503, 429])
    async with InMemoryDurability() as durability:
        events = await committed_events(durability)
        async with OutboxRelay(durability, webhook(endpoint)) as relay:
            assert (await relay.run_once()).published == len(events)
    assert endpoint.accepted == [event_document(e) for e in events]
    assert endpoint.requests == len(events) + 2  # the first event took three tries


async def test_a_refused_webhook_fails_at_once_and_blocks_only_its_thread() -> None:
    endpoint = Endpoint(answers=[400])
    sink = webhook(endpoint)
    async with InMemoryDurability() as durability:
        events = await committed_events(durability)
    with pytest.raises(WebhookError) as refused:
        await sink.publish(events[0])
    assert refused.value.status == 400 and endpoint.requests == 1
    endpoint.answers = [500, 500, 500, 500]  # every retry of t1's first event fails
    async with InMemoryDurability() as durability:
        events = await committed_events(durability)
        # One thread at a time, so that t1's four tries get the four errors.
        async with OutboxRelay(durability, sink, concurrency=1) as relay:
            report = await relay.run_once()
            [failing] = (await relay.status()).failing
    assert (report.failed, failing.event.thread_id, failing.last_error) == (
        1,
        "t1",
        "WebhookError: https://hooks.example.test/ik answered 500",
    )
    assert [d["thread_id"] for d in endpoint.accepted] == ["t2"] * sum(
        e.thread_id == "t2" for e in events
    )


#: Event types a capability may emit that are no valid raw header value.
AWKWARD_TYPES = [
    "billing.reçu",
    "billing.line\nbreak",
    "billing.tab\tand\x7fdel",
    " billing.padded ",
    "billing.100%",
    "billing.émoji.🧾",
]


async def test_every_event_type_reaches_a_webhook_in_an_encoded_header() -> None:
    """A type outside visible ASCII goes percent-encoded into its header, so that the
    relay can deliver it (sent raw, the client refused it and the thread's outbox stayed
    blocked behind it); the header decodes back to the body's ``type``."""

    @capability("billing.notes", description="Emits awkward event types")
    async def notes(input: dict[str, Any], ctx: CapabilityContext) -> None:
        for event_type in AWKWARD_TYPES:
            ctx.emit(event_type, {"n": 1})

    interpreter = ScriptedInterpreter({"notes": Interpretation([Intent("billing.notes", {})])})
    agent = Agent(name="notes", version="1", capabilities=[notes], interpreter=interpreter)
    headers: list[str] = []
    endpoint = Endpoint()

    def receive(request: httpx.Request) -> httpx.Response:
        header = request.headers[EVENT_TYPE_HEADER]
        assert header.isascii() and header.isprintable() and header == header.strip()
        assert unquote(header) == json.loads(request.content)["type"]
        headers.append(header)
        return endpoint(request)

    sink = WebhookSink(
        "https://hooks.example.test/ik", secret=SECRET, transport=httpx.MockTransport(receive)
    )
    async with InMemoryDurability() as durability:
        await Kernel(agent, durability).turn("t", "1", "notes")
        events = await read_all_events(durability)
        async with OutboxRelay(durability, sink) as relay:
            report = await relay.run_once()
            assert (report.published, report.failed) == (len(events), 0)
            assert (await relay.status()).unpublished == 0
    assert [d["type"] for d in endpoint.accepted] == [e.type for e in events]
    assert set(AWKWARD_TYPES) <= {d["type"] for d in endpoint.accepted}
    # The kernel's own types, and plain ones, are sent as they are.
    assert "turn.committed" in headers and encode_event_type("billing.charged") == (
        "billing.charged"
    )
    assert encode_event_type("a/b:c_d-e") == "a/b:c_d-e"
    assert encode_event_type("100%") == "100%25"
