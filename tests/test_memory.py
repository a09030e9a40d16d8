"""The in-memory adapter runs the whole conformance suite, plus the shared code's
defence for recorders that cannot say who claimed a thread."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from intention_kernel._turns import TurnCommit, TurnScope
from intention_kernel.durability import Durability, TurnTransaction
from intention_kernel.durability._memory import _MemoryRecorder
from intention_kernel.durability.abc import RecordedDurability, Recorder, RecorderOptions, TurnStart
from intention_kernel.errors import TenantMismatchError, ThreadBusyError
from intention_kernel.testing import InMemoryDurability
from intention_kernel.testing.conformance import DurabilityConformance, Tamper, commit_for
from intention_kernel.testing.conformance._support import HeldTurn


class _MemoryTamper:
    """The store's own tamper, with the one write it cannot make turned into a skip."""

    def __init__(self, durability: InMemoryDurability) -> None:
        self._tamper = durability.tamper()

    async def write_checkpoint_text(self, thread_id: str, text: str) -> None:
        await self._tamper.write_checkpoint_text(thread_id, text)

    async def write_receipt_status(self, thread_id: str, key: str, status: str) -> None:
        # The in-memory store holds typed receipts; an unknown state cannot even be
        # represented, so emulate the decode failure a SQL store would report.
        try:
            await self._tamper.write_receipt_status(thread_id, key, status)
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

    @pytest.fixture
    def make_durability_with_lock_timeout(self) -> Callable[[float], Durability] | None:
        return lambda seconds: InMemoryDurability(lock_timeout=seconds)


class _UndeclaredRecorder(Recorder):
    """A third-party recorder that declares nothing: no ``options``, no ``start_turn``.
    Every I/O method forwards to a memory recorder."""

    def __init__(self) -> None:
        self.inner = _MemoryRecorder(lock_timeout=30.0)


_MEMBERS = {name: member for part in Recorder.__mro__ for name, member in vars(part).items()}
for _name, _member in _MEMBERS.items():
    if callable(_member) and not _name.startswith("_") and _name != "start_turn":
        setattr(
            _UndeclaredRecorder,
            _name,
            lambda self, *args, _name=_name, **kwargs: getattr(self.inner, _name)(*args, **kwargs),
        )


class TestRecorderThatDeclaresNothing(DurabilityConformance):
    """The defaults of an undeclared recorder (each write in a task of its own, the
    lock then ``begin_turn``, a ``prepared`` receipt resolvable) meet the contract."""

    persistent = False

    @pytest.fixture
    def make_durability(self) -> Callable[[], Durability]:
        # The loop above sets its methods at run time, where mypy cannot see them.
        recorder = _UndeclaredRecorder()  # type: ignore[abstract]
        assert recorder.options == RecorderOptions()
        assert not recorder.options.finishes_writes_when_cancelled
        assert not recorder.options.attempts_outlive_lock
        shared = RecordedDurability(recorder)
        return lambda: shared


async def test_a_turn_shown_another_tenants_receipt_never_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The receipts' own tenant check, for a recorder that cannot say which tenant
    claimed a thread (a third-party one, say): even an operation that catches the
    refusal commits nothing, so the thread stays its first tenant's."""
    durability = InMemoryDurability()
    recorder = await durability.recorder()
    begin_turn = recorder.begin_turn

    async def without_claims(thread_id: str, turn_id: str, known: int | None) -> TurnStart:
        return replace(await begin_turn(thread_id, turn_id, known), claimed_by=None)

    monkeypatch.setattr(recorder, "begin_turn", without_claims)

    async def acme(tx: TurnTransaction) -> TurnCommit:
        await tx.run_effect("k", lambda a: {"secret": "acme"}, step_id="s")
        raise RuntimeError("crashed before its commit")

    with pytest.raises(RuntimeError):
        await durability.with_turn(TurnScope("t", "1", tenant_id="acme"), acme)

    async def globex(tx: TurnTransaction) -> TurnCommit:
        with pytest.raises(TenantMismatchError) as refused:
            await tx.run_effect("k", lambda a: {"secret": "globex"}, step_id="s")
        assert refused.value.receipt is None  # nothing of acme's receipt is handed out
        return commit_for(tx)

    with pytest.raises(TenantMismatchError, match="nothing was committed"):
        await durability.with_turn(TurnScope("t", "2", tenant_id="globex"), globex)
    assert await durability.load_checkpoint("t") is None

    async def acme_again(tx: TurnTransaction) -> TurnCommit:
        effect = await tx.run_effect("k", lambda a: {"secret": "twice"}, step_id="s")
        assert effect.value == {"secret": "acme"}
        return commit_for(tx)

    result = await durability.with_turn(TurnScope("t", "1", tenant_id="acme"), acme_again)
    assert result.checkpoint_version == 1


async def test_a_busy_thread_is_waited_for_then_refused_after_the_lock_timeout() -> None:
    """An uncontended lock is taken at once; a contended one is waited for, up to
    ``lock_timeout`` (``ThreadBusyError``), and taken as soon as it is free."""
    durability = InMemoryDurability(lock_timeout=0.2)
    held = HeldTurn()
    first = asyncio.create_task(durability.with_turn(TurnScope("t", "1"), held))
    await asyncio.wait_for(held.entered.wait(), 5)
    with pytest.raises(ThreadBusyError) as busy:
        await durability.with_turn(TurnScope("t", "2"), commit_for_turn)
    assert busy.value.thread_id == "t"
    assert (await durability.with_turn(TurnScope("u", "1"), commit_for_turn)).turn_id == "1"
    waiting = asyncio.create_task(durability.with_turn(TurnScope("t", "2"), commit_for_turn))
    await asyncio.sleep(0.05)
    held.release.set()
    assert (await first).checkpoint_version == 1
    assert (await waiting).checkpoint_version == 2


async def commit_for_turn(tx: TurnTransaction) -> TurnCommit:
    return commit_for(tx)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_a_lock_timeout_that_never_ends_or_is_negative_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        InMemoryDurability(lock_timeout=value)


async def test_a_failed_turn_start_lets_the_threads_lock_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``lock_and_begin`` (the default ``start_turn``): when ``begin_turn`` fails under
    the lock, its error reaches the caller and the lock is released, so the next turn
    takes it at once (``wait=False`` would raise ``ThreadBusyError`` otherwise)."""
    durability = InMemoryDurability()
    recorder = await durability.recorder()
    begin_turn = recorder.begin_turn
    failures = [OSError("the store went away")]

    async def failing_once(thread_id: str, turn_id: str, known: int | None) -> TurnStart:
        if failures:
            raise failures.pop()
        return await begin_turn(thread_id, turn_id, known)

    monkeypatch.setattr(recorder, "begin_turn", failing_once)
    with pytest.raises(OSError, match="went away"):
        await durability.with_turn(TurnScope("t", "1"), commit_for_turn)
    result = await durability.with_turn(TurnScope("t", "1"), commit_for_turn, wait=False)
    assert result.checkpoint_version == 1
