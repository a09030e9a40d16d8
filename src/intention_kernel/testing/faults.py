"""Fault injection for crash and chaos tests: make a turn die, or raise, at a named point.

In a test process, raise at a point and look at what the store kept::

    from intention_kernel.testing import faults

    with faults.injected(faults.BEFORE_COMMIT, "raise"):
        with pytest.raises(faults.InjectedFault):
            await kernel.turn("t", "delivery-1", "yes")
    retried = await kernel.turn("t", "delivery-1", "yes")   # runs again, effects deduplicated

In a worker process, make the process really die there (``os._exit``, so no
``finally`` block, no flush and no cleanup runs)::

    faults.inject(faults.AFTER_RECEIPT_PREPARED, "exit")

A worker arms its faults itself, from its own configuration (its command line, say).
The library never reads fault settings from the environment.

The points are these; :mod:`intention_kernel._faults` shows exactly where each one is.

- ``AFTER_LOCK``, ``AFTER_CHECKPOINT_LOAD``, ``AFTER_RECEIPT_PREPARED``.
- ``IN_PROVIDER_AFTER_WRITE``, which the test's own provider code reaches with :func:`reach`.
- ``AFTER_RECEIPT_COMPLETED``, ``BEFORE_COMMIT``, ``DURING_COMMIT`` and ``AFTER_COMMIT``.

Unarmed, the mechanism costs one flag check per point.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from intention_kernel import _faults
from intention_kernel._faults import (
    AFTER_CHECKPOINT_LOAD,
    AFTER_COMMIT,
    AFTER_LOCK,
    AFTER_RECEIPT_COMPLETED,
    AFTER_RECEIPT_PREPARED,
    BEFORE_COMMIT,
    DURING_COMMIT,
    IN_PROVIDER_AFTER_WRITE,
    POINTS,
)

__all__ = [
    "AFTER_CHECKPOINT_LOAD",
    "AFTER_COMMIT",
    "AFTER_LOCK",
    "AFTER_RECEIPT_COMPLETED",
    "AFTER_RECEIPT_PREPARED",
    "BEFORE_COMMIT",
    "DURING_COMMIT",
    "EXIT_STATUS",
    "IN_PROVIDER_AFTER_WRITE",
    "POINTS",
    "Fault",
    "InjectedFault",
    "clear",
    "inject",
    "injected",
    "reach",
]

#: The exit status of a process killed by an ``"exit"`` fault (as if by SIGKILL: 128 + 9).
EXIT_STATUS = 137

Action = Literal["exit", "raise"] | Callable[[str], None]


class InjectedFault(BaseException):
    """Raised at a point armed with ``"raise"``.

    It is a ``BaseException``, like the process death it stands for.
    So no ``except Exception`` in the code under test intercepts it.
    Such code is a capability's error handling, say.
    The runtime turning a failure into a ``failed`` step is another.
    An effect's ``uncertain`` bookkeeping is a third.
    So it unwinds the turn as a crash would, except that the process survives.
    """

    def __init__(self, point: str) -> None:
        super().__init__(f"fault injected at {point}")
        self.point = point


@dataclass
class Fault:
    """One armed point: how often it was reached, and how often its action ran."""

    point: str
    skip: int
    times: int | None
    reached: int = 0
    fired: int = 0


def inject(
    point: str,
    action: Action = "raise",
    *,
    skip: int = 0,
    times: int | None = 1,
    exit_status: int = EXIT_STATUS,
) -> Fault:
    """Arm ``point``: after ``skip`` passes, run ``action`` on the next ``times`` passes.

    ``action`` is ``"exit"``, for ``os._exit(exit_status)``.
    It may be ``"raise"``, for :class:`InjectedFault`.
    It may also be a callable taking the point's name.
    ``times`` of ``None`` means every later pass.

    Replaces whatever was armed at ``point``. Returns the :class:`Fault`, whose
    counters show whether the point was reached.
    """
    fault = Fault(point, skip, times)
    run = _action(action, exit_status)

    def fire(reached: str) -> None:
        fault.reached += 1
        if fault.reached <= fault.skip:
            return
        if fault.times is not None and fault.fired >= fault.times:
            return
        fault.fired += 1
        run(reached)

    _faults.set_action(point, fire)
    return fault


def clear(point: str | None = None) -> None:
    """Disarm ``point``, or every point."""
    for name in POINTS if point is None else (point,):
        _faults.set_action(name, None)


@contextmanager
def injected(
    point: str,
    action: Action = "raise",
    *,
    skip: int = 0,
    times: int | None = 1,
    exit_status: int = EXIT_STATUS,
) -> Iterator[Fault]:
    """:func:`inject` for the duration of a ``with`` block."""
    fault = inject(point, action, skip=skip, times=times, exit_status=exit_status)
    try:
        yield fault
    finally:
        clear(point)


def reach(point: str) -> None:
    """Mark a fault point in the test's own code, such as
    ``IN_PROVIDER_AFTER_WRITE`` in a fake provider once its remote write is durable."""
    if _faults.armed:
        _faults.reach(point)


def _action(action: Action, exit_status: int) -> Callable[[str], None]:
    if action == "exit":

        def die(point: str) -> None:
            os._exit(exit_status)

        return die
    if action == "raise":

        def throw(point: str) -> None:
            raise InjectedFault(point)

        return throw
    if callable(action):
        return action
    raise ValueError(f"a fault action is 'exit', 'raise' or a callable, not {action!r}")
