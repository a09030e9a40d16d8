"""A model check: random conversations against a reference model, on every adapter.

Hypothesis drives a :class:`~hypothesis.stateful.RuleBasedStateMachine` through
random sequences of turns on two threads: proposals of a confirmed charge,
acceptances whose provider call succeeds, is declined (not applied) or loses its
response, rejections, questions, redeliveries of old turn IDs (with the same
request, and with another one), operator reconciliations (valid and refused),
turns that crash at a fault point (``"raise"`` faults) and their later
redelivery, and adapter restarts. A small reference model, written from the
source document's rules and nothing else, predicts each turn's result, and after
every step the store must agree with it: results, receipts, checkpoint (version,
pending confirmation, agenda, facts), outbox and the provider's ledger.

The run is bounded for CI by the hypothesis profile (``tests/conftest.py``):
deterministic in CI, fresh examples on every local run; ``--hypothesis-profile=
thorough`` explores far more.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from intention_kernel import (
    Kernel,
    ReceiptNotFoundError,
    ReceiptStateError,
    TurnConflictError,
    TurnResult,
)
from intention_kernel.durability import Durability
from intention_kernel.testing import InMemoryDurability, faults
from intention_kernel.testing.agents import billing_agent
from proving_support import LedgerProvider, Store, charge_key, drop_schema, new_schema

T = TypeVar("T")

THREADS = ("a", "b")
PAYMENT_INTENTS = ("pi_1", "pi_2", "pi_3")
BEHAVIOURS = ("ok", "ok", "not_applied", "lost_response")
ALWAYS_REACHED = (
    faults.AFTER_LOCK,
    faults.AFTER_CHECKPOINT_LOAD,
    faults.BEFORE_COMMIT,
    faults.DURING_COMMIT,
    faults.AFTER_COMMIT,
)
REACHED_WHEN_CALLING = (
    faults.AFTER_RECEIPT_PREPARED,
    faults.IN_PROVIDER_AFTER_WRITE,
    faults.AFTER_RECEIPT_COMPLETED,
)


# -- the reference model ---------------------------------------------------------------------


@dataclass
class ReceiptModel:
    status: str
    attempt: int
    value: Any
    turn_id: str
    announced: bool = False  # a committed event announced the applied write


@dataclass
class ThreadModel:
    """What the source document says a thread holds after the turns so far."""

    version: int = 0
    pending: tuple[str, int] | None = None  # the charge awaiting confirmation
    receipts: dict[str, ReceiptModel] = field(default_factory=dict)
    facts: dict[str, tuple[Any, int]] = field(default_factory=dict)  # key -> (value, version)
    committed: dict[str, tuple[str, dict[str, Any] | None]] = field(default_factory=dict)
    in_doubt: list[str] = field(default_factory=list)  # crashed deliveries, uncommitted
    events: int = 0
    turns: int = 0

    def record_fact(self, key: str, value: Any) -> None:
        version = self.facts[key][1] + 1 if key in self.facts else 1
        self.facts[key] = (value, version)


@dataclass
class Expected:
    """One turn's predicted outcome: step statuses and values, and its event types."""

    steps: list[tuple[str, Any]]
    events: list[str]
    pending: tuple[str, int] | None


# -- the machine -----------------------------------------------------------------------------


class Harness:
    """One event loop and one store for a whole test; one adapter per example."""

    def __init__(self, store: Store | None, ledger: Path) -> None:
        self.store = store
        self.ledger = ledger
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def open(self) -> Durability:
        durability = InMemoryDurability() if self.store is None else self.store.durability()
        self.run(durability.__aenter__())
        return durability

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


