"""Named fault points inside a turn, for crash and chaos tests (private).

The durable code paths call :func:`reach` at each point below, guarded by the
module flag ``armed``::

    if _faults.armed:
        _faults.reach(_faults.BEFORE_COMMIT)

Unless a test armed a fault, the whole mechanism costs one attribute read per
point. That is a few per turn: tens of nanoseconds against a turn's hundreds of
microseconds. Tests arm points through :mod:`intention_kernel.testing.faults`.
Nothing here reads the environment or any configuration. A worker process arms its
faults explicitly.

The points, in the order a turn with one external write reaches them:

- ``after_lock``: the thread lock is held; nothing read yet.
- ``after_checkpoint_load``: the prior-result check found none and the checkpoint
  is loaded; the runtime has not started.
- ``after_receipt_prepared``: ``prepared`` is durable; the provider was not called.
- ``in_provider_after_write``: reached by the *test's* provider once its remote
  write is durable, before it answers (the lost-response window).
- ``after_receipt_completed``: ``completed`` and its value are durable.
- ``before_commit``: the commit record is built; nothing of it is written.
- ``during_commit``: inside the adapter's commit. On SQLite, within the commit
  transaction after its statements and before ``COMMIT``. On PostgreSQL, as the
  statement is sent: the commit is a single statement (one implicit transaction). A
  test makes the server hold that transaction open before its ``COMMIT``, to die
  inside it (see ``tests/test_crash_matrix.py``).
- ``after_commit``: the turn is committed; its result was not returned yet.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "AFTER_CHECKPOINT_LOAD",
    "AFTER_COMMIT",
    "AFTER_LOCK",
    "AFTER_RECEIPT_COMPLETED",
    "AFTER_RECEIPT_PREPARED",
    "BEFORE_COMMIT",
    "DURING_COMMIT",
    "IN_PROVIDER_AFTER_WRITE",
    "POINTS",
    "armed",
    "reach",
    "set_action",
]

#: The thread's lock is held; nothing of the turn is read yet.
AFTER_LOCK = "after_lock"
#: The checkpoint is loaded; the turn has not interpreted anything.
AFTER_CHECKPOINT_LOAD = "after_checkpoint_load"
#: The ``prepared`` receipt is committed; the provider is not called yet.
AFTER_RECEIPT_PREPARED = "after_receipt_prepared"
#: Reached by the test's provider once its write is durable, before it answers.
IN_PROVIDER_AFTER_WRITE = "in_provider_after_write"
#: The ``completed`` receipt is committed; the turn has not committed.
AFTER_RECEIPT_COMPLETED = "after_receipt_completed"
#: The commit record is built; nothing of it is written yet.
BEFORE_COMMIT = "before_commit"
#: Inside the adapter's commit, before its ``COMMIT`` (see the module docstring).
DURING_COMMIT = "during_commit"
#: The turn is committed; its result is not returned yet.
AFTER_COMMIT = "after_commit"

#: Every point, in the order a turn with one external write reaches them.
POINTS: tuple[str, ...] = (
    AFTER_LOCK,
    AFTER_CHECKPOINT_LOAD,
    AFTER_RECEIPT_PREPARED,
    IN_PROVIDER_AFTER_WRITE,
    AFTER_RECEIPT_COMPLETED,
    BEFORE_COMMIT,
    DURING_COMMIT,
    AFTER_COMMIT,
)

#: True while at least one point has an action. The only thing the hot path reads.
armed: bool = False

_actions: dict[str, Callable[[str], None]] = {}


def reach(point: str) -> None:
    """Run the action armed at ``point``, if any (it may exit the process or raise)."""
    action = _actions.get(point)
    if action is not None:
        action(point)


def set_action(point: str, action: Callable[[str], None] | None) -> None:
    """Arm (``action``) or disarm (``None``) one point; keeps ``armed`` up to date."""
    global armed
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; the points are {', '.join(POINTS)}")
    if action is None:
        _actions.pop(point, None)
    else:
        _actions[point] = action
    armed = bool(_actions)
