"""The demo's database file: made ready for a fresh run, never someone else's.

The demo keeps its fake provider's ledger in the SQLite file of the kernel's store.
So it recreates that file on each run.
It only removes a file it created itself, recognised by the ledger's table.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

__all__ = ["DEMO_MARKER_TABLE", "SIDE_FILES", "prepare_demo_db"]

DEMO_MARKER_TABLE = "demo_provider_charges"
SIDE_FILES = ("-wal", "-shm", "-journal", ".locks")


def prepare_demo_db(path: str) -> str | None:
    """Make ``path`` ready for a fresh run; return why not if it must not be touched."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"directory {directory!r} does not exist"
    if os.path.isdir(path):
        return f"{path!r} is a directory"
    if os.path.exists(path) and os.path.getsize(path) > 0:
        try:
            uri = Path(path).absolute().as_uri() + "?mode=ro"
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
                found = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                    (DEMO_MARKER_TABLE,),
                ).fetchone()
        except sqlite3.Error as exc:
            return f"{path!r} exists and cannot be read as SQLite ({exc}); not overwriting it"
        if found is None:
            return (
                f"{path!r} exists and was not created by the demo (no {DEMO_MARKER_TABLE} "
                "table); the demo recreates its database, so it will not overwrite this one"
            )
    for suffix in ("", *SIDE_FILES):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    return None
