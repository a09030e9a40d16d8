"""``SyncKernel``: the async kernel's turns, streams and operations from plain threads.

Each test runs on memory, SQLite and PostgreSQL, each opened from its URL, as an
application would. The same script of turns gives what ``Kernel`` gives. 32 threads on
8 conversation threads share one instance. Every turn commits once and each thread's
turns serialize. The stream is a plain iterator of the async stream's events. Errors
keep their types. A call on a thread that runs an event loop is refused. ``close()``
waits for turns in flight. A timeout or ``KeyboardInterrupt`` cancels the turn as
``asyncio`` would.
Forks and a real WSGI server are in ``test_sync_processes.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import datetime
import gc
import inspect
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import (
    Agent,
    Cancellation,
    CompilationError,
    EventLoopRunningError,
    Intent,
    Interpretation,
    InterpretationRequest,
    InvalidRequestError,
    Kernel,
    KernelClosedError,
    Queued,
    ReceiptStateError,
    SyncKernel,
    TurnConflictError,
    TurnEvent,
    TurnResult,
    capability,
)
from intention_kernel.durability import Durability, open_durability
from intention_kernel.testing import InMemoryDurability, ScriptedInterpreter
from intention_kernel.testing._agents import FakeProvider, billing_agent
from proving_support import fresh_store_urls
from sync_support import CrowdProbe, ThreadGate, crowd_agent, gate_agent

# -- stores, by URL ----------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A factory of URLs of fresh, empty stores of one kind: memory, SQLite files,
    PostgreSQL schemas of their own (dropped afterwards)."""
    yield from fresh_store_urls(request, tmp_path, "ik_sync")


# -- the same script, both ways ----------------------------------------------------------------

_ID = re.compile(r"^(ix|rcpt|evt)_[0-9a-f]{32}$")


def _stable(value: Any, names: dict[str, str]) -> Any:
    """``value`` with each generated ID replaced by its order of appearance: two runs
    compare equal when their IDs link the same things."""
    if isinstance(value, dict):
        return {k: _stable(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_stable(v, names) for v in value]
    if isinstance(value, str) and _ID.match(value):
        return names.setdefault(value, f"{value[:3]}#{len(names)}")
    if isinstance(value, datetime.datetime):
        return "<time>"
    return value


LOST = "payments.charge:charge:pi_lost"

#: (method, arguments) in order; a turn's ``turn_id`` doubles as a delivery's identity.
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("turn", {"thread_id": "t1", "turn_id": "1", "message": "charge pi_1 500 and balance"}),
    ("turn", {"thread_id": "t1", "turn_id": "2", "message": "yes"}),
    ("turn", {"thread_id": "t1", "turn_id": "2", "message": "yes"}),  # a redelivery
    ("turn", {"thread_id": "t1", "turn_id": "2", "message": "no"}),  # another request
    ("turn", {"thread_id": "t1", "turn_id": "3", "message": "refund pi_1 100"}),
    ("turn", {"thread_id": "t1", "turn_id": "4", "answer": "accept"}),
    ("turn", {"thread_id": "t2", "turn_id": "1", "message": "charge pi_lost 9"}),
    ("turn", {"thread_id": "t2", "turn_id": "2", "message": "yes"}),  # lost response
    ("turn", {"thread_id": "t2", "turn_id": "3", "message": "charge pi_no 3"}),
    ("turn", {"thread_id": "t2", "turn_id": "4", "message": "yes"}),  # declined
    ("turn", {"thread_id": "t3", "turn_id": "1", "message": "peek and ghost", "tenant_id": "a"}),
    ("turn", {"thread_id": "t3", "turn_id": "2", "message": "balance", "tenant_id": "b"}),
    ("turn", {"thread_id": "t3", "turn_id": "3"}),  # neither message nor answer
    ("turn", {"thread_id": "", "turn_id": "1", "message": "balance"}),
    ("stream_turn", {"thread_id": "t4", "turn_id": "1", "message": "charge pi_4 1 and balance"}),
    ("stream_turn", {"thread_id": "t4", "turn_id": "1", "message": "charge pi_4 1 and balance"}),
    ("stream_turn", {"thread_id": "t4", "turn_id": "1", "message": "balance"}),
    ("list_receipts", {}),
    ("list_receipts", {"status": "uncertain"}),
    ("list_receipts", {"status": "bogus"}),
    ("resolve_receipt", {"thread_id": "t2", "key": LOST, "applied": True, "value": {"ok": 1}}),
    ("resolve_receipt", {"thread_id": "t2", "key": LOST, "applied": False}),
    ("list_receipts", {"thread_id": "t2"}),
    ("read_outbox", {}),
    ("read_outbox", {"thread_id": "t1", "after": 2, "limit": 3}),
    ("checkpoint", {"thread_id": "t1"}),
    ("checkpoint", {"thread_id": "nobody"}),
]  # fmt: skip


