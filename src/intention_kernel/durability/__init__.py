"""The storage contract of intention-kernel, documented in one place.

A **durability adapter** is the transaction boundary of a turn. The kernel calls
``await durability.with_turn(scope, operation)``; for one ``thread_id`` the
adapter must:

1. serialize concurrent turns (across processes and hosts where the store is shared).
   ``with_turn(..., wait=False)`` makes one attempt at the thread's lock
   (``Agent(on_busy="reject")``). It raises ``ThreadBusyError`` at once when another
   turn holds the lock. ``wait=True`` (the default) queues behind that turn, up to the
   adapter's lock timeout.
2. load the latest checkpoint.
3. return the stored result with ``replayed=True`` when the same ``turn_id`` was
   already committed, without calling ``operation`` and without loading the
   checkpoint; a different request under a committed ``turn_id`` raises
   ``TurnConflictError``.
4. expose durable effect coordination to the operation (``tx.run_effect``).
5. atomically commit the result, the next checkpoint and the outbox events, with a
   unique ``(thread_id, turn_id)`` and a fenced (compare-and-set) thread version.
6. keep the turn's journal (``tx.recorded(key, compute)``). The first call of a key
   in a turn ID computes the value. It records the value durably before returning
   it, in its own short write under the thread's lock. Every later call of that key
   in the same turn ID returns the recorded value without computing it. That holds
   in this delivery and in a delivery after a crash. Values are JSON; a recorded
   value comes back as the store reads it. A turn ID whose journal was recorded for
   another request raises ``TurnConflictError``. The journal of a turn is deleted by
   its commit; a committed turn replays without reading it. The runtime records each
   model round's response there before any step of the round runs. A framework
   bridge may record its own model requests the same way, under keys of its own.
   The runtime's keys start with ``kernel.``. A turn that never calls it costs
   nothing.

``with_turn`` is where a turn's IDs are checked (the kernel does not check them
again): a thread, turn or tenant ID that breaks the rules of
:func:`~intention_kernel._ids.check_id` is refused with
``InvalidRequestError`` before anything is read.

Effects (``tx.run_effect(key, fn, step_id=...)``) go per ``(thread_id, key)``:

- a completed receipt returns the stored value without calling ``fn``.
- an uncertain receipt raises ``EffectUncertainError`` without calling ``fn``.
- so does a prepared one left by an attempt that did not finish.
- otherwise ``prepared`` is persisted before ``fn`` runs, and ``completed`` /
  ``failed`` / ``uncertain`` right after it.

Tenants: a thread belongs to the tenant of its first durable write (its first
committed turn or, before that, its first effect receipt); a turn of another tenant
is refused with ``TenantMismatchError`` and is never shown that tenant's receipts.
The inspection and operations methods (``load_checkpoint``, ``list_receipts``,
``resolve_receipt``, ``read_outbox``) are operator-level: they see every tenant
unless filtered (``list_receipts(tenant_id=...)``). ``RecordedDurability`` also takes
``owner=ThreadOwner(tenant_id)`` on ``load_checkpoint`` and ``resolve_receipt``. A
thread of another owner then reads as missing. That is decided on the snapshot read
or under the thread's lock. So a host acting for a tenant is never shown another
tenant's first turn while it runs.

There are two ways to write an adapter:

- implement :class:`Durability` directly (the protocol below), or
- implement the small I/O-only :class:`~intention_kernel.durability.abc.Recorder`
  and subclass :class:`~intention_kernel.durability.abc.RecordedDurability`, which
  applies every rule above in shared, tested code. The bundled adapters do this. A
  recorder has four parts, each a Protocol in :mod:`~intention_kernel.durability.abc`:
  ``TurnRecorder`` (lock, begin, commit, read), ``EffectRecorder`` (claim, settle, list,
  resolve), ``OutboxRecorder`` (read, claim, mark published) and ``MaintenanceRecorder``
  (scan, rewrite, prune). It declares its options in ``options``, a
  :class:`~intention_kernel.durability.abc.RecorderOptions`.

The outbox relay, the operations, the HTTP host and the CLI each take a Protocol of
:mod:`~intention_kernel.durability.abc` naming what they use (``Recorded``,
``Migratable``, ``TenantStore``, ``InteractionQueue``, ``Operable``), not a class: a
durability that offers those methods works with them. Either way, run the conformance
suite in :mod:`intention_kernel.testing.conformance`. The names an adapter author needs
are gathered in :mod:`intention_kernel.durability.abc`.

Adapters: ``InMemoryDurability`` (``intention_kernel.testing``), ``SQLiteDurability``
(``intention_kernel.durability.sqlite``), ``PostgresDurability``
(``intention_kernel.durability.postgres``), or :func:`open_durability` with a URL.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol, Self

from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel._effects import EffectFn, EffectOrigin, EffectResult, Receipt, ReceiptStatus
from intention_kernel._turns import OutboxEvent, TurnCommit, TurnResult, TurnScope
from intention_kernel.durability._contract.options import check_seconds, take_url_options

__all__ = ["Durability", "TurnOperation", "TurnTransaction", "open_durability"]

# The former names of the option checks, which adapters now import from ``_options``.
_check_seconds = check_seconds
_take_url_options = take_url_options


class TurnTransaction(Protocol):
    """What an operation sees inside ``with_turn``."""

    @property
    def scope(self) -> TurnScope: ...

    @property
    def checkpoint(self) -> KernelCheckpoint | None: ...

    async def run_effect(
        self,
        key: str,
        fn: EffectFn,
        *,
        step_id: str,
        actor: str | None = None,
        origin: EffectOrigin | None = None,
    ) -> EffectResult[Any]:
        """Run ``fn`` once per ``(thread_id, key)`` (see "Effects" above); ``actor``
        (who approved the write, if anyone) and ``origin`` (what the write is for) are
        recorded on the receipt of the attempt, with its prepare. The runtime passes
        ``origin`` only to a transaction whose ``run_effect`` names it."""
        ...

    async def recorded(
        self,
        key: str,
        compute: Callable[[], Awaitable[Any]],
        *,
        keep: Callable[[Any], bool] | None = None,
    ) -> Any:
        """The JSON value this turn ID recorded under ``key``, or else ``await compute()``,
        recorded durably and returned (unless ``keep(value)`` is false); see rule 6."""
        ...


#: The body of a turn: given its transaction, the commit it asks for.
TurnOperation = Callable[[TurnTransaction], Awaitable[TurnCommit]]


class Durability(Protocol):
    """The contract every durability adapter fulfils."""

    async def with_turn(
        self, scope: TurnScope, operation: TurnOperation, *, wait: bool = True
    ) -> TurnResult:
        """Run ``operation`` as the turn ``scope`` names, or replay its commit.

        A committed turn ID answers its stored result without running anything.
        Otherwise the thread is locked, and the operation's commit is written once.
        With ``wait=False`` a busy thread raises ``ThreadBusyError`` at once.
        """
        ...

    async def load_checkpoint(self, thread_id: str) -> KernelCheckpoint | None:
        """The thread's last committed checkpoint, or ``None`` for a new thread."""
        ...

    async def list_receipts(
        self,
        thread_id: str | None = None,
        status: ReceiptStatus | str | None = None,
        *,
        tenant_id: str | None = None,
    ) -> list[Receipt]:
        """The receipts, oldest first, filtered by each argument given."""
        ...

    async def resolve_receipt(
        self,
        thread_id: str,
        key: str,
        *,
        applied: bool,
        value: Any = None,
        note: str | None = None,
        actor: str | None = None,
    ) -> Receipt:
        """Settle an ``uncertain`` receipt by hand: applied or not applied.

        The answer is recorded with its note and actor, and announced.
        """
        ...

    async def read_outbox(
        self, thread_id: str | None = None, after: int | None = None, limit: int = 100
    ) -> list[OutboxEvent]:
        """Outbox events in ``seq`` order, after ``after``, at most ``limit``."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections; a closed adapter runs no turn."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def open_durability(
    url: str, *, lock_timeout: float | None = None, connect_timeout: float | None = None
) -> Durability:
    """Build an adapter from a URL (not opened: nothing is read or created yet).

    - ``sqlite:///relative.db``, ``sqlite:////absolute/path.db`` → ``SQLiteDurability``
    - ``postgresql://user@host:5432/db`` (or ``postgres://``) → ``PostgresDurability``.
      Three query parameters are the adapter's, not libpq's. They are removed before
      the rest reaches libpq. ``schema`` is the PostgreSQL schema holding the tables.
      ``lock_timeout`` is the seconds to wait for a busy thread. ``lease_expiry`` is the
      seconds a thread lease lasts unless renewed. A URL with two of them:
      ``postgresql://app@db/app?schema=billing&lock_timeout=5&sslmode=require``.
    - ``memory://`` → ``InMemoryDurability``, for tests and examples only.

    Options are ``None`` for the adapter's default. ``lock_timeout`` is the seconds a
    turn waits for a busy thread; a URL may not give ``lock_timeout=`` too.
    ``connect_timeout`` is the seconds opening waits to reach the server (PostgreSQL
    only; see ``PostgresDurability``). A bad URL or option is a ``ValueError``.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(
            f"not a durability URL: {url!r} (expected sqlite:///path.db or postgresql://...)"
        )
    if lock_timeout is not None:
        lock_timeout = _check_seconds("lock_timeout", lock_timeout)
    if connect_timeout is not None:
        connect_timeout = _check_seconds("connect_timeout", connect_timeout)
    scheme = scheme.lower()
    if scheme == "sqlite":
        from intention_kernel.durability.sqlite import SQLiteDurability

        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise ValueError(f"sqlite URL needs a path: {url!r} (sqlite:///file.db)")
        if lock_timeout is None:
            return SQLiteDurability(path)
        return SQLiteDurability(path, lock_timeout=lock_timeout)
    if scheme in ("postgresql", "postgres"):
        from intention_kernel.durability import postgres

        dsn, options = _take_url_options(url, postgres.URL_OPTIONS)
        timeout = options.get("lock_timeout")
        if timeout is not None and lock_timeout is not None:
            raise ValueError("lock_timeout= twice: in the durability URL and as an option")
        if timeout is not None:
            lock_timeout = _seconds("lock_timeout", timeout)
        expiry = options.get("lease_expiry")
        return postgres.PostgresDurability(
            dsn,
            schema=options.get("schema", postgres.DEFAULT_SCHEMA),
            lock_timeout=postgres.DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout,
            connect_timeout=connect_timeout,
            lease_expiry=(
                postgres.DEFAULT_LEASE_EXPIRY
                if expiry is None
                else _seconds("lease_expiry", expiry)
            ),
        )
    if scheme == "memory":
        from intention_kernel.durability._memory import InMemoryDurability

        if lock_timeout is None:
            return InMemoryDurability()
        return InMemoryDurability(lock_timeout=lock_timeout)
    raise ValueError(f"unknown durability scheme {scheme!r} in {url!r}")


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}= in the durability URL must be a number of seconds, got {text!r}")
    return value
