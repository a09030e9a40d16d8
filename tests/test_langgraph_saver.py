"""KernelSaver: LangGraph's own conformance suite on memory, SQLite and PostgreSQL, its
sync methods, the compare-and-set on the parent checkpoint, and a real graph.

The suite is ``langgraph-checkpoint-conformance`` from PyPI (the dev extra): its
``validate()`` makes a fresh saver per capability through the factories below, and
runs the async methods. The sync methods run it too, through :class:`SyncMethods`,
whose async methods call the saver's sync ones on a thread.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.graph import END, START, StateGraph

from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.errors import InvalidRequestError
from intention_kernel.integrations.langgraph import CheckpointConflictError, KernelSaver
from intention_kernel.testing import InMemoryDurability
from proving_support import fresh_store_urls

StoreURL = Callable[[], str]


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreURL]:
    """A function giving the URL of a fresh store of each kind (a new SQLite file, a
    new PostgreSQL schema, dropped afterwards) at every call."""
    yield from fresh_store_urls(request, tmp_path, "ik_saver")


class SyncMethods(BaseCheckpointSaver[int]):
    """A KernelSaver seen through its sync methods: each async method here calls the
    sync one on a worker thread, as a sync graph's thread would."""

    def __init__(self, saver: KernelSaver) -> None:
        super().__init__()
        self.saver = saver

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.saver.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        def listed() -> list[CheckpointTuple]:
            return list(self.saver.list(config, filter=filter, before=before, limit=limit))

        for tup in await asyncio.to_thread(listed):
            yield tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.saver.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.saver.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.saver.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.saver.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.saver.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.saver.prune, thread_ids, strategy=strategy)


async def test_the_conformance_suite_passes_on_each_store(store_url: StoreURL) -> None:
    @checkpointer_test(name="KernelSaver")
    async def factory() -> AsyncIterator[KernelSaver]:
        async with KernelSaver(store_url()) as saver:
            yield saver

    report = await validate(factory)
    report.print_report()
    assert report.passed_all_base(), report.to_dict()
    results = report.to_dict()["results"]
    for capability in (
        "put",
        "put_writes",
        "get_tuple",
        "list",
        "delete_thread",
        "delete_for_runs",
        "copy_thread",
        "prune",
    ):
        assert results[capability]["passed"] is True, results[capability]
        assert results[capability]["tests_failed"] == 0


async def test_the_conformance_suite_passes_through_the_sync_methods(store_url: StoreURL) -> None:
    @checkpointer_test(name="KernelSaver (sync)")
    async def factory() -> AsyncIterator[SyncMethods]:
        saver = KernelSaver(store_url())
        try:
            yield SyncMethods(saver)
        finally:
            await asyncio.to_thread(saver.close)

    report = await validate(factory)
    report.print_report()
    assert report.passed_all_base(), report.to_dict()
    results = report.to_dict()["results"]
    for capability in ("delete_for_runs", "copy_thread", "prune"):
        assert results[capability]["passed"] is True, results[capability]


async def test_an_adapter_object_is_used_and_left_open(tmp_path: Path) -> None:
    async with SQLiteDurability(tmp_path / "k.db") as durability:
        async with KernelSaver(durability) as saver:
            config = generate_config("t")
            stored = await saver.aput(config, generate_checkpoint(), generate_metadata(), {})
        # The saver closed, the adapter did not: a second saver reads the same rows.
        async with KernelSaver(durability) as again:
            tup = await again.aget_tuple(generate_config("t"))
        assert tup is not None and tup.config == stored
        assert await durability.load_checkpoint("t") is None  # the kernel's own rows: none


async def test_two_savers_on_one_memory_store_share_its_threads() -> None:
    durability = InMemoryDurability()
    first, second = KernelSaver(durability), KernelSaver(durability)
    stored = await first.aput(generate_config("t"), generate_checkpoint(), generate_metadata(), {})
    tup = await second.aget_tuple(generate_config("t"))
    assert tup is not None and tup.config == stored


# -- the compare-and-set on the parent checkpoint --------------------------------------------


async def _put(
    saver: KernelSaver, parent: RunnableConfig | None, **metadata: Any
) -> RunnableConfig:
    config = generate_config("t")
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return await saver.aput(config, generate_checkpoint(), generate_metadata(**metadata), {})


async def _ids(saver: KernelSaver) -> list[str]:
    return [tup.checkpoint["id"] async for tup in saver.alist(generate_config("t"))]


