"""PostgreSQL durability: many workers on many hosts sharing one database.

Design, and why:

- **Per-thread serialization with leases**, not sessions. A turn takes its
  thread in one statement. The lease is a row of ``ik_leases``. It holds an owner,
  a fencing epoch that only grows, and an expiry on the server's clock. The turn
  then holds no session while the interpreter or a capability runs. It borrows one
  per statement it must write. A task renews the lease while the turn runs. A dead
  worker's threads are free once their leases expire (``lease_expiry``, 30 s by
  default).
- **Every write is fenced by the lease, in the same statement**: a receipt
  prepare, a journal entry, the commit, an operator's resolution. A worker paused
  past its lease (or cut off) finds each of them refused (``LeaseLostError``):
  nothing it started is committed or announced. Only a provider call's outcome
  is fenced by the attempt that prepared it instead. So it is still recorded,
  unless the next holder already judged the receipt uncertain.
- **Fenced commit.** Result, checkpoint and events are one statement. It checks
  and releases the lease. It inserts the ``(thread_id, turn_id)`` primary key. It
  compares-and-sets the thread version and owner, as the SQLite adapter does. A
  lost commit acknowledgement is resolved by the retry, which finds the turn row.
- **Outbox positions in commit order.** A sequence is not commit-ordered in
  PostgreSQL. Position 5 can commit after 6, and a relay that saw 6 would skip 5
  forever. So turns insert their events unnumbered. ``read_outbox`` first numbers
  every committed, unnumbered event from a counter row. Numbering runs one
  transaction at a time. Turn commits take no global lock.
- **Transaction poolers welcome.** No session state is used between
  transactions. Tables are named with their schema. No advisory lock outlives its
  transaction. No statement is prepared on the server.

Modules:

- ``_schema``: migrations, and the functions that start a turn, prepare a receipt
  and commit a turn.
- ``_statements``: SQL.
- ``_sessions``: the pool, its retry, the cursor cache, the portability probe.
- ``_leases``: thread leases and relay claims.
- ``_recorder``: the storage contract.
- ``_adapter``: ``PostgresDurability``.
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
    DEFAULT_LEASE_EXPIRY as DEFAULT_LEASE_EXPIRY,
)
from intention_kernel.durability.postgres._adapter import (
    DEFAULT_LOCK_TIMEOUT as DEFAULT_LOCK_TIMEOUT,
)
from intention_kernel.durability.postgres._adapter import DEFAULT_SCHEMA as DEFAULT_SCHEMA
from intention_kernel.durability.postgres._adapter import URL_OPTIONS as URL_OPTIONS
from intention_kernel.durability.postgres._adapter import PostgresDurability
from intention_kernel.durability.postgres._schema import BEGIN_TURN as BEGIN_TURN
from intention_kernel.durability.postgres._schema import COMMIT_TURN as COMMIT_TURN
from intention_kernel.durability.postgres._schema import MIGRATIONS as MIGRATIONS
from intention_kernel.durability.postgres._schema import PREPARE_RECEIPT as PREPARE_RECEIPT
from intention_kernel.durability.postgres._sessions import advisory_key as advisory_key
from intention_kernel.durability.postgres._sessions import qualify as qualify
from intention_kernel.durability.postgres._statements import (
    INSERT_RECEIPT_IF_NEW as INSERT_RECEIPT_IF_NEW,
)
from intention_kernel.durability.postgres._statements import UPDATE_RECEIPT as UPDATE_RECEIPT
from intention_kernel.durability.postgres._statements import receipts_query as receipts_query

__all__ = ["PostgresDurability"]
