"""Checkpoint encoding, migrations of older revisions and refusal of newer ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from intention_kernel._checkpoint import (
    SCHEMA_REVISION,
    KernelCheckpoint,
    check_compatible,
    decode_checkpoint,
    encode_checkpoint,
)
from intention_kernel._facts import Evidence, FactRecord
from intention_kernel.errors import CheckpointCompatibilityError, CorruptRecordError


def _checkpoint() -> KernelCheckpoint:
    fact = FactRecord("k", {"v": 1}, 2, Evidence("a.b", "t1", "t1#1", ("r",)))
    return KernelCheckpoint(SCHEMA_REVISION, "sha256:x", 3, facts={"k": fact})


def test_round_trip() -> None:
    checkpoint = _checkpoint()
    assert decode_checkpoint(encode_checkpoint(checkpoint)) == checkpoint


def test_older_revisions_are_migrated_in_order() -> None:
    seen: list[int] = []

    def one_to_two(doc: dict[str, Any]) -> dict[str, Any]:
        seen.append(doc["schema_revision"])
        doc["renamed"] = doc.pop("legacy_messages")
        return doc

    def two_to_three(doc: dict[str, Any]) -> dict[str, Any]:
        seen.append(2)
        doc["messages"] = doc.pop("renamed")
        return doc

    document = json.loads(encode_checkpoint(_checkpoint()))
    document["schema_revision"] = 1
    document["legacy_messages"] = document.pop("messages")
    decoded = decode_checkpoint(json.dumps(document), migrations=[one_to_two, two_to_three])
    assert seen == [1, 2]
    assert decoded.schema_revision == 3 and decoded.facts == _checkpoint().facts


def test_a_newer_revision_is_refused() -> None:
    document = json.loads(encode_checkpoint(_checkpoint()))
    document["schema_revision"] = SCHEMA_REVISION + 1
    with pytest.raises(CheckpointCompatibilityError, match="newer"):
        decode_checkpoint(json.dumps(document), thread_id="t")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[1]",
        '{"schema_revision": "1"}',
        '{"schema_revision": 0}',
        '{"schema_revision": 1, "agent_fingerprint": "x", "version": "three"}',
    ],
)
def test_corrupted_documents_are_typed_errors(text: str) -> None:
    with pytest.raises(CorruptRecordError):
        decode_checkpoint(text, thread_id="t")


def test_compatibility_accepts_own_and_declared_fingerprints_only() -> None:
    checkpoint = _checkpoint()
    check_compatible(checkpoint, fingerprint="sha256:x")
    check_compatible(checkpoint, fingerprint="sha256:new", compatible={"sha256:x"})
    with pytest.raises(CheckpointCompatibilityError):
        check_compatible(checkpoint, fingerprint="sha256:new")
