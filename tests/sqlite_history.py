"""SQLite files as earlier versions of the library left them, for the upgrade tests."""

from __future__ import annotations

import sqlite3

__all__ = [
    "undo_migration_8",
    "undo_migration_9",
    "undo_migration_10",
    "undo_migration_11",
    "undo_migration_12",
    "undo_migration_13",
    "undo_migration_14",
    "undo_migration_15",
    "undo_migration_16",
    "undo_migration_17",
]


def undo_migration_12(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 12 held it: no LangGraph checkpoints."""
    undo_migration_13(conn)
    for table in ("ik_lg_checkpoints", "ik_lg_writes", "ik_lg_heads"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("DELETE FROM ik_schema WHERE version > 11")


def undo_migration_13(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 13 held it: no turn streams."""
    undo_migration_14(conn)
    conn.execute("DROP TRIGGER ik_journal_streams")
    conn.execute("DROP TABLE ik_streams")
    conn.execute("ALTER TABLE ik_journal DROP COLUMN segment")
    conn.execute("ALTER TABLE ik_journal DROP COLUMN events")
    conn.execute("DELETE FROM ik_schema WHERE version > 12")


def undo_migration_14(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 14 held it: no timers."""
    undo_migration_15(conn)
    conn.execute("DROP TABLE ik_timers")
    conn.execute("DELETE FROM ik_schema WHERE version > 13")


def undo_migration_17(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 17 held it: interrupts by base version only,
    and no inbox entry marked started."""
    conn.executescript(
        """
        CREATE TABLE ik_interrupts_old (
            thread_id TEXT NOT NULL, base_version INTEGER NOT NULL,
            created_at TEXT NOT NULL, PRIMARY KEY (thread_id, base_version)
        ) WITHOUT ROWID;
        INSERT OR IGNORE INTO ik_interrupts_old
        SELECT thread_id, base_version, created_at FROM ik_interrupts;
        DROP TABLE ik_interrupts;
        ALTER TABLE ik_interrupts_old RENAME TO ik_interrupts;
        ALTER TABLE ik_inbox DROP COLUMN started;
        DELETE FROM ik_schema WHERE version > 16;
        """
    )


def undo_migration_16(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 16 held it: an inbox without steers."""
    undo_migration_17(conn)
    conn.execute("ALTER TABLE ik_inbox DROP COLUMN steer")
    conn.execute("ALTER TABLE ik_inbox DROP COLUMN taken_by")
    conn.execute("DELETE FROM ik_schema WHERE version > 15")


def undo_migration_15(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 15 held it: stop requests with no scope."""
    undo_migration_16(conn)
    conn.executescript(
        """
        CREATE TABLE ik_cancels_old (
            thread_id TEXT NOT NULL, turn_id TEXT NOT NULL, reason TEXT,
            created_at TEXT NOT NULL, PRIMARY KEY (thread_id, turn_id)
        ) WITHOUT ROWID;
        INSERT INTO ik_cancels_old SELECT thread_id, turn_id, reason, created_at FROM ik_cancels;
        DROP TABLE ik_cancels;
        ALTER TABLE ik_cancels_old RENAME TO ik_cancels;
        DELETE FROM ik_schema WHERE version > 14;
        """
    )


def undo_migration_11(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 11 held it: journal entries with no tenant."""
    undo_migration_12(conn)
    conn.execute("ALTER TABLE ik_journal DROP COLUMN tenant_id")
    conn.execute("DELETE FROM ik_schema WHERE version > 10")


def undo_migration_10(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 10 held it: no thread inbox."""
    undo_migration_11(conn)
    conn.execute("DROP TABLE ik_inbox")
    conn.execute("DROP TABLE ik_cancels")
    conn.execute("DROP TABLE ik_interrupts")
    conn.execute("DELETE FROM ik_schema WHERE version > 9")


def undo_migration_9(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 9 held it: receipts without the write's
    capability, input and approvers (and no later migration either)."""
    undo_migration_10(conn)
    for column in ("capability_id", "input", "approved_by"):
        conn.execute(f"ALTER TABLE ik_receipts DROP COLUMN {column}")
    conn.execute("DELETE FROM ik_schema WHERE version > 8")


def undo_migration_8(conn: sqlite3.Connection) -> None:
    """The file as a store before migration 8 held it: each receipt index in its core,
    no index rows, no ``receipt_seq`` (and what later migrations added, undone first)."""
    undo_migration_9(conn)
    threads = conn.execute("SELECT thread_id, checkpoint FROM ik_threads WHERE version > 0")
    for thread_id, core in threads.fetchall():
        index = conn.execute(
            "SELECT body FROM ik_receipt_index WHERE thread_id = ? ORDER BY seq", (thread_id,)
        )
        if '"receipts":' not in core:
            core = f'{core[:-1]},"receipts":[{",".join(row[0] for row in index)}]}}'
        conn.execute("UPDATE ik_threads SET checkpoint = ? WHERE thread_id = ?", (core, thread_id))
    conn.execute("DROP TABLE ik_receipt_index")
    conn.execute("ALTER TABLE ik_threads DROP COLUMN receipt_seq")
    conn.execute("DELETE FROM ik_schema WHERE version > 7")
