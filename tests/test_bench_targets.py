"""The benchmark harness judges the issue's targets on a run's own figures.

No timing here: the figures come from a stored run (``bench/results/``) and from
hand-made results, and the test checks how each is judged.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from bench.run import report, targets

STORED = Path(__file__).parent.parent / "bench" / "results" / "20261201T165115Z-full.json"


def _stored() -> dict[str, Any]:
    results: dict[str, Any] = json.loads(STORED.read_text())
    return results


def _held(results: dict[str, Any]) -> dict[str, bool]:
    return {t["target"]: t["held"] for t in targets(results)}


def test_a_stored_full_run_is_judged_target_by_target() -> None:
    held = _held(_stored())
    assert len(held) == 16
    missed = [target for target, ok in held.items() if not ok]
    assert missed == [
        "ik-postgres, 8 workers, ≥ 0.8x the floor",
        "ik-postgres@uvloop, 8 workers, ≥ 0.8x the floor",
    ]
    assert held["ik-sqlite-full ≥ 0.7x its floor"]
    assert held["ik-postgres: turn 10000 ≤ 1.2x a young thread's"]


def test_a_ratio_just_under_its_target_misses_it_and_prints_so() -> None:
    results = _stored()
    results["throughput"]["ik-sqlite-normal"]["ratio"] = 0.6996
    results["scale_out"][0]["ratio"] = 0.796
    results["growth"]["ik-sqlite-full"]["points"][-1]["vs_fresh"] = 1.2001
    results["throughput"]["ik-sqlite-full"]["replay_p50_ms"] = 1.0
    checked = {t["target"]: t for t in targets(results)}
    for name in (
        "ik-sqlite-normal ≥ 0.7x its floor",
        "ik-postgres, 1 worker, ≥ 0.8x the floor",
        "ik-sqlite-full: turn 10000 ≤ 1.2x a young thread's",
        "ik-sqlite-full replay p50 < 1 ms",
    ):
        assert not checked[name]["held"], name
    assert checked["ik-postgres, 1 worker, ≥ 0.8x the floor"]["figure"] == "0.796x"
    results["targets"] = list(checked.values())
    text = report(results)
    assert "| ik-postgres, 1 worker, ≥ 0.8x the floor | 0.796x | **no** |" in text
    assert "Targets (bench/README.md): 10 of 16 held in this run" in text


def test_only_what_the_run_measured_is_judged() -> None:
    results = copy.deepcopy(_stored())
    results["throughput"] = {row: r for row, r in results["throughput"].items() if "sqlite" in row}
    results["scale_out"], results["growth"] = [], {}
    assert sorted(_held(results)) == [
        "ik-sqlite-full replay p50 < 1 ms",
        "ik-sqlite-full ≥ 0.7x its floor",
        "ik-sqlite-normal replay p50 < 1 ms",
        "ik-sqlite-normal ≥ 0.7x its floor",
    ]
