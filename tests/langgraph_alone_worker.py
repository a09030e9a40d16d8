"""The LangGraph desk run by LangGraph alone, in its own OS process, for
tests/test_compare_langgraph.py.

As LangGraph's persistence guide shows it: the graph is compiled with ``SqliteSaver``
(on a file) or ``PostgresSaver`` (in a schema) and run with ``durability="sync"``
(each step's checkpoint written before the next step starts), on ``thread_id``. The
refund asks with ``interrupt()``; an approval resumes with ``Command(resume=...)``.

Run as ``python tests/langgraph_alone_worker.py '<json config>'``: ``store`` (see
:meth:`proving_support.Store.config`), ``ledger``, ``asks``, ``thread_id``, one of
``message`` (a new input), ``resume`` (``null``: go on from the last checkpoint) and
``approve`` (the resume value), and optional ``die_at_request`` and ``fault``
(``{"point"}``: SIGKILL there). Prints one JSON line: ``{"output"}``, the last
message's text, or ``{"interrupt"}``, the value the graph paused on.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.types import Command

from intention_kernel.testing import faults
from langgraph_support import Desk


def saver(store: dict[str, str]) -> Any:
    if store["kind"] == "sqlite":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        saved: Any = SqliteSaver(sqlite3.connect(store["location"], check_same_thread=False))
    else:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        with psycopg.connect(store["location"], autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{store["schema"]}"')
        conn = psycopg.connect(
            store["location"],
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={store['schema']}",
        )
        saved = PostgresSaver(conn)
    saved.setup()
    return saved


def main(config: dict[str, Any]) -> None:
    desk = Desk(
        config["ledger"],
        asks=config.get("asks"),
        die_at_request=config.get("die_at_request"),
        alone=True,
        checkpointer=saver(config["store"]),
    )
    fault = config.get("fault")
    if fault is not None:
        faults.inject(fault["point"], lambda point: os.kill(os.getpid(), signal.SIGKILL))
    if "message" in config:
        input: Any = {"messages": [HumanMessage(config["message"])]}
    elif "approve" in config:
        input = Command(resume=config["approve"])
    else:
        input = None  # go on from the last checkpoint
    run = {"configurable": {"thread_id": config["thread_id"]}}
    state = desk.graph.invoke(input, run, durability="sync")
    if state.get("__interrupt__"):
        print(json.dumps({"interrupt": state["__interrupt__"][0].value}), flush=True)
    else:
        print(json.dumps({"output": state["messages"][-1].content}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
