"""Bad input, on SQLite and PostgreSQL: a typed error, and nothing written.

"Nothing written" is checked the strict way: every row of every table of the store
is read before and after (:meth:`proving_support.Store.snapshot`) and compared.

What the conformance suite (run by every adapter) and ``tests/test_runtime.py``
already prove is not repeated here; see ``docs/guarantees.md`` for the map. This
module adds several cases. Rows are corrupted in every table that holds a turn's state
(truncated JSON included). Capability input fails validation. Its turn commits a
failed step, and nothing but that commit is written. Interpreters raise or return
garbage on the real stores. A reply comes that no store can hold. Messages are
enormous, and IDs have odd characters and lengths. Provider values and errors that no store
can hold are the conformance suite's (``ReceiptConformance``).
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import (
    Agent,
    Answer,
    CapabilityContext,
    CapabilityResult,
    CheckpointCompatibilityError,
    CorruptRecordError,
    Intent,
    Interpretation,
    InterpretationError,
    InvalidRequestError,
    Kernel,
    KernelError,
    StepStatus,
    StoreError,
    TurnResult,
    capability,
)
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel.testing import ScriptedInterpreter
from intention_kernel.testing._agents import billing_agent
from proving_support import (
    LedgerProvider,
    Store,
    charge_key,
    ledger_keys,
    make_sql_store,
    read_all_events,
)

LONE_SURROGATE = "\ud800"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path)


@pytest.fixture
def provider(tmp_path: Path) -> LedgerProvider:
    return LedgerProvider(path=str(tmp_path / "provider.ledger"), sync=False)


def param(store: Store, text: str) -> str:
    """``text`` with ``?`` placeholders in the store's own placeholder style."""
    return text.replace("?", "%s") if store.kind == "postgres" else text


# -- rows corrupted in the store -------------------------------------------------------------


async def history(kernel: Kernel) -> None:
    """A thread with a completed charge, a fact, and a confirmation pending."""
    await kernel.turn("t", "1", "charge pi_1 500")
    await kernel.turn("t", "2", "yes")
    await kernel.turn("t", "3", "balance 7")
    await kernel.turn("t", "4", "charge pi_1 500")


def rewrite_checkpoint(change: Callable[[str], str]) -> Callable[[Store], None]:
    """Rewrite the stored checkpoint document (its core, where messages and facts have
    rows of their own) of thread ``t``."""

    def tamper(store: Store) -> None:
        select = "SELECT checkpoint FROM ik_threads WHERE thread_id = ?"
        [(core,)] = store.query(param(store, select), "t")
        update = "UPDATE ik_threads SET checkpoint = ? WHERE thread_id = ?"
        store.query(param(store, update), change(core), "t")

    return tamper


def set_in_checkpoint(field: str, value: Callable[[Any], Any]) -> Callable[[Store], None]:
    def change(core: str) -> str:
        document = json.loads(core)
        document[field] = value(document[field])
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False)

    return rewrite_checkpoint(change)


def truncate_rows(
    table: str, column: str, where: str = "thread_id = 't'"
) -> Callable[[Store], None]:
    """Cut the JSON of ``column`` in half, as a torn write would."""

    def tamper(store: Store) -> None:
        if table not in store.tables():
            pytest.skip(f"this storage layout has no {table} table")
        [(rows,)] = store.query(f"SELECT count(*) FROM {table} WHERE {where}")
        assert rows > 0, f"nothing to corrupt in {table}"
        half = f"substr({column}, 1, length({column}) / 2)"
        store.query(f"UPDATE {table} SET {column} = {half} WHERE {where}")

    return tamper


def unknown_receipt_state(store: Store) -> None:
    if store.kind == "postgres":
        store.query("ALTER TABLE ik_receipts DROP CONSTRAINT ik_receipts_status_check")
        store.query("UPDATE ik_receipts SET status = 'exploded'")
        return
    with closing(sqlite3.connect(store.location, isolation_level=None)) as conn:
        conn.execute("PRAGMA ignore_check_constraints = 1")  # the CHECK is part of the table
        conn.execute("UPDATE ik_receipts SET status = 'exploded'")