def _provider() -> FakeProvider:
    return FakeProvider(behaviour={"pi_lost": "lost_response", "pi_no": "not_applied"})


def _outcome(value: Any) -> Any:
    """What a call returned, as plain data to compare (generated IDs not yet renamed)."""
    if isinstance(value, TurnResult):
        return value.to_dict()
    if isinstance(value, list) and value and isinstance(value[0], TurnEvent):
        return [event.to_dict() for event in value]
    if isinstance(value, list):
        return [_outcome(item) for item in value]
    if value is None:
        return None
    if hasattr(value, "model_dump"):  # a checkpoint
        return value.model_dump(mode="json")
    fields = dataclasses.asdict(value)  # a receipt or an outbox event
    return {k: v for k, v in fields.items() if k not in ("created_at", "updated_at", "resolved_at")}


def _play_sync(url: str) -> list[Any]:
    out: list[Any] = []
    with SyncKernel(billing_agent(_provider()), url) as kernel:
        for method, args in SCRIPT:
            try:
                if method == "stream_turn":
                    out.append(_outcome(list(kernel.stream_turn(**args))))
                else:
                    out.append(_outcome(getattr(kernel, method)(**args)))
            except Exception as error:
                out.append(type(error))
    stable: list[Any] = _stable(out, {})
    return stable


async def _play_async(url: str) -> list[Any]:
    out: list[Any] = []
    async with open_durability(url) as durability:
        kernel = Kernel(billing_agent(_provider()), durability)
        for method, args in SCRIPT:
            try:
                if method == "stream_turn":
                    out.append(_outcome([e async for e in kernel.stream_turn(**args)]))
                elif method in ("turn", "checkpoint"):
                    out.append(_outcome(await getattr(kernel, method)(**args)))
                else:
                    out.append(_outcome(await getattr(durability, method)(**args)))
            except Exception as error:
                out.append(type(error))
    stable: list[Any] = _stable(out, {})
    return stable


def test_a_script_of_turns_and_operations_gives_what_the_async_kernel_gives(
    store_url: Callable[[], str],
) -> None:
    synchronous = _play_sync(store_url())
    asynchronous = asyncio.run(_play_async(store_url()))
    assert synchronous == asynchronous
    # The script reached what it meant to: results, replays, refusals, each kind of step.
    outcomes = dict(zip(range(len(SCRIPT)), synchronous, strict=True))
    assert outcomes[2]["replayed"] is True and outcomes[1]["replayed"] is False
    assert outcomes[3] is TurnConflictError
    assert outcomes[7]["steps"][0]["status"] == "uncertain"
    assert outcomes[9]["steps"][0]["status"] == "failed"
    assert outcomes[11].__name__ == "TenantMismatchError"
    assert outcomes[12] is InvalidRequestError and outcomes[13] is InvalidRequestError
    assert [e["type"] for e in outcomes[15]] == ["result"]  # a replay streams its result
    assert outcomes[16] is TurnConflictError
    assert outcomes[19] is InvalidRequestError
    assert outcomes[20]["status"] == "completed" and outcomes[21] is ReceiptStateError
    assert outcomes[25]["version"] == 4 and outcomes[26] is None


