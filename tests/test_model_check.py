"""A model check: random conversations against a reference model, on every adapter.

Hypothesis drives a :class:`~hypothesis.stateful.RuleBasedStateMachine` through
random sequences of turns on two threads. The turns propose a confirmed charge. They
accept one, and its provider call succeeds, is declined (not applied) or loses its
response. They reject, and they ask questions. They redeliver old turn IDs, with the
same request and with another one. They run operator reconciliations, valid and
refused. Some crash at a fault point (``"raise"`` faults) and are redelivered later.
Adapters restart as well. A small reference model, written from the
source document's rules and nothing else, predicts each turn's result, and after
every step the store must agree with it, field by field:

- each result: its steps (capability, status, value), reply, recorded facts
  (key, value, version), checkpoint version and pending confirmation; a turn that
  died after its commit is checked when its redelivery replays it.
- the checkpoint: version, pending confirmation and agenda, facts, the bounded
  messages (both sides of every committed turn, the last ``MAX_MESSAGES``), and the
  receipt index (keys, statuses and turns, in recency order, the last
  ``MAX_RECEIPTS``), all exactly.
- the receipts (status, attempt, value, announced), the provider's ledger, and the
  whole outbox of each thread: every event's type, turn and the payload fields a
  consumer relies on (``fact.recorded`` key and version, ``effect.*`` key, attempt,
  status, ``turn.committed`` version and steps, ...).

Rules are weighted towards the paths a uniform walk seldom takes. One is a crash
inside the provider window of a charge that would call the provider. Another is an
acceptance that meets a dead attempt's ``prepared`` receipt. A third is a crash right
after committing a charge. The run records which (fault point, path) combinations it
met. The test fails if one of :func:`required_paths` never occurred. So a budget or a
rule change cannot quietly stop exploring them.

The run is bounded for CI by the hypothesis profile (``tests/conftest.py``):
deterministic in CI, fresh examples on every local run; ``--hypothesis-profile=
thorough`` explores far more.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
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
from intention_kernel._turns import OutboxEvent
from intention_kernel.durability import Durability
from intention_kernel.testing import InMemoryDurability, faults
from intention_kernel.testing._agents import billing_agent
from proving_support import LedgerProvider, Store, charge_key, drop_schema, new_schema

T = TypeVar("T")

THREADS = ("a", "b")
PAYMENT_INTENTS = ("pi_1", "pi_2", "pi_3")
BEHAVIOURS = ("ok", "ok", "not_applied", "lost_response")
MAX_MESSAGES = 6  # small, so that every example bounds the conversation
MAX_RECEIPTS = 2  # smaller than the payment intents, so that the index is bounded too
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
CALLS = "calls the provider"  # the path of an acceptance whose charge reaches the provider

CHARGE = "payments.charge"
BALANCE = "billing.balance"
NOTHING_PENDING = "There is nothing waiting for an answer, so nothing was done."
UNCERTAIN_REPLY = (
    "Charge a payment intent: I could not tell whether this went through, so it will not be "
    "tried again until someone has checked it."
)
NOT_APPLIED_REPLY = "Charge a payment intent: this did not go through. You can ask again."
CANCELLED_REPLY = "Cancelled: nothing was done."

# The payload fields of each event type that the model predicts (the others are IDs).
PAYLOAD_FIELDS = {
    "turn.committed": ("version", "steps"),
    "interaction.opened": ("kind", "capability_id", "prompt"),
    "interaction.resolved": ("capability_id", "resolution"),
    "fact.recorded": ("key", "version"),
    "effect.completed": ("key", "attempt", "status"),
    "effect.failed": ("key", "attempt", "status", "attempted"),
    "effect.uncertain": ("key", "attempt", "status", "attempted"),
    "billing.charged": ("payment_intent_id",),
    "receipt.resolved": ("key", "applied", "status", "previous_status"),
}

Event = tuple[str | None, str, dict[str, Any]]  # turn, type, predicted payload fields


def project(event: OutboxEvent) -> Event:
    payload = {name: event.payload[name] for name in PAYLOAD_FIELDS[event.type]}
    if event.type == "turn.committed":
        payload["steps"] = [(s["capability_id"], s["status"]) for s in payload["steps"]]
    return event.turn_id, event.type, payload


def prompt(pi: str, amount: int) -> str:
    return f"Charge {amount} to {pi}?"


def summary(result: TurnResult) -> dict[str, Any]:
    """What the model predicts of a result."""
    return {
        "version": result.checkpoint_version,
        "reply": result.reply,
        "steps": [(s.capability_id, str(s.status), s.value) for s in result.steps],
        "facts": [(f.key, f.value, f.version) for f in result.facts],
        "pending": None if result.interaction is None else result.interaction.input,
    }


# -- the reference model ---------------------------------------------------------------------


@dataclass
class ReceiptModel:
    status: str
    attempt: int
    value: Any
    turn_id: str  # the turn of the receipt's latest attempt
    announced: bool = False  # a committed event announced the applied write


@dataclass
class Committed:
    message: str
    expected: dict[str, Any]  # the result's summary, as the model predicted it
    result: dict[str, Any] | None  # the result as first returned; None if never returned


@dataclass
class ThreadModel:
    """What the source document says a thread holds after the turns so far."""

    version: int = 0
    pending: tuple[str, int] | None = None  # the charge awaiting confirmation
    receipts: dict[str, ReceiptModel] = field(default_factory=dict)
    index: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (status, turn)
    facts: dict[str, tuple[Any, int]] = field(default_factory=dict)  # key -> (value, version)
    messages: list[tuple[str, str, str]] = field(default_factory=list)  # role, content, turn
    committed: dict[str, Committed] = field(default_factory=dict)
    in_doubt: list[str] = field(default_factory=list)  # crashed deliveries, uncommitted
    events: list[Event] = field(default_factory=list)
    turns: int = 0


@dataclass
class Expected:
    """One turn's predicted outcome, before its commit. ``noted``: the receipts its steps
    touched, in order; ``facts``: (key, value) recorded; ``events``: all but the final
    ``turn.committed``."""

    pending: tuple[str, int] | None
    steps: list[tuple[str, str, Any]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    facts: list[tuple[str, Any]] = field(default_factory=list)
    noted: list[str] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


# -- the machine -----------------------------------------------------------------------------


class Harness:
    """One event loop and one store for a whole test; one adapter per example. ``paths``
    counts the (rule or fault point, path) combinations met over the whole run."""

    def __init__(self, store: Store | None, ledger: Path) -> None:
        self.store = store
        self.ledger = ledger
        self.loop = asyncio.new_event_loop()
        self.paths: Counter[tuple[str, str]] = Counter()
        self.steps = 0

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def open(self) -> Durability:
        durability = InMemoryDurability() if self.store is None else self.store.durability()
        self.run(durability.__aenter__())
        return durability

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


def required_paths(store: Store | None) -> set[tuple[str, str]]:
    """What every run must have met at least once.

    It must meet a death at every fault point of an acceptance that calls the provider.
    The in-memory commit has no "during". It must meet every state an acceptance can
    meet. It must replay a turn that died after its commit. It must meet both
    reconciliations."""
    crashes = [p for p in faults.POINTS if store is not None or p != faults.DURING_COMMIT]
    return {
        *((point, CALLS) for point in crashes),
        ("accept", "new"),
        ("accept", "failed: retried"),
        ("accept", "completed: deduplicated"),
        ("accept", "completed by a turn that never committed"),
        ("accept", "uncertain: fails closed"),
        ("accept", "prepared by a dead attempt: fails closed"),
        ("accept", "nothing pending"),
        ("redeliver", "a turn that died after its commit"),
        ("reconcile", "applied"),
        ("reconcile", "not applied"),
    }


def dies_at(point: str) -> Callable[..., None]:
    """A scenario rule: :meth:`ConversationMachine.charge_that_dies` at ``point``."""

    @precondition(lambda self: self.fresh_charges())
    @rule(data=st.data(), then=st.sampled_from(BEHAVIOURS))
    def scenario(self: ConversationMachine, data: st.DataObject, then: str) -> None:
        self.charge_that_dies(*self.draw_a_fresh_charge(data), point, then)

    scenario.__name__ = scenario.__qualname__ = f"a_charge_dies_at_{point}"
    return scenario


class ConversationMachine(RuleBasedStateMachine):
    harness: Harness  # set by the test before running

    def __init__(self) -> None:
        super().__init__()
        self.prefix = uuid.uuid4().hex[:8]  # examples share the store, never a thread
        self.provider = LedgerProvider(path=str(self.harness.ledger), sync=False)
        self.durability = self.harness.open()
        self.kernel = self.new_kernel()
        self.threads = {name: ThreadModel() for name in THREADS}
        self.ledger: list[str] = []

    def teardown(self) -> None:
        faults.clear()
        self.harness.run(self.durability.aclose())

    # -- helpers ---------------------------------------------------------------------------

    def new_kernel(self) -> Kernel:
        agent = billing_agent(self.provider, max_messages=MAX_MESSAGES, max_receipts=MAX_RECEIPTS)
        return Kernel(agent, self.durability)

    def met(self, what: str, path: str) -> None:
        """Count a (rule or fault point, path) combination this run met."""
        self.harness.paths[(what, path)] += 1

    def tid(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def new_turn(self, name: str) -> str:
        model = self.threads[name]
        model.turns += 1
        return f"turn-{model.turns}"

    def deliver(self, name: str, turn_id: str, message: str) -> TurnResult:
        return self.harness.run(self.kernel.turn(self.tid(name), turn_id, message))

    def record_fact(self, model: ThreadModel, key: str, value: Any, expected: Expected) -> None:
        version = model.facts[key][1] + 1 if key in model.facts else 1
        model.facts[key] = (value, version)
        expected.facts.append((key, value))
        expected.events.append(("fact.recorded", {"key": key, "version": version}))

    def commit(
        self, name: str, turn_id: str, message: str, result: TurnResult | None, expected: Expected
    ) -> None:
        """Fold a committed turn into the model, and check its result (if it returned one)
        and its events."""
        model = self.threads[name]
        model.version += 1
        model.pending = expected.pending
        reply = "\n".join(expected.replies) or "Sorry, I could not find anything to do for that."
        predicted = {
            "version": model.version,
            "reply": reply,
            "steps": expected.steps,
            "facts": [(k, v, model.facts[k][1]) for k, v in expected.facts],
            "pending": None
            if expected.pending is None
            else {"payment_intent_id": expected.pending[0], "amount": expected.pending[1]},
        }
        steps = [(capability, status) for capability, status, _ in expected.steps]
        events: list[Event] = [(turn_id, t, p) for t, p in expected.events]
        events.append((turn_id, "turn.committed", {"version": model.version, "steps": steps}))
        model.events.extend(events)
        model.messages += [("user", message, turn_id), ("assistant", reply, turn_id)]
        del model.messages[:-MAX_MESSAGES]
        for key in expected.noted:
            receipt = model.receipts[key]
            model.index.pop(key, None)  # the index keeps recency order
            model.index[key] = (receipt.status, receipt.turn_id)
        for key in list(model.index)[:-MAX_RECEIPTS]:
            del model.index[key]
        model.committed[turn_id] = Committed(
            message, predicted, result.to_dict() if result is not None else None
        )
        if turn_id in model.in_doubt:
            model.in_doubt.remove(turn_id)
        if result is not None:
            assert not result.replayed
            assert summary(result) == predicted, result
        outbox = self.harness.run(self.durability.read_outbox(self.tid(name), limit=1000))
        assert [project(e) for e in outbox if e.turn_id == turn_id] == events

    # -- what the source document says each turn does ----------------------------------------

    def expect_accept(self, name: str, turn_id: str, behaviour: str) -> Expected:
        """Accepting: the pending charge runs exactly once per key, whatever came before."""
        model = self.threads[name]
        if model.pending is None:
            self.met("accept", "nothing pending")
            return Expected(None, replies=[NOTHING_PENDING])
        pi, amount = model.pending
        key = charge_key(pi)
        receipt = model.receipts.get(key)
        expected = Expected(None, noted=[key])
        expected.events.append(
            ("interaction.resolved", {"capability_id": CHARGE, "resolution": "accepted"})
        )

        def effect(status: str, receipt: ReceiptModel) -> None:
            payload: dict[str, Any] = {"key": key, "attempt": receipt.attempt, "status": status}
            if status != "completed":
                payload["attempted"] = receipt.turn_id == turn_id
            expected.events.append((f"effect.{status}", payload))

        if receipt is None or receipt.status == "failed":
            self.met("accept", "new" if receipt is None else "failed: retried")
            attempt = receipt.attempt + 1 if receipt else 1
            if behaviour == "not_applied":
                receipt = model.receipts[key] = ReceiptModel("failed", attempt, None, turn_id)
                effect("failed", receipt)
                expected.steps.append((CHARGE, "failed", None))
                expected.replies.append(NOT_APPLIED_REPLY)
                return expected
            self.ledger.append(key)
            if behaviour == "lost_response":
                receipt = model.receipts[key] = ReceiptModel("uncertain", attempt, None, turn_id)
                effect("uncertain", receipt)
                expected.steps.append((CHARGE, "uncertain", None))
                expected.replies.append(UNCERTAIN_REPLY)
                return expected
            value = {"charge_id": f"ch_{pi}_{attempt}", "amount": amount}
            receipt = model.receipts[key] = ReceiptModel("completed", attempt, value, turn_id)
            receipt.announced = True
            effect("completed", receipt)
        elif receipt.status in ("uncertain", "prepared"):
            self.met(
                "accept",
                "uncertain: fails closed"
                if receipt.status == "uncertain"
                else "prepared by a dead attempt: fails closed",
            )
            receipt.status = "uncertain"  # a dead attempt's "prepared" fails closed
            effect("uncertain", receipt)
            expected.steps.append((CHARGE, "uncertain", None))
            expected.replies.append(UNCERTAIN_REPLY)
            return expected
        elif not receipt.announced:  # completed by a turn that never committed: announce it
            self.met("accept", "completed by a turn that never committed")
            receipt.announced = True
            effect("completed", receipt)
        else:
            self.met("accept", "completed: deduplicated")
        self.record_fact(model, f"charge.{pi}", receipt.value, expected)
        expected.events.append(("billing.charged", {"payment_intent_id": pi}))
        expected.steps.append((CHARGE, "completed", receipt.value))
        expected.replies.append(f"Charged {amount} to {pi}.")
        return expected

    # -- rules -----------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(THREADS),
        pi=st.sampled_from(PAYMENT_INTENTS),
        amount=st.sampled_from([100, 250]),
    )
    def propose(self, name: str, pi: str, amount: int) -> None:
        model = self.threads[name]
        turn_id, message = self.new_turn(name), f"charge {pi} {amount}"
        result = self.deliver(name, turn_id, message)
        expected = Expected((pi, amount), replies=[prompt(pi, amount)])
        if model.pending:
            expected.events.append(
                ("interaction.resolved", {"capability_id": CHARGE, "resolution": "superseded"})
            )
        expected.events.append(
            (
                "interaction.opened",
                {"kind": "confirmation", "capability_id": CHARGE, "prompt": prompt(pi, amount)},
            )
        )
        expected.steps.append((CHARGE, "awaiting_confirmation", None))
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

    def dead_attempts(self) -> list[str]:
        """Threads whose pending charge meets a ``prepared`` receipt of a dead attempt."""
        return [
            name
            for name, model in self.threads.items()
            if model.pending is not None
            and getattr(model.receipts.get(charge_key(model.pending[0])), "status", None)
            == "prepared"
        ]

    @precondition(lambda self: self.dead_attempts())
    @rule(data=st.data(), behaviour=st.sampled_from(BEHAVIOURS))
    def accept_after_a_dead_attempt(self, data: st.DataObject, behaviour: str) -> None:
        """The person answers again after the accepting turn died inside the provider
        window: the charge must fail closed, whatever the provider would say now."""
        self.accept(data.draw(st.sampled_from(self.dead_attempts())), behaviour)

    @rule(name=st.sampled_from(THREADS))
    def reject(self, name: str) -> None:
        model = self.threads[name]
        turn_id = self.new_turn(name)
        result = self.deliver(name, turn_id, "no")
        if model.pending is None:
            expected = Expected(None, replies=[NOTHING_PENDING])
        else:
            expected = Expected(None, replies=[CANCELLED_REPLY])
            expected.events.append(
                ("interaction.resolved", {"capability_id": CHARGE, "resolution": "rejected"})
            )
            expected.steps.append((CHARGE, "rejected", None))
        self.commit(name, turn_id, "no", result, expected)

    @rule(name=st.sampled_from(THREADS), due=st.integers(1, 9999))
    def ask_balance(self, name: str, due: int) -> None:
        model = self.threads[name]
        turn_id, message = self.new_turn(name), f"balance {due}"
        result = self.deliver(name, turn_id, message)
        expected = Expected(model.pending, replies=[f"You owe {due}."])
        expected.steps.append((BALANCE, "completed", {"due": due}))
        self.record_fact(model, "balance", due, expected)
        self.commit(name, turn_id, message, result, expected)

    @precondition(lambda self: any(m.committed for m in self.threads.values()))
    @rule(data=st.data(), elsewhere=st.booleans())
    def redeliver(self, data: st.DataObject, elsewhere: bool) -> None:
        """A transport retry, maybe to another worker: the stored result, nothing runs."""
        if elsewhere:
            self.restart()
        name = data.draw(st.sampled_from([n for n in THREADS if self.threads[n].committed]))
        self.redeliver_turn(name, data.draw(st.sampled_from(sorted(self.threads[name].committed))))

    def redeliver_turn(self, name: str, turn_id: str) -> None:
        committed = self.threads[name].committed[turn_id]
        calls = len(self.provider.ledger)
        replayed = self.deliver(name, turn_id, committed.message)
        assert replayed.replayed
        if committed.result is None:  # committed by a turn that died before answering
            self.met("redeliver", "a turn that died after its commit")
            assert summary(replayed) == committed.expected, replayed
            committed.result = dict(replayed.to_dict(), replayed=False)
        else:
            assert replayed.to_dict() == dict(committed.result, replayed=True)
        assert len(self.provider.ledger) == calls

    def unanswered(self) -> list[tuple[str, str]]:
        """(thread, turn) of committed turns whose result was never returned."""
        return [
            (name, turn_id)
            for name in THREADS
            for turn_id, committed in sorted(self.threads[name].committed.items())
            if committed.result is None
        ]

    @precondition(lambda self: self.unanswered())
    @rule(data=st.data())
    def redeliver_a_turn_that_died_after_its_commit(self, data: st.DataObject) -> None:
        """The host retries the delivery whose worker died after committing it: the
        replay must be the result the model predicted for that turn."""
        name, turn_id = data.draw(st.sampled_from(self.unanswered()))
        self.redeliver_turn(name, turn_id)

    @precondition(lambda self: any(m.committed for m in self.threads.values()))
    @rule(data=st.data())
    def redeliver_another_request(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([n for n in THREADS if self.threads[n].committed]))
        turn_id = data.draw(st.sampled_from(sorted(self.threads[name].committed)))
        message = self.threads[name].committed[turn_id].message
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
        self.resolve(name, key, applied=applied)

    def resolve(self, name: str, key: str, *, applied: bool) -> None:
        receipt = self.threads[name].receipts[key]
        store = self.harness.store
        if not applied and receipt.status == "prepared" and store and store.kind == "postgres":
            # A PostgreSQL lock dies with its session while the worker may live on: a
            # prepared receipt may be a live attempt's, never resolvable as not applied.
            self.met("reconcile", "not applied refused: prepared on PostgreSQL")
            with pytest.raises(ReceiptStateError, match="may still be running"):
                self.harness.run(
                    self.durability.resolve_receipt(self.tid(name), key, applied=False)
                )
            return
        self.met("reconcile", "applied" if applied else "not applied")
        value = {"charge_id": "ch_found_by_ops", "amount": 1} if applied else None
        resolved = self.harness.run(
            self.durability.resolve_receipt(self.tid(name), key, applied=applied, value=value)
        )
        receipt = self.threads[name].receipts[key]
        previous = receipt.status
        receipt.status, receipt.value = ("completed", value) if applied else ("failed", None)
        receipt.announced = applied  # by the receipt.resolved event
        assert (resolved.status, resolved.attempt, resolved.value) == (
            receipt.status,
            receipt.attempt,
            receipt.value,
        )
        self.threads[name].events.append(
            (
                None,
                "receipt.resolved",
                {
                    "key": key,
                    "applied": applied,
                    "status": receipt.status,
                    "previous_status": previous,
                },
            )
        )

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
        if calls_provider:
            self.met(point, CALLS)
        else:
            self.met(point, "nothing pending" if pi is None else f"meets {receipt.status}")  # type: ignore[union-attr]
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

    def fresh_charges(self) -> list[tuple[str, str]]:
        """(thread, payment intent) whose acceptance would call the provider."""
        return [
            (name, pi)
            for name in THREADS
            for pi in PAYMENT_INTENTS
            if getattr(self.threads[name].receipts.get(charge_key(pi)), "status", "failed")
            == "failed"
        ]

    # -- scenarios: short conversations that take the paths a uniform walk seldom takes -----
    # Each is a rule of its own with no choice of fault point. Hypothesis draws a rule's
    # arguments far less evenly than it seems. Each runs on a charge whose acceptance
    # reaches the provider. The test also plays each once before the walk (see TOUR).

    def draw_a_fresh_charge(self, data: st.DataObject) -> tuple[str, str, int]:
        name, pi = data.draw(st.sampled_from(self.fresh_charges()))
        return name, pi, data.draw(st.sampled_from([100, 250]))

    def charge_that_dies(self, name: str, pi: str, amount: int, point: str, then: str) -> None:
        """Propose a charge, let its acceptance die at ``point``, then go on.

        It goes on as a host or a person would. The host retries the same delivery.
        After a death with ``prepared`` or ``completed`` durable, the person's answer
        arrives again under a new delivery ID. The provider would now behave as
        ``then``. The answer must fail closed, or reuse the completed receipt."""
        self.propose(name, pi, amount)
        self.crash_while_accepting(name, point)
        if point == faults.AFTER_COMMIT:
            self.redeliver_turn(name, f"turn-{self.threads[name].turns}")
        elif point in REACHED_WHEN_CALLING:
            self.accept(name, then)
        else:
            self.redeliver_crashed_turn(name, self.threads[name].in_doubt[-1])

    def charge_declined_then_tried_again(self, name: str, pi: str, amount: int, then: str) -> None:
        """The provider declines (not applied): the receipt is ``failed``, and the next
        acceptance of the same charge calls the provider again, as the next attempt of
        the same receipt."""
        self.propose(name, pi, amount)
        self.accept(name, "not_applied")
        self.propose(name, pi, amount)
        self.accept(name, then)

    def charge_lost_then_reconciled(self, name: str, pi: str, amount: int, applied: bool) -> None:
        """A lost response fails closed on the next acceptance; an operator resolves it,
        and the charge goes on (the stored value, or a second attempt)."""
        self.propose(name, pi, amount)
        self.accept(name, "lost_response")
        self.propose(name, pi, amount)
        self.accept(name, "ok")  # fails closed
        self.resolve(name, charge_key(pi), applied=applied)
        self.propose(name, pi, amount)
        self.accept(name, "ok")

    die_after_the_lock = dies_at(faults.AFTER_LOCK)
    die_after_loading_the_checkpoint = dies_at(faults.AFTER_CHECKPOINT_LOAD)
    die_after_preparing_the_receipt = dies_at(faults.AFTER_RECEIPT_PREPARED)
    die_in_the_provider_after_its_write = dies_at(faults.IN_PROVIDER_AFTER_WRITE)
    die_after_completing_the_receipt = dies_at(faults.AFTER_RECEIPT_COMPLETED)
    die_before_the_commit = dies_at(faults.BEFORE_COMMIT)
    die_during_the_commit = dies_at(faults.DURING_COMMIT)
    die_after_the_commit = dies_at(faults.AFTER_COMMIT)

    @precondition(lambda self: self.fresh_charges())
    @rule(data=st.data(), then=st.sampled_from(BEHAVIOURS))
    def decline_then_try_again(self, data: st.DataObject, then: str) -> None:
        self.charge_declined_then_tried_again(*self.draw_a_fresh_charge(data), then)

    @precondition(lambda self: self.fresh_charges())
    @rule(data=st.data(), applied=st.booleans())
    def lose_a_response_then_reconcile(self, data: st.DataObject, applied: bool) -> None:
        self.charge_lost_then_reconciled(*self.draw_a_fresh_charge(data), applied)

    @precondition(lambda self: any(m.in_doubt for m in self.threads.values()))
    @rule(data=st.data(), elsewhere=st.booleans())
    def redeliver_a_crashed_turn(self, data: st.DataObject, elsewhere: bool) -> None:
        """The crashed delivery arrives again, maybe at another worker: it runs now, against
        the thread as it is."""
        if elsewhere:
            self.restart()
        name = data.draw(st.sampled_from([n for n in THREADS if self.threads[n].in_doubt]))
        self.redeliver_crashed_turn(name, data.draw(st.sampled_from(self.threads[name].in_doubt)))

    def redeliver_crashed_turn(self, name: str, turn_id: str) -> None:
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
        self.kernel = self.new_kernel()

    # -- after every step ------------------------------------------------------------------

    @invariant()
    def the_store_agrees_with_the_model(self) -> None:
        self.harness.steps += 1
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
                messages = [(m.role, m.content, m.turn_id) for m in checkpoint.messages]
                assert messages == model.messages
                index = [(r.key, (str(r.status), r.turn_id)) for r in checkpoint.receipts]
                assert index == list(model.index.items())
            receipts = self.harness.run(self.durability.list_receipts(thread_id))
            assert {r.key: (str(r.status), r.attempt, r.value, r.announced) for r in receipts} == {
                key: (r.status, r.attempt, r.value, r.announced)
                for key, r in model.receipts.items()
            }
            events = self.harness.run(self.durability.read_outbox(thread_id, limit=1000))
            assert [project(e) for e in events] == model.events
            assert [e.seq for e in events] == list(range(1, len(events) + 1))


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


# Every scenario once, each on threads of its own, before the walk: so that every run,
# whatever hypothesis draws, checks each required path against the model.
TOUR: tuple[Callable[[ConversationMachine], None], ...] = (
    *(
        lambda machine, point=point: machine.charge_that_dies("a", "pi_1", 100, point, "ok")
        for point in faults.POINTS
    ),
    lambda machine: machine.charge_declined_then_tried_again("a", "pi_1", 100, "ok"),
    lambda machine: machine.charge_lost_then_reconciled("a", "pi_1", 100, applied=True),
    lambda machine: machine.charge_lost_then_reconciled("a", "pi_1", 100, applied=False),
    lambda machine: machine.accept("a", "ok"),  # nothing pending
)


def test_random_conversations_match_the_reference_model(harness: Harness) -> None:
    machine: type[ConversationMachine] = type(  # a subclass bound to this store
        "Machine", (ConversationMachine,), {"harness": harness}
    )
    required = required_paths(harness.store)
    for play in TOUR:
        toured = machine()
        try:
            play(toured)
            toured.the_store_agrees_with_the_model()
        finally:
            toured.teardown()
    missing = required - set(harness.paths)
    assert not missing, f"the tour never met {sorted(missing)}"

    harness.paths.clear()
    run_state_machine_as_test(machine, settings=settings())
    met = sorted(f"{what} / {path}: {n}" for (what, path), n in harness.paths.items())
    print(f"{harness.steps} checks of the store; the walk met:\n  " + "\n  ".join(met))
    missing = required - set(harness.paths)
    # The CI profile draws the same walk each run: there, a rule or budget change that
    # stops the walk reaching a path fails. A random local walk may miss one by chance
    # (the tour checked it anyway), which is reported, not failed.
    if settings().derandomize:
        assert not missing, f"the walk never met {sorted(missing)}; it met:\n" + "\n".join(met)
    elif missing:
        print(f"this random walk never met {sorted(missing)} (the tour did)")
