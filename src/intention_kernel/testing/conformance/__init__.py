"""The adapter conformance suite: one test per rule of "Durability and effects".

Every durability adapter, bundled or third-party, proves itself by running this suite.
The suite comes in one test case per part of the storage contract:

- :class:`TurnConformance`: one turn at a time per thread, begin, atomic commit.
  It also covers replay, conflicts, checkpoints, IDs and tenants.
- :class:`EffectConformance`: receipts claimed and settled around the provider call.
  With :class:`ReceiptConformance`, receipts are also listed and resolved.
- :class:`ConfirmationConformance`: confirmations, pending interactions and quorums.
  It also covers actors (on the events and the receipt) and digests.
- :class:`ApprovalConformance`: deadlines, the expiry sweep, edits, reasons, busy threads.
  It also covers confirmations stored before these existed.
- :class:`JournalConformance`: the journal (``tx.recorded``), and the model rounds in it.
  The runtime records each round of an interpreter that works in rounds.
- :class:`OutboxConformance`: reading the outbox, and the relay on it.
- :class:`MaintenanceConformance`: the deploy check, migrations and pruning.

:class:`DurabilityConformance` is all of them.
Subclass it, or a part, in a pytest module, and provide the ``make_durability`` fixture.
It is a factory that returns a *new, unopened* adapter on the same store at each call::

    from intention_kernel.testing.conformance import DurabilityConformance

    class TestMyAdapter(DurabilityConformance):
        @pytest.fixture
        def make_durability(self, tmp_path):
            return lambda: MyAdapter(tmp_path / "store")

Three fixtures are optional:

- ``tamper`` (see :class:`Tamper`) lets the bad-row tests write raw bytes into the store.
- ``inspector`` (see :class:`Inspector`) lets the maintenance tests check the rows they wrote.
- ``make_durability_with_lock_timeout`` lets the migration test meet a busy thread quickly.

Set ``persistent = False`` for adapters whose state does not outlive the instance.
The restart tests then skip, since there is nothing to restart from.
:meth:`InMemoryDurability.tamper
<intention_kernel.testing.InMemoryDurability.tamper>` is the in-memory store's
``tamper``.

Fixtures of :class:`ConformanceCase` declare what an adapter offers beyond ``Durability``.
Each defaults to what every ``RecordedDurability`` offers, and to a skip for other classes:

- ``fault_points``: it reaches the points of :mod:`intention_kernel.testing.faults`.
- ``tenant_store`` and ``interaction_queue``: it is a ``TenantStore`` or an ``InteractionQueue``.
- ``operable``: every instance is an ``Operable``.
  The relay, the operations and the journal's tests drive its recorder.

The suite needs pytest-asyncio with ``asyncio_mode = "auto"``.
"""

from __future__ import annotations

from intention_kernel.testing.conformance._approvals import ApprovalConformance
from intention_kernel.testing.conformance._confirmations import ConfirmationConformance
from intention_kernel.testing.conformance._effects import EffectConformance
from intention_kernel.testing.conformance._journal import JournalConformance
from intention_kernel.testing.conformance._maintenance import MaintenanceConformance
from intention_kernel.testing.conformance._outbox import OutboxConformance
from intention_kernel.testing.conformance._receipts import ReceiptConformance
from intention_kernel.testing.conformance._support import (
    ConformanceCase,
    Inspector,
    Tamper,
    commit_for,
)
from intention_kernel.testing.conformance._turns import TurnConformance

__all__ = [
    "ApprovalConformance",
    "ConfirmationConformance",
    "ConformanceCase",
    "DurabilityConformance",
    "EffectConformance",
    "Inspector",
    "JournalConformance",
    "MaintenanceConformance",
    "OutboxConformance",
    "ReceiptConformance",
    "Tamper",
    "TurnConformance",
    "commit_for",
]


class DurabilityConformance(
    TurnConformance,
    EffectConformance,
    ConfirmationConformance,
    ApprovalConformance,
    JournalConformance,
    OutboxConformance,
    MaintenanceConformance,
):
    """Every part of the suite: subclass and provide ``make_durability``."""
