"""As if the library knew one more checkpoint revision than it does: the current one,
and a migration from it that tags every message's content with ``" [v2]"`` (the
migration ``test_operations.py`` injects). No older revision exists yet, so this is
how the ``migrate`` command is tested on real stores.

- :func:`install` puts the revision in place, in a test through
  ``monkeypatch.setattr`` (undone afterwards), in a worker process for good.
- ``python tests/revision_two.py cli ARGS...`` runs ``intention-kernel ARGS...`` with the
  revision installed. Its environment can set four variables.
  ``IK_MIGRATE_DELAY`` (seconds) slows each migrated thread down.
  ``IK_MIGRATE_KILL_AT=N`` makes the process kill itself (SIGKILL) as it migrates its
  N-th thread. ``IK_MIGRATE_READY=PATH`` creates that file as it starts its first
  migration. ``IK_MIGRATE_WAIT_FOR=PATH`` holds the first migration until that file
  exists.
- ``python tests/revision_two.py turns '<json>'`` commits turns with the revision
  installed, printing one JSON line per committed turn (see :func:`commit_turns`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from intention_kernel import _checkpoint as checkpoint
from intention_kernel import operations
from intention_kernel._checkpoint import CHECKPOINT_MIGRATIONS

TAG = " [v2]"
_migrated = 0


def tag_messages(document: dict[str, Any]) -> dict[str, Any]:
    """The injected migration: revision ``SCHEMA_REVISION`` to the next."""
    global _migrated
    _migrated += 1
    if os.environ.get("IK_MIGRATE_KILL_AT") == str(_migrated):
        os.kill(os.getpid(), signal.SIGKILL)  # interrupted: the thread is not rewritten
    ready, wait_for = os.environ.get("IK_MIGRATE_READY"), os.environ.get("IK_MIGRATE_WAIT_FOR")
    if ready and _migrated == 1:
        _touch(ready)
    if wait_for and _migrated == 1:
        _wait_for(wait_for)
    time.sleep(float(os.environ.get("IK_MIGRATE_DELAY", "0")))
    document["messages"] = [dict(m, content=m["content"] + TAG) for m in document["messages"]]
    return document


ORIGINAL = CHECKPOINT_MIGRATIONS
MIGRATIONS = (*ORIGINAL, tag_messages)
REVISION = len(MIGRATIONS) + 1


def install(patch: Callable[[object, str, Any], None] = setattr) -> None:
    """Register the migration, and update the copies this library takes at import."""
    import intention_kernel.durability._engine.checkpoints as _checkpoints
    from intention_kernel._runtime import reply

    patch(checkpoint, "CHECKPOINT_MIGRATIONS", MIGRATIONS)
    patch(checkpoint, "SCHEMA_REVISION", REVISION)
    # Where the revision or the migration list was bound at import time (a library that
    # reads CHECKPOINT_MIGRATIONS on each use has no such copies, and these are skipped).
    for module, name, value in (
        (reply, "SCHEMA_REVISION", REVISION),
        (_checkpoints, "_CURRENT_CORE_PREFIX", f'{{"schema_revision":{REVISION},'),
    ):
        if hasattr(module, name):
            patch(module, name, value)
    for function in (
        checkpoint.decode_checkpoint,
        operations.check_checkpoints,
        operations.migrate_checkpoints,
    ):
        defaults = function.__kwdefaults__ or {}
        if defaults.get("migrations") is ORIGINAL:
            patch(function, "__kwdefaults__", {**defaults, "migrations": MIGRATIONS})


async def commit_turns(config: dict[str, Any]) -> None:
    """Commit ``balance N`` turns on ``threads``, round after round, ``pause`` seconds
    apart. From the command line, it starts once ``wait_for`` exists. The first round
    goes in reverse thread order, creating ``started`` after its first turn. The rounds
    go on until ``stop`` exists, then one more. Each committed turn is one JSON line on
    stdout: ``{"thread_id", "turn_id", "version"}``."""
    from intention_kernel import Kernel
    from intention_kernel.durability import open_durability
    from intention_kernel.testing._agents import FakeProvider, billing_agent

    threads: list[str] = config["threads"]
    async with open_durability(config["url"]) as store:
        kernel = Kernel(billing_agent(FakeProvider()), store)
        round_, last = config["first_turn"], False
        while True:
            order = threads[::-1] if round_ == config["first_turn"] else threads
            for thread_id in order:
                result = await kernel.turn(thread_id, str(round_), f"balance {round_}")
                line = {"thread_id": thread_id, "turn_id": str(round_)}
                print(json.dumps({**line, "version": result.checkpoint_version}), flush=True)
                _touch(config["started"])
                await asyncio.sleep(config["pause"])
            if last:
                return
            last = _exists(config["stop"])
            round_ += 1


def _touch(path: str) -> None:
    with open(path, "a"):
        pass


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + 20
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


if __name__ == "__main__":
    install()
    if sys.argv[1] == "cli":
        from intention_kernel.cli import main

        sys.argv = ["intention-kernel", *sys.argv[2:]]
        main()
    else:
        config = json.loads(sys.argv[2])
        _wait_for(config["wait_for"])
        asyncio.run(commit_turns(config))
