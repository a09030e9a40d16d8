"""A watch on the SQLite adapter's connections: one user at a time, and every cursor
freed by the thread that made it, unless it was closed first.

``watch_connections(monkeypatch)`` makes every connection the adapter opens (it alone
passes ``check_same_thread=False``) an :class:`Owned` one and answers the list of
uses that broke the rule, each as a sentence naming the threads. What counts:

- a call on the connection (a statement, ``commit``, ``rollback``, ``close``, or
  reading ``in_transaction`` or ``total_changes``) while another thread is inside a
  call on it;
- a call while another thread's transaction is open on it (a rollback there would
  undo that thread's writes);
- a cursor that still may hold a statement (not closed) freed on another thread than
  the one that made it: freeing resets the statement, which may be running again on
  the thread that made it (SQLite then answers ``bad parameter or other API misuse``).
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import pytest

__all__ = ["Owned", "watch_connections"]


class _Cursor(sqlite3.Cursor):
    def __init__(self, conn: Owned) -> None:
        super().__init__(conn)
        self._maker = threading.current_thread().name
        self._closed = False
        self._problems = conn.problems

    def close(self) -> None:
        self._closed = True
        super().close()

    def __del__(self) -> None:
        here = threading.current_thread().name
        if not self._closed and here != self._maker:
            self._problems.append(f"a cursor made on {self._maker} was freed open on {here}")


class Owned(sqlite3.Connection):
    """A connection that records the uses breaking the one-user rule in ``problems``."""

    problems: list[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.problems = []
        self._guard = threading.Lock()
        self._inside: str | None = None  # the thread inside a call now
        self._owner: str | None = None  # the thread whose transaction is open

    def _check(self, what: str) -> None:
        here = threading.current_thread().name
        if self._inside is not None and self._inside != here:
            self.problems.append(f"{what} on {here} while {self._inside} was inside a call")
        elif self._owner is not None and self._owner != here:
            self.problems.append(f"{what} on {here} inside {self._owner}'s transaction")

    def _enter(self, what: str) -> None:
        with self._guard:
            self._check(what)
            self._inside = threading.current_thread().name

    def _leave(self) -> None:
        with self._guard:
            open_now = super().in_transaction
            if open_now and self._owner is None:
                self._owner = self._inside
            elif not open_now:
                self._owner = None
            self._inside = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self._enter(f"execute({sql.split()[0]})")
        try:
            return _Cursor(self).execute(sql, parameters)
        finally:
            self._leave()

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        self._enter(f"executemany({sql.split()[0]})")
        try:
            return _Cursor(self).executemany(sql, parameters)
        finally:
            self._leave()

    def commit(self) -> None:
        self._enter("commit")
        try:
            super().commit()
        finally:
            self._leave()

    def rollback(self) -> None:
        self._enter("rollback")
        try:
            super().rollback()
        finally:
            self._leave()

    def close(self) -> None:
        self._enter("close")
        try:
            super().close()
        finally:
            with self._guard:
                self._inside = self._owner = None

    @property
    def in_transaction(self) -> bool:
        with self._guard:
            self._check("in_transaction")
        return super().in_transaction

    @property
    def total_changes(self) -> int:
        with self._guard:
            self._check("total_changes")
        return super().total_changes


def watch_connections(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the adapter's connections :class:`Owned` ones; answer their problems."""
    problems: list[str] = []
    connect = sqlite3.connect

    def owned(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        if kwargs.get("check_same_thread", True) or "factory" in kwargs:
            own: sqlite3.Connection = connect(*args, **kwargs)  # the test's own connections
            return own
        conn = connect(*args, factory=Owned, **kwargs)
        assert isinstance(conn, Owned)
        conn.problems = problems
        return conn

    monkeypatch.setattr(sqlite3, "connect", owned)
    return problems
