"""Who sent a turn, and who may answer a capability's confirmation (pure).

A :class:`Principal` names the sender of a turn: ``Kernel.turn(..., principal=...)``.
Its tenant is the turn's tenant. Its name is the actor of any answer in that turn,
structured or read from a message by the interpreter.

A capability's approver policy says who may answer its confirmations::

    @capability("refunds.issue", effect="write", approvers="operator",
                self_approval=False, approvals=2)

- ``approvers=None``: anyone who may post to the thread (the default).
- a role, or a set of roles: a principal with one of them.
- a callable ``(principal, interaction) -> bool``: the application decides.

``self_approval=False`` refuses an accept from the principal whose turn proposed the
operation. That principal may still reject it: withdrawing is not approving.

Principals are compared by :func:`principal_key`, not as raw strings. Without it,
``"ana"`` and ``"ana "`` would count as two approvers of one quorum.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from intention_kernel._ids import check_id
from intention_kernel.errors import InvalidRequestError, KernelError

if TYPE_CHECKING:
    from intention_kernel._checkpoint import Interaction

__all__ = [
    "ROLES",
    "ApproverCheck",
    "Approvers",
    "Principal",
    "Role",
    "approver_problem",
    "approvers_problem",
    "describe_approvers",
    "frozen_roles",
    "principal_key",
    "same_principal",
]

#: What a principal may do: a user posts turns and reads; an operator also reconciles.
Role = Literal["user", "operator"]
#: Every role, in order of authority.
ROLES: tuple[Role, ...] = ("user", "operator")

#: A callable approver policy: whether ``principal`` may answer ``interaction``.
ApproverCheck = Callable[["Principal", "Interaction"], bool]
#: Who may answer a capability's confirmations (see the module docstring).
Approvers = str | Collection[str] | ApproverCheck | None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sends a turn.

    ``name`` is recorded as the actor of what it answers or resolves.
    ``tenant_id`` is the tenant its turns run under; ``None`` means no tenant.
    ``role`` says what it may do.
    The host gives a ``user`` turns and its tenant's threads.
    It gives an ``operator`` its tenant's receipts and interactions as well.

    A bad field raises ``InvalidRequestError``, a ``ValueError``.
    """

    name: str
    tenant_id: str | None = None
    role: Role = "user"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidRequestError(
                "a principal needs a name (recorded as the actor of what it answers)"
            )
        if self.role not in ROLES:
            raise InvalidRequestError(
                f"a principal's role is 'user' or 'operator', not {self.role!r}"
            )
        try:
            check_id("principal", self.name)
            if self.tenant_id is not None:
                check_id("tenant_id", self.tenant_id)
        except KernelError as exc:
            raise InvalidRequestError(str(exc)) from None

    @property
    def actor(self) -> str:
        """The name recorded as the actor of this principal's answers."""
        return self.name


def principal_key(name: str) -> str:
    """The form in which two names are compared: NFKC, stripped, case-folded.

    Folding errs toward "the same person".
    Both uses fail closed that way.
    A quorum counts fewer approvers, and self-approval refuses more answers.
    """
    return unicodedata.normalize("NFKC", name).strip().casefold()


def same_principal(a: str | None, b: str | None) -> bool:
    """Whether two recorded names stand for one principal (``None`` matches nothing)."""
    return a is not None and b is not None and principal_key(a) == principal_key(b)


def approvers_problem(capability_id: str, approvers: object) -> str | None:
    """Why ``approvers`` is not a policy (checked at compilation), or ``None``."""
    if approvers is None or callable(approvers):
        return None
    roles = (approvers,) if isinstance(approvers, str) else approvers
    if not isinstance(roles, Collection) or not roles:
        return (
            f"{capability_id}: approvers must be None, a role, a set of roles or a "
            f"callable (principal, interaction) -> bool, not {approvers!r}"
        )
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        return (
            f"{capability_id}: approvers names unknown roles {unknown!r}; the roles are "
            f"{', '.join(ROLES)} (use a callable for any other rule)"
        )
    return None


def frozen_roles(approvers: Approvers) -> Approvers:
    """``approvers`` as it is kept: a collection of roles becomes a ``frozenset``.

    Call it on a policy :func:`approvers_problem` accepted."""
    if approvers is None or isinstance(approvers, str) or callable(approvers):
        return approvers
    return frozenset(approvers)


def describe_approvers(approvers: Approvers, self_approval: bool, approvals: int = 1) -> str:
    """Who may answer, in words for a person.

    The reply to a refused answer shows it.
    So do the host's interaction queue and the console.
    """
    if approvers is None:
        who = "anyone who may post to the thread"
    elif isinstance(approvers, str):
        who = f"a principal with the role {approvers!r}"
    elif callable(approvers):
        text = getattr(approvers, "description", None)
        if not isinstance(text, str) or not text.strip():
            text = (getattr(approvers, "__doc__", None) or "").strip().split("\n", 1)[0]
        name = getattr(approvers, "__name__", type(approvers).__name__)
        who = text.rstrip(".") if text else f"whoever {name} allows"
    else:
        roles = " or ".join(repr(r) for r in sorted(approvers))
        who = f"a principal with the role {roles}"
    if not self_approval:
        who += ", other than the person who proposed it"
    if approvals > 1:
        who += f" ({approvals} different people must accept)"
    return who


def approver_problem(
    *,
    approvers: Approvers,
    self_approval: bool,
    principal: Principal | None,
    interaction: Interaction,
    accept: bool,
) -> str | None:
    """Why ``principal`` may not give this answer to ``interaction``, or ``None``.

    ``principal`` is ``None`` when the answer names no one.
    A policy cannot be checked then, so any policy but the default refuses it.
    A callable that raises refuses too.
    An approval is never granted by an error.
    """
    if approvers is None and self_approval:
        return None
    if principal is None:
        return "the answer names no one, so its sender cannot be checked against the policy"
    if approvers is not None:
        if callable(approvers):
            try:
                allowed = approvers(principal, interaction) is True
            except Exception as exc:
                return (
                    f"the approver check failed on {principal.name!r}: {type(exc).__name__}: {exc}"
                )
        else:
            roles = (approvers,) if isinstance(approvers, str) else approvers
            allowed = principal.role in roles
        if not allowed:
            return f"{principal.name!r} (role {principal.role!r}) is not an approver"
    if accept and not self_approval:
        proposer = interaction.proposed_by
        if proposer is None:
            return (
                "the request was proposed by no named principal, so an accept cannot be "
                "shown to come from someone else; ask for it again"
            )
        if same_principal(proposer, principal.name):
            return f"{principal.name!r} proposed this request and may not approve it"
    return None
