"""The tenant-ownership rule, as pure functions of what one snapshot shows.

A thread belongs to the tenant of its first durable write
(a :class:`~intention_kernel.durability._contract.records.ThreadOwner`). That write is one of:

- its first committed turn.
- before that, the first effect receipt a turn prepared on it.
- or else the first journal entry a turn recorded on it.

``with_turn`` refuses a turn of any other tenant with ``TenantMismatchError``. Hosts
apply the same rule to reads.

A receipt claims the thread, and not only a commit. Take a first turn that prepared
(or completed) an effect and crashed before its commit. It leaves receipts on a thread
that has no committed turn. Say the thread stayed unowned. A turn of another tenant on
the same thread ID could then commit and take the thread. That would lock the first
tenant out of its own retry. A ``run_effect`` with the same key would also be shown
the first tenant's provider value. So each receipt records its tenant. A recorder reads the
thread's earliest receipt in the same round trip as the rest of a turn's start
(``TurnStart.claimed_by``). So the claim costs no write and no round trip.

A journal entry claims the thread for the same reason. A first turn that recorded
model rounds and failed leaves them on a thread with no owner. Say another tenant
delivers the same thread ID, turn ID and message. Unclaimed, its turn would go on from
those rounds. The first tenant's model responses would reach its reply. Its commit
would take the thread. So each entry records its tenant too, and only that tenant's
turn reads it.

Once something durable is written on a thread, its owner never changes. Take a caller
that decides on the same snapshot (or under the same lock) as its read or its write.
A first turn of another tenant still running cannot fool it. Every use
of the rule goes through :func:`owns`.
"""

from __future__ import annotations

from intention_kernel.durability._contract.records import StoredThread, ThreadOwner

__all__ = ["ANY_TENANT", "cancel_scope", "owner_of", "owns"]


def owner_of(thread: StoredThread | None, claimed_by: ThreadOwner | None) -> ThreadOwner | None:
    """The owner of a thread from what one snapshot shows.

    It is the tenant of its committed turns if it has one. Else it is ``claimed_by``:
    the tenant of its earliest receipt or journal entry, ``None`` if it has neither."""
    if thread is not None and thread.version:
        return ThreadOwner(thread.tenant_id)
    return claimed_by


def owns(owner: ThreadOwner | None, tenant_id: str | None) -> bool:
    """Whether a caller of ``tenant_id`` (``None``: no tenant) may act on a thread whose
    owner is ``owner``. A thread is its owner's alone. A thread nobody owns yet is free
    for any tenant's first durable write. It has no checkpoint and no receipt. So a read
    of it shows nothing, whoever asks."""
    return owner is None or owner.tenant_id == tenant_id


#: The scope of a stop request from a caller not bound to a tenant: it stops any turn.
ANY_TENANT = "*"


def cancel_scope(tenant_id: str | None) -> str:
    """The scope a stop request of a caller of ``tenant_id`` is stored under.

    A turn of that tenant reads this scope besides :data:`ANY_TENANT`. ``""``: no
    tenant."""
    return "" if tenant_id is None else "=" + tenant_id
