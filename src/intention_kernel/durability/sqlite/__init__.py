"""SQLite durability: the embedded default, safe across processes on one file.

Design, and why:

- **WAL, ``synchronous=FULL`` by default.** Every commit is on disk before it is
  acknowledged; readers never block the writer. ``NORMAL`` is offered for hosts
  that accept losing the last commits on power loss (not on process crash).
- **Per-thread serialization with an OS lock**, writes on a worker thread when
  turns overlap, reads inline: the reasons are in :mod:`._connection`.
- **Fenced commit.** The turn commit compares-and-sets the thread version and its
  owner. It inserts the ``(thread_id, turn_id)`` primary key. A turn that lost its
  claim fails instead of overwriting. It cannot lose it, short of the lock file
  being deleted or another program writing the file.
- **Checkpoints in pieces.** The thread row holds the checkpoint's core. Messages
  and facts have rows of their own, written only when a turn appends or changes
  them. So a turn costs the same on the 10,000th turn of a thread as on the 10th.

Modules: ``_schema`` (migrations), ``_statements`` (SQL), ``_connection``
(connections, worker thread, file locks), ``_recorder`` (the storage contract),
``_adapter`` (``SQLiteDurability``).
"""

from __future__ import annotations

from intention_kernel.durability.sqlite._adapter import SQLiteDurability, StatementTrace
from intention_kernel.durability.sqlite._schema import MIGRATIONS as MIGRATIONS

__all__ = ["SQLiteDurability", "StatementTrace"]
