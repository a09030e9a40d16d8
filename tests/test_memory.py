"""The in-memory adapter runs the whole conformance suite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from intention_kernel.durability import Durability
from intention_kernel.effects import ReceiptStatus
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing.conformance import DurabilityConformance, Tamper


class _MemoryTamper:
    def __init__(self, durability: InMemoryDurability) -> None:
        self._durability = durability
        self._state = durability._recorder._state  # type: ignore[attr-defined]

    async def write_checkpoint_text(self, thread_id: str, text: str) -> None:
        self._state.threads[thread_id].checkpoint = text
        self._durability._checkpoints.clear()  # the shared instance must not trust its cache

    async def write_receipt_status(self, thread_id: str, key: str, status: str) -> None:
        receipt = self._state.receipts[(thread_id, key)]
        # The in-memory store holds typed receipts; an unknown state cannot even be
        # represented, so emulate the decode failure a SQL store would report.
        try:
            self._state.receipts[(thread_id, key)] = replace(receipt, status=ReceiptStatus(status))
        except ValueError:
            pytest.skip("the in-memory store cannot hold a receipt in an unknown state")


class TestInMemoryDurability(DurabilityConformance):
    persistent = False

    @pytest.fixture
    def make_durability(self) -> Callable[[], Durability]:
        shared = InMemoryDurability()
        return lambda: shared

    @pytest.fixture
    def tamper(self, durability: Durability) -> Tamper | None:
        assert isinstance(durability, InMemoryDurability)
        return _MemoryTamper(durability)
