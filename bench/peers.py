"""What users would pick instead, on equivalent work: LangGraph and DBOS.

LangGraph: a ``StateGraph`` with two nodes (read the balance; charge through the fake
provider and record the fact), messages bounded to the same 50, on ``SqliteSaver`` /
``PostgresSaver``. DBOS: a workflow with two steps (the same read and charge), the
workflow ID ``thread:turn``, on a SQLite or PostgreSQL system database.

The latency group's peers (``bench.latency``) do the same work with a model call that
awaits: LangGraph's ``AsyncPostgresSaver`` and an async DBOS workflow, on pools of 10.
"""

from __future__ import annotations

import operator
import sqlite3
from typing import Annotated, Any, TypedDict

from bench.latency import POOL, Clock
from bench.workload import MAX_MESSAGES, FakeProvider, message, payment

LANGGRAPH_CAVEAT = (
    "no turn-ID dedupe (a resubmitted turn runs again), no effect receipts, "
    "no outbox, no confirmation state"
)
DBOS_CAVEAT = (
    "no per-thread serialization of turns, no conversation checkpoint (messages and "
    "facts are not kept), no outbox; effects deduplicated per workflow ID only"
)


def _bounded(old: list[Any], new: list[Any]) -> list[Any]:
    return (old + new)[-MAX_MESSAGES:]


def langgraph_saver(store: str, path: str, dsn: str, schema: str) -> tuple[Any, Any]:
    """A LangGraph checkpointer, set up, and the connection it writes on (closed by the
    row): ``SqliteSaver`` on ``path`` or ``PostgresSaver`` in ``schema``."""
    if store == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn: Any = sqlite3.connect(path, check_same_thread=False)
        saver: Any = SqliteSaver(conn)
    else:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn = psycopg.connect(
            dsn,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={schema}",
        )
        saver = PostgresSaver(conn)
    saver.setup()
    return conn, saver


class _State(TypedDict, total=False):
    n: int
    messages: Annotated[list[dict[str, str]], _bounded]
    facts: Annotated[dict[str, Any], operator.or_]
    balance: int


class LangGraphRow:
    def __init__(self, store: str, path: str, dsn: str, schema: str) -> None:
        self.store, self.path, self.dsn, self.schema = store, path, dsn, schema
        self.provider = FakeProvider()

    async def setup(self) -> None:
        from langgraph.graph import END, START, StateGraph

        provider = self.provider

        def read(state: _State) -> _State:
            return {"balance": 4200}

        def write(state: _State) -> _State:
            n = state["n"]
            value = provider.charge(payment(n), 100, f"payments.charge:charge:{payment(n)}")
            reply = f"You owe 4200.\nCharged 100 to {payment(n)}."
            return {
                "facts": {f"charge.{payment(n)}": value},
                "messages": [{"role": "assistant", "content": reply}],
            }

        graph = StateGraph(_State)
        graph.add_node("read", read)
        graph.add_node("write", write)
        graph.add_edge(START, "read")
        graph.add_edge("read", "write")
        graph.add_edge("write", END)
        self.conn, saver = langgraph_saver(self.store, self.path, self.dsn, self.schema)
        self.graph = graph.compile(checkpointer=saver)

    async def close(self) -> None:
        self.conn.close()

    async def turn(self, thread: str, n: int) -> None:
        self.graph.invoke(
            {"n": n, "messages": [{"role": "user", "content": message(n)}]},
            {"configurable": {"thread_id": thread}},
        )

    replay = turn  # there is no turn ID: resubmitting runs the turn again


class DBOSRow:
    def __init__(self, store: str, path: str, dsn: str, schema: str) -> None:
        self.store, self.path, self.dsn, self.schema = store, path, dsn, schema
        self.provider = FakeProvider()

    async def setup(self) -> None:
        from dbos import DBOS, DBOSConfig, SetWorkflowID

        provider = self.provider
        url = f"sqlite:///{self.path}" if self.store == "sqlite" else self.dsn
        config: DBOSConfig = {
            "name": "ikbench",
            "system_database_url": url,
            "log_level": "WARNING",
        }
        if self.store == "postgres":
            config["dbos_system_schema"] = self.schema
        DBOS(config=config)

        @DBOS.step()
        def read_balance() -> dict[str, int]:
            return {"due": 4200}

        @DBOS.step()
        def charge(n: int) -> dict[str, Any]:
            return provider.charge(payment(n), 100, f"payments.charge:charge:{payment(n)}")

        @DBOS.workflow()
        def turn(thread: str, n: int, text: str) -> dict[str, Any]:
            balance = read_balance()
            value = charge(n)
            return {"reply": f"You owe {balance['due']}.\nCharged 100.", "value": value}

        DBOS.launch()
        self._dbos, self._set_id, self._turn = DBOS, SetWorkflowID, turn

    async def close(self) -> None:
        self._dbos.destroy()

    async def turn(self, thread: str, n: int) -> None:
        with self._set_id(f"{thread}:{n}"):
            self._turn(thread, n, message(n))

    replay = turn  # same workflow ID: DBOS returns the recorded result


