"""A preforked worker behaves as a process started with ``python script``.

The crash tests rely on it: the worker's pid, its exit status, its output, and its
death by SIGKILL must be what a fresh process would give."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

import prefork

WORKER = """
import json, os, sys, time
import decimal  # imported once, by the server

def main():
    config = json.loads(sys.argv[1])
    print(json.dumps({
        "pid": os.getpid(),
        "argv": sys.argv[1:],
        "env": os.environ.get("IK_PREFORK_TEST"),
        "cwd": os.getcwd(),
        "stdin": sys.stdin.read(),
        "main": __name__,
        "path0": sys.path[0],
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if config.get("sleep"):
        time.sleep(config["sleep"])
    if config.get("raise"):
        raise RuntimeError("the worker failed")
    sys.exit(config.get("exit", 0))

if __name__ == "__main__":
    main()
"""


def state(pid: int) -> str | None:
    """The process's state letter in /proc, or ``None`` once it is reaped."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.read_text().split()[2] if stat.exists() else None


def write_worker(tmp_path: Path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return script


async def test_a_worker_gets_its_own_pid_argv_environment_stdio_and_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = write_worker(tmp_path)
    monkeypatch.setenv("IK_PREFORK_TEST", "seen")  # set after the server started
    first = await prefork.spawn(script, json.dumps({"exit": 3}))
    second = await prefork.spawn(script, json.dumps({}))
    (out1, err1), (out2, _) = await asyncio.gather(first.communicate(), second.communicate())
    assert (first.returncode, second.returncode) == (3, 0)
    one, two = json.loads(out1), json.loads(out2)
    assert one["pid"] == first.pid and two["pid"] == second.pid
    assert len({first.pid, second.pid, os.getpid()}) == 3
    assert one["argv"] == [json.dumps({"exit": 3})]
    assert one["env"] == "seen" and one["cwd"] == os.getcwd()
    assert one["stdin"] == "" and one["main"] == "__main__"
    assert one["path0"] == str(tmp_path)
    assert err1 == b"to stderr\n"


async def test_an_uncaught_exception_exits_1_with_its_traceback(tmp_path: Path) -> None:
    worker = await prefork.spawn(write_worker(tmp_path), json.dumps({"raise": True}))
    _, stderr = await worker.communicate()
    assert worker.returncode == 1
    assert b"RuntimeError: the worker failed" in stderr


async def test_sigkill_and_sigstop_reach_the_worker_by_its_pid(tmp_path: Path) -> None:
    worker = await prefork.spawn(write_worker(tmp_path), json.dumps({"sleep": 60}))
    line = await worker.stdout.readline()
    assert json.loads(line)["pid"] == worker.pid
    worker.send_signal(signal.SIGSTOP)
    # A stopped process reads as state T in /proc: it is paused, not gone.
    for _ in range(100):
        if state(worker.pid) == "T":
            break
        await asyncio.sleep(0.01)
    assert state(worker.pid) == "T"
    worker.kill()
    assert await worker.wait() == -signal.SIGKILL
    assert state(worker.pid) is None  # reaped by its server


async def test_returncode_is_set_when_the_worker_ends_without_a_wait(tmp_path: Path) -> None:
    worker = await prefork.spawn(write_worker(tmp_path), json.dumps({"exit": 5}))
    for _ in range(500):  # crash tests poll it so to see a worker end early
        if worker.returncode is not None:
            break
        await asyncio.sleep(0.01)
    assert worker.returncode == 5
    assert await worker.wait() == 5
