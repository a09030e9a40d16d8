"""PostgreSQL durability: many workers on many hosts sharing one database.

Design, and why:

- **Per-thread serialization with a session-level advisory lock** held on one
  pooled connection for the whole turn. No transaction is open while the
  interpreter or a capability runs (the session sits idle, holding only the
  lock), and the server drops the lock the moment the session ends: a killed
  worker frees its threads at once, a vanished host within about 25 seconds
  (server-side TCP keepalives and ``tcp_user_timeout``, set on every session).
- **Every statement of a turn runs on that same connection.** A commit that
  succeeds was therefore made by a session that still held the lock; if the
  session died, the lock died with it and so does every later statement of
  the turn, which then commits nothing. It also means one connection per
  in-flight turn: a turn never waits for a second connection while holding
  the first, so a full pool cannot deadlock.
- **Fenced commit.** Result, checkpoint and events are one transaction that
  inserts the ``(thread_id, turn_id)`` primary key and compares-and-sets the
  thread version and owner, exactly as the SQLite adapter does. A lost commit
  acknowledgement is resolved by the retry, which finds the turn row and replays.
- **Outbox positions in commit order.** A sequence is not commit-ordered in
  PostgreSQL (position 5 can commit after 6, and a relay that saw 6 would skip
  5 forever), so turns insert their events unnumbered and ``read_outbox``
  first numbers every committed, unnumbered event from a counter row, one
  numbering transaction at a time. Turn commits take no global lock.

Modules: ``_schema`` (migrations and the turn-start function), ``_statements`` (SQL),
``_commit`` (the commit statement builder), ``_sessions`` (the pool, its retry, the
cursor cache), ``_locks`` (advisory-lock sessions and relay claims), ``_recorder``
(the storage contract), ``_adapter`` (``PostgresDurability``).
"""

from __future__ import annotations

try:
    import psycopg  # noqa: F401
    import psycopg_pool  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "PostgresDurability needs psycopg 3 and psycopg-pool: "
        "pip install 'intention-kernel[postgres]'"
    ) from exc

from intention_kernel.durability.postgres._adapter import (
    DEFAULT_LOCK_TIMEOUT as DEFAULT_LOCK_TIMEOUT,
)
from intention_kernel.durability.postgres._adapter import DEFAULT_SCHEMA as DEFAULT_SCHEMA
from intention_kernel.durability.postgres._adapter import URL_OPTIONS as URL_OPTIONS
from intention_kernel.durability.postgres._adapter import PostgresDurability
from intention_kernel.durability.postgres._commit import COMMIT_PARTS as COMMIT_PARTS
from intention_kernel.durability.postgres._commit import commit_statement as commit_statement
from intention_kernel.durability.postgres._schema import BEGIN_TURN as BEGIN_TURN
from intention_kernel.durability.postgres._schema import MIGRATIONS as MIGRATIONS
from intention_kernel.durability.postgres._sessions import advisory_key as advisory_key
from intention_kernel.durability.postgres._statements import (
    INSERT_RECEIPT_IF_NEW as INSERT_RECEIPT_IF_NEW,
)
from intention_kernel.durability.postgres._statements import UPDATE_RECEIPT as UPDATE_RECEIPT
from intention_kernel.durability.postgres._statements import receipts_query as receipts_query

__all__ = ["PostgresDurability"]
