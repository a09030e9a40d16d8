"""``python -m bench --burner N`` keeps N cores busy during a run, and none after it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench.burner import burners, header

ROOT = Path(__file__).resolve().parents[1]


def cpu_ticks(pid: int) -> int:
    """User and system clock ticks the process has run (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_burner_spins_while_the_block_runs_and_is_reaped_after_it() -> None:
    with burners(1) as spinning:
        [burner] = spinning
        deadline = time.monotonic() + 30
        # It runs on a core of its own: its CPU grows while this process sleeps.
        while cpu_ticks(burner.pid) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu_ticks(burner.pid) >= 10
        assert burner.poll() is None
    # Killed and waited for: no spinner and no zombie is left.
    assert burner.returncode == -signal.SIGKILL


def test_no_burner_starts_no_process_and_a_negative_count_is_refused() -> None:
    with burners(0) as spinning:
        assert spinning == []
    with pytest.raises(ValueError, match="count of cores"), burners(-1):
        pass
    assert header(0) == ""
    assert header(1) == "1 CPU burner (1 core) ran beside this run"
    assert header(2) == "2 CPU burners (2 cores) ran beside this run"


def test_the_command_refuses_a_negative_count_before_running_anything() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--burner", "-1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--burner takes a count of cores, not -1" in done.stderr
