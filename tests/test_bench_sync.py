"""The benchmark's sync group (``--only sync``) is judged on its own figures.

No timing here: hand-made results, and how the target and the table read them.
"""

from __future__ import annotations

from typing import Any

from bench.run import targets
from bench.sync import PAIRS, report


def _results(full: float, normal: float) -> dict[str, Any]:
    """A run of the sync group only, with the sync rows at these ratios to the async."""
    rows: dict[str, Any] = {}
    pairs = []
    for (async_row, sync_row), ratio in zip(PAIRS, (full, normal), strict=True):
        rows[async_row] = {"tps": 1000.0, "tps_blocks": [1000.0], "p50_ms": 1.0}
        rows[sync_row] = {"tps": 1000.0 * ratio, "tps_blocks": [1000.0 * ratio], "p50_ms": 1.1}
        pairs.append(
            {
                "async": async_row,
                "sync": sync_row,
                "ratio_blocks": [ratio],
                "ratio": ratio,
                "overhead": 1 - ratio,
                "cpu_ratio": 1.1,
                "p50_delta_us": 100.0,
            }
        )
    return {
        "throughput": {},
        "growth": {},
        "scale_out": [],
        "sync": {"rows": rows, "pairs": pairs},
    }


def test_the_facade_holds_its_target_under_15_percent_of_a_turn_and_misses_it_above() -> None:
    judged = {t["target"]: (t["held"], t["figure"]) for t in targets(_results(0.851, 0.849))}
    assert judged == {
        "sync-sqlite-full: facade overhead < 15% of a turn (x async)": (True, "0.851x"),
        "sync-sqlite-normal: facade overhead < 15% of a turn (x async)": (False, "0.849x"),
    }


def test_the_table_shows_each_setting_with_its_overhead() -> None:
    lines = report(_results(0.9, 0.8)["sync"])
    assert any(line.startswith("| FULL | 1000 | 900 | 0.900 | 10.0 % |") for line in lines)
    assert any(line.startswith("| NORMAL | 1000 | 800 | 0.800 | 20.0 % |") for line in lines)
