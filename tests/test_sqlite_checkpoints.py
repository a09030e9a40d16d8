"""WAL checkpoints on SQLite run on a thread of their own, off the commit path, and the
WAL stays bounded: proven on the files, with several processes and a reader beside."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

from intention_kernel.durability import TurnTransaction
from intention_kernel.durability.sqlite import SQLiteDurability
from intention_kernel.testing.conformance import commit_for
from intention_kernel.turns import EventDraft, TurnCommit, TurnScope
from test_sqlite_processes import Cluster, cluster, turn

__all__ = ["cluster"]  # the fixture, imported for the process test

PAGE = 4096
FRAME = PAGE + 24  # a WAL frame: a page and its header


def wal_frames(db: Path) -> int:
    """Frames the ``-wal`` file has room for: the most it ever held since it was made."""
    return max(os.path.getsize(f"{db}-wal") - 32, 0) // FRAME


def db_size(db: Path) -> int:
    return db.stat().st_size


def adapter(db: Path, *, checkpoint_after_frames: int, **options: object) -> SQLiteDurability:
    store = SQLiteDurability(db, **options)  # type: ignore[arg-type]
    store._recorder.checkpoint_after_frames = checkpoint_after_frames  # type: ignore[attr-defined]
    return store


async def padded(tx: TurnTransaction) -> TurnCommit:
    """A commit with an event of about half a page: a few WAL frames per turn."""
    return commit_for(tx, [EventDraft("padded", {"pad": "x" * 2000})])


async def run_turns(store: SQLiteDurability, tag: str, turns: int, in_flight: int = 1) -> None:
    """``turns`` new turns (IDs tagged ``tag``) on a few threads, ``in_flight`` at once."""

    async def client(k: int) -> None:
        for n in range(turns // in_flight):
            await store.with_turn(TurnScope(f"t{k}-{n % 7}", f"{tag}-{k}-{n}"), padded)

    await asyncio.gather(*(client(k) for k in range(in_flight)))


async def test_commits_never_checkpoint_the_wal(tmp_path: Path) -> None:
    """With the checkpoint thread's threshold out of reach, thousands of WAL frames
    commit and the database file is never written: no COMMIT ran a checkpoint (SQLite's
    own would have at 1,000 frames, inside the commit that crossed them)."""
    db = tmp_path / "k.db"
    async with adapter(db, checkpoint_after_frames=10**8) as store:
        await run_turns(store, "a", 20)
        size = db_size(db)
        await run_turns(store, "b", 600)
        assert wal_frames(db) > 2_000
        assert db_size(db) == size
        with closing(sqlite3.connect(db)) as reader:  # all of it committed, in the WAL
            assert reader.execute("SELECT count(*) FROM ik_turns").fetchone() == (620,)


async def test_the_checkpoint_thread_keeps_the_wal_bounded(tmp_path: Path) -> None:
    """Under sustained turns, one at a time and overlapping, the checkpoint thread copies
    the WAL into the database file (its own connection runs the checkpoints, on its own
    thread) and the WAL file stays a small fraction of what was written."""
    db = tmp_path / "k.db"
    checkpoints: list[str] = []

    def trace(role: str, sql: str) -> None:
        if role == "checkpointer":
            checkpoints.append(f"{threading.current_thread().name}: {sql}")
        else:
            assert "wal_checkpoint" not in sql

    async with adapter(db, checkpoint_after_frames=100, trace=trace) as store:
        await run_turns(store, "a", 20)
        size = db_size(db)
        await run_turns(store, "b", 600)
        await run_turns(store, "c", 600, in_flight=8)
        # 1,200 turns wrote several frames each; the WAL never held more than a few
        # times the threshold (the writers' safety net is four times it).
        assert wal_frames(db) <= 600
        assert db_size(db) > size + 200 * PAGE
    assert checkpoints
    assert all(c.startswith("ik-sqlite-checkpoint: PRAGMA wal_checkpoint(") for c in checkpoints)
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM ik_turns").fetchone() == (1_220,)


async def test_checkpoints_of_several_processes_and_a_reader_share_one_file(
    cluster: Cluster,
) -> None:
    """Two worker processes commit turns at once on one file, each with its checkpoint
    thread, while a reader here holds a snapshot: every turn commits, the reader's
    snapshot never changes under it, and the file is sound afterwards."""
    per_worker = 120
    workers = await cluster.start_together(
        [
            [turn(f"w{w}-{n % 5}", f"w{w}-{n}", f"pi_w{w}_{n}", 100) for n in range(per_worker)]
            for w in range(2)
        ]
    )
    reader_saw: list[int] = []
    with closing(sqlite3.connect(cluster.db, isolation_level=None, timeout=10)) as reader:
        for _ in range(3):
            reader.execute("BEGIN")
            seen = reader.execute("SELECT count(*) FROM ik_turns").fetchone()[0]
            await asyncio.sleep(0.1)  # checkpoints and commits go on meanwhile
            again = reader.execute("SELECT count(*) FROM ik_turns").fetchone()[0]
            reader.execute("COMMIT")
            assert again == seen
            reader_saw.append(seen)
            await asyncio.sleep(0.05)
    outcomes = [o for w in workers for o in await w.finish()]
    assert len(outcomes) == 2 * per_worker
    assert [o for o in outcomes if "error" in o] == []
    committed = {u for _, u, _ in cluster.committed_turns()}
    missing = [o for o in outcomes if o["turn_id"] not in committed]
    assert missing == [], [
        (m["turn_id"], m["result"]["replayed"], m["result"]["checkpoint_version"]) for m in missing
    ]
    assert reader_saw == sorted(reader_saw)
    with closing(sqlite3.connect(cluster.db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        # The WAL was copied into the database file while the workers ran, or when the
        # last of them closed: the file alone holds every turn.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    copy = cluster.root / "copy.db"
    copy.write_bytes(cluster.db.read_bytes())
    with closing(sqlite3.connect(copy)) as conn:
        assert conn.execute("SELECT count(*) FROM ik_turns").fetchone() == (2 * per_worker,)
