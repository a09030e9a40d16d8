"""The adapter-author surface (``intention_kernel.durability.abc``) beside the
application facade (``intention_kernel``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Self

import pytest

import intention_kernel
import intention_kernel.durability as durability
import intention_kernel.durability._contract.ownership as ownership
import intention_kernel.durability._contract.recorders as contract
import intention_kernel.durability._contract.records as records
import intention_kernel.durability._engine.recorded as engine
import intention_kernel.durability._layout as layout
import intention_kernel.durability.abc as abc
from host_support import asgi_client
from intention_kernel import (
    Kernel,
    KernelCheckpoint,
    OutboxEvent,
    Receipt,
    ReceiptStatus,
    TurnResult,
    TurnScope,
    _checkpoint,
    _ids,
)
from intention_kernel.durability import Durability, TurnOperation
from intention_kernel.durability.abc import PendingInteraction, ThreadOwner
from intention_kernel.host import Principal, create_app
from intention_kernel.operations import check_checkpoints, migrate_checkpoints, prune
from intention_kernel.outbox import OutboxRelay
from intention_kernel.testing import FakeProvider, InMemoryDurability, billing_agent
from intention_kernel.testing.conformance import DurabilityConformance


def test_the_adapter_surface_exports_the_storage_contract_as_defined() -> None:
    homes = (records, contract, engine, layout, ownership, _ids, durability, _checkpoint)
    for name in abc.__all__:
        defined = next(getattr(m, name) for m in homes if hasattr(m, name))
        assert getattr(abc, name) is defined, name
    for name in (
        "Recorder",
        "RecordedDurability",
        "RecorderOptions",
        "TurnRecord",
        "StoredThread",
        "TurnStart",
        "ThreadOwner",
        "Durability",
        "check_id",
    ):
        assert name in abc.__all__, name


def test_the_application_facade_holds_no_adapter_author_classes() -> None:
    assert "Recorder" not in intention_kernel.__all__
    assert "RecordedDurability" not in intention_kernel.__all__
    assert not hasattr(intention_kernel, "Recorder")
    assert "Kernel" in intention_kernel.__all__ and "TurnScope" in intention_kernel.__all__


def test_the_id_rules_have_one_home() -> None:
    assert abc.check_id is _ids.check_id
    assert (abc.MAX_ID_LENGTH, abc.MAX_ID_BYTES) == (_ids.MAX_ID_LENGTH, _ids.MAX_ID_BYTES)


class ThirdPartyDurability:
    """A durability that is no ``RecordedDurability``: it offers the outer ring's
    Protocols (``Operable``, ``TenantStore``, ``InteractionQueue``) by forwarding each
    method to an in-memory adapter, as a third-party adapter would offer its own."""

    def __init__(self) -> None:
        self._inner = InMemoryDurability()

    async def with_turn(
        self, scope: TurnScope, operation: TurnOperation, *, wait: bool = True
    ) -> TurnResult:
        return await self._inner.with_turn(scope, operation, wait=wait)

    async def load_checkpoint(
        self, thread_id: str, *, owner: ThreadOwner | None = None
    ) -> KernelCheckpoint | None:
        return await self._inner.load_checkpoint(thread_id, owner=owner)

    async def list_receipts(
        self,
        thread_id: str | None = None,
        status: ReceiptStatus | str | None = None,
        *,
        tenant_id: str | None = None,
    ) -> list[Receipt]:
        return await self._inner.list_receipts(thread_id, status, tenant_id=tenant_id)

    async def resolve_receipt(
        self,
        thread_id: str,
        key: str,
        *,
        applied: bool,
        value: Any = None,
        note: str | None = None,
        actor: str | None = None,
        owner: ThreadOwner | None = None,
    ) -> Receipt:
        return await self._inner.resolve_receipt(
            thread_id, key, applied=applied, value=value, note=note, actor=actor, owner=owner
        )

    async def read_outbox(
        self, thread_id: str | None = None, after: int | None = None, limit: int = 100
    ) -> list[OutboxEvent]:
        return await self._inner.read_outbox(thread_id, after, limit)

    async def thread_owner(self, thread_id: str) -> ThreadOwner | None:
        return await self._inner.thread_owner(thread_id)

    async def pending_interactions(
        self, *, owner: ThreadOwner | None = None, after: str | None = None, limit: int = 100
    ) -> list[PendingInteraction]:
        return await self._inner.pending_interactions(owner=owner, after=after, limit=limit)

    async def exists(self) -> bool:
        return await self._inner.exists()

    def missing_store_reason(self) -> str:
        return "no third-party store here"

    async def recorder(self) -> abc.Recorder:
        return await self._inner.recorder()

    def forget_checkpoint(self, thread_id: str) -> None:
        self._inner.forget_checkpoint(thread_id)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def test_the_outer_rings_protocols_are_met_by_every_bundled_adapter_and_a_third_party() -> None:
    third = ThirdPartyDurability()
    assert not isinstance(third, abc.RecordedDurability)
    for store in (third, InMemoryDurability()):
        for part in (abc.Operable, abc.TenantStore, abc.InteractionQueue):
            assert isinstance(store, part), (store, part)
    assert not isinstance(object(), abc.Operable)


async def test_a_third_party_durability_works_with_the_relay_operations_and_host() -> None:
    third = ThirdPartyDurability()
    agent = billing_agent(FakeProvider())
    kernel = Kernel(agent, third)
    await kernel.turn("t-1", "1", "balance 100", tenant_id="acme")
    await kernel.turn("t-1", "2", "charge pi_1 500", tenant_id="acme")

    published: list[OutboxEvent] = []
    async with OutboxRelay(third, published.append) as relay:
        report = await relay.run_once()
        assert report.published == len(published) > 0
        assert (await relay.status()).unpublished == 0

    checked = await check_checkpoints(third, agent)
    assert (checked.threads, checked.ok) == (1, True)
    assert (await migrate_checkpoints(third)).migrated == 0
    assert (await prune(third, older_than=timedelta(0))).events == len(published)

    app = create_app(kernel, tokens={"ada": Principal("ada", "acme", "operator")})
    async with asgi_client(app, token="ada") as client:
        queue = await client.get("/v1/interactions")
        thread = await client.get("/v1/threads/t-1")
    assert queue.status_code == 200, queue.text
    assert [i["thread_id"] for i in queue.json()["interactions"]] == ["t-1"]
    assert thread.status_code == 200, thread.text


class TestAThirdPartyDurabilityDeclaringWhatItOffers(DurabilityConformance):
    """The shipped cases on a durability that is no ``RecordedDurability``. What it
    declares runs on it. That is fault points, reached by the engine it forwards to;
    ``owner=``; the interaction queue; and its recorder, for the relay, the operations
    and the journal. So none of those tests skips for its class."""

    persistent = False

    @pytest.fixture
    def make_durability(self) -> Callable[[], Durability]:
        shared = ThirdPartyDurability()
        return lambda: shared

    @pytest.fixture
    def fault_points(self) -> bool:
        return True

    @pytest.fixture
    def operable(self) -> bool:
        return True

    @pytest.fixture
    def tenant_store(self, durability: Durability) -> abc.TenantStore | None:
        assert isinstance(durability, ThirdPartyDurability)
        return durability

    @pytest.fixture
    def interaction_queue(self, durability: Durability) -> abc.InteractionQueue | None:
        assert isinstance(durability, ThirdPartyDurability)
        return durability