async def test_a_put_from_a_parent_that_is_no_longer_the_latest_is_refused(
    store_url: StoreURL,
) -> None:
    async with KernelSaver(store_url()) as saver:
        base = await _put(saver, None)
        winner = await _put(saver, base)
        before = await _ids(saver)
        with pytest.raises(CheckpointConflictError, match="moved on") as refused:
            await _put(saver, base)
        assert refused.value.thread_id == "t"
        # Nothing stored; the winner is still the latest.
        assert await _ids(saver) == before
        latest = await saver.aget_tuple(generate_config("t"))
        assert latest is not None and latest.config == winner
        # The winner's line goes on.
        await _put(saver, winner)


async def test_a_root_put_on_a_thread_that_has_one_is_kept_aside_and_cannot_grow(
    store_url: StoreURL,
) -> None:
    async with KernelSaver(store_url()) as saver:
        first = await _put(saver, None)
        aside = await _put(saver, None)  # a second writer that read an empty thread
        latest = await saver.aget_tuple(generate_config("t"))
        assert latest is not None and latest.config == first
        assert aside["configurable"]["checkpoint_id"] in await _ids(saver)
        with pytest.raises(CheckpointConflictError):
            await _put(saver, aside)


async def test_a_fork_starts_from_any_stored_checkpoint_and_becomes_the_latest(
    store_url: StoreURL,
) -> None:
    async with KernelSaver(store_url()) as saver:
        base = await _put(saver, None)
        await _put(saver, base)
        fork = await _put(saver, base, source="fork")
        latest = await saver.aget_tuple(generate_config("t"))
        assert latest is not None and latest.config == fork
        update = await _put(saver, base, source="update")
        latest = await saver.aget_tuple(generate_config("t"))
        assert latest is not None and latest.config == update
        # A fork from a checkpoint that was never stored is refused.
        missing = generate_config("t", checkpoint_id=str(uuid.uuid4()))
        with pytest.raises(CheckpointConflictError):
            await _put(saver, missing, source="fork")


async def test_the_same_checkpoint_put_again_is_stored_once(store_url: StoreURL) -> None:
    async with KernelSaver(store_url()) as saver:
        base = await _put(saver, None)
        config = generate_config("t", checkpoint_id=base["configurable"]["checkpoint_id"])
        checkpoint = generate_checkpoint()
        child = await saver.aput(config, checkpoint, generate_metadata(), {})
        assert await saver.aput(config, checkpoint, generate_metadata(), {}) == child
        assert len(await _ids(saver)) == 2
        # The same ID under another parent is refused.
        with pytest.raises(CheckpointConflictError, match="another parent"):
            await saver.aput(generate_config("t"), checkpoint, generate_metadata(), {})


async def test_deleting_the_latest_checkpoints_run_makes_the_newest_left_the_latest(
    store_url: StoreURL,
) -> None:
    async with KernelSaver(store_url()) as saver:
        base = await _put(saver, None, run_id="r1")
        second = await _put(saver, base, run_id="r1")
        await _put(saver, second, run_id="r2")
        await saver.adelete_for_runs(["r2"])
        latest = await saver.aget_tuple(generate_config("t"))
        assert latest is not None and latest.config == second
        await _put(saver, second, run_id="r3")  # the line goes on from there
        await saver.adelete_for_runs(["r1", "r3"])
        assert await saver.aget_tuple(generate_config("t")) is None
        assert await _ids(saver) == []
        await _put(saver, None)  # an empty thread again: a first checkpoint is the latest


async def test_an_unknown_prune_strategy_is_refused_and_prunes_nothing(
    store_url: StoreURL,
) -> None:
    async with KernelSaver(store_url()) as saver:
        await _put(saver, await _put(saver, None))
        with pytest.raises(InvalidRequestError, match="strategy"):
            await saver.aprune(["t"], strategy="keep_oldest")
        assert len(await _ids(saver)) == 2
        await saver.aprune(["t"])
        assert len(await _ids(saver)) == 1


async def test_a_config_without_a_thread_is_refused_with_nothing_stored(
    store_url: StoreURL,
) -> None:
    async with KernelSaver(store_url()) as saver:
        configs: list[RunnableConfig] = [
            {"configurable": {}},
            {},
            {"configurable": {"thread_id": ""}},
        ]
        for config in configs:
            with pytest.raises(InvalidRequestError, match="thread_id"):
                await saver.aput(config, generate_checkpoint(), generate_metadata(), {})
            with pytest.raises(InvalidRequestError, match="thread_id"):
                await saver.aget_tuple(config)
        with pytest.raises(InvalidRequestError, match="checkpoint_id"):
            await saver.aput_writes(generate_config("t"), [("ch", 1)], "task")
        assert [tup async for tup in saver.alist(None)] == []


