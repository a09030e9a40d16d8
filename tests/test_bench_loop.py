"""The agent-loop rows measure what they say, in worker processes as ``python -m bench``
runs them: a resubmitted committed turn, and a delivery killed in its third model call
(SIGKILL, in a child process) then delivered again, counting model rounds and tools:
the kernel's redelivery asks only the round that was not answered."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

import pytest
from bench.run import Proc, drop_schemas


def run_row(row: str, tmp_path: Path) -> dict[str, Any]:
    """Three turns, three resubmissions and a crash, in the row's worker process."""
    schema = f"ikt_loop_{uuid.uuid4().hex[:8]}"
    p = Proc(row, argparse.Namespace(dir=str(tmp_path), schema=schema, base=None))
    try:
        p.call("setup")
        turns = p.call("turns", count=3)
        replays = p.call("replays", count=3)
        crashed = p.call("crash", n=1)
    finally:
        p.stop()
        if "postgres" in row:
            drop_schemas(schema)
    return {"turns": turns, "replays": replays, "crash": crashed}


@pytest.mark.parametrize(
    "row", ["loop-ik-sqlite", pytest.param("loop-ik-postgres", marks=pytest.mark.postgres)]
)
def test_the_kernel_loop_row_replays_a_committed_turn_and_reports_a_crashed_ones_rounds(
    row: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if "postgres" in row:
        request.getfixturevalue("postgres_dsn")  # skipped, or failed, without a server
    measured = run_row(row, tmp_path)
    assert len(measured["turns"]["lat"]) == 3
    # A committed turn delivered again: the stored result, no model call, no tool.
    assert (measured["replays"]["model_rerun"], measured["replays"]["effects_rerun"]) == (0, 0)
    [(how, crashed)] = measured["crash"].items()
    assert how == "same turn ID"
    # The child answered rounds 1 and 2 and ran both reads before it was killed.
    assert crashed["first_delivery_rounds_answered"] == [0, 1]
    assert crashed["first_delivery_tools_run"] == 2
    # Delivered again, the turn took rounds 1 and 2 from its journal, asked round 3
    # only, and committed (the row checks its reply); both reads ran again (reads are
    # not recorded).
    assert crashed["redelivery_rounds_asked"] == [2]
    assert crashed["answered_rounds_asked_again"] == 0
    assert crashed["model_calls"] == 1
    assert crashed["tool_calls"] == 2


def test_langgraphs_react_row_runs_a_resubmitted_turn_again_and_resumes_a_crashed_one(
    tmp_path: Path,
) -> None:
    # The langgraph extra (in dev) brings langgraph; its SQLite saver comes with bench.
    pytest.importorskip("langgraph.checkpoint.sqlite", reason="the bench extra installs it")
    measured = run_row("loop-langgraph-sqlite", tmp_path)
    # No turn ID: each resubmission asks the model three times and runs both tools.
    assert (measured["replays"]["model_rerun"], measured["replays"]["effects_rerun"]) == (9, 6)
    crash = measured["crash"]
    assert crash["same input"]["redelivery_rounds_asked"] == [0, 1, 2]
    assert crash["same input"]["tool_calls"] == 2
    assert crash["resume: invoke(None)"]["redelivery_rounds_asked"] == [2]
    assert crash["resume: invoke(None)"]["tool_calls"] == 0
