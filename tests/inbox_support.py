"""What the inbox's process tests share: ``tests/test_inbox_kills.py`` and
``tests/test_steer.py`` use it.

It gives a worker process that is never left running. :func:`run_worker` starts
``python <worker> '<json config>'`` with its output piped. :func:`worker_process`
does the same for a block, and kills the worker if it still runs at the block's end.
:func:`wait_for_file` waits until a worker created a file, or fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import prefork

#: The steer worker (``tests/steer_worker.py``) and the interrupt worker.
STEER_WORKER = Path(__file__).with_name("steer_worker.py")
INTERRUPT_WORKER = Path(__file__).with_name("interrupt_worker.py")


async def run_worker(worker: Path, config: dict[str, Any]) -> prefork.Forked:
    """Start the worker script with its JSON config; stdout and stderr piped."""
    return await prefork.spawn(worker, json.dumps(config))


@contextlib.asynccontextmanager
async def worker_process(worker: Path, config: dict[str, Any]) -> AsyncIterator[prefork.Forked]:
    """The worker, running for the block: killed at its end if it did not exit.

    A failed assertion inside the block then leaves no process behind."""
    process = await run_worker(worker, config)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()


async def wait_for_file(path: str, seconds: float = 30.0) -> None:
    """Return once ``path`` exists; fail after ``seconds``."""
    for _ in range(int(seconds / 0.01)):
        if Path(path).exists():  # noqa: ASYNC240
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never appeared")
