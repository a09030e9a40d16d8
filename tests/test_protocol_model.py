"""The turn protocol's SPIN model (models/turn_protocol.pml): it has no counterexample,
each mutant has one for the property it breaks, and its crash labels are the
library's fault points.

This is not tests/test_model_check.py (a hypothesis check of the adapters against a
reference model): here SPIN explores every interleaving of the protocol itself.
The runs need ``spin`` and ``cc``: they skip without them locally, and fail without
them when INTENTION_KERNEL_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from conftest import service_unavailable
from intention_kernel import _faults

ROOT = Path(__file__).resolve().parent.parent


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_protocol", ROOT / "models" / "check_protocol.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


@pytest.fixture
def build(tmp_path: Path) -> Path:
    missing = checker.tools_missing()
    if missing:
        why = f"{' and '.join(missing)} not on the PATH: `{checker.install_command(missing)}`"
        service_unavailable("SPIN", why)
    return tmp_path


def test_the_models_crash_labels_are_exactly_the_libraries_fault_points() -> None:
    assert checker.fault_labels() == set(_faults.POINTS)


def test_a_crash_label_missing_from_the_model_is_noticed() -> None:
    source = checker.MODEL.read_text()
    assert "during_commit: COMMIT_POINT" in source
    without = source.replace("during_commit: COMMIT_POINT", "COMMIT_POINT")
    assert checker.fault_labels(without) == set(_faults.POINTS) - {_faults.DURING_COMMIT}


# One xdist worker runs the exhaustive runs, one at a time: each keeps a core busy
# for up to a minute, and the largest holds 2 GB. The mutants stop at their first
# counterexample within seconds: they go to any worker. The LTL run takes about a
# minute alone and five under CI's load, past the suite's 300 s timeout.
@pytest.mark.slow
@pytest.mark.xdist_group("spin")
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("run", checker.MODEL_RUNS, ids=lambda run: run.name)
def test_each_model_has_no_counterexample_under_any_interleaving(run: Any, build: Path) -> None:
    """Every exhaustive run of ``make model-check``. The turn protocol is checked with
    and without its LTL claim. PostgreSQL's leases: workers paused past their lease,
    takeovers, fenced writes. Then the inbox (queue, cancel, interrupt, steer) and the
    timers. Crashes come at every durable point. ``make test`` runs each here, once."""
    result = checker.verify(run, build)
    print(result.summary())
    assert result.violation is None, result.trail
    assert result.complete, result.report
    assert result.states > 1_000_000, result.report  # the whole space, not a stub


def test_runs_are_chosen_by_name_or_pattern() -> None:
    models, mutants = checker.selected(["timer*"])
    assert [run.name for run in models] == ["timers", "timers-inbox"]
    assert len(mutants) == 6 and {run.model for run in mutants} == {"timers.pml"}
    assert checker.selected([]) == (checker.MODEL_RUNS, checker.MUTANT_RUNS)
    with pytest.raises(ValueError, match="no run is named 'nothing-such'"):
        checker.selected(["nothing-such"])


@pytest.mark.parametrize("run", checker.MUTANT_RUNS, ids=lambda run: run.name)
def test_each_mutant_of_the_protocol_has_a_counterexample_for_the_property_it_breaks(
    run: Any, build: Path
) -> None:
    result = checker.verify(run, build)
    print(result.summary())
    assert result.violation is not None, result.report
    assert run.expect in result.violation, result.violation
    assert result.trail, "pan wrote no trail to replay"


@pytest.mark.parametrize(
    ("tools", "package"), [(["cc"], "apt-get install spin"), ([], "apt-get install spin gcc")]
)
def test_a_machine_without_spin_is_told_in_one_line_which_package_to_install(
    tmp_path: Path, tools: list[str], package: str
) -> None:
    """On a fresh machine without SPIN, ``make model-check`` prints one line. It must
    say what to install, not leave the person to search."""
    import shutil
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found is not None, f"{tool} is needed to run this test"
        (bin_dir / tool).symlink_to(found)
    done = subprocess.run(
        [sys.executable, str(ROOT / "models" / "check_protocol.py")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert package in line and "spin" in line