# -- many threads on one instance --------------------------------------------------------------


def test_32_threads_on_8_conversations_commit_each_turn_once_serialized_per_conversation(
    store_url: Callable[[], str],
) -> None:
    probe = CrowdProbe(crowd=4)
    turns_each, callers, conversations = 3, 32, 8
    results: list[TurnResult] = []
    errors: list[BaseException] = []
    start = threading.Barrier(callers)
    with SyncKernel(crowd_agent(probe), store_url()) as kernel:

        def caller(n: int) -> None:
            start.wait()
            try:
                for k in range(turns_each):
                    thread_id = f"conv-{n % conversations}"
                    results.append(kernel.turn(thread_id, f"c{n}-{k}", f"work {n} {k}"))
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        # Each turn once, none replayed, and the checkpoint versions of each conversation
        # are 1..n without a gap or a repeat: its turns ran one after the other.
        assert len(results) == callers * turns_each
        assert not any(r.replayed for r in results)
        per_conversation = callers // conversations * turns_each
        for c in range(conversations):
            versions = sorted(r.checkpoint_version for r in results if r.thread_id == f"conv-{c}")
            assert versions == list(range(1, per_conversation + 1))
            checkpoint = kernel.checkpoint(f"conv-{c}")
            assert checkpoint is not None and checkpoint.version == per_conversation
        committed = [e for e in kernel.read_outbox(limit=1000) if e.type == "turn.committed"]
        assert sorted((e.thread_id, e.turn_id) for e in committed) == sorted(
            (r.thread_id, r.turn_id) for r in results
        )
        # Receipts: one per turn's write, each completed once.
        receipts = kernel.list_receipts()
        assert len(receipts) == len(results) and {r.status for r in receipts} == {"completed"}
        assert all(r.attempt == 1 for r in receipts)
    # Never two turns of one conversation inside a capability at once; turns of
    # different conversations were (the probe waits for a crowd of them).
    assert probe.most_inside_one_conversation == 1
    assert probe.most_conversations_inside >= probe.crowd


# -- streaming ---------------------------------------------------------------------------------


def test_the_stream_is_a_plain_iterator_ending_with_the_committed_result(tmp_path: Path) -> None:
    with SyncKernel(billing_agent(FakeProvider()), f"sqlite:///{tmp_path}/s.db") as kernel:
        events = list(kernel.stream_turn("t", "1", "charge pi_1 5 and balance"))
        assert [e.type for e in events] == ["interaction", "step", "step", "result"]
        again = kernel.turn("t", "1", "charge pi_1 5 and balance")
        assert again.replayed and TurnResult.from_dict(events[-1].data) == dataclasses.replace(
            again, replayed=False
        )


def test_a_stream_closed_after_its_first_event_leaves_a_committed_turn(tmp_path: Path) -> None:
    interpreter = GatedSecondRound()
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=interpreter)
    url = f"sqlite:///{tmp_path}/s.db"
    kernel = SyncKernel(agent, url)
    stream = kernel.stream_turn("t", "1", "balance")
    first = next(stream)
    assert first.type == "step"
    stream.close()
    assert list(stream) == []  # a closed stream ends
    # The turn goes on alone, waiting in its second round; close() waits for it.
    closer = threading.Thread(target=kernel.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()
    interpreter.gate.set()
    closer.join()
    # The turn reached its commit before close() closed the store.
    with SyncKernel(agent, url) as again:
        result = again.turn("t", "1", "balance")
        assert result.replayed and result.reply == "You owe 5."


def test_a_stream_used_as_a_context_manager_closes_when_the_block_ends(tmp_path: Path) -> None:
    interpreter = GatedSecondRound()
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=interpreter)
    with SyncKernel(agent, f"sqlite:///{tmp_path}/s.db") as kernel:
        with kernel.stream_turn("t", "1", "balance") as stream:
            assert next(stream).type == "step"
        with pytest.raises(StopIteration):
            next(stream)
        interpreter.gate.set()
    assert kernel.closed


