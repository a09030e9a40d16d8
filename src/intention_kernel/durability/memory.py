"""In-memory durability: a real adapter whose state lives only in this process.

For application tests, evaluations and examples. It enforces the same
invariants and raises the same errors as the SQL adapters (it stores results
and checkpoints as the same JSON text, so a test exercises the same codecs),
but nothing survives the process: production needs a durable adapter.

Serialization is one :class:`asyncio.Lock` per thread, which is enough because
the state is not shared with any other process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from intention_kernel.durability.base import (
    PlanFn,
    RecordedDurability,
    ResolutionFn,
    StoredThread,
    StoredTurn,
    TurnRecord,
    TurnStart,
)
from intention_kernel.effects import EffectPlan, Receipt, ReceiptStatus, utcnow
from intention_kernel.errors import FencedCommitError, ThreadBusyError
from intention_kernel.turns import EventDraft, OutboxEvent

__all__ = ["InMemoryDurability"]


@dataclass
class _Thread:
    version: int = 0
    tenant_id: str | None = None
    checkpoint: str | None = None
    next_seq: int = 1
    messages: list[str] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)


@dataclass
class _State:
    threads: dict[str, _Thread] = field(default_factory=dict)
    turns: dict[tuple[str, str], StoredTurn] = field(default_factory=dict)
    receipts: dict[tuple[str, str], Receipt] = field(default_factory=dict)
    outbox: list[OutboxEvent] = field(default_factory=list)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)


class _MemoryRecorder:
    def __init__(self, lock_timeout: float) -> None:
        self._state = _State()
        self._lock_timeout = lock_timeout

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @asynccontextmanager
    async def lock(self, thread_id: str) -> AsyncIterator[object]:
        lock = self._state.locks.setdefault(thread_id, asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), self._lock_timeout)
        except TimeoutError:
            raise ThreadBusyError(
                f"thread {thread_id!r} stayed busy for {self._lock_timeout}s", thread_id=thread_id
            ) from None
        try:
            yield lock
        finally:
            lock.release()

    async def begin_turn(
        self, thread_id: str, turn_id: str, known_version: int | None
    ) -> TurnStart:
        thread = self._state.threads.get(thread_id)
        stored = self._state.turns.get((thread_id, turn_id))
        if stored is not None:
            return TurnStart(stored, None, thread.tenant_id if thread else None)
        if thread is not None and thread.version == known_version:
            return TurnStart(None, StoredThread(thread.version, thread.tenant_id, None))
        return TurnStart(None, self._snapshot(thread))

    async def read_thread(self, thread_id: str) -> StoredThread | None:
        return self._snapshot(self._state.threads.get(thread_id))

    @staticmethod
    def _snapshot(thread: _Thread | None) -> StoredThread | None:
        if thread is None:
            return None
        return StoredThread(
            thread.version,
            thread.tenant_id,
            thread.checkpoint,
            tuple(thread.messages),
            tuple(thread.facts.items()),
        )

    async def claim_effect(self, thread_id: str, key: str, plan: PlanFn) -> EffectPlan:
        decided = plan(self._state.receipts.get((thread_id, key)))
        if decided.write is not None:
            self._state.receipts[(thread_id, key)] = decided.write
        return decided

    async def write_receipt(self, receipt: Receipt, expected: Receipt) -> None:
        current = self._state.receipts.get((receipt.thread_id, receipt.key))
        if current is None or (current.status, current.attempt) != (
            expected.status,
            expected.attempt,
        ):
            raise FencedCommitError(
                f"receipt {receipt.key!r} changed while its effect ran",
                thread_id=receipt.thread_id,
                key=receipt.key,
                receipt=current,
            )
        self._state.receipts[(receipt.thread_id, receipt.key)] = receipt

    async def commit_turn(self, record: TurnRecord) -> None:
        state = self._state
        thread = state.threads.get(record.thread_id)
        current = thread.version if thread else 0
        if current != record.expected_version or (record.thread_id, record.turn_id) in state.turns:
            raise FencedCommitError(
                f"thread {record.thread_id!r} moved to version {current} while turn "
                f"{record.turn_id!r} ran; nothing was committed",
                thread_id=record.thread_id,
                turn_id=record.turn_id,
            )
        if thread is None:
            thread = state.threads[record.thread_id] = _Thread(tenant_id=record.tenant_id)
        # Everything below is plain assignment with no await: atomic for this process.
        state.turns[(record.thread_id, record.turn_id)] = StoredTurn(
            record.request_digest, record.result
        )
        thread.version = record.version
        thread.checkpoint = record.checkpoint
        thread.tenant_id = record.tenant_id
        if record.rewrite:
            thread.messages.clear()
            thread.facts.clear()
        thread.messages.extend(record.messages)
        if record.trim_messages or record.rewrite:
            del thread.messages[: max(len(thread.messages) - record.keep_messages, 0)]
        thread.facts.update(record.facts)
        for key in record.removed_facts:
            thread.facts.pop(key, None)
        self._append(record.thread_id, record.turn_id, record.events)

    def _append(self, thread_id: str, turn_id: str | None, events: Sequence[EventDraft]) -> None:
        state = self._state
        thread = state.threads.setdefault(thread_id, _Thread())
        now = utcnow()
        for draft in events:
            state.outbox.append(
                OutboxEvent(
                    id=draft.id,
                    position=len(state.outbox) + 1,
                    thread_id=thread_id,
                    turn_id=turn_id,
                    seq=thread.next_seq,
                    type=draft.type,
                    payload=draft.payload,
                    created_at=now,
                )
            )
            thread.next_seq += 1

    async def read_receipts(
        self, thread_id: str | None, status: ReceiptStatus | None
    ) -> list[Receipt]:
        found = [
            r
            for r in self._state.receipts.values()
            if (thread_id is None or r.thread_id == thread_id)
            and (status is None or r.status is status)
        ]
        return sorted(found, key=lambda r: (r.created_at or utcnow(), r.id))

    async def resolve_receipt(self, thread_id: str, key: str, resolution: ResolutionFn) -> Receipt:
        resolved, event = resolution(self._state.receipts.get((thread_id, key)))
        self._state.receipts[(thread_id, key)] = resolved
        self._append(thread_id, None, [event])
        return resolved

    async def read_outbox(
        self, thread_id: str | None, after: int | None, limit: int
    ) -> list[OutboxEvent]:
        start = after or 0
        selected = (
            e for e in self._state.outbox[start:] if thread_id is None or e.thread_id == thread_id
        )
        out: list[OutboxEvent] = []
        for event in selected:
            out.append(replace(event))
            if len(out) >= limit:
                break
        return out


class InMemoryDurability(RecordedDurability):
    """Durability for tests and examples; state lives only in this process.

    ``lock_timeout`` bounds how long a turn waits for a busy thread before
    ``ThreadBusyError``.
    """

    def __init__(self, *, lock_timeout: float = 30.0) -> None:
        super().__init__(_MemoryRecorder(lock_timeout))
