"""The cost meter (``python -m bench --only cost``) measures what it says.

It runs in worker processes, as ``python -m bench`` runs them. It reports every path's
CPU and Python calls per turn, the kernel above its floor, a base tree's twin row, and
the import's figures. Small sizes; nothing here asserts a time."""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from bench import instructions
from bench.cost import cost, parse_perf
from bench.counting import profiled_calls, sqlite_driver_seconds
from bench.run import Proc, base_tree, drop_schemas

TINY = {
    "cost_warmup": 4,
    "cost_blocks": 1,
    "cost_block": 64,
    "cost_calls": 64,
    "cost_valgrind_turns": 0,  # valgrind's own test is below: too slow for every path
    "import_runs": 1,
}


# About a minute alone; 186-194 s in CI runs at load 8, near the suite's 300 s.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_meter_reports_every_sqlite_path_and_its_base_twin(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra runs the bridge row")
    args = argparse.Namespace(
        dir=str(tmp_path),
        schema=f"ikt_cost_{uuid.uuid4().hex[:8]}",
        no_postgres=True,
        base=base_tree("HEAD"),
        base_ref="HEAD",
    )
    result = cost(args, TINY)
    paths = {p["path"]: p for p in result["paths"]}
    assert set(paths) == {
        "kernel, SQLite FULL, 1 client",
        "floor, SQLite FULL, 1 client",
        "kernel, SQLite FULL, 64 in flight",
        "floor, SQLite FULL, 64 in flight",
        "agent loop, SQLite, 3 rounds",
        "agent loop streamed, SQLite, 3 rounds",
        "Pydantic AI bridge, SQLite, 3 requests",
        "Pydantic AI alone, in memory, 3 requests",
    }
    for p in paths.values():
        assert p["cpu_us"] > 0 and p["calls"] > 0, p
        if p["row"].startswith(("floor", "bridge-alone")):
            assert "base" not in p
        else:  # each kernel path ran against the base tree too, in the same blocks
            assert p["base"]["calls"] > 0 and p["base"]["cpu_vs_base"] > 0, p
    # The kernel does the floor's work and more: it makes more calls than the floor.
    for n in ("1 client", "64 in flight"):
        kernel = paths[f"kernel, SQLite FULL, {n}"]
        assert kernel["floor"] == f"floor, SQLite FULL, {n}"
        assert kernel["calls"] > paths[kernel["floor"]]["calls"]
        assert kernel["calls_ratio"] > 1
    # One client on SQLite: the CPU inside the driver is split out, for kernel and floor.
    # The kernel's statements are the floor's, give or take, so neither side is near 0.
    # At 64 in flight the writer thread runs them, out of cProfile's sight: no split.
    kernel, floor = paths["kernel, SQLite FULL, 1 client"], paths["floor, SQLite FULL, 1 client"]
    for p in (kernel, floor):
        assert 0 < p["driver_us"] < p["cpu_us"] * 2, p
    assert kernel["own_ratio"] == pytest.approx(
        (kernel["cpu_us"] - kernel["driver_us"]) / (floor["cpu_us"] - floor["driver_us"])
    )
    assert paths["kernel, SQLite FULL, 64 in flight"]["driver_us"] is None
    # The bridge's peer is the same Pydantic AI agent alone: it touches no store.
    bridge = paths["Pydantic AI bridge, SQLite, 3 requests"]
    alone = paths["Pydantic AI alone, in memory, 3 requests"]
    assert bridge["floor"] == alone["path"] and alone["driver_us"] == 0
    assert bridge["driver_us"] > 0 and bridge["calls"] > alone["calls"]
    # Three model rounds cost more Python than the one-round turn.
    assert (
        paths["agent loop, SQLite, 3 rounds"]["calls"]
        > paths["kernel, SQLite FULL, 1 client"]["calls"] / 2
    )
    if result["instructions"]["available"]:
        assert all(p["instructions"] > 0 for p in paths.values())
    else:  # no hardware counters: every row says why, none makes a figure up
        assert result["instructions"]["reason"].startswith("perf")
        assert all(p["instructions"] is None for p in paths.values())
    imports = result["imports"]
    assert set(imports) == {"this tree", "base HEAD"}
    for figures in imports.values():
        assert figures["wall_ms"] > figures["python_alone_ms"] > 0
        assert figures["importtime_ms"] > 0 and figures["calls"] > 1000
        assert "intention_kernel" in [name for _, name in figures["heaviest"]]


def measured(row: str, n: int, tmp_path: Path, schema: str) -> dict[str, Any]:
    p = Proc(row, argparse.Namespace(dir=str(tmp_path), schema=schema, base=None))
    try:
        p.call("setup")
        p.call("cost", what="cpu", n=n, count=4)
        return p.call("cost", what="calls", n=n, count=n * 2)
    finally:
        p.stop()