def test_a_turns_error_raises_from_the_stream_with_its_type(tmp_path: Path) -> None:
    with SyncKernel(billing_agent(FakeProvider()), f"sqlite:///{tmp_path}/s.db") as kernel:
        kernel.turn("t", "1", "balance")
        stream = kernel.stream_turn("t", "1", "charge pi_1 5")
        with pytest.raises(TurnConflictError):
            next(stream)
        with pytest.raises(StopIteration):
            next(stream)  # the stream ended with its error
        with pytest.raises(InvalidRequestError):
            next(kernel.stream_turn("t", "2"))


class GatedSecondRound:
    """Two rounds; the second answers once a plain thread sets ``gate``."""

    multi_round = True

    def __init__(self) -> None:
        self.gate = threading.Event()

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if not request.rounds:
            return Interpretation(intents=[Intent("billing.balance", {"due": 5})])
        while not self.gate.is_set():  # noqa: ASYNC110  (set by a plain thread)
            await asyncio.sleep(0.01)
        return Interpretation(reply="You owe 5.")


# -- errors keep their types; refusals ---------------------------------------------------------


def test_errors_reach_the_caller_with_their_types_and_change_nothing() -> None:
    store = InMemoryDurability()
    agent = billing_agent(FakeProvider())
    twice = dataclasses.replace(agent, capabilities=[*agent.capabilities, *agent.capabilities])
    with pytest.raises(CompilationError):
        SyncKernel(twice, store)
    with pytest.raises(ValueError, match="unknown durability scheme"):
        SyncKernel(billing_agent(FakeProvider()), "mysql://nope")
    with pytest.raises(ValueError, match="timeout"):
        SyncKernel(billing_agent(FakeProvider()), store, timeout=0)
    with SyncKernel(billing_agent(FakeProvider()), store) as kernel:
        with pytest.raises(InvalidRequestError):
            kernel.turn("t", "1", answer="maybe")
        with pytest.raises(InvalidRequestError):
            kernel.read_outbox(limit=0)
        assert kernel.checkpoint("t") is None and kernel.read_outbox() == []


def test_a_call_on_a_thread_running_an_event_loop_is_refused_and_runs_nothing() -> None:
    provider = FakeProvider()
    with SyncKernel(billing_agent(provider), InMemoryDurability()) as kernel:

        async def inside_a_loop() -> None:
            with pytest.raises(EventLoopRunningError, match="await the methods of Kernel"):
                kernel.turn("t", "1", "charge pi_1 5")
            with pytest.raises(EventLoopRunningError):
                next(kernel.stream_turn("t", "1", "balance"))
            with pytest.raises(EventLoopRunningError):
                kernel.close()

        asyncio.run(inside_a_loop())
        assert kernel.checkpoint("t") is None and not kernel.closed


def test_a_capability_that_calls_its_own_sync_kernel_fails_its_step_without_a_deadlock() -> None:
    holder: list[SyncKernel] = []

    @capability("desk.nested", description="Calls the sync kernel from inside a turn")
    async def nested(input: dict[str, Any], ctx: Any) -> Any:
        return holder[0].turn("other", "1", "hello")

    agent = Agent(
        name="nested",
        version="1",
        capabilities=[nested],
        interpreter=ScriptedInterpreter({"go": Interpretation([Intent("desk.nested", {})])}),
    )
    with SyncKernel(agent, InMemoryDurability()) as kernel:
        holder.append(kernel)
        result = kernel.turn("t", "1", "go")
        assert result.steps[0].status == "failed"
        assert "event loop" in (result.steps[0].error or "")


