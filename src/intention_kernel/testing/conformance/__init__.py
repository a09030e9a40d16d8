"""The adapter conformance suite: one test per rule of "Durability and effects".

Every durability adapter, bundled or third-party, proves itself by running this
suite. The suite comes in one test case per part of the storage contract:

- :class:`TurnConformance`: one turn at a time per thread, begin, atomic commit,
  replay, conflicts, checkpoints, IDs and tenants;
- :class:`EffectConformance`: receipts claimed and settled around the provider call,
  and (with :class:`ReceiptConformance`) listed and resolved;
- :class:`ConfirmationConformance`: confirmations and pending interactions, quorums,
  actors (on the events and the receipt) and digests;
- :class:`ApprovalConformance`: deadlines, the expiry sweep, edits, reasons, busy
  threads, and confirmations stored before these existed;
- :class:`JournalConformance`: the journal (``tx.recorded``), and the model rounds the
  runtime records in it;
- :class:`OutboxConformance`: reading the outbox, and the relay on it;
- :class:`MaintenanceConformance`: the deploy check, migrations and pruning.

:class:`DurabilityConformance` is all of them. Subclass it, or a part, in a pytest
module and provide the ``make_durability`` fixture (a factory returning a *new,
unopened* adapter on the same store each time it is called)::

    from intention_kernel.testing.conformance import DurabilityConformance

    class TestMyAdapter(DurabilityConformance):
        @pytest.fixture
        def make_durability(self, tmp_path):
            return lambda: MyAdapter(tmp_path / "store")

Optionally provide ``tamper`` (see :class:`Tamper`) so the bad-row tests can
write raw bytes into the store, ``inspector`` (see :class:`Inspector`) so the
maintenance tests can check the rows they wrote, and ``make_durability_with_lock_timeout``
so the migration test can meet a busy thread without waiting long. Set
``persistent = False`` for adapters whose state does not outlive the instance (the
restart tests then skip). :meth:`InMemoryDurability.tamper
<intention_kernel.durability.memory.InMemoryDurability.tamper>` is the in-memory store's
``tamper``.

What an adapter offers beyond ``Durability`` is declared by fixtures of
:class:`ConformanceCase`, each defaulting to what every ``RecordedDurability`` offers
and to a skip for any other class: ``fault_points`` (it reaches the points of
:mod:`intention_kernel.testing.faults`), ``tenant_store`` (it is a ``TenantStore``),
``interaction_queue`` (an ``InteractionQueue``) and ``operable`` (every instance is an
``Operable``: the relay, the operations and the journal's tests drive its recorder).
The suite needs pytest-asyncio with ``asyncio_mode = "auto"``.
"""

from __future__ import annotations

from intention_kernel.testing.conformance._support import (
    ConformanceCase,
    Inspector,
    Tamper,
    commit_for,
)
from intention_kernel.testing.conformance.approvals import ApprovalConformance
from intention_kernel.testing.conformance.confirmations import ConfirmationConformance
from intention_kernel.testing.conformance.effects import EffectConformance
from intention_kernel.testing.conformance.journal import JournalConformance
from intention_kernel.testing.conformance.maintenance import MaintenanceConformance
from intention_kernel.testing.conformance.outbox import OutboxConformance
from intention_kernel.testing.conformance.receipts import ReceiptConformance
from intention_kernel.testing.conformance.turns import TurnConformance

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
