"""A ``SyncKernel`` in a process of its own, driven by ``tests/test_sync_processes.py``.

Run as ``python tests/sync_fork_worker.py <scenario> <store URL>``; prints one JSON
object on its last line of stdout.

- ``fork-url``: the parent runs a turn over the URL, forks; the child runs a turn
  and replays the parent's, closes its kernel and exits; the parent runs another.
- ``fork-object``: the same over a store object (``open_durability(url)``): the child
  is refused with ``ForkedKernelError``; the parent goes on.
- ``fork-unused``: a kernel over a store object that the parent never used: the
  child runs a turn; the parent then runs one.
- ``interrupt``: the main thread waits in a turn whose write is in flight; SIGINT
  arrives. Reports what the wait raised and the receipt and checkpoint after it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from intention_kernel import KernelError, SyncKernel
from intention_kernel.durability import open_durability
from sync_support import ThreadGate, gate_agent

#: Well under the test's 60 s timeout for this process.
HANG_SECONDS = 45


def in_child(work: Any) -> dict[str, Any]:
    """Run ``work()`` in a forked child; its JSON answer, or its error's class name."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer = {"ok": work()}
        except KernelError as error:
            answer = {"error": type(error).__name__, "message": str(error)}
        except BaseException as error:  # report anything: the parent must not hang
            answer = {"error": type(error).__name__, "message": str(error)}
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(answer))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as inp:
        text = inp.read()
    _, status = os.waitpid(pid, 0)
    report: dict[str, Any] = json.loads(text)
    report["exit"] = os.waitstatus_to_exitcode(status)
    return report


def fork(url: str, *, by_url: bool, used: bool) -> dict[str, Any]:
    gate = ThreadGate()
    gate.released.set()
    kernel = SyncKernel(gate_agent(gate), url if by_url else open_durability(url))
    report: dict[str, Any] = {}
    if used:
        report["parent_before"] = kernel.turn("parent", "1", "a").checkpoint_version

    def child() -> dict[str, Any]:
        result = kernel.turn("child", "1", "b")
        replay = kernel.turn("parent", "1", "a").replayed if used else None
        kernel.close()
        return {"version": result.checkpoint_version, "replayed": replay}

    report["child"] = in_child(child)
    report["parent_after"] = kernel.turn("parent", "2", "c").checkpoint_version
    report["child_seen_by_parent"] = kernel.turn("child", "1", "b").replayed
    report["writes"] = gate.calls
    kernel.close()
    return report


def interrupt(url: str) -> dict[str, Any]:
    # A process started from a shell's background job inherits SIGINT ignored.
    # Ctrl-C would then do nothing, and the turn would wait for ever.
    # This scenario is a caller whose Ctrl-C raises: Python's own default.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    gate = ThreadGate()
    kernel = SyncKernel(gate_agent(gate), url)

    def send_sigint() -> None:
        gate.entered.wait()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=send_sigint, daemon=True).start()
    try:
        kernel.turn("t", "1", "slow")
        raised = None
    except KeyboardInterrupt:
        raised = "KeyboardInterrupt"
    # Read at once: a turn still running would show its receipt ``prepared``.
    receipts = [r.status.value for r in kernel.list_receipts("t")]
    checkpoint = kernel.checkpoint("t")
    gate.released.set()
    again = kernel.turn("t", "1", "slow")
    kernel.close()
    return {
        "raised": raised,
        "receipts": receipts,
        "checkpoint": None if checkpoint is None else checkpoint.version,
        "again": again.steps[0].status.value,
        "writes": gate.calls,
    }


def main() -> None:
    scenario, url = sys.argv[1], sys.argv[2]
    # A hang would otherwise end in the test's timeout with no trace of where.
    # Before it, every thread's stack goes to stderr, which the test shows.
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    if scenario == "interrupt":
        report = interrupt(url)
    else:
        by_url, used = {
            "fork-url": (True, True),
            "fork-object": (False, True),
            "fork-unused": (False, False),
        }[scenario]
        report = fork(url, by_url=by_url, used=used)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
