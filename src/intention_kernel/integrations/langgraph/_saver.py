"""KernelSaver: a LangGraph checkpointer on intention-kernel's stores.

It serves applications that drive their graph themselves, with ``graph.invoke`` and a ``thread_id``.
They want its checkpoints in the store their kernel uses.
That is memory, SQLite or PostgreSQL, opened from the same URLs as :func:`open_durability`.

Each thread has one writer at a time:

- A checkpoint is stored only if its parent is still the latest checkpoint.
  That is the latest of its thread and namespace.
- It is a compare-and-set on the parent's ID, under the store's write lock.
- Two runs that started from the same checkpoint cannot both extend it.
  The later put raises :class:`CheckpointConflictError`, and that run stops there.
- Time travel and ``update_state`` branch on purpose, from any stored checkpoint.
  Their metadata's ``source`` is ``"fork"`` or ``"update"``.

The store's connections live on one event loop.
That is the loop of the first async call.
Failing that, the first sync call starts a loop thread of the saver's own.
Calls from other threads or loops are handed to that loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from intention_kernel._loopthread import LoopThread
from intention_kernel.durability import Durability, open_durability
from intention_kernel.errors import EventLoopRunningError, InvalidRequestError, KernelClosedError
from intention_kernel.integrations.langgraph._rows import (
    FORK_SOURCES,
    CheckpointConflictError,
    CheckpointRows,
    StoredCheckpoint,
    StoredWrite,
)

__all__ = ["CheckpointConflictError", "KernelSaver"]

T = TypeVar("T")


class KernelSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer whose checkpoints live in an intention-kernel store.

    ``store`` is a URL for :func:`open_durability`, or an adapter object.
    A URL is ``sqlite:///app.db``, ``memory://`` or a ``postgresql://`` URL.
    The saver opens and closes the store of a URL.
    An adapter is a ``SQLiteDurability``, ``PostgresDurability`` or ``InMemoryDurability``.
    The application closes an adapter object itself.
    An adapter object is used on the saver's loop (see the module docstring).
    From sync code alone, that is the saver's own loop thread.
    ``close`` stops that thread, so pass a URL there.
    ``serde`` is LangGraph's serializer, or its default when None.

    Use it as LangGraph's own savers: ``graph.compile(checkpointer=saver)``.
    Then call ``graph.invoke(..., {"configurable": {"thread_id": ...}})`` or ``ainvoke``.
    A put whose parent is no longer its thread's latest checkpoint is refused.
    It raises :class:`CheckpointConflictError`: another run wrote the thread meanwhile.
    """

    def __init__(self, store: str | Durability, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self._owned = isinstance(store, str)
        self._durability = open_durability(store) if isinstance(store, str) else store
        self._rows: CheckpointRows | None = None
        self._home: asyncio.AbstractEventLoop | None = None
        self._loop_thread: LoopThread | None = None
        self._state = threading.Lock()
        self._closed = False

    # -- the loop the store lives on ---------------------------------------------------------

    async def _ready(self) -> CheckpointRows:
        """The store's rows, opened on first use (on the home loop)."""
        if self._rows is None:
            self._rows = await _rows_of(self._durability)
        return self._rows

    async def _on_home(self, fn: Callable[[CheckpointRows], Coroutine[Any, Any, T]]) -> T:
        """Await ``fn(rows)`` on the home loop, binding it to this loop on first use."""
        running = asyncio.get_running_loop()
        with self._state:
            self._check_open()
            if self._home is None:
                self._home = running
            home = self._home

        async def call() -> T:
            return await fn(await self._ready())

        if home is running:
            return await call()
        self._check_home(home, self._loop_thread)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), home))

    def _block(self, fn: Callable[[CheckpointRows], Coroutine[Any, Any, T]]) -> T:
        """Run ``fn(rows)`` on the home loop and wait for it, from a plain thread."""
        running = asyncio._get_running_loop()
        with self._state:
            self._check_open()
            if self._home is None:
                self._loop_thread = LoopThread("intention-kernel-saver")
                self._home = self._loop_thread.loop
            home = self._home
        if running is home:
            raise EventLoopRunningError(
                "KernelSaver's sync methods were called on the event loop its store lives "
                "on: waiting there would block that loop; use the async graph methods "
                "(ainvoke, astream), which call aput and aget_tuple"
            )
        loop_thread = self._loop_thread
        self._check_home(home, loop_thread)

        async def call() -> T:
            return await fn(await self._ready())

        if loop_thread is not None and home is loop_thread.loop:
            # The saver's own loop runs only while a caller or its thread drives it.
            return loop_thread.call(call)
        return asyncio.run_coroutine_threadsafe(call(), home).result()

    def _check_open(self) -> None:
        if self._closed:
            raise KernelClosedError("this KernelSaver is closed")

    @staticmethod
    def _check_home(home: asyncio.AbstractEventLoop, loop_thread: LoopThread | None) -> None:
        # The saver's own loop may be idle between calls: it is not a dead loop.
        own = loop_thread is not None and home is loop_thread.loop
        if home.is_closed() or not (own or home.is_running()):
            raise EventLoopRunningError(
                "the event loop KernelSaver's store was opened on is no longer running; "
                "make a KernelSaver for each event loop (asyncio.run) that uses it"
            )

    # -- rows from LangGraph's values --------------------------------------------------------

    def _row(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> StoredCheckpoint:
        thread_id, ns = _place(config)
        kind, body = self.serde.dumps_typed(checkpoint)
        stored = get_serializable_checkpoint_metadata(config, metadata)
        meta_kind, meta = self.serde.dumps_typed(stored)
        run_id = stored.get("run_id")
        return StoredCheckpoint(
            thread_id,
            ns,
            checkpoint["id"],
            get_checkpoint_id(config),
            kind,
            body,
            meta_kind,
            meta,
            None if run_id is None else str(run_id),
        )

    def _writes(
        self, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> list[StoredWrite]:
        return [
            StoredWrite(task_id, WRITES_IDX_MAP.get(channel, idx), channel, *dumped, task_path)
            for idx, (channel, value) in enumerate(writes)
            for dumped in [self.serde.dumps_typed(value)]
        ]

    def _tuple(self, row: StoredCheckpoint, writes: list[StoredWrite]) -> CheckpointTuple:
        def config(checkpoint_id: str) -> RunnableConfig:
            return {
                "configurable": {
                    "thread_id": row.thread_id,
                    "checkpoint_ns": row.checkpoint_ns,
                    "checkpoint_id": checkpoint_id,
                }
            }

        return CheckpointTuple(
            config=config(row.checkpoint_id),
            checkpoint=self.serde.loads_typed((row.type, row.checkpoint)),
            metadata=self.serde.loads_typed((row.metadata_type, row.metadata)),
            parent_config=None if row.parent_id is None else config(row.parent_id),
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed((w.type, w.value))) for w in writes
            ],
        )

    def _put_call(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> tuple[Callable[[CheckpointRows], Coroutine[Any, Any, None]], RunnableConfig]:
        """What ``put`` and ``aput`` ask of the rows, and the config they answer."""
        row = self._row(config, checkpoint, metadata)
        fork = metadata.get("source") in FORK_SOURCES
        stored: RunnableConfig = {
            "configurable": {
                "thread_id": row.thread_id,
                "checkpoint_ns": row.checkpoint_ns,
                "checkpoint_id": row.checkpoint_id,
            }
        }
        return (lambda rows: rows.put(row, fork=fork)), stored

    def _put_writes_call(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Callable[[CheckpointRows], Coroutine[Any, Any, None]]:
        """What ``put_writes`` and ``aput_writes`` ask of the rows."""
        thread_id, ns = _place(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise InvalidRequestError("put_writes needs a config with a checkpoint_id")
        rows_of = self._writes(writes, task_id, task_path)
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        return lambda rows: rows.put_writes(thread_id, ns, checkpoint_id, rows_of, replace=replace)

    def _matches(self, tup: CheckpointTuple, wanted: dict[str, Any] | None) -> bool:
        return not wanted or all(tup.metadata.get(k) == v for k, v in wanted.items())

    # -- async -------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or its thread's latest, with its writes."""
        thread_id, ns = _place(config)
        checkpoint_id = get_checkpoint_id(config)
        found = await self._on_home(lambda rows: rows.get(thread_id, ns, checkpoint_id))
        return None if found is None else self._tuple(*found)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints matching ``config`` and the metadata ``filter``, newest first."""
        found = await self._on_home(lambda rows: self._search(rows, config, before, filter, limit))
        for tup in found:
            if limit is not None and limit <= 0:
                return
            if self._matches(tup, filter):
                if limit is not None:
                    limit -= 1
                yield tup

    async def _search(
        self,
        rows: CheckpointRows,
        config: RunnableConfig | None,
        before: RunnableConfig | None,
        filter: dict[str, Any] | None,
        limit: int | None,
    ) -> list[CheckpointTuple]:
        """The matching checkpoints, newest first, up to ``limit``.

        Without a metadata filter, the store applies the limit.
        A filter reads the metadata, which only this side decodes.
        """
        wanted = (config or {}).get("configurable", {})
        found = await rows.search(
            _text(wanted, "thread_id"),
            _text(wanted, "checkpoint_ns"),
            _text(wanted, "checkpoint_id"),
            None if before is None else get_checkpoint_id(before),
            None if filter or limit is None else max(limit, 0),
        )
        return [self._tuple(row, writes) for row, writes in found]

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` as the child of the one ``config`` names.

        That parent may no longer be its thread's latest checkpoint.
        Then it raises :class:`CheckpointConflictError`, and nothing is stored.
        Metadata that marks a fork is the exception.
        """
        call, stored = self._put_call(config, checkpoint, metadata)
        await self._on_home(call)
        return stored

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes on the checkpoint ``config`` names."""
        await self._on_home(self._put_writes_call(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of ``thread_id``."""
        await self._on_home(lambda rows: rows.delete_thread(str(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose metadata names one of ``run_ids``, with their writes.

        A namespace may lose its latest checkpoint.
        Its newest remaining one then becomes the latest.
        """
        wanted = [str(run_id) for run_id in run_ids]
        if wanted:
            await self._on_home(lambda rows: rows.delete_for_runs(wanted))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and latest mark of one thread to another."""
        source, target = str(source_thread_id), str(target_thread_id)
        await self._on_home(lambda rows: rows.copy_thread(source, target))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune the threads' checkpoints by ``strategy``.

        ``"keep_latest"`` keeps only each namespace's latest checkpoint and its writes.
        ``"delete"`` deletes the threads; another strategy is refused.

        A graph with a ``DeltaChannel`` rebuilds it from older checkpoints.
        So do not keep only the latest of its threads (see LangGraph's ``prune``).
        """
        keep_latest = _strategy(strategy)
        threads = [str(thread_id) for thread_id in thread_ids]
        if threads:
            await self._on_home(lambda rows: rows.prune(threads, keep_latest=keep_latest))

    # -- sync --------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The sync twin of :meth:`aget_tuple`."""
        thread_id, ns = _place(config)
        checkpoint_id = get_checkpoint_id(config)
        found = self._block(lambda rows: rows.get(thread_id, ns, checkpoint_id))
        return None if found is None else self._tuple(*found)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The sync twin of :meth:`alist`."""
        found = self._block(lambda rows: self._search(rows, config, before, filter, limit))
        for tup in found:
            if limit is not None and limit <= 0:
                return
            if self._matches(tup, filter):
                if limit is not None:
                    limit -= 1
                yield tup

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """The sync twin of :meth:`aput`."""
        call, stored = self._put_call(config, checkpoint, metadata)
        self._block(call)
        return stored

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """The sync twin of :meth:`aput_writes`."""
        self._block(self._put_writes_call(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """The sync twin of :meth:`adelete_thread`."""
        self._block(lambda rows: rows.delete_thread(str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """The sync twin of :meth:`adelete_for_runs`."""
        wanted = [str(run_id) for run_id in run_ids]
        if wanted:
            self._block(lambda rows: rows.delete_for_runs(wanted))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """The sync twin of :meth:`acopy_thread`."""
        source, target = str(source_thread_id), str(target_thread_id)
        self._block(lambda rows: rows.copy_thread(source, target))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """The sync twin of :meth:`aprune`."""
        keep_latest = _strategy(strategy)
        threads = [str(thread_id) for thread_id in thread_ids]
        if threads:
            self._block(lambda rows: rows.prune(threads, keep_latest=keep_latest))

    # -- lifecycle ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the store if the saver opened it from a URL, then refuse every call."""
        with self._state:
            if self._closed:
                return
            home, self._closed = self._home, True
        if not self._owned:
            return
        running = asyncio.get_running_loop()
        if home is None or home is running:
            await self._durability.aclose()
        elif self._loop_thread is not None:
            thread, self._loop_thread = self._loop_thread, None
            await asyncio.to_thread(thread.stop, self._durability.aclose)
        else:
            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(self._durability.aclose(), home)
            )

    def close(self) -> None:
        """The sync twin of :meth:`aclose`, from a plain thread."""
        with self._state:
            if self._closed:
                return
            home, thread, self._closed = self._home, self._loop_thread, True
            self._loop_thread = None
        if thread is not None:
            thread.stop(self._durability.aclose if self._owned else _nothing)
        elif self._owned and home is not None and home.is_running():
            asyncio.run_coroutine_threadsafe(self._durability.aclose(), home).result()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def _nothing() -> None:
    return None


def _place(config: RunnableConfig) -> tuple[str, str]:
    """The thread and namespace ``config`` names; a missing thread is refused."""
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise InvalidRequestError(
            'KernelSaver needs a thread: pass config={"configurable": {"thread_id": ...}}'
        )
    return str(thread_id), str(configurable.get("checkpoint_ns") or "")


def _strategy(strategy: str) -> bool:
    """Whether a prune ``strategy`` keeps the latest checkpoints; an unknown one is refused."""
    if strategy not in ("keep_latest", "delete"):
        raise InvalidRequestError(
            f"prune strategy {strategy!r} is not 'keep_latest' or 'delete'; nothing was pruned"
        )
    return strategy == "keep_latest"


def _text(configurable: dict[str, Any], key: str) -> str | None:
    value = configurable.get(key)
    return None if value is None else str(value)


async def _rows_of(durability: Durability) -> CheckpointRows:
    """The rows of the store behind ``durability``, which this opens."""
    from intention_kernel.durability._engine.recorded import RecordedDurability
    from intention_kernel.durability._memory import InMemoryDurability

    if isinstance(durability, InMemoryDurability):
        from intention_kernel.integrations.langgraph._memory_rows import memory_rows

        return memory_rows(durability)
    if isinstance(durability, RecordedDurability):
        recorder = await durability.recorder()
        from intention_kernel.durability.sqlite._recorder import SQLiteRecorder
        from intention_kernel.integrations.langgraph import _sql_rows

        if isinstance(recorder, SQLiteRecorder):
            return _sql_rows.SQLiteRows(recorder)
        try:
            from intention_kernel.durability.postgres._recorder import PostgresRecorder
        except ImportError:  # pragma: no cover - without the postgres extra
            pass
        else:
            if isinstance(recorder, PostgresRecorder):
                return _sql_rows.PostgresRows(recorder)
    raise InvalidRequestError(
        f"KernelSaver keeps checkpoints in intention-kernel's memory, SQLite or PostgreSQL "
        f"stores, not in {type(durability).__name__}"
    )