def unreadable_announcements(store: Store) -> None:
    """The keys that turn 2 (which completed and announced the charge) lists as
    announced, made unreadable: torn JSON in SQLite, a NULL key in PostgreSQL's array."""
    if store.kind == "postgres":
        store.query("UPDATE ik_turns SET announced = ARRAY[NULL]::text[] WHERE turn_id = '2'")
        return
    truncate_rows("ik_turns", "announced", "turn_id = '2'")(store)


def truncated_index_rows(store: Store) -> None:
    """SQLite's receipt index rows, torn (PostgreSQL keeps the index in the core)."""
    if store.kind == "postgres":
        pytest.skip("PostgreSQL keeps the receipt index in the core: no rows to tear")
    truncate_rows("ik_receipt_index", "body")(store)


@dataclass(frozen=True)
class Corruption:
    tamper: Callable[[Store], None]
    error: type[KernelError]
    # What meets the corrupted row: the next turn (accepting the pending charge), a
    # replay of a committed turn, or the outbox relay.
    probe: str = "turn"


CORRUPTIONS = {
    "checkpoint-truncated": Corruption(
        rewrite_checkpoint(lambda c: c[: len(c) // 2]), CorruptRecordError
    ),
    "checkpoint-not-json": Corruption(
        rewrite_checkpoint(lambda c: "¡not json!"), CorruptRecordError
    ),
    "checkpoint-version-mismatch": Corruption(
        set_in_checkpoint("version", lambda v: v + 3), CorruptRecordError
    ),
    "checkpoint-newer-schema-revision": Corruption(
        set_in_checkpoint("schema_revision", lambda r: r + 1), CheckpointCompatibilityError
    ),
    "checkpoint-foreign-agent": Corruption(
        set_in_checkpoint("agent_fingerprint", lambda f: "sha256:" + "0" * 64),
        CheckpointCompatibilityError,
    ),
    "message-rows-truncated": Corruption(truncate_rows("ik_messages", "body"), CorruptRecordError),
    "fact-rows-truncated": Corruption(truncate_rows("ik_facts", "body"), CorruptRecordError),
    "receipt-index-rows-truncated": Corruption(truncated_index_rows, CorruptRecordError),
    "receipt-unknown-state": Corruption(unknown_receipt_state, CorruptRecordError),
    "receipt-value-truncated": Corruption(
        truncate_rows("ik_receipts", "value"), CorruptRecordError
    ),
    "turn-announcements-unreadable": Corruption(unreadable_announcements, CorruptRecordError),
    "turn-result-truncated": Corruption(
        truncate_rows("ik_turns", "result", "turn_id = '3'"), CorruptRecordError, probe="replay"
    ),
    "outbox-payload-truncated": Corruption(
        truncate_rows("ik_outbox", "payload", "type = 'turn.committed'"),
        CorruptRecordError,
        probe="outbox",
    ),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
async def test_a_corrupted_row_is_a_typed_error_and_nothing_is_written(
    store: Store, provider: LedgerProvider, case: str
) -> None:
    corruption = CORRUPTIONS[case]
    async with store.durability() as durability:
        await history(Kernel(billing_agent(provider), durability))
        await read_all_events(durability)  # a relay caught up (PostgreSQL numbers events then)
    corruption.tamper(store)
    before, calls = store.snapshot(), ledger_keys(provider.path)

    async with store.durability() as reopened:  # an adapter that never saw the good rows
        kernel = Kernel(billing_agent(provider), reopened)
        if corruption.probe == "turn":
            meet: Awaitable[object] = kernel.turn("t", "5", "yes")
        elif corruption.probe == "replay":
            meet = kernel.turn("t", "3", "balance 7")
        else:
            meet = reopened.read_outbox(limit=1000)
        with pytest.raises(corruption.error) as caught:
            await meet
        assert caught.value.thread_id == "t"
        if corruption.probe != "replay":  # committed turns still replay: no checkpoint needed
            assert (await kernel.turn("t", "2", "yes")).replayed
    assert store.snapshot() == before
    assert ledger_keys(provider.path) == calls


async def test_checkpoint_text_that_is_not_utf8_is_a_typed_error_and_nothing_is_written(
    tmp_path: Path, provider: LedgerProvider
) -> None:
    store = Store("sqlite", str(tmp_path / "kernel.db"))  # PostgreSQL refuses such text itself
    async with store.durability() as durability:
        await history(Kernel(billing_agent(provider), durability))
    store.query("UPDATE ik_threads SET checkpoint = CAST(x'7b22ff22' AS TEXT)")

    def raw_snapshot() -> list[Any]:
        with closing(sqlite3.connect(store.location)) as conn:
            conn.text_factory = bytes
            return [sorted(conn.execute(f"SELECT * FROM {t}"), key=repr) for t in store.tables()]

    before = raw_snapshot()
    async with store.durability() as reopened:
        with pytest.raises(CorruptRecordError, match="not UTF-8") as caught:
            await Kernel(billing_agent(provider), reopened).turn("t", "5", "yes")
        # Not a transient StoreError: retrying reads the same bytes. The adapter reads
        # the thread's row, so it names the thread.
        assert not isinstance(caught.value, StoreError) and caught.value.thread_id == "t"
    assert raw_snapshot() == before
    assert ledger_keys(provider.path) == [charge_key("pi_1")]


# -- capability input that fails validation --------------------------------------------------


def changed_rows(
    before: dict[str, list[tuple[Any, ...]]], after: dict[str, list[tuple[Any, ...]]]
) -> dict[str, tuple[int, int]]:
    """Per table whose rows changed: (rows gone, rows new); a changed row counts in both."""
    changes = {}
    for table in sorted(set(before) | set(after)):
        old = Counter(map(repr, before.get(table, [])))
        new = Counter(map(repr, after.get(table, [])))
        if old != new:
            changes[table] = ((old - new).total(), (new - old).total())
    return changes


INVALID_INPUT = {
    # A write that needs confirmation, proposed with input its model refuses: it is never
    # planned, so nothing awaits a confirmation for it (the pending one stays).
    "required-write-bad-fields": ("charge nope -5", ["payment_intent_id", "amount"]),
    "required-write-missing-field": ("charge pi_9", ["amount"]),
    # A write that confirms on its own ("capability" mode) never runs its handler.
    "capability-mode-write": ("refund pi_1 -5", ["amount"]),
}


@pytest.mark.parametrize("case", INVALID_INPUT)
async def test_capability_input_that_fails_validation_is_a_failed_step_and_writes_no_effect(
    store: Store, provider: LedgerProvider, case: str
) -> None:
    """The turn commits (a failed step does not abort it). That commit is all that is
    written. It writes its result, the thread's next version and its two messages, and
    one ``turn.committed``. There is no receipt, no fact, and no provider call. The
    pending confirmation is untouched."""
    message, fields = INVALID_INPUT[case]
    async with store.durability() as durability:
        kernel = Kernel(billing_agent(provider), durability)
        await history(kernel)
        events = await read_all_events(durability)
        before = store.snapshot()
        result = await kernel.turn("t", "5", message)
        changed = changed_rows(before, store.snapshot())
        [step] = result.steps
        assert step.status == StepStatus.FAILED and step.receipt_ids == ()
        assert all(field in (step.error or "") for field in fields), step.error
        assert result.interaction is not None and result.interaction.input == {
            "payment_intent_id": "pi_1",
            "amount": 500,
        }
        new_events = await read_all_events(durability, after=events[-1].position)
        assert [(e.turn_id, e.type) for e in new_events] == [("5", "turn.committed")]
        assert new_events[0].payload["steps"] == [
            {"step_id": step.step_id, "capability_id": step.capability_id, "status": "failed"}
        ]
    assert changed == {
        "ik_messages": (0, 2),
        "ik_outbox": (0, 1),
        "ik_threads": (1, 1),
        "ik_turns": (0, 1),
    }
    assert ledger_keys(provider.path) == [charge_key("pi_1")]  # turn 2's charge only


# -- an interpreter that raises or returns garbage -------------------------------------------


class Unserializable:
    pass


def unavailable(request: InterpretationRequest) -> Interpretation:
    raise ConnectionError("model unavailable")


GARBAGE: dict[str, Callable[[InterpretationRequest], Any]] = {
    "raises": unavailable,
    "returns-none": lambda request: None,
    "returns-a-dict": lambda request: {"intents": [{"capability_id": "payments.charge"}]},
    "intents-not-a-list": lambda request: Interpretation(intents="payments.charge"),  # type: ignore[arg-type]
    "intent-not-an-intent": lambda request: Interpretation(intents=[("payments.charge", {})]),  # type: ignore[list-item]
    "answer-of-another-kind": lambda request: Interpretation(answer="maybe"),  # type: ignore[arg-type]
    "reply-not-a-string": lambda request: Interpretation(reply=Unserializable()),  # type: ignore[arg-type]
    "reply-unstorable-text": lambda request: Interpretation(reply=f"ok {LONE_SURROGATE}"),
}


@pytest.mark.parametrize("case", GARBAGE)
async def test_an_interpreter_that_raises_or_returns_garbage_writes_nothing(
    store: Store, provider: LedgerProvider, case: str
) -> None:
    async with store.durability() as durability:
        good = Kernel(billing_agent(provider), durability)
        await history(good)
        before = store.snapshot()
        bad = Kernel(
            billing_agent(provider, interpreter=ScriptedInterpreter(GARBAGE[case])), durability
        )
        with pytest.raises(InterpretationError) as caught:
            await bad.turn("t", "5", "yes please")
        assert (caught.value.thread_id, caught.value.turn_id) == ("t", "5")
        assert store.snapshot() == before
        # The same delivery, retried once the model behaves, runs normally.
        retried = await good.turn("t", "5", "yes please")
        assert not retried.replayed and retried.steps[0].status == StepStatus.COMPLETED
    assert ledger_keys(provider.path) == [charge_key("pi_1")]  # deduplicated: charged in turn 2


# -- values and errors that no store can hold ------------------------------------------------


async def test_a_capability_reply_that_cannot_be_stored_is_a_typed_error_and_writes_nothing(
    store: Store,
) -> None:
    @capability("x.reply")
    async def reply(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult(reply=f"done {LONE_SURROGATE}")

    script = {"go": Interpretation([Intent("x.reply")]), "hi": Interpretation(reply="hello")}
    agent = Agent("o", "1", [reply], ScriptedInterpreter(script))
    async with store.durability() as durability:
        kernel = Kernel(agent, durability)
        await kernel.turn("t", "0", "hi")
        before = store.snapshot()
        with pytest.raises(KernelError, match="cannot be stored") as caught:
            await kernel.turn("t", "1", "go")
        assert (caught.value.thread_id, caught.value.turn_id) == ("t", "1")
        assert store.snapshot() == before
        assert (await kernel.turn("t", "2", "hi")).checkpoint_version == 2


# -- an enormous message ---------------------------------------------------------------------


async def test_an_enormous_message_at_the_limit_round_trips_and_one_over_writes_nothing(
    store: Store, provider: LedgerProvider
) -> None:
    async with store.durability() as durability:
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn("t", "0", "balance")
        before = store.snapshot()
        limit = kernel.max_message_chars
        with pytest.raises(InvalidRequestError, match="limit"):
            await kernel.turn("t", "1", "😀" * (limit + 1))
        assert store.snapshot() == before

        at_limit = "😀" * limit  # four bytes each in UTF-8
        result = await kernel.turn("t", "1", at_limit)
        assert result.checkpoint_version == 2
        assert (await kernel.turn("t", "1", at_limit)).replayed
    async with store.durability() as reopened:
        checkpoint = await reopened.load_checkpoint("t")
        assert checkpoint is not None
        assert next(m.content for m in checkpoint.messages if m.turn_id == "1") == at_limit


async def test_a_megabyte_message_under_a_raised_limit_commits_and_round_trips(
    store: Store, provider: LedgerProvider
) -> None:
    text = "".join(random.Random(7).choices("abcdefghij ✓é€😀\n\"'\\", k=1_000_000))
    async with store.durability() as durability:
        kernel = Kernel(billing_agent(provider), durability, max_message_chars=1_000_000)
        assert (await kernel.turn("t", "1", text)).checkpoint_version == 1
    async with store.durability() as reopened:
        kernel = Kernel(billing_agent(provider), reopened, max_message_chars=1_000_000)
        assert (await kernel.turn("t", "1", text)).replayed
        checkpoint = await reopened.load_checkpoint("t")
        assert checkpoint is not None and checkpoint.messages[0].content == text


# -- odd IDs ---------------------------------------------------------------------------------


def incompressible(n: int, seed: int) -> str:
    """``n`` random characters outside the Basic Multilingual Plane (4 bytes each)."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(n))


BAD_REQUESTS: dict[str, dict[str, Any]] = {
    "thread-lone-surrogate": {"thread_id": f"t{LONE_SURROGATE}"},
    "turn-lone-surrogate": {"turn_id": f"1{LONE_SURROGATE}"},
    "tenant-lone-surrogate": {"tenant_id": f"acme{LONE_SURROGATE}"},
    "message-lone-surrogate": {"message": f"balance {LONE_SURROGATE}"},
    "answer-unknown-decision": {"message": None, "answer": Answer(decision="no")},  # type: ignore[arg-type]
    "answer-not-json": {"message": None, "answer": Answer(value={1, 2})},
    "ids-too-many-bytes": {"thread_id": incompressible(512, 1), "turn_id": incompressible(512, 2)},
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
async def test_a_request_with_an_id_message_or_answer_no_store_can_hold_is_refused(
    store: Store, provider: LedgerProvider, case: str
) -> None:
    async with store.durability() as durability:
        kernel = Kernel(billing_agent(provider), durability)
        await history(kernel)
        before = store.snapshot()
        request: dict[str, Any] = {"thread_id": "t", "turn_id": "5", "message": "yes"}
        request.update(BAD_REQUESTS[case])
        with pytest.raises(InvalidRequestError):
            await kernel.turn(**request)
        assert store.snapshot() == before
    assert ledger_keys(provider.path) == [charge_key("pi_1")]


@pytest.mark.parametrize(
    "document",
    [
        {},
        None,
        {"thread_id": "t", "turn_id": "1", "replayed": False, "reply": 3},
        {"thread_id": "t", "turn_id": "1", "replayed": False, "reply": "", "steps": "x"},
        {
            "thread_id": "t",
            "turn_id": "1",
            "replayed": False,
            "reply": "",
            "steps": [{"step_id": "1#1", "capability_id": "a.b", "status": "exploded"}],
        },
    ],
)
def test_a_malformed_turn_result_document_is_a_typed_error(document: Any) -> None:
    with pytest.raises(InvalidRequestError, match="not a TurnResult document"):
        TurnResult.from_dict(document)


async def test_ids_of_the_largest_accepted_size_commit_on_every_store(
    store: Store, provider: LedgerProvider
) -> None:
    """The largest IDs accepted (1,024 bytes of UTF-8 each: 256 four-byte characters,
    incompressible) fit every key and index of the store, with a write effect too."""
    thread_id, turn_id = incompressible(256, 3), incompressible(256, 4)
    async with store.durability() as durability:
        kernel = Kernel(billing_agent(provider), durability)
        await kernel.turn(thread_id, turn_id, "charge pi_1 500", tenant_id=incompressible(256, 5))
        accepted = await kernel.turn(
            thread_id, turn_id[::-1], "yes", tenant_id=incompressible(256, 5)
        )
        assert accepted.steps[0].status == StepStatus.COMPLETED
        assert (
            await kernel.turn(thread_id, turn_id[::-1], "yes", tenant_id=incompressible(256, 5))
        ).replayed
        [receipt] = await durability.list_receipts(thread_id)
        assert receipt.status == "completed"


async def test_ids_differing_only_in_case_normalization_space_or_wildcards_are_distinct(
    store: Store, provider: LedgerProvider
) -> None:
    ids = [
        "thread",
        "Thread",
        "thread ",
        " thread",
        "caf\u00e9",
        "cafe\u0301",
        "t%",
        "t_",
        "tx",
        "t\\",
    ]
    async with store.durability() as durability:
        kernel = Kernel(billing_agent(provider), durability)
        for i, thread_id in enumerate(ids):
            result = await kernel.turn(thread_id, "1", f"balance {i + 1}")
            assert (result.replayed, result.checkpoint_version) == (False, 1), thread_id
        for i, thread_id in enumerate(ids):
            checkpoint = await durability.load_checkpoint(thread_id)
            assert checkpoint is not None and checkpoint.facts["balance"].value == i + 1
            assert [e.thread_id for e in await durability.read_outbox(thread_id=thread_id)] == [
                thread_id,
                thread_id,
            ]
