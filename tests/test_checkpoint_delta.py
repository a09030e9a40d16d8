"""What a commit writes is the checkpoint delta the turn states. It is never a guess
from object identity. Each runtime turn hands its recorder exactly the messages it
said, the facts it recorded and the new core. A delta that does not make the checkpoint
is refused. A commit built by hand is diffed by value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from intention_kernel import (
    Agent,
    CapabilityContext,
    CapabilityResult,
    Fact,
    Intent,
    Interpretation,
    Kernel,
    KernelError,
    capability,
)
from intention_kernel._checkpoint import (
    CheckpointDelta,
    KernelCheckpoint,
    Message,
    decode_checkpoint,
    delta_between,
    encode_checkpoint,
)
from intention_kernel._facts import Evidence, FactRecord
from intention_kernel._interpretation import InterpretationRequest
from intention_kernel._turns import TurnCommit, TurnResult, TurnScope
from intention_kernel.durability import TurnTransaction
from intention_kernel.durability._contract.records import TurnRecord
from intention_kernel.durability._engine.recorded import RecordedDurability
from intention_kernel.durability._layout.codec import (
    encode_bare_core,
    encode_checkpoint_core,
    encode_fact,
    encode_message,
    encode_receipt_ref,
)
from intention_kernel.durability._memory import InMemoryDurability
from intention_kernel.durability.sqlite import SQLiteDurability

MAX_MESSAGES = 6


class _Rules:
    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        n = int(request.message.split()[-1])
        if n % 5 == 0:
            return Interpretation(intents=[Intent("shop.look", {})], reply="looking")
        if n % 7 == 0:  # two writes: the second key is used again by the next turn
            return Interpretation(
                intents=[Intent("shop.pay", {"n": n}), Intent("shop.pay", {"n": n + 1})]
            )
        return Interpretation(intents=[Intent("shop.pay", {"n": n})])


def _agent() -> Agent:
    @capability("shop.pay", effect="write", confirmation="capability")
    async def pay(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        """New and replaced facts; keys used again, within the receipt index and beyond."""
        n = input["n"]
        key = f"pay:{n % 25}" if n % 3 else f"pay:new{n}"
        effect = await ctx.run_effect(key, lambda a: {"n": n})
        return CapabilityResult(
            value=effect.value,
            facts=[Fact(f"paid.{n % 40}", effect.value), Fact("last", n)],
        )

    @capability("shop.look", effect="read")
    async def look(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        return CapabilityResult(value=len(ctx.facts))

    return Agent(
        name="shop",
        version="1",
        capabilities=[pay, look],
        interpreter=_Rules(),
        max_messages=MAX_MESSAGES,
        max_receipts=10,
    )


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], RecordedDurability]:
    def make() -> RecordedDurability:
        if request.param == "memory":
            return InMemoryDurability()
        return SQLiteDurability(tmp_path / "k.db")

    return make


async def test_each_turn_writes_what_it_said_recorded_and_its_core(
    make_store: Callable[[], RecordedDurability], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    records: list[TurnRecord] = []
    recorder = await store.recorder()
    original = type(recorder).commit_turn

    async def spy(self: Any, record: TurnRecord) -> None:
        records.append(record)
        await original(self, record)

    monkeypatch.setattr(type(recorder), "commit_turn", spy)
    index_rows = recorder.options.receipt_index_rows
    index: list[tuple[str, str]] = []  # the index rows, as the records say to write them
    moved = trimmed = 0
    async with store:
        kernel = Kernel(_agent(), store)
        previous: KernelCheckpoint | None = None
        for n in range(1, 61):
            result = await kernel.turn("t", f"k{n}", f"pay {n}")
            rows = records[-1].rows
            checkpoint = await store.load_checkpoint("t")
            assert checkpoint is not None
            said = [m for m in checkpoint.messages if m.turn_id == f"k{n}"]
            before = len(previous.messages) if previous else 0
            if index_rows:
                assert rows.core == encode_bare_core(checkpoint)
                gone = set(rows.moved_index_keys)
                index = [e for e in index if e[0] not in gone] + list(rows.receipt_index)
                index = index[rows.trim_index :]
                assert index == [(r.key, encode_receipt_ref(r)) for r in checkpoint.receipts]
                assert len(rows.receipt_index) <= 2  # what the turn used, not the index
                moved += bool(gone)
                trimmed += rows.trim_index
            else:
                assert rows.core == encode_checkpoint_core(checkpoint)
                assert (tuple(rows.receipt_index), tuple(rows.moved_index_keys)) == ((), ())
                assert rows.trim_index == 0
            assert list(rows.messages) == [encode_message(m) for m in said] and len(said) == 2
            assert (rows.keep_messages, rows.trim_messages) == (
                len(checkpoint.messages),
                before + 2 - len(checkpoint.messages),
            )
            recorded: dict[str, FactRecord] = {}
            for fact in result.facts:
                recorded[fact.key] = fact
            assert list(rows.facts) == [(k, encode_fact(r)) for k, r in recorded.items()]
            assert (tuple(rows.removed_facts), rows.rewrite) == ((), False)
            previous = checkpoint
    assert (moved > 0 and trimmed > 0) is index_rows  # the run moved keys and trimmed


async def test_the_receipt_index_in_rows_reads_back_as_the_index_in_a_core(
    tmp_path: Path,
) -> None:
    """SQLite keeps the receipt index in rows (keys moved to the end, entries appended,
    the oldest trimmed); the memory store keeps it in the core. The same turns leave
    the same index after each one, read back from the store, and from a new store on
    the file, which has no checkpoint in memory."""
    memory, sqlite = InMemoryDurability(), SQLiteDurability(tmp_path / "k.db")
    assert (await memory.recorder()).options.receipt_index_rows is False
    assert (await sqlite.recorder()).options.receipt_index_rows is True

    def index(checkpoint: KernelCheckpoint | None) -> list[tuple[str, str, str, str]]:
        assert checkpoint is not None
        return [(r.key, r.status, r.turn_id, r.step_id) for r in checkpoint.receipts]

    async with memory:
        in_core = Kernel(_agent(), memory)
        async with sqlite:
            in_rows = Kernel(_agent(), sqlite)
            for n in range(1, 61):
                await in_core.turn("t", f"k{n}", f"pay {n}")
                await in_rows.turn("t", f"k{n}", f"pay {n}")
                expected = index(await memory.load_checkpoint("t"))
                assert index(await sqlite.load_checkpoint("t")) == expected
                assert len(expected) <= 10
            assert len(expected) == 10
        async with SQLiteDurability(tmp_path / "k.db") as reopened:
            assert index(await reopened.load_checkpoint("t")) == expected
            await Kernel(_agent(), reopened).turn("t", "k61", "pay 61")
            await in_core.turn("t", "k61", "pay 61")
            expected = index(await memory.load_checkpoint("t"))
            assert index(await reopened.load_checkpoint("t")) == expected


async def test_a_delta_that_does_not_make_the_checkpoint_is_refused(
    make_store: Callable[[], RecordedDurability],
) -> None:
    async with make_store() as store:
        await Kernel(_agent(), store).turn("t", "k1", "pay 1")
        said = Message("user", "by hand", "h")

        def commit(delta: Callable[[KernelCheckpoint], CheckpointDelta]) -> Any:
            async def operation(tx: TurnTransaction) -> TurnCommit:
                base = tx.checkpoint
                assert base is not None
                checkpoint = replace(
                    base, version=base.version + 1, messages=(*base.messages, said)
                )
                result = TurnResult("t", tx.scope.turn_id, False, "ok", checkpoint_version=2)
                return TurnCommit(result, checkpoint, (), (), delta(base))

            return operation

        wrong: list[Callable[[KernelCheckpoint], CheckpointDelta]] = [
            lambda b: CheckpointDelta(b.version),  # the message is missing
            lambda b: CheckpointDelta(b.version - 1, messages_appended=(said,)),
            lambda b: CheckpointDelta(b.version, messages_appended=(said,), messages_trimmed=1),
            lambda b: CheckpointDelta(b.version, messages_appended=(replace(said, content="x"),)),
            lambda b: CheckpointDelta(b.version, (said,), facts_removed=("last",)),
            lambda b: CheckpointDelta(
                b.version, (said,), facts_set=(replace(b.facts["last"], version=9),)
            ),
            lambda b: CheckpointDelta(b.version, (said,), receipts_appended=b.receipts[:1]),
        ]
        stored = await store.load_checkpoint("t")
        for i, delta in enumerate(wrong):
            with pytest.raises(KernelError, match="refusing to commit an inconsistent turn"):
                await store.with_turn(TurnScope("t", f"h{i}"), commit(delta))
            assert await store.load_checkpoint("t") == stored  # nothing was written
        await store.with_turn(
            TurnScope("t", "right"), commit(lambda b: CheckpointDelta(b.version, (said,)))
        )
        after = await store.load_checkpoint("t")
        assert after is not None and stored is not None
        assert after.messages == (*stored.messages, said) and after.facts == stored.facts


def test_a_checkpoint_built_by_hand_is_diffed_by_value() -> None:
    """Equal values are kept whatever objects hold them: a checkpoint decoded anew (no
    object shared with the one it equals) differs from it by nothing."""
    record = FactRecord("a", 1, 1, evidence=Evidence("cap", "1", "1#1"))
    base = KernelCheckpoint(
        schema_revision=1,
        agent_fingerprint="sha256:x",
        version=3,
        messages=(Message("user", "hi", "1"), Message("assistant", "hello", "1")),
        facts={"a": record, "b": replace(record, key="b")},
    )
    copy = decode_checkpoint(encode_checkpoint(base))
    assert copy == base and copy.messages[0] is not base.messages[0]
    assert delta_between(base, replace(copy, version=4)) == CheckpointDelta(base_version=3)
    said, new = Message("user", "again", "2"), replace(record, key="c")
    grown = replace(
        copy,
        version=4,
        messages=(copy.messages[1], said),
        facts={"b": copy.facts["b"], "a": replace(record, value=2, version=2), "c": new},
    )
    assert delta_between(base, grown) == CheckpointDelta(
        base_version=3,
        messages_appended=(said,),
        messages_trimmed=1,
        facts_set=(replace(record, value=2, version=2), new),
    )
    # Not a run of the base's newest messages: all of them dropped, all appended.
    assert delta_between(base, replace(copy, messages=(said, *copy.messages))) == CheckpointDelta(
        base_version=3, messages_appended=(said, *copy.messages), messages_trimmed=2
    )