async def test_a_closed_saver_refuses_calls(store_url: StoreURL) -> None:
    saver = KernelSaver(store_url())
    await _put(saver, None)
    await saver.aclose()
    from intention_kernel.errors import KernelClosedError

    with pytest.raises(KernelClosedError):
        await saver.aget_tuple(generate_config("t"))


# -- a graph driven through it ---------------------------------------------------------------


class Count(TypedDict):
    n: int
    seen: list[str]


def _graph(saver: BaseCheckpointSaver[Any]) -> Any:
    def bump(state: Count) -> dict[str, Any]:
        return {"n": state["n"] + 1, "seen": [*state["seen"], f"bump{state['n']}"]}

    def double(state: Count) -> dict[str, Any]:
        return {"n": state["n"] * 2, "seen": [*state["seen"], "double"]}

    builder = StateGraph(Count)
    builder.add_node("bump", bump)
    builder.add_node("double", double)
    builder.add_edge(START, "bump")
    builder.add_edge("bump", "double")
    builder.add_edge("double", END)
    return builder.compile(checkpointer=saver)


def test_a_sync_graph_keeps_its_state_across_savers(store_url: StoreURL) -> None:
    url = store_url()
    if url == "memory://":
        url_store: Any = InMemoryDurability()
    else:
        url_store = url
    config: RunnableConfig = {"configurable": {"thread_id": "g"}}
    with KernelSaver(url_store) as saver:
        graph = _graph(saver)
        assert graph.invoke({"n": 1, "seen": []}, config)["n"] == 4
        assert graph.invoke({"n": 3, "seen": []}, config)["seen"] == ["bump3", "double"]
    with KernelSaver(url_store) as saver:
        state = _graph(saver).get_state(config)
        assert state.values == {"n": 8, "seen": ["bump3", "double"]}
        history = list(_graph(saver).get_state_history(config))
        assert len(history) == 8  # input, bump, double and the start, for each run


async def test_an_async_graph_time_travels_from_an_older_checkpoint(store_url: StoreURL) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "g"}}
    async with KernelSaver(store_url()) as saver:
        graph = _graph(saver)
        await graph.ainvoke({"n": 1, "seen": []}, config)
        await graph.ainvoke({"n": 5, "seen": []}, config)
        history = [s async for s in graph.aget_state_history(config)]
        # The state before the first run's "double": replay it from there.
        before_double = next(s for s in history if s.next == ("double",) and s.values["n"] == 2)
        replayed = await graph.ainvoke(None, before_double.config)
        assert replayed["n"] == 4
        latest = await graph.aget_state(config)
        assert latest.values["n"] == 4
        # The replayed branch grows from its fork: a new run extends it.
        assert (await graph.ainvoke({"n": 0, "seen": []}, config))["n"] == 2


# -- the migrations that made the tables -----------------------------------------------------


async def _a_kernel_turn(durability: Any) -> Any:
    from intention_kernel._kernel import Kernel
    from intention_kernel.testing._agents import FakeProvider, billing_agent

    await Kernel(billing_agent(FakeProvider()), durability).turn("k", "1", "balance 500")
    return await durability.load_checkpoint("k")


async def test_an_sqlite_store_from_before_migration_12_is_upgraded(tmp_path: Path) -> None:
    import sqlite3

    from intention_kernel.durability.sqlite import MIGRATIONS
    from sqlite_history import undo_migration_12

    path = tmp_path / "k.db"
    async with SQLiteDurability(path) as durability:
        before = await _a_kernel_turn(durability)
    with sqlite3.connect(path) as conn:
        undo_migration_12(conn)
    async with KernelSaver(f"sqlite:///{path}") as saver:
        stored = await _put(saver, None)
        assert (await saver.aget_tuple(generate_config("t"))).config == stored  # type: ignore[union-attr]
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT MAX(version) FROM ik_schema").fetchone()[0]
    assert version == len(MIGRATIONS) and MIGRATIONS[11].count("CREATE TABLE ik_lg_") == 3
    async with SQLiteDurability(path) as durability:
        assert await durability.load_checkpoint("k") == before