class LatencyLangGraphRow:
    """LangGraph's ``AsyncPostgresSaver`` on a pool of ``POOL``: the model node awaits
    the latency and reads the balance, the second node charges and records the fact."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.provider, self.clock = FakeProvider(), Clock()

    async def setup(self) -> None:
        import psycopg
        from langchain_core.runnables import RunnableConfig
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.graph import END, START, StateGraph
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        provider, clock = self.provider, self.clock

        async def model(state: _State, config: RunnableConfig) -> _State:
            await clock.model(config["configurable"]["thread_id"])
            return {"balance": 4200}

        async def write(state: _State) -> _State:
            n = state["n"]
            value = await provider.charge_async(
                payment(n), 100, f"payments.charge:charge:{payment(n)}"
            )
            reply = f"You owe 4200.\nCharged 100 to {payment(n)}."
            return {
                "facts": {f"charge.{payment(n)}": value},
                "messages": [{"role": "assistant", "content": reply}],
            }

        with psycopg.connect(self.dsn, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        self.pool: Any = AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=POOL,
            open=False,
            kwargs={
                "autocommit": True,
                "prepare_threshold": 0,
                "row_factory": dict_row,
                "options": f"-c search_path={self.schema}",
            },
        )
        await self.pool.open(wait=True)
        saver = AsyncPostgresSaver(self.pool)
        await saver.setup()
        graph = StateGraph(_State)
        graph.add_node("model", model)
        graph.add_node("write", write)
        graph.add_edge(START, "model")
        graph.add_edge("model", "write")
        graph.add_edge("write", END)
        self.graph = graph.compile(checkpointer=saver)

    async def close(self) -> None:
        await self.pool.close()

    async def turn(self, thread: str, n: int) -> None:
        await self.graph.ainvoke(
            {"n": n, "messages": [{"role": "user", "content": message(n)}]},
            {"configurable": {"thread_id": thread}},
            durability="sync",
        )


class LatencyDBOSRow:
    """A DBOS workflow of two async steps (the model's call, then the charge), workflow
    ID ``thread:turn``, on a PostgreSQL system database with a pool of ``POOL``."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        self.provider, self.clock = FakeProvider(), Clock()

    async def setup(self) -> None:
        from dbos import DBOS, DBOSConfig, SetWorkflowID

        provider, clock = self.provider, self.clock
        config: DBOSConfig = {
            "name": "ikbench-latency",
            "system_database_url": self.dsn,
            "dbos_system_schema": self.schema,
            "sys_db_pool_size": POOL,
            # DBOS's own engine settings, with the row's name for the session sampler.
            "db_engine_kwargs": {
                "connect_args": {"application_name": self.schema},
                "pool_timeout": 30,
                "max_overflow": 0,
                "pool_pre_ping": True,
            },
            "log_level": "WARNING",
        }
        DBOS(config=config)

        @DBOS.step()
        async def model(thread: str) -> dict[str, int]:
            await clock.model(thread)
            return {"due": 4200}

        @DBOS.step()
        async def charge(n: int) -> dict[str, Any]:
            return await provider.charge_async(
                payment(n), 100, f"payments.charge:charge:{payment(n)}"
            )

        @DBOS.workflow()
        async def turn(thread: str, n: int, text: str) -> dict[str, Any]:
            balance = await model(thread)
            value = await charge(n)
            return {"reply": f"You owe {balance['due']}.\nCharged 100.", "value": value}

        DBOS.launch()
        self._dbos, self._set_id, self._turn = DBOS, SetWorkflowID, turn

    async def close(self) -> None:
        self._dbos.destroy()

    async def turn(self, thread: str, n: int) -> None:
        with self._set_id(f"{thread}:{n}"):
            await self._turn(thread, n, message(n))