class ConversationMachine(RuleBasedStateMachine):
    harness: Harness  # set by the test before running

    def __init__(self) -> None:
        super().__init__()
        self.prefix = uuid.uuid4().hex[:8]  # examples share the store, never a thread
        self.provider = LedgerProvider(path=str(self.harness.ledger), sync=False)
        self.durability = self.harness.open()
        self.kernel = Kernel(billing_agent(self.provider), self.durability)
        self.threads = {name: ThreadModel() for name in THREADS}
        self.ledger: list[str] = []

    def teardown(self) -> None:
        faults.clear()
        self.harness.run(self.durability.aclose())

    # -- helpers ---------------------------------------------------------------------------

    def tid(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def new_turn(self, name: str) -> str:
        model = self.threads[name]
        model.turns += 1
        return f"turn-{model.turns}"

    def deliver(self, name: str, turn_id: str, message: str) -> TurnResult:
        return self.harness.run(self.kernel.turn(self.tid(name), turn_id, message))

    def commit(
        self, name: str, turn_id: str, message: str, result: TurnResult | None, expected: Expected
    ) -> None:
        """Fold a committed turn into the model, checking its result and its events."""
        model = self.threads[name]
        model.version += 1
        model.pending = expected.pending
        model.events += len(expected.events)
        model.committed[turn_id] = (message, result.to_dict() if result else None)
        if turn_id in model.in_doubt:
            model.in_doubt.remove(turn_id)
        if result is not None:
            assert not result.replayed
            assert result.checkpoint_version == model.version
            assert [(s.status, s.value) for s in result.steps] == expected.steps, result
            if expected.pending is None:
                assert result.interaction is None
            else:
                assert result.interaction is not None
                pi, amount = expected.pending
                assert result.interaction.input == {"payment_intent_id": pi, "amount": amount}
        events = self.harness.run(self.durability.read_outbox(self.tid(name), limit=1000))
        assert [e.type for e in events if e.turn_id == turn_id] == expected.events

    # -- what the source document says each turn does ----------------------------------------

    def expect_accept(self, name: str, turn_id: str, behaviour: str) -> Expected:
        """Accepting: the pending charge runs exactly once per key, whatever came before."""
        model = self.threads[name]
        if model.pending is None:
            return Expected([], ["turn.committed"], None)
        pi, amount = model.pending
        key = charge_key(pi)
        receipt = model.receipts.get(key)
        events = ["interaction.resolved"]
        if receipt is None or receipt.status == "failed":
            attempt = receipt.attempt + 1 if receipt else 1
            if behaviour == "not_applied":
                model.receipts[key] = ReceiptModel("failed", attempt, None, turn_id)
                return Expected(
                    [("failed", None)], [*events, "effect.failed", "turn.committed"], None
                )
            self.ledger.append(key)
            if behaviour == "lost_response":
                model.receipts[key] = ReceiptModel("uncertain", attempt, None, turn_id)
                return Expected(
                    [("uncertain", None)], [*events, "effect.uncertain", "turn.committed"], None
                )
            value = {"charge_id": f"ch_{pi}_{attempt}", "amount": amount}
            receipt = model.receipts[key] = ReceiptModel("completed", attempt, value, turn_id)
            receipt.announced = True
            events.append("effect.completed")
        elif receipt.status in ("uncertain", "prepared"):
            receipt.status = "uncertain"  # a dead attempt's "prepared" fails closed
            return Expected(
                [("uncertain", None)], [*events, "effect.uncertain", "turn.committed"], None
            )
        elif not receipt.announced:  # completed by a turn that never committed: announce it
            receipt.announced = True
            events.append("effect.completed")
        model.record_fact(f"charge.{pi}", receipt.value)
        events += ["fact.recorded", "billing.charged", "turn.committed"]
        return Expected([("completed", receipt.value)], events, None)

    # -- rules -----------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(THREADS),
        pi=st.sampled_from(PAYMENT_INTENTS),
        amount=st.sampled_from([100, 250]),
    )
    def propose(self, name: str, pi: str, amount: int) -> None:
        model = self.threads[name]
        turn_id, message = self.new_turn(name), f"charge {pi} {amount}"
        superseded = ["interaction.resolved"] if model.pending else []
        result = self.deliver(name, turn_id, message)
        expected = Expected(
            [("awaiting_confirmation", None)],
            [*superseded, "interaction.opened", "turn.committed"],
            (pi, amount),
        )
        self.commit(name, turn_id, message, result, expected)

    @rule(
        name=st.sampled_from(THREADS),
        pi=st.sampled_from(PAYMENT_INTENTS),
        amount=st.sampled_from([100, 250]),
        behaviour=st.sampled_from(BEHAVIOURS),
    )
    def charge(self, name: str, pi: str, amount: int, behaviour: str) -> None:
        """The common conversation: propose a charge, then accept it."""
        self.propose(name, pi, amount)
        self.accept(name, behaviour)

    @rule(name=st.sampled_from(THREADS), behaviour=st.sampled_from(BEHAVIOURS))
    def accept(self, name: str, behaviour: str) -> None:
        turn_id = self.new_turn(name)
        pending = self.threads[name].pending
        if pending is not None:
            self.provider.behaviour[pending[0]] = behaviour  # type: ignore[assignment]
        expected = self.expect_accept(name, turn_id, behaviour)
        result = self.deliver(name, turn_id, "yes")
        self.commit(name, turn_id, "yes", result, expected)

    @rule(name=st.sampled_from(THREADS))
    def reject(self, name: str) -> None:
        model = self.threads[name]
        turn_id = self.new_turn(name)
        result = self.deliver(name, turn_id, "no")
        if model.pending is None:
            expected = Expected([], ["turn.committed"], None)
        else:
            expected = Expected(
                [("rejected", None)], ["interaction.resolved", "turn.committed"], None
            )
        self.commit(name, turn_id, "no", result, expected)

    @rule(name=st.sampled_from(THREADS), due=st.integers(1, 9999))
    def ask_balance(self, name: str, due: int) -> None:
        model = self.threads[name]
        turn_id, message = self.new_turn(name), f"balance {due}"
        result = self.deliver(name, turn_id, message)
        model.record_fact("balance", due)
        expected = Expected(
            [("completed", {"due": due})], ["fact.recorded", "turn.committed"], model.pending
        )
        self.commit(name, turn_id, message, result, expected)

    @precondition(lambda self: any(m.committed for m in self.threads.values()))
    @rule(data=st.data(), elsewhere=st.booleans())
    def redeliver(self, data: st.DataObject, elsewhere: bool) -> None:
        """A transport retry, maybe to another worker: the stored result, nothing runs."""
        if elsewhere:
            self.restart()
        name = data.draw(st.sampled_from([n for n in THREADS if self.threads[n].committed]))
        model = self.threads[name]
        turn_id = data.draw(st.sampled_from(sorted(model.committed)))
        message, stored = model.committed[turn_id]
        calls = len(self.provider.ledger)
        replayed = self.deliver(name, turn_id, message)
        assert replayed.replayed
        if stored is None:  # committed by a turn that crashed before answering
            model.committed[turn_id] = (message, dict(replayed.to_dict(), replayed=False))
        else:
            assert replayed.to_dict() == dict(stored, replayed=True)
        assert len(self.provider.ledger) == calls

    @precondition(lambda self: any(m.committed for m in self.threads.values()))
    @rule(data=st.data())
    def redeliver_another_request(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([n for n in THREADS if self.threads[n].committed]))
        turn_id = data.draw(st.sampled_from(sorted(self.threads[name].committed)))
        message = self.threads[name].committed[turn_id][0]
        with pytest.raises(TurnConflictError):
            self.deliver(name, turn_id, "balance 1" if message != "balance 1" else "no")

    def resolvable(self) -> list[tuple[str, str]]:
        """(thread, key) of every receipt an operator may resolve: uncertain, or prepared
        by an attempt that died."""
        return [
            (name, key)
            for name in THREADS
            for key, r in sorted(self.threads[name].receipts.items())
            if r.status in ("uncertain", "prepared")
        ]

    @precondition(lambda self: self.resolvable())
    @rule(data=st.data(), applied=st.booleans())
    def reconcile(self, data: st.DataObject, applied: bool) -> None:
        """An operator resolves an uncertain receipt from the provider's records."""
        name, key = data.draw(st.sampled_from(self.resolvable()))
        value = {"charge_id": "ch_found_by_ops", "amount": 1} if applied else None
        resolved = self.harness.run(
            self.durability.resolve_receipt(self.tid(name), key, applied=applied, value=value)
        )
        receipt = self.threads[name].receipts[key]
        receipt.status, receipt.value = ("completed", value) if applied else ("failed", None)
        receipt.announced = applied  # by the receipt.resolved event
        assert (resolved.status, resolved.attempt, resolved.value) == (
            receipt.status,
            receipt.attempt,
            receipt.value,
        )
        self.threads[name].events += 1  # receipt.resolved

    @rule(name=st.sampled_from(THREADS), pi=st.sampled_from(PAYMENT_INTENTS))
    def reconcile_refused(self, name: str, pi: str) -> None:
        """Any other receipt (completed, failed, or none at all) cannot be resolved."""
        if (name, charge_key(pi)) in self.resolvable():
            return
        receipt = self.threads[name].receipts.get(charge_key(pi))
        error = ReceiptNotFoundError if receipt is None else ReceiptStateError
        with pytest.raises(error):
            self.harness.run(
                self.durability.resolve_receipt(self.tid(name), charge_key(pi), applied=True)
            )

    @rule(name=st.sampled_from(THREADS), point=st.sampled_from(faults.POINTS))
    def crash_while_accepting(self, name: str, point: str) -> None:
        """The accepting turn dies at a fault point (the provider would have succeeded)."""
        if point == faults.DURING_COMMIT and self.harness.store is None:
            point = faults.BEFORE_COMMIT  # the in-memory commit has no "during"
        model = self.threads[name]
        pi = model.pending[0] if model.pending else None
        receipt = model.receipts.get(charge_key(pi)) if pi else None
        calls_provider = pi is not None and (receipt is None or receipt.status == "failed")
        turn_id = self.new_turn(name)
        if pi is not None:
            self.provider.behaviour[pi] = "ok"
        with faults.injected(point, "raise") as fault:
            if point in ALWAYS_REACHED or calls_provider:
                with pytest.raises(faults.InjectedFault):
                    self.deliver(name, turn_id, "yes")
                assert fault.fired == 1
            else:  # the point is never reached: the turn runs normally
                expected = self.expect_accept(name, turn_id, "ok")
                self.commit(name, turn_id, "yes", self.deliver(name, turn_id, "yes"), expected)
                assert fault.fired == 0
                return
        if point == faults.AFTER_COMMIT:
            expected = self.expect_accept(name, turn_id, "ok")
            self.commit(name, turn_id, "yes", None, expected)
            return
        model.in_doubt.append(turn_id)
        if point in (faults.AFTER_LOCK, faults.AFTER_CHECKPOINT_LOAD):
            return
        if not calls_provider:  # the effect was decided from its receipt, before the point
            if receipt is not None and receipt.status == "prepared":
                receipt.status = "uncertain"  # a dead attempt's "prepared" fails closed
            return
        assert pi is not None and model.pending is not None
        key = charge_key(pi)
        attempt = receipt.attempt + 1 if receipt else 1
        if point == faults.AFTER_RECEIPT_PREPARED:
            model.receipts[key] = ReceiptModel("prepared", attempt, None, turn_id)
            return
        self.ledger.append(key)
        if point == faults.IN_PROVIDER_AFTER_WRITE:
            model.receipts[key] = ReceiptModel("prepared", attempt, None, turn_id)
            return
        value = {"charge_id": f"ch_{pi}_{attempt}", "amount": model.pending[1]}
        model.receipts[key] = ReceiptModel("completed", attempt, value, turn_id)

    @precondition(lambda self: any(m.in_doubt for m in self.threads.values()))
    @rule(data=st.data(), elsewhere=st.booleans())
    def redeliver_a_crashed_turn(self, data: st.DataObject, elsewhere: bool) -> None:
        """The crashed delivery arrives again, maybe at another worker: it runs now, against
        the thread as it is."""
        if elsewhere:
            self.restart()
        name = data.draw(st.sampled_from([n for n in THREADS if self.threads[n].in_doubt]))
        turn_id = data.draw(st.sampled_from(self.threads[name].in_doubt))
        pending = self.threads[name].pending
        if pending is not None:
            self.provider.behaviour[pending[0]] = "ok"
        expected = self.expect_accept(name, turn_id, "ok")
        self.commit(name, turn_id, "yes", self.deliver(name, turn_id, "yes"), expected)

    def restart(self) -> None:
        """A new adapter on the same store: nothing may live only in the old one's memory."""
        if self.harness.store is None:
            return  # the in-memory adapter's state is the instance
        self.harness.run(self.durability.aclose())
        self.durability = self.harness.open()
        self.kernel = Kernel(billing_agent(self.provider), self.durability)

    # -- after every step ------------------------------------------------------------------

    @invariant()
    def the_store_agrees_with_the_model(self) -> None:
        assert self.provider.ledger == self.ledger  # each key at most once, never behind
        for name, model in self.threads.items():
            thread_id = self.tid(name)
            checkpoint = self.harness.run(self.durability.load_checkpoint(thread_id))
            if model.version == 0:
                assert checkpoint is None
            else:
                assert checkpoint is not None and checkpoint.version == model.version
                if model.pending is None:
                    assert checkpoint.interaction is None and checkpoint.agenda == ()
                else:
                    pi, amount = model.pending
                    assert checkpoint.interaction is not None
                    assert checkpoint.interaction.input == {
                        "payment_intent_id": pi,
                        "amount": amount,
                    }
                    assert [a.interaction_id for a in checkpoint.agenda] == [
                        checkpoint.interaction.id
                    ]
                facts = {key: (r.value, r.version) for key, r in checkpoint.facts.items()}
                assert facts == model.facts
                # The checkpoint's receipt index: one entry per key, none of another thread.
                index = [r.key for r in checkpoint.receipts]
                assert len(index) == len(set(index)), f"a key indexed twice: {index}"
                assert set(index) <= set(model.receipts)
            receipts = self.harness.run(self.durability.list_receipts(thread_id))
            assert {r.key: (str(r.status), r.attempt, r.value, r.announced) for r in receipts} == {
                key: (r.status, r.attempt, r.value, r.announced)
                for key, r in model.receipts.items()
            }
            events = self.harness.run(self.durability.read_outbox(thread_id, limit=1000))
            assert len(events) == model.events
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert {e.turn_id for e in events} <= {*model.committed, None}
            committed = [e.turn_id for e in events if e.type == "turn.committed"]
            assert sorted(committed) == sorted(model.committed)


# -- one test per adapter --------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    store: Store | None = None
    schema = ""
    if request.param == "sqlite":
        store = Store("sqlite", str(tmp_path / "model.db"))
    elif request.param == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        schema = new_schema()
        store = Store("postgres", dsn, schema)
    harness = Harness(store, tmp_path / "provider.ledger")
    yield harness
    harness.close()
    if schema:
        drop_schema(store.location, schema)  # type: ignore[union-attr]


def test_random_conversations_match_the_reference_model(harness: Harness) -> None:
    machine: Callable[[], ConversationMachine] = type(  # a subclass bound to this store
        "Machine", (ConversationMachine,), {"harness": harness}
    )
    run_state_machine_as_test(machine, settings=settings())
