"""The tenant-ownership rule, as pure functions of what one snapshot shows.

A thread belongs to the tenant of its first durable write: its first committed turn
or, before that, the first effect receipt a turn prepared on it, or else the first
journal entry a turn recorded on it (a
:class:`~intention_kernel.durability.records.ThreadOwner`). ``with_turn`` refuses a turn
of any other tenant with ``TenantMismatchError``; hosts apply the same rule to reads.

A receipt claims the thread, and not only a commit: a first turn that prepared (or
completed) an effect and crashed before its commit leaves receipts on a thread that has
no committed turn. If the thread stayed unowned, a turn of another tenant on the same
thread ID could commit and take the thread, locking the first tenant out of its own
retry. A ``run_effect`` with the same key would also be shown the first tenant's
provider value. Each receipt records its tenant, and a recorder reads the thread's
earliest receipt in the same round trip as the rest of a turn's start
(``TurnStart.claimed_by``), so the claim costs no write and no round trip.

A journal entry claims the thread for the same reason. A first turn that recorded
model rounds and failed leaves them on a thread with no owner. Unclaimed, another
tenant delivering the same thread ID, turn ID and message would go on from them: the
first tenant's model responses would reach its reply, and its commit would take the
thread. Each entry records its tenant too, and only that tenant's turn reads it.

Once something durable is written on a thread its owner never changes. A caller that
decides on the same snapshot (or under the same lock) as its read or its write
therefore cannot be fooled by a first turn of another tenant still running. Every use
of the rule goes through :func:`owns`.
"""

from __future__ import annotations

from intention_kernel.durability.records import StoredThread, ThreadOwner

__all__ = ["ANY_TENANT", "cancel_scope", "owner_of", "owns"]


def owner_of(thread: StoredThread | None, claimed_by: ThreadOwner | None) -> ThreadOwner | None:
    """The owner of a thread from what one snapshot shows: the tenant of its committed
    turns if it has one, else ``claimed_by`` (the tenant of its earliest receipt or
    journal entry, or ``None`` if it has neither)."""
    if thread is not None and thread.version:
        return ThreadOwner(thread.tenant_id)
    return claimed_by


def owns(owner: ThreadOwner | None, tenant_id: str | None) -> bool:
    """Whether a caller of ``tenant_id`` (``None``: no tenant) may act on a thread whose
    owner is ``owner``. A thread is its owner's alone. A thread nobody owns yet is free
    for any tenant's first durable write; it has no checkpoint and no receipt, so a read
    of it shows nothing whoever asks."""
    return owner is None or owner.tenant_id == tenant_id


#: The scope of a stop request from a caller not bound to a tenant: it stops any turn.
ANY_TENANT = "*"


def cancel_scope(tenant_id: str | None) -> str:
    """The scope a stop request of a caller of ``tenant_id`` is stored under, and the
    one a turn of that tenant reads besides :data:`ANY_TENANT`. ``""``: no tenant."""
    return "" if tenant_id is None else "=" + tenant_id
