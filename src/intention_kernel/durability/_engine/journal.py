"""The journal part of a turn's ``tx``: the values it records, by key (``recorded``).

A value computed once per turn ID (a model round's response, say) is written to the
journal before it is used. A delivery of the same turn ID after a crash reads it back
and does not compute it again. :class:`~._transaction.Transaction` takes this part in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from intention_kernel._effects import utcnow
from intention_kernel._json import describe_error, dump_value, load_value, normalize, text_problem
from intention_kernel.durability._contract.records import JournalEntry
from intention_kernel.errors import (
    CorruptRecordError,
    JournalError,
    TenantMismatchError,
    TurnConflictError,
)

if TYPE_CHECKING:
    from intention_kernel._turns import TurnScope
    from intention_kernel.durability._contract.recorders import Recorder

__all__ = ["TurnJournal"]


class TurnJournal:
    """``Transaction``'s journal methods, and the state every part of a ``tx`` shares.

    ``Transaction.__init__`` sets every slot. The parts are a chain of classes, not
    side-by-side mixins: only one base of a class may add slots."""

    __slots__ = (
        "_closed",
        "_journaled",
        "_recorded",
        "_recorder",
        "_recording",
        "_refused",
        "_scope",
    )

    _scope: TurnScope
    _recorder: Recorder
    _closed: bool
    _recorded: dict[str, Any] | None
    _recording: set[str]
    _journaled: bool
    _refused: TenantMismatchError | None

    async def recorded(
        self,
        key: str,
        compute: Callable[[], Awaitable[Any]],
        *,
        keep: Callable[[Any], bool] | None = None,
        stream: Callable[[], tuple[int, str]] | None = None,
    ) -> Any:
        """The JSON value recorded under ``key`` by this turn ID.

        If there is none, ``await compute()``, record it and return it. ``keep`` may say
        not to record it.

        Either way the value comes back as the store reads it: tuples as lists, and so
        on. So the first delivery and a redelivery go on from the same value. The entry
        is durable before this returns. A delivery of the same turn ID after a crash
        gets it without calling ``compute``. ``keep(value)`` returning ``False`` hands
        the value back unrecorded. The runtime so skips a model round that asks for
        nothing; the commit that follows records that round anyway. A key that is not
        storable text, or a value that is not JSON, raises ``JournalError`` and records
        nothing.

        ``stream()`` is called just before the write. It gives a streamed turn's events
        since its previous entry. They are written with the entry, in its transaction.
        """
        scope = self._scope
        if self._closed:
            raise JournalError(
                f"tx.recorded({key!r}) called after the turn ended",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        problem = (
            "it is not a non-empty string"
            if not isinstance(key, str) or not key
            else text_problem(key)
        )
        if problem is not None:
            raise JournalError(
                f"journal key {key!r} cannot be recorded: {problem}",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        if key in self._recording:
            # Two computations of one key would both be recorded. The second write would
            # be refused as a conflict, after its computation (a model request) was paid.
            raise JournalError(
                f"journal key {key!r} is already being computed in this turn",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        recorded = self._recorded
        if recorded is None:
            recorded = self._recorded = await self._read_journal()
        if key in recorded:
            return recorded[key]
        self._recording.add(key)
        try:
            value = await compute()
        finally:
            self._recording.discard(key)
        try:
            stored = normalize(value)
            text = dump_value(stored)
        except (TypeError, ValueError) as exc:
            raise JournalError(
                f"the value computed for journal key {key!r} cannot be recorded: "
                f"{describe_error(exc)}",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            ) from exc
        if keep is not None and not keep(stored):
            return stored
        if self._closed:  # the turn ended while ``compute`` ran (a task left behind)
            raise JournalError(
                f"tx.recorded({key!r}) finished after the turn ended; nothing was recorded",
                thread_id=scope.thread_id,
                turn_id=scope.turn_id,
            )
        entry = JournalEntry(
            scope.thread_id,
            scope.turn_id,
            key,
            scope.request_digest,
            text,
            utcnow(),
            scope.tenant_id,
            stream() if stream is not None else None,
        )
        # Marked before the write. A write whose acknowledgement is lost may still have
        # stored the entry. The commit must then delete it too.
        self._journaled = True
        await self._recorder.write_journal(entry)
        recorded[key] = stored
        return stored

    async def _read_journal(self) -> dict[str, Any]:
        scope = self._scope
        entries = await self._recorder.read_journal(scope.thread_id, scope.turn_id)
        found: dict[str, Any] = {}
        for entry in entries:
            if entry.tenant_id != scope.tenant_id:
                # Another tenant's turn of this ID recorded these values. Continuing from
                # them would put that tenant's model responses in this tenant's reply.
                # Marked refused, so that no commit follows even if the error is caught.
                refused = TenantMismatchError(
                    f"turn {scope.turn_id!r} of thread {scope.thread_id!r} was started by "
                    "another tenant, whose model responses are recorded; nothing was read",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                )
                self._refused = refused
                raise refused
            if (
                scope.request_digest is not None
                and entry.request_digest is not None
                and entry.request_digest != scope.request_digest
            ):
                raise TurnConflictError(
                    f"turn {scope.turn_id!r} of thread {scope.thread_id!r} was started for a "
                    "different request, whose model responses are recorded; use a new turn "
                    "ID for a new request",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                )
            try:
                found[entry.key] = load_value(entry.value)
            except ValueError as exc:
                raise CorruptRecordError(
                    f"journal entry {entry.key!r} of turn {scope.turn_id!r} on thread "
                    f"{scope.thread_id!r} cannot be decoded: {exc}",
                    thread_id=scope.thread_id,
                    turn_id=scope.turn_id,
                    key=entry.key,
                ) from exc
        self._journaled = bool(found)
        return found