def test_calls_after_close_are_refused_and_close_is_idempotent(tmp_path: Path) -> None:
    kernel = SyncKernel(billing_agent(FakeProvider()), f"sqlite:///{tmp_path}/c.db")
    kernel.turn("t", "1", "balance")
    kernel.close()
    kernel.close()
    for call in (
        lambda: kernel.turn("t", "2", "balance"),
        lambda: kernel.checkpoint("t"),
        lambda: kernel.list_receipts(),
        lambda: next(kernel.stream_turn("t", "2", "balance")),
    ):
        with pytest.raises(KernelClosedError):
            call()


def test_close_waits_for_the_turns_in_flight_then_closes_the_store(tmp_path: Path) -> None:
    gate = ThreadGate()
    url = f"sqlite:///{tmp_path}/c.db"
    kernel = SyncKernel(gate_agent(gate), url)
    done: list[TurnResult] = []
    turn = threading.Thread(target=lambda: done.append(kernel.turn("t", "1", "slow")))
    turn.start()
    gate.entered.wait()  # the write is in flight
    closer = threading.Thread(target=kernel.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive() and done == []  # close() waits for the turn in flight
    assert kernel.closed
    second = threading.Thread(target=kernel.close)
    second.start()
    second.join(0.3)
    assert second.is_alive()  # a second close() returns once the first one did
    with pytest.raises(KernelClosedError):  # and refuses new calls at once
        kernel.turn("t", "2", "other")
    gate.released.set()
    turn.join()
    closer.join()
    second.join()
    assert done[0].steps[0].status == "completed" and gate.calls == 1
    with SyncKernel(gate_agent(gate), url) as again:
        assert again.turn("t", "1", "slow").replayed


# -- timeouts, contexts, collection ------------------------------------------------------------


def test_a_timeout_cancels_the_turn_as_asyncio_would_and_commits_nothing(
    store_url: Callable[[], str],
) -> None:
    gate = ThreadGate()
    # Two seconds: time enough for the write to start on a loaded machine, so that the
    # timeout finds it in flight.
    with SyncKernel(gate_agent(gate), store_url(), timeout=2.0) as kernel:
        with pytest.raises(TimeoutError):
            kernel.turn("t", "1", "slow")
        assert gate.entered.is_set()
        # The write was in flight: its receipt is uncertain, and the turn did not commit.
        (receipt,) = kernel.list_receipts("t")
        assert receipt.status == "uncertain" and kernel.checkpoint("t") is None
        # Delivered again, the turn fails closed: the write is not tried a second time.
        gate.released.set()
        again = kernel.turn("t", "1", "slow")
        assert again.steps[0].status == "uncertain" and gate.calls == 1


def test_a_turn_runs_in_a_copy_of_the_callers_context() -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
    seen: list[str] = []

    def interpret(request: InterpretationRequest) -> Interpretation:
        seen.append(request_id.get())
        return Interpretation(reply="ok")

    agent = dataclasses.replace(
        billing_agent(FakeProvider()), interpreter=ScriptedInterpreter(interpret)
    )
    with SyncKernel(agent, InMemoryDurability()) as kernel:

        def handler(name: str) -> None:
            request_id.set(name)
            kernel.turn("t-" + name, "1", "hi")

        threads = [threading.Thread(target=handler, args=(f"req-{n}",)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(seen) == ["req-0", "req-1", "req-2", "req-3"]


def test_a_kernel_dropped_unclosed_stops_its_loop_thread_when_collected(tmp_path: Path) -> None:
    def loop_threads() -> int:
        return sum(t.name.startswith("intention-kernel-") for t in threading.enumerate())

    before = loop_threads()
    kernel = SyncKernel(billing_agent(FakeProvider()), f"sqlite:///{tmp_path}/g.db")
    kernel.turn("t", "1", "balance")
    assert loop_threads() == before + 1
    del kernel
    gc.collect()
    assert loop_threads() == before


# -- the inbox: submit, cancel, drain ---------------------------------------------------------


class HeldModel:
    """Waits for a plain thread to release it, then asks for two look-ups."""

    def __init__(self) -> None:
        self.thinking, self.done = threading.Event(), threading.Event()

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        self.thinking.set()
        while not self.done.is_set():  # noqa: ASYNC110  (set by a plain thread)
            await asyncio.sleep(0.01)
        return Interpretation(
            intents=[Intent("billing.balance", {"due": 5}), Intent("billing.balance", {"due": 5})]
        )


def test_a_plain_thread_cancels_a_turn_another_thread_runs(
    store_url: Callable[[], str],
) -> None:
    model = HeldModel()
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=model)
    results: list[TurnResult] = []
    with SyncKernel(agent, store_url(), timeout=60) as kernel:
        running = threading.Thread(target=lambda: results.append(kernel.turn("t1", "d1", "owe?")))
        running.start()
        assert model.thinking.wait(30)
        asked = kernel.cancel("t1", "d1", reason="pressed stop")  # from this plain thread
        assert asked == Cancellation("t1", "d1", "requested", "pressed stop")
        model.done.set()
        running.join(60)
        assert not running.is_alive()
        [result] = results
        assert result.steps == ()  # stopped at its first safe point, before a step
        assert "pressed stop" in result.reply
        again = kernel.cancel("t1", "d1")
        assert again.status == "committed"
        assert kernel.turn("t1", "d1", "owe?").replayed  # the cancelled turn committed


def test_submit_queues_behind_a_running_turn_and_drain_runs_the_inbox(
    store_url: Callable[[], str],
) -> None:
    gate = ThreadGate()
    agent = dataclasses.replace(gate_agent(gate), on_busy="queue")
    results: list[TurnResult | Queued] = []
    with SyncKernel(agent, store_url(), timeout=60) as kernel:
        running = threading.Thread(target=lambda: results.append(kernel.submit("t1", "1", "1")))
        running.start()
        assert gate.entered.wait(30)
        assert kernel.submit("t1", "2", "2") == Queued("t1", "2", position=1)
        assert kernel.submit("t1", "3", "3") == Queued("t1", "3", position=2)
        assert kernel.cancel("t1", "3").status == "dequeued"
        gate.released.set()
        running.join(60)
        assert not running.is_alive()
        [first] = results
        assert isinstance(first, TurnResult) and first.checkpoint_version == 1
        kernel.drain("t1")  # waits for the thread; whoever drained, turn 2 committed
        again = kernel.submit("t1", "2", "2")
        assert isinstance(again, TurnResult)
        assert (again.replayed, again.checkpoint_version) == (True, 2)
        checkpoint = kernel.checkpoint("t1")
        assert checkpoint is not None and checkpoint.version == 2  # turn 3 never ran


def test_drain_on_an_agent_that_does_not_queue_runs_its_detached_turns(
    store_url: Callable[[], str],
) -> None:
    kernel = SyncKernel(billing_agent(FakeProvider()), store_url())
    with kernel:
        assert kernel.drain("t1") == []  # nothing detached: nothing ran
        accepted = kernel.detach_turn("t1", "d1", "balance 500")
        assert accepted.turn_id == "d1"
        kernel.drain("t1")
        status = kernel.turn_status("t1", "d1")
        assert status.status == "committed"
        assert status.result is not None and status.result.turn_id == "d1"
        events = list(kernel.watch_turn("t1", "d1"))
        assert [e.type for e in events][-1] == "result"


def test_timers_are_set_listed_fired_and_cancelled_from_plain_code(
    store_url: Callable[[], str],
) -> None:
    now = [datetime.datetime(2026, 12, 5, 9, 0, tzinfo=datetime.UTC)]
    with SyncKernel(billing_agent(FakeProvider()), store_url(), clock=lambda: now[0]) as sync:
        minute = datetime.timedelta(minutes=1)
        timer = sync.schedule("t1", "nudge", after=minute, message="any news?", data={"n": 1})
        assert timer.due_at == now[0] + minute
        sync.schedule("t1", "dropped", after=minute)
        assert sync.cancel_timer("t1", "dropped") is True
        assert sync.cancel_timer("t1", "dropped") is False
        assert [t.key for t in sync.timers("t1", status="pending")] == ["nudge"]
        assert sync.fire_due_timers() == []  # not due yet
        now[0] += minute
        (fired,) = sync.fire_due_timers()
        assert fired.outcome == "fired" and fired.turn_id.startswith("timer:nudge@")
        assert [t.status for t in sync.timers("t1")] == ["fired"]
        assert sync.fire_due_timers() == []  # once
        with pytest.raises(InvalidRequestError):
            sync.schedule("t1", "bad", after=datetime.timedelta(seconds=-1))
        assert [t.key for t in sync.timers()] == ["nudge"]


# -- the twin's surface ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sync_method", "async_method"),
    [
        (SyncKernel.turn, Kernel.turn),
        (SyncKernel.stream_turn, Kernel.stream_turn),
        (SyncKernel.checkpoint, Kernel.checkpoint),
        (SyncKernel.list_receipts, Durability.list_receipts),
        (SyncKernel.resolve_receipt, Durability.resolve_receipt),
        (SyncKernel.read_outbox, Durability.read_outbox),
        (SyncKernel.submit, Kernel.submit),
        (SyncKernel.cancel, Kernel.cancel),
        (SyncKernel.drain, Kernel.drain),
        (SyncKernel.watch_turn, Kernel.watch_turn),
        (SyncKernel.turn_status, Kernel.turn_status),
        (SyncKernel.detach_turn, Kernel.detach_turn),
        (SyncKernel.schedule, Kernel.schedule),
        (SyncKernel.cancel_timer, Kernel.cancel_timer),
        (SyncKernel.timers, Kernel.timers),
        (SyncKernel.fire_due_timers, Kernel.fire_due_timers),
    ],
)
def test_each_sync_method_takes_the_arguments_of_its_async_twin(
    sync_method: Callable[..., Any], async_method: Callable[..., Any]
) -> None:
    # A parameter added to the async method (a new keyword of Kernel.turn) fails this
    # until the twin takes it too.
    def parameters(method: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
        signature = inspect.signature(method)
        return [(p.name, p.kind, p.default) for p in signature.parameters.values()]

    assert parameters(sync_method) == parameters(async_method)


def test_a_kernel_whose_last_reference_drops_on_its_own_loop_closes_without_a_deadlock(
    tmp_path: Path,
) -> None:
    holder: list[SyncKernel] = []
    gate = threading.Event()

    class DropsTheKernel:
        """Round 2 waits for the gate, then drops the last reference to the kernel,
        on the kernel's loop thread: its finalizer runs there."""

        multi_round = True

        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            if not request.rounds:
                return Interpretation(intents=[Intent("billing.balance", {"due": 5})])
            while not gate.is_set():  # noqa: ASYNC110  (set by a plain thread)
                await asyncio.sleep(0.01)
            holder.clear()
            return Interpretation(reply="You owe 5.")

    def loop_threads() -> int:
        return sum(t.name.startswith("intention-kernel-") for t in threading.enumerate())

    before = loop_threads()
    agent = dataclasses.replace(billing_agent(FakeProvider()), interpreter=DropsTheKernel())
    url = f"sqlite:///{tmp_path}/d.db"
    holder.append(SyncKernel(agent, url))
    with holder[0].stream_turn("t", "1", "balance") as stream:
        assert next(stream).type == "step"
    del stream
    gate.set()  # the turn goes on alone, and drops the kernel on the loop thread
    for _ in range(1000):
        if loop_threads() == before:
            break
        threading.Event().wait(0.01)
    assert loop_threads() == before  # the loop shut down instead of waiting on itself
    with SyncKernel(agent, url) as again:
        assert again.turn("t", "1", "balance").replayed  # and the turn had committed


# -- who runs the loop -------------------------------------------------------------------------


def loop_runner_agent(seen: list[int], gate: threading.Event | None = None) -> Agent:
    """One capability that records the thread it runs on, after ``gate`` opens."""

    @capability("desk.where", description="Records the thread the turn runs on")
    async def where(input: dict[str, Any], ctx: Any) -> Any:
        while gate is not None and not gate.is_set():  # noqa: ASYNC110  (a plain thread sets it)
            await asyncio.sleep(0.005)
        seen.append(threading.get_ident())
        return {"ok": True}

    return Agent(
        name="where",
        version="1",
        capabilities=[where],
        interpreter=ScriptedInterpreter({"go": Interpretation([Intent("desk.where", {})])}),
    )


def test_a_lone_caller_runs_its_turn_in_its_own_thread(tmp_path: Path) -> None:
    """With no other call in flight, the turn runs in the calling thread: no hop to the
    loop's thread, whose wake-up was most of the facade's cost."""
    seen: list[int] = []
    with SyncKernel(loop_runner_agent(seen), f"sqlite:///{tmp_path}/l.db") as kernel:
        assert kernel.turn("t", "1", "go").steps[0].status == "completed"
        elsewhere: list[int] = []
        worker = threading.Thread(
            target=lambda: elsewhere.append(kernel.turn("t", "2", "go").checkpoint_version)
        )
        worker.start()
        worker.join(30)
        assert elsewhere == [2]
        loop_thread = kernel._engine.loop._thread.ident  # type: ignore[union-attr]
    assert seen[0] == threading.get_ident() and seen[1] == worker.ident
    assert loop_thread not in seen


def test_a_call_while_another_runs_joins_it_and_the_loop_returns_to_its_callers(
    tmp_path: Path,
) -> None:
    """A second caller's turn runs on the loop the first caller drives; the first turn,
    left running when its neighbour's ended, goes on on the loop's own thread; once
    nothing runs, the next caller drives the loop again."""
    seen: list[int] = []
    gate = threading.Event()
    url = f"sqlite:///{tmp_path}/j.db"
    with SyncKernel(loop_runner_agent(seen, gate), url) as kernel:
        first: list[TurnResult] = []
        holder = threading.Thread(target=lambda: first.append(kernel.turn("a", "1", "go")))
        holder.start()
        for _ in range(1000):  # the holder drives the loop, waiting on the gate
            if kernel._engine.active:
                break
            threading.Event().wait(0.005)
        other: list[TurnResult] = []
        joiner = threading.Thread(target=lambda: other.append(kernel.turn("b", "1", "go")))
        joiner.start()
        threading.Event().wait(0.05)
        gate.set()
        holder.join(30)
        joiner.join(30)
        assert [r.checkpoint_version for r in first + other] == [1, 1]
        # The loop's own thread may still wind down after both callers returned: it
        # lets the loop go once nothing is left to run. Until then a call hops to it.
        loop = kernel._engine.loop
        assert loop is not None
        deadline = time.monotonic() + 30
        while loop._driver is not None:
            assert time.monotonic() < deadline, "the loop's thread never let the loop go"
            threading.Event().wait(0.005)
        seen.clear()
        assert kernel.turn("c", "1", "go").checkpoint_version == 1
        assert seen == [threading.get_ident()]  # this caller drives the loop again


def test_under_another_event_loop_policy_every_call_runs_on_the_loop_thread(
    tmp_path: Path,
) -> None:
    """Only the standard selector loop is driven by its callers: under another policy
    (uvloop's here) each call hops to the kernel's loop thread, as it always did."""
    uvloop = pytest.importorskip("uvloop")
    seen: list[int] = []
    policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        kernel = SyncKernel(loop_runner_agent(seen), f"sqlite:///{tmp_path}/u.db")
        with kernel:
            assert kernel.turn("t", "1", "go").checkpoint_version == 1
            assert kernel.turn("t", "2", "go").checkpoint_version == 2
            loop = kernel._engine.loop
            assert loop is not None and type(loop.loop).__module__.startswith("uvloop")
            assert seen == [loop._thread.ident] * 2
        assert not loop._thread.is_alive()
    finally:
        asyncio.set_event_loop_policy(policy)
