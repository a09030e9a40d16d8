"""A store written by an earlier tree is read, and encoded again, to the very same bytes.

``tests/fixtures/stores/main-4409db6.sql`` is a SQLite store that ``main`` at 4409db6
wrote (``tests/stored_bytes_support.py``): non-ASCII text, escapes, floats, integers
past 64 bits, nested objects in their own key order. Every stored JSON text (turn
results, messages, facts, the checkpoint's core and receipt index) must come out of
this tree's encoders byte for byte. Every request digest must be recomputed equal.
Take a change of encoder, such as a faster JSON library or a lazily built adapter. If
it moved one byte, it would fail here. A store would then hold two encodings of one
value.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pydantic
import pytest

from intention_kernel import Kernel
from intention_kernel._checkpoint import Message, ReceiptRef, decode_checkpoint
from intention_kernel._facts import FactRecord
from intention_kernel._turns import decode_result, encode_result, request_digest
from intention_kernel.durability._layout.codec import (
    assemble_checkpoint,
    encode_bare_core,
    encode_fact,
    encode_message,
    encode_receipt_ref,
)
from intention_kernel.durability.sqlite import SQLiteDurability
from stored_bytes_support import TURNS, agent

FIXTURE = Path(__file__).parent / "fixtures" / "stores" / "main-4409db6.sql"


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    conn = sqlite3.connect(path)
    conn.executescript(FIXTURE.read_text(encoding="utf-8"))
    conn.close()
    return path


def rows(path: Path, sql: str) -> list[tuple[str, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_every_stored_text_is_encoded_again_to_the_same_bytes(stored: Path) -> None:
    results = rows(stored, "SELECT result FROM ik_turns")
    assert len(results) == len(TURNS)
    for (text,) in results:
        assert encode_result(decode_result(text, replayed=False)) == text
    messages = rows(stored, "SELECT body FROM ik_messages")
    assert len(messages) == 2 * len(TURNS)
    for (text,) in messages:
        assert encode_message(pydantic.TypeAdapter(Message).validate_json(text)) == text
    facts = rows(stored, "SELECT body FROM ik_facts")
    assert any("日本語" in text for (text,) in facts)
    for (text,) in facts:
        assert encode_fact(pydantic.TypeAdapter(FactRecord).validate_json(text)) == text
    index = rows(stored, "SELECT body FROM ik_receipt_index")
    assert index
    for (text,) in index:
        assert encode_receipt_ref(pydantic.TypeAdapter(ReceiptRef).validate_json(text)) == text


def test_every_stored_checkpoint_core_is_encoded_again_to_the_same_bytes(stored: Path) -> None:
    threads = rows(stored, "SELECT thread_id, checkpoint FROM ik_threads ORDER BY thread_id")
    assert [thread for thread, _ in threads] == ["t-ascii", "t-unicode"]
    for thread, core in threads:
        where = f"WHERE thread_id = '{thread}'"
        messages = [
            b for (b,) in rows(stored, f"SELECT body FROM ik_messages {where} ORDER BY seq")
        ]
        facts = [
            (key, body)
            for key, body in rows(stored, f"SELECT key, body FROM ik_facts {where} ORDER BY rowid")
        ]
        index = [
            b for (b,) in rows(stored, f"SELECT body FROM ik_receipt_index {where} ORDER BY seq")
        ]
        document, in_pieces = assemble_checkpoint(core, messages, facts, index)
        assert in_pieces
        checkpoint = decode_checkpoint(document, thread_id=thread)
        assert encode_bare_core(checkpoint) == core
        assert [encode_receipt_ref(ref) for ref in checkpoint.receipts] == index


def test_every_request_digest_is_computed_again_equal(stored: Path) -> None:
    query = "SELECT thread_id, turn_id, request_digest FROM ik_turns"
    digests = {(thread, turn): digest for thread, turn, digest in rows(stored, query)}
    for thread, turn, message in TURNS:
        assert request_digest(message, None) == digests[thread, turn]


async def test_the_stored_turns_replay_and_the_threads_go_on(stored: Path) -> None:
    async with SQLiteDurability(str(stored)) as durability:
        kernel = Kernel(agent(), durability)
        for thread, turn, message in TURNS:
            replayed = await kernel.turn(thread, turn, message)
            assert replayed.replayed and replayed.reply and "✓" in replayed.reply
        fresh = await kernel.turn("t-unicode", "ü-2", "record 6")
        assert not fresh.replayed and fresh.steps[0].status == "completed"
