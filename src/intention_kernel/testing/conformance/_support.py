"""What every part of the conformance suite shares.

- :class:`ConformanceCase`: the fixtures a subclass provides.
- :class:`Tamper` and :class:`Inspector`: raw access to a store.
- :func:`commit_for`, :class:`HeldTurn`, and the helpers of the tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import pytest

from intention_kernel._agent import Agent
from intention_kernel._checkpoint import (
    SCHEMA_REVISION,
    KernelCheckpoint,
)
from intention_kernel._effects import EffectAuthority
from intention_kernel._facts import FactRecord
from intention_kernel._interpretation import Intent, Interpretation
from intention_kernel._kernel import Kernel
from intention_kernel._turns import (
    EventDraft,
    OutboxEvent,
    TurnCommit,
    TurnResult,
    TurnScope,
)
from intention_kernel.durability import Durability, TurnOperation, TurnTransaction
from intention_kernel.durability._contract.recorders import InteractionQueue, Operable, TenantStore
from intention_kernel.durability._engine.recorded import RecordedDurability
from intention_kernel.testing._agents import FakeProvider, billing_agent
from intention_kernel.testing._scripted import ScriptedInterpreter


class Tamper(Protocol):
    """Raw access to an adapter's store, for tests of corrupted and foreign rows."""

    async def write_checkpoint_text(self, thread_id: str, text: str) -> None:
        """Overwrite the stored checkpoint document of an existing thread.

        The suite then reads it through a new adapter from ``make_durability``.
        An adapter may trust the checkpoint it committed while the stored version is unchanged.
        So a same-version rewrite behind its back is seen on reopening.
        ``make_durability`` may return one shared instance.
        That adapter must forget such cached state here.
        """
        ...

    async def write_receipt_status(self, thread_id: str, key: str, status: str) -> None:
        """Overwrite the stored status of an existing receipt, bypassing any check."""
        ...


class Inspector(Protocol):
    """Raw reads of an adapter's store, for tests of what a maintenance run wrote."""

    async def schema_revisions(self) -> set[int]:
        """The schema revisions the store's rows record for their checkpoints."""
        ...

    async def snapshot(self) -> object:
        """Every stored row, comparable with ``==``: equal snapshots mean that nothing
        was written in between."""
        ...


class ConformanceCase:
    """The fixtures of every part: subclass a part and provide ``make_durability``."""

    #: State outlives the adapter instance (reopening the store sees it).
    persistent: ClassVar[bool] = True

    # -- fixtures the subclass provides -------------------------------------------------------

    @pytest.fixture
    def make_durability(self) -> Callable[[], Durability]:
        pytest.fail("subclass a conformance case and provide a make_durability fixture")

    @pytest.fixture
    def tamper(self, durability: Durability) -> Tamper | None:
        return None

    @pytest.fixture
    def inspector(self) -> Inspector | None:
        return None

    @pytest.fixture
    def make_durability_with_lock_timeout(self) -> Callable[[float], Durability] | None:
        """A factory like ``make_durability`` for an adapter with a short lock wait.

        The adapter waits at most the given seconds for a busy thread.
        ``None`` skips the tests that need a short wait.
        """
        return None

    # -- what the adapter declares it offers (a subclass overrides to declare more) ----------

    @pytest.fixture
    def fault_points(self, durability: Durability) -> bool:
        """Whether the adapter reaches the points of :mod:`intention_kernel.testing.faults`.

        It must reach them at the moments they name (``faults.reach``).
        Every ``RecordedDurability`` does.
        Another adapter that does declares it by returning ``True``.
        ``False`` skips the tests of a turn that dies at such a point.
        """
        return isinstance(durability, RecordedDurability)

    @pytest.fixture
    def tenant_store(self, durability: Durability) -> TenantStore | None:
        """The adapter as a :class:`~intention_kernel.durability._contract.recorders.TenantStore`.

        A tenant store has ``thread_owner``, and takes ``owner=`` on two methods.
        Those are ``load_checkpoint`` and ``resolve_receipt``.
        Every ``RecordedDurability`` is one; another adapter that is one returns ``durability``.
        ``None`` skips the tests of ``owner=``.
        """
        return durability if isinstance(durability, RecordedDurability) else None

    @pytest.fixture
    def operable(self, durability: Durability) -> bool:
        """Whether every adapter ``make_durability`` builds is operable.

        That is an :class:`~intention_kernel.durability._contract.recorders.Operable`.
        It hands out its opened recorder, forgets a checkpoint, and says whether its store exists.
        The outbox relay, the operations and the journal's tests drive it.
        Every ``RecordedDurability`` is one.
        Another adapter that is one declares it by returning ``True``; ``False`` skips those tests.
        """
        return isinstance(durability, RecordedDurability)

    @pytest.fixture
    def interaction_queue(self, durability: Durability) -> InteractionQueue | None:
        """The adapter as an :class:`~intention_kernel.durability.abc.InteractionQueue`
        (``pending_interactions``), as for ``tenant_store``."""
        return durability if isinstance(durability, RecordedDurability) else None

    # -- fixtures of the suite ----------------------------------------------------------------

    @pytest.fixture
    async def durability(
        self, make_durability: Callable[[], Durability]
    ) -> AsyncIterator[Durability]:
        async with make_durability() as durability:
            yield durability

    @pytest.fixture
    def provider(self) -> FakeProvider:
        return FakeProvider()

    @pytest.fixture
    def kernel(self, durability: Durability, provider: FakeProvider) -> Kernel:
        return Kernel(billing_agent(provider), durability)


