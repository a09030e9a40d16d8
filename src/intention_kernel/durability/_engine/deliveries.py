"""Which turns run or wait for their thread's lock, for a cancel to ask.

A cancel may find a turn's redelivery queued in the inbox, not started. Removing it
answers ``"dequeued"``: the turn will not run. That is false while another delivery
of the same turn runs, maybe in another process. So a store marks each delivery in
``start_turn``, for as long as it holds the thread's lock. The local stores mark it
at no cost in commits: a counter in memory, or a byte of SQLite's lock file. Their
thread lock for a turn takes and drops the mark itself (``replay_or_lock_and_begin``'s
``lock``): no second context manager per turn. PostgreSQL writes the turn ID on the
lease row, in the statement that takes it.
"""

from __future__ import annotations

__all__ = ["Deliveries"]


class Deliveries:
    """The turns that hold their thread in a store private to one process, by count."""

    def __init__(self) -> None:
        self._count: dict[tuple[str, str], int] = {}

    def take(self, key: tuple[str, str]) -> None:
        self._count[key] = self._count.get(key, 0) + 1

    def give(self, key: tuple[str, str]) -> None:
        left = self._count.pop(key) - 1
        if left:
            self._count[key] = left

    def __contains__(self, key: object) -> bool:
        return key in self._count