@pytest.mark.postgres
async def test_a_postgres_schema_from_before_migration_14_is_upgraded(postgres_dsn: str) -> None:
    import psycopg
    from psycopg import sql

    from intention_kernel.durability.postgres import MIGRATIONS, PostgresDurability

    schema = "ik_saver_" + uuid.uuid4().hex[:12]
    try:
        async with PostgresDurability(postgres_dsn, schema=schema) as durability:
            before = await _a_kernel_turn(durability)
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
            # Back to version 13: the saver's tables, and those of later migrations.
            conn.execute(
                "DROP TABLE ik_lg_checkpoints, ik_lg_writes, ik_lg_heads, ik_streams, ik_timers"
            )
            conn.execute("DELETE FROM ik_schema WHERE version > 13")
        async with KernelSaver(f"{postgres_dsn}?schema={schema}") as saver:
            stored = await _put(saver, None)
            tup = await saver.aget_tuple(generate_config("t"))
            assert tup is not None and tup.config == stored
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
            [(version,)] = conn.execute("SELECT MAX(version) FROM ik_schema").fetchall()
            # Schema-qualified: nothing of the saver's landed in another schema.
            [(elsewhere,)] = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE tablename = 'ik_lg_heads' "
                "AND schemaname = %s",
                (schema,),
            ).fetchall()
        assert version == len(MIGRATIONS) and elsewhere == 1
        async with PostgresDurability(postgres_dsn, schema=schema) as durability:
            assert await durability.load_checkpoint("k") == before
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# -- two writers on one thread, in two processes ---------------------------------------------


def _two_writers(url: str, thread_id: str, folder: Path) -> list[dict[str, Any]]:
    import json
    import subprocess
    import sys

    worker = Path(__file__).with_name("langgraph_saver_worker.py")
    barrier: dict[str, Any] = {"dir": str(folder / f"barrier-{thread_id}"), "count": 2}
    Path(barrier["dir"]).mkdir()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(worker),
                json.dumps(
                    {
                        "url": url,
                        "thread_id": thread_id,
                        "writer": writer,
                        "start": start,
                        "barrier": barrier,
                    }
                ),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent,
        )
        for writer, start in (("A", 100), ("B", 200))
    ]
    outcomes = []
    for writer, proc in zip("AB", procs, strict=True):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outcomes.append({"writer": writer, **json.loads(out.strip().splitlines()[-1])})
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize("fresh", [True, False], ids=["new-thread", "existing-thread"])
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_processes_driving_one_thread_one_wins_the_other_is_refused(
    kind: str, fresh: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Both processes read the thread before either writes (a barrier before the first
    put), then race. One run completes; the other is refused with a typed error at
    its first put that the winner made stale. The thread's history, walked from its
    latest checkpoint, is the winner's alone: nothing of the loser is in it."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'k.db'}"
        drop: Callable[[], None] = lambda: None  # noqa: E731
    else:
        import psycopg
        from psycopg import sql

        dsn: str = request.getfixturevalue("postgres_dsn")
        schema = "ik_saver_" + uuid.uuid4().hex[:12]
        url = f"{dsn}?schema={schema}"

        def drop() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )

    try:
        config: RunnableConfig = {"configurable": {"thread_id": "race", "writer": "setup"}}
        with KernelSaver(url) as saver:
            if not fresh:
                assert _graph(saver).invoke({"n": 0, "seen": []}, config)["n"] == 2
            before = len(list(saver.list(config)))
        outcomes = _two_writers(url, "race", tmp_path)
        assert sorted(o["outcome"] for o in outcomes) == ["done", "refused"], outcomes
        [winner] = [o for o in outcomes if o["outcome"] == "done"]
        [loser] = [o for o in outcomes if o["outcome"] == "refused"]
        assert loser["error"] == "CheckpointConflictError"
        start = 100 if winner["writer"] == "A" else 200
        assert winner["n"] == start + 3

        with KernelSaver(url) as saver:
            latest = saver.get_tuple(config)
            assert latest is not None
            assert latest.checkpoint["channel_values"]["n"] == start + 3
            assert latest.checkpoint["channel_values"]["seen"] == [
                winner["writer"],
                "one",
                "two",
                "three",
            ]
            lineage: list[object] = []
            cursor: CheckpointTuple | None = latest
            while cursor is not None:
                lineage.append(cursor.metadata.get("writer"))
                parent = cursor.parent_config
                cursor = None if parent is None else saver.get_tuple(parent)
            run = [w for w in lineage if w != "setup"]
            assert run and set(run) == {winner["writer"]}, lineage
            assert lineage[len(run) :] == ["setup"] * (len(lineage) - len(run))
            # The winner's input checkpoint and its four steps. Of the loser's: on a
            # new thread its first put, kept aside as a root of its own; else none.
            stored = list(saver.list(config))
            assert len(stored) - before == 5 + fresh
            aside = [t for t in stored if t.metadata.get("writer") == loser["writer"]]
            assert len(aside) == fresh
            assert all(t.parent_config is None for t in aside)
    finally:
        drop()