def as_operable(durability: Durability, operable: bool) -> Operable:
    """``durability`` as an ``Operable``, as its case declared (``operable``), or a skip."""
    if not operable:
        pytest.skip("this adapter declares no recorder (the operable fixture)")
    assert isinstance(durability, Operable), f"{durability!r} is declared operable and is not"
    return durability


async def payloads(durability: Durability, thread_id: str, type: str) -> list[Any]:
    """The payloads of the thread's committed events of ``type``, in order."""
    return [e.payload for e in await durability.read_outbox(thread_id=thread_id) if e.type == type]


def edges_kernel(durability: Durability, *capabilities: Any) -> Kernel:
    """A kernel whose interpreter runs the capability a message names, with no input.

    Any other message runs nothing.
    """
    ids = {c.id for c in capabilities}

    def interpret(request: Any) -> Interpretation:
        if request.message in ids:
            return Interpretation([Intent(request.message, {})])
        return Interpretation([])

    agent = Agent(
        name="edges",
        version="1",
        capabilities=list(capabilities),
        interpreter=ScriptedInterpreter(interpret),
    )
    return Kernel(agent, durability)


class Crash(Exception):
    """A turn's operation failing before its commit."""


class ProcessDied(BaseException):
    """Stands in for the process dying while the provider call runs."""


async def die_in_the_provider_call(durability: Durability, scope: TurnScope) -> None:
    """A turn whose process dies inside the provider call of effect ``k``.

    It leaves that receipt ``prepared`` and commits nothing.
    """

    def dies(authority: EffectAuthority) -> Any:
        raise ProcessDied

    async def operation(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("k", dies, step_id="s1")
        raise AssertionError("unreachable")

    with pytest.raises(ProcessDied):
        await durability.with_turn(scope, operation)


class Capturing:
    """Passes turns through to ``inner`` and keeps every checkpoint they commit."""

    def __init__(self, inner: Durability, committed: list[KernelCheckpoint]) -> None:
        self._inner, self._committed = inner, committed

    async def with_turn(
        self, scope: TurnScope, operation: TurnOperation, *, wait: bool = True
    ) -> TurnResult:
        async def capturing(tx: TurnTransaction) -> TurnCommit:
            commit = await operation(tx)
            self._committed.append(commit.checkpoint)
            return commit

        return await self._inner.with_turn(scope, capturing, wait=wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def commit_for(
    tx: TurnTransaction,
    events: Sequence[EventDraft] = (),
    *,
    facts: Mapping[str, FactRecord] | None = None,
    announced: Sequence[str] = (),
) -> TurnCommit:
    """A minimal valid commit for raw ``with_turn`` operations.

    It is the next version of the thread.
    It has ``events``, ``facts`` (none by default) and ``announced`` keys.
    Adapter authors may use it in their own tests, beside the suite.
    """
    previous = tx.checkpoint
    version = (previous.version if previous else 0) + 1
    checkpoint = KernelCheckpoint(
        schema_revision=SCHEMA_REVISION,
        agent_fingerprint="sha256:raw",
        version=version,
        facts=dict(facts or {}),
    )
    result = TurnResult(
        tx.scope.thread_id, tx.scope.turn_id, False, "ok", checkpoint_version=version
    )
    return TurnCommit(result, checkpoint, tuple(events), tuple(announced))


class HeldTurn:
    """A ``with_turn`` operation that holds its thread until released.

    ``entered`` is set once it runs under the thread's lock.
    It commits (:func:`commit_for`) once ``release`` is set.
    ``ran`` lists the turn IDs it ran for.
    """

    def __init__(self) -> None:
        self.entered, self.release = asyncio.Event(), asyncio.Event()
        self.ran: list[str] = []

    async def __call__(self, tx: TurnTransaction) -> TurnCommit:
        self.ran.append(tx.scope.turn_id)
        self.entered.set()
        await self.release.wait()
        return commit_for(tx)


async def read_all_events(durability: Durability) -> list[OutboxEvent]:
    """The whole outbox, page by page, as a relay reads it."""
    events: list[OutboxEvent] = []
    while batch := await durability.read_outbox(
        after=events[-1].position if events else None, limit=500
    ):
        events.extend(batch)
    return events
