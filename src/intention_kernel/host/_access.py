"""Who is calling, what their role lets them do, and which threads they may see.

``tokens`` maps each bearer token to a :class:`Principal`.
With it, every API request must carry ``Authorization: Bearer <token>``.
A principal has a name, a tenant and a role:

- ``user`` (a chat front end, say) posts turns, which run under its tenant.
  It reads that tenant's threads.
- ``operator`` (a person) may also list and resolve that tenant's receipts.
  It is recorded by name as the resolution's actor.

Anything else a role may not do is answered 403 ``forbidden``.
A token may map to a bare tenant ID, or to ``None`` for no tenant.
It is then a ``user`` of that tenant, named after it.
A principal without a tenant sees the threads created without one.
Without ``tokens`` there is no authentication.
Every caller is then ``anonymous``, an operator without a tenant.

A thread belongs to the tenant of its first durable write (see ``ThreadOwner``).
That is its first committed turn.
Before that, it is the first effect receipt a turn prepared on it.
The store's own filter lists a tenant's receipts, by the tenant each receipt records.

Reading a thread goes through :meth:`Access.load_checkpoint`.
Resolving a receipt goes through :meth:`Access.resolve_receipt`.
Both hand the caller's tenant to the store.
The store decides on the snapshot it reads, or under the thread's lock.
Asked first and acted on later, the answer could be stale.
While another tenant's first turn runs, its thread has no owner yet.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from intention_kernel._authority import ROLES, Principal, Role
from intention_kernel._checkpoint import KernelCheckpoint
from intention_kernel._effects import Receipt
from intention_kernel._ids import check_id
from intention_kernel.durability import Durability
from intention_kernel.durability._contract.ownership import owns
from intention_kernel.durability._contract.recorders import TenantStore
from intention_kernel.durability._contract.records import ThreadOwner
from intention_kernel.host._problems import HostProblem

__all__ = ["ROLES", "Access", "Principal", "Role"]

#: Every caller when the app has no tokens.
ANONYMOUS = Principal("anonymous", None, "operator")


class Access:
    """Authentication and per-thread visibility for one app."""

    def __init__(
        self, tokens: Mapping[str, Principal | str | None] | None, durability: Durability
    ) -> None:
        self.enabled = tokens is not None
        self._tokens: list[tuple[bytes, Principal]] = []
        for token, granted in (tokens or {}).items():
            if not isinstance(token, str) or not token.strip() or token != token.strip():
                raise ValueError("bearer tokens must be non-empty strings without outer spaces")
            if not isinstance(granted, Principal):
                if granted is not None:
                    check_id("tenant_id", granted)
                granted = Principal(granted or "user", granted, "user")
            self._tokens.append((token.encode(), granted))
        self._durability = durability
        self._owners = durability if isinstance(durability, TenantStore) else None
        if self.enabled and self._owners is None:
            raise TypeError(
                "tenant isolation needs a store with thread_owner() and owner= on "
                "load_checkpoint() and resolve_receipt() (a TenantStore); "
                f"{type(durability).__name__} has none (every bundled adapter has them)"
            )

    def authenticate(self, request: Request) -> Principal:
        """The caller, or a 401 problem."""
        if not self.enabled:
            return ANONYMOUS
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            offered = token.strip().encode()
            found: Principal | None = None
            for known, principal in self._tokens:
                # Compare against every token, in constant time, whatever matches.
                if hmac.compare_digest(known, offered):
                    found = principal
            if found is not None:
                return found
        raise HostProblem(
            "unauthorized",
            "a valid bearer token is required",
            headers={"WWW-Authenticate": 'Bearer realm="intention-kernel"'},
        )

    def require_operator(self, principal: Principal, action: str) -> None:
        """Refuse ``action`` with 403 unless ``principal`` is an operator."""
        if principal.role != "operator":
            raise HostProblem(
                "forbidden",
                f"{action} needs an operator token; this token's role is {principal.role!r}",
            )

    async def sees(
        self, principal: Principal, thread_id: str, cache: dict[str, bool] | None = None
    ) -> bool:
        """Whether ``principal`` may see the receipts of ``thread_id`` in a listing.

        It is asked after the receipts were read.
        A listed receipt claimed its thread, whose owner then never changes.
        So the answer cannot be stale for it.
        """
        if cache is not None and thread_id in cache:
            return cache[thread_id]
        if self._owners is None:
            visible = True
        else:
            visible = owns(await self._owners.thread_owner(thread_id), principal.tenant_id)
        if cache is not None:
            cache[thread_id] = visible
        return visible

    async def may_act(self, principal: Principal, thread_id: str) -> bool:
        """Whether ``principal`` may act on ``thread_id`` as posting a turn there would.

        A thread nobody owns yet is free, as for a first turn.
        Once owned, its owner never changes.
        So a later act cannot find another owner.
        """
        if self._owners is None or not self.enabled:
            return True
        return owns(await self._owners.thread_owner(thread_id), principal.tenant_id)

    async def load_checkpoint(
        self, principal: Principal, thread_id: str
    ) -> KernelCheckpoint | None:
        """The thread's checkpoint if ``principal`` may read it, else ``None``."""
        if self._owners is None or not self.enabled:
            return await self._durability.load_checkpoint(thread_id)
        return await self._owners.load_checkpoint(thread_id, owner=ThreadOwner(principal.tenant_id))

    async def resolve_receipt(
        self,
        principal: Principal,
        thread_id: str,
        key: str,
        *,
        applied: bool,
        value: Any,
        note: str | None,
    ) -> Receipt:
        """Resolve a receipt of a thread ``principal`` may act on.

        The principal is recorded as the actor.
        Any other receipt raises ``ReceiptNotFoundError``, as a missing one does.
        """
        if self._owners is None or not self.enabled:
            return await self._durability.resolve_receipt(
                thread_id, key, applied=applied, value=value, note=note, actor=principal.actor
            )
        return await self._owners.resolve_receipt(
            thread_id,
            key,
            applied=applied,
            value=value,
            note=note,
            actor=principal.actor,
            owner=ThreadOwner(principal.tenant_id),
        )