# -- a process killed between steps ----------------------------------------------------------


def _worker(config: dict[str, Any]) -> tuple[int, str]:
    import json
    import subprocess
    import sys

    worker = Path(__file__).with_name("langgraph_saver_worker.py")
    done = subprocess.run(
        [sys.executable, str(worker), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,
        check=False,
    )
    return done.returncode, done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_run_killed_between_steps_goes_on_from_its_last_checkpoint_in_another_process(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGKILL as the graph's second node starts: the checkpoint after its first node is
    stored, and a new process resumes from it (``invoke(None)``). The first node never
    runs again; the thread's history is one line, killed run and resumed run alike."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'k.db'}"
    else:
        dsn: str = request.getfixturevalue("postgres_dsn")
        schema = "ik_saver_" + uuid.uuid4().hex[:12]
        url = f"{dsn}?schema={schema}"
    try:
        base = {"url": url, "thread_id": "crash", "writer": "first"}
        code, _ = _worker({**base, "start": 10, "die_in": "two"})
        assert code == -9  # killed by SIGKILL
        config: RunnableConfig = {"configurable": {"thread_id": "crash"}}
        with KernelSaver(url) as saver:
            latest = saver.get_tuple(config)
            assert latest is not None
            assert latest.checkpoint["channel_values"]["seen"] == ["first", "one"]
        code, out = _worker({**base, "writer": "second", "start": None})
        assert code == 0 and '"n": 13' in out, out
        with KernelSaver(url) as saver:
            latest = saver.get_tuple(config)
            assert latest is not None
            assert latest.checkpoint["channel_values"]["seen"] == ["first", "one", "two", "three"]
            lineage: list[str] = []
            cursor: CheckpointTuple | None = latest
            while cursor is not None:
                lineage.append(cursor.checkpoint["id"])
                parent = cursor.parent_config
                cursor = None if parent is None else saver.get_tuple(parent)
            assert sorted(t.checkpoint["id"] for t in saver.list(config)) == sorted(lineage)
    finally:
        if kind == "postgres":
            import psycopg
            from psycopg import sql

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )


async def test_update_state_on_an_older_checkpoint_branches_from_it(store_url: StoreURL) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "g"}}
    async with KernelSaver(store_url()) as saver:
        graph = _graph(saver)
        await graph.ainvoke({"n": 1, "seen": []}, config)
        first = [s async for s in graph.aget_state_history(config)][-1]  # the oldest
        await graph.ainvoke({"n": 5, "seen": []}, config)
        branched = await graph.aupdate_state(first.config, {"n": 100})
        latest = await graph.aget_state(config)
        assert latest.config == branched and latest.values["n"] == 100


def test_a_subgraph_keeps_its_own_namespace_through_the_saver(store_url: StoreURL) -> None:
    class Inner(TypedDict):
        n: int

    inner = StateGraph(Inner)
    inner.add_node("add", lambda s: {"n": s["n"] + 10})
    inner.add_edge(START, "add")
    inner.add_edge("add", END)
    url = store_url()
    with KernelSaver(InMemoryDurability() if url == "memory://" else url) as saver:
        outer = StateGraph(Inner)
        outer.add_node("inner", inner.compile(checkpointer=True))
        outer.add_edge(START, "inner")
        outer.add_edge("inner", END)
        graph = outer.compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": "s"}}
        assert graph.invoke({"n": 1}, config) == {"n": 11}
        assert graph.invoke({"n": 2}, config) == {"n": 12}
        spaces = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(None)}
        assert "" in spaces and "inner" in spaces
        sub = saver.get_tuple({"configurable": {"thread_id": "s", "checkpoint_ns": "inner"}})
        assert sub is not None and sub.checkpoint["channel_values"]["n"] == 12
