"""LangGraph alone against LangGraph inside intention-kernel: the numbers for LangGraph
rows of the README's table "Framework alone vs inside intention-kernel".

Both columns run the same ReAct agent (``tests/langgraph_support.py``: a scripted chat
model, a cancel, a refund that needs approval, a ledger file as the provider's own
record). Alone, the graph is compiled with LangGraph's ``SqliteSaver`` or
``PostgresSaver`` and run with ``durability="sync"``; the refund asks with
``interrupt()`` and is approved with ``Command(resume=...)``
(``tests/langgraph_alone_worker.py``). Inside, ``KernelAgent`` runs it in turns
(``tests/langgraph_worker.py``). Processes are real and killed with SIGKILL. Each test
asserts the numbers its table cells show. The savers come with the ``bench`` extra.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge_support import read_ledger
from bridge_support import run_worker as run
from intention_kernel.testing import faults
from proving_support import Store, make_sql_store

pytest.importorskip("langgraph.checkpoint.sqlite", reason="the bench extra installs it")
pytest.importorskip("langgraph.checkpoint.postgres", reason="the bench extra installs it")

HERE = Path(__file__).parent
ALONE = HERE / "langgraph_alone_worker.py"
INSIDE = HERE / "langgraph_worker.py"
KILLED = -signal.SIGKILL
IN_PROVIDER = {"point": faults.IN_PROVIDER_AFTER_WRITE, "action": "sigkill"}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from make_sql_store(request.param, request, tmp_path, file="desk.db")


@dataclass
class Files:
    """The provider's ledger and the model's log of one column."""

    ledger: Path
    asks: Path

    @classmethod
    def under(cls, dir: Path, name: str) -> Files:
        dir.joinpath(name).mkdir()
        return cls(dir / name / "ledger", dir / name / "asks")

    def config(self) -> dict[str, Any]:
        return {"ledger": str(self.ledger), "asks": str(self.asks)}

    def provider_calls(self) -> int:
        return len(read_ledger(self.ledger))

    def model_calls(self) -> int:
        return len(read_ledger(self.asks))


def alone_config(files: Files, store: Store, thread: str, **extra: Any) -> dict[str, Any]:
    # Alone, LangGraph's tables live beside the kernel's in the same file or schema.
    return {**files.config(), "store": store.config(), "thread_id": thread, **extra}


# -- (a) one write, a process killed after it, the request delivered again ---------------------


@pytest.mark.slow
async def test_a_write_after_a_crash_and_redelivery_twice_alone_once_inside(
    sql_store: Store, tmp_path: Path
) -> None:
    """The process dies (SIGKILL) as the model is asked call 2, the one that reads the
    cancel's result. Alone, the request delivered again is a new input; resumed from
    the last checkpoint instead (``invoke(None)``), LangGraph calls the shop once."""
    alone = Files.under(tmp_path, "alone")
    config = alone_config(alone, sql_store, "a1", message="cancel 42")
    assert await run(ALONE, {**config, "die_at_request": 2}, KILLED) == []
    assert (alone.provider_calls(), alone.model_calls()) == (1, 1)
    [rerun] = await run(ALONE, config)
    assert rerun == {"output": 'cancel_order: {"id": "cancel_42"}'}
    # The new input runs the loop again: the model asks for the cancel again.
    assert (alone.provider_calls(), alone.model_calls()) == (2, 3)

    resumed = Files.under(tmp_path, "resumed")
    config = alone_config(resumed, sql_store, "a2", message="cancel 42")
    assert await run(ALONE, {**config, "die_at_request": 2}, KILLED) == []
    [done] = await run(ALONE, alone_config(resumed, sql_store, "a2", resume=None))
    assert done == {"output": 'cancel_order: {"id": "cancel_42"}'}
    assert (resumed.provider_calls(), resumed.model_calls()) == (1, 2)

    inside = Files.under(tmp_path, "inside")
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    config = {**inside.config(), "store": sql_store.config(), "turns": [turn]}
    assert await run(INSIDE, {**config, "die_at_request": 2}, KILLED) == []
    [redelivered] = await run(INSIDE, config)
    assert redelivered["result"]["reply"] == 'cancel_order: {"id": "cancel_42"}'
    # Call 1 is recorded and the cancel's receipt completed: call 2 only.
    assert (inside.provider_calls(), inside.model_calls()) == (1, 2)


# -- (b) a process killed inside the provider call ---------------------------------------------


@pytest.mark.slow
async def test_a_crash_inside_the_write_runs_it_again_alone_and_never_inside(
    sql_store: Store, tmp_path: Path
) -> None:
    """SIGKILL after the shop applied the cancel, before the tool returned. Alone, the
    last checkpoint is before the tools step: resuming runs the cancel again. Inside,
    the receipt is ``uncertain`` and the cancel is never sent again."""
    alone = Files.under(tmp_path, "alone")
    config = alone_config(alone, sql_store, "a1", message="cancel 42")
    assert await run(ALONE, {**config, "fault": IN_PROVIDER}, KILLED) == []
    [done] = await run(ALONE, alone_config(alone, sql_store, "a1", resume=None))
    assert done == {"output": 'cancel_order: {"id": "cancel_42"}'}
    assert alone.provider_calls() == 2

    inside = Files.under(tmp_path, "inside")
    turn = {"thread_id": "t1", "turn_id": "turn-1", "message": "cancel 42"}
    config = {**inside.config(), "store": sql_store.config(), "turns": [turn]}
    assert await run(INSIDE, {**config, "fault": IN_PROVIDER}, KILLED) == []
    [redelivered] = await run(INSIDE, config)
    assert [s["status"] for s in redelivered["result"]["steps"]] == ["uncertain"]
    assert inside.provider_calls() == 1


# -- (c) an approval given after a restart, and a crash after the approved call -------------


@pytest.mark.slow
async def test_an_approved_call_runs_again_after_a_crash_alone_and_once_inside(
    sql_store: Store, tmp_path: Path
) -> None:
    """Process 1 asks; process 2, after the restart, approves and dies (SIGKILL) after
    the shop applied the refund; process 3 delivers the approval again."""
    shown = {"tool_name": "issue_refund", "args": {"order_id": "42", "cents": 1250}}
    alone = Files.under(tmp_path, "alone")
    [asked] = await run(ALONE, alone_config(alone, sql_store, "a1", message="refund 42"))
    assert asked == {"interrupt": shown}
    approve = alone_config(alone, sql_store, "a1", approve={"decision": "accept"})
    assert await run(ALONE, {**approve, "fault": IN_PROVIDER}, KILLED) == []
    [done] = await run(ALONE, approve)
    assert done == {"output": 'issue_refund: {"id": "refund_42"}'}
    assert alone.provider_calls() == 2  # the approved refund, twice

    inside = Files.under(tmp_path, "inside")
    config = {**inside.config(), "store": sql_store.config()}
    ask = {"thread_id": "t1", "turn_id": "turn-1", "message": "refund 42"}
    [held] = await run(INSIDE, {**config, "turns": [ask]})
    digest = held["result"]["interaction"]["digest"]
    accept = {"thread_id": "t1", "turn_id": "turn-2", "answer": {"digest": digest}}
    assert await run(INSIDE, {**config, "turns": [accept], "fault": IN_PROVIDER}, KILLED) == []
    [again] = await run(INSIDE, {**config, "turns": [accept]})
    assert [s["status"] for s in again["result"]["steps"]] == ["uncertain"]
    assert inside.provider_calls() == 1