@pytest.mark.postgres
def test_the_meter_counts_the_kernels_calls_on_postgresql_above_its_floor(
    postgres_dsn: str, tmp_path: Path
) -> None:
    schema = f"ikt_cost_{uuid.uuid4().hex[:8]}"
    try:
        kernel = measured("ik-postgres", 1, tmp_path, schema)
        floor = measured("floor-postgres-async", 1, tmp_path, schema)
        overlap = measured("ik-postgres-full-overlap", 64, tmp_path, schema)
    finally:
        drop_schemas(schema)
    assert kernel["turns"] == 2 and overlap["turns"] == 128
    # The kernel's turn takes its lease in its first statement; the floor spends a
    # statement of its own on the advisory lock. So the kernel may make fewer Python
    # calls than the floor (1,826 against 1,843 on 2026-12-05). The meter must still
    # count the kernel's whole turn: more than half the floor's calls, not a part.
    assert kernel["calls"] > floor["calls"] / 2 > 0
    assert overlap["calls"] > 0


def test_perf_output_is_read_as_a_count_or_as_the_reason_there_is_none() -> None:
    assert parse_perf("123456,,instructions:u,1000,100.00,,\n") == (123456.0, "")
    count, reason = parse_perf("<not supported>,,instructions:u,0,100.00,,\n")
    assert count is None and "not supported" in reason
    count, reason = parse_perf("perf: command not found\n")
    assert count is None and reason == "perf: perf: command not found"


CACHEGRIND = """==8811== Cachegrind, a high-precision tracing profiler
==8811== I   refs:      6,204,326,424
"""


def test_cachegrinds_summary_is_read_as_a_count_or_as_none() -> None:
    assert instructions.parse_cachegrind(CACHEGRIND) == 6_204_326_424
    assert instructions.parse_cachegrind("valgrind: command failed\n") is None


def test_without_valgrind_the_meter_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no valgrind on it
    assert instructions.valgrind_available() == (
        False,
        "valgrind not installed (Debian: valgrind)",
    )


@pytest.mark.slow
def test_valgrind_counts_a_turn_alike_in_two_runs(tmp_path: Path) -> None:
    available, why = instructions.valgrind_available()
    if not available:
        pytest.skip(why)

    def counted(row: str) -> float:
        figure, reason = instructions.count(
            row, tree=None, directory=str(tmp_path), dsn="", schema="", warm=4, turns=8
        )
        assert figure is not None, reason
        return figure

    floor, again = counted("floor-sqlite-full"), counted("floor-sqlite-full")
    # Set-up and import cancel out: what is left is the turns, the same in both runs.
    # (Each child costs seconds under valgrind: the kernel's row is compared in the
    # meter's own runs, bench/README.md "Round 12".)
    assert floor > 100_000
    assert again == pytest.approx(floor, rel=0.005)
    # A child that fails gives its reason, not a figure.
    figure, reason = instructions.count(
        "no-such-row", tree=None, directory=str(tmp_path), dsn="", schema="", warm=1, turns=1
    )
    assert figure is None and "unknown row no-such-row" in reason


@dataclasses.dataclass
class _One:
    x: int


@dataclasses.dataclass
class _Two:
    x: int


def test_calls_are_counted_from_the_profilers_entries_not_pstats_table() -> None:
    # Both generated ``__init__``s are ``<string>:2(__init__)`` to pstats: one drops out.
    profiler = cProfile.Profile()
    profiler.enable()
    for n in range(10):
        _One(n)
        _Two(n)
    profiler.disable()
    table: int = pstats.Stats(profiler).total_calls  # type: ignore[attr-defined]
    counted = profiled_calls(profiler)
    assert counted - table >= 10  # the other class's ten calls, which pstats lost
    inits = [e for e in profiler.getstats() if getattr(e.code, "co_name", "") == "__init__"]
    assert sum(e.callcount for e in inits) >= 20


def test_the_sqlite_drivers_own_time_is_its_methods_alone() -> None:
    conn = sqlite3.connect(":memory:")
    rows = [(n,) for n in range(20_000)]
    # The CPU clock, as the meter's: time other jobs hold the core counts for neither.
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    conn.execute("CREATE TABLE t (x)")
    conn.executemany("INSERT INTO t VALUES (?)", rows)
    profiler.disable()
    driver = sqlite_driver_seconds(profiler)
    everything = sum(e.inlinetime for e in profiler.getstats())
    assert 0 < driver <= everything
    # Most of this run's time is in the driver; a sum that missed it would be near 0.
    assert driver > everything / 2
