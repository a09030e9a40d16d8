"""Agent definitions and their compilation.

``Agent(...)`` only records. :func:`compile_agent` (called by ``Kernel(...)``) checks
the definition and computes its fingerprint. The fingerprint is a stable hash of the
agent's name and version. It also covers each capability's id, effect, confirmation
mode and input schema. A stored checkpoint records the fingerprint it was written
under. An agent loads it only if the fingerprint is its own, or one it declares in
``compatible_fingerprints``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from intention_kernel._authority import approvers_problem
from intention_kernel._capabilities import Capability
from intention_kernel._interpretation import (
    CapabilitySpec,
    Interpreter,
    RuleInterpreter,
    works_in_rounds,
)
from intention_kernel._replies import Replies
from intention_kernel.errors import CompilationError

__all__ = ["Agent", "CompiledAgent", "compile_agent"]

CAPABILITY_ID = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
_EFFECTS = ("read", "write")
_CONFIRMATIONS = ("none", "required", "capability")


@dataclass(frozen=True)
class Agent:
    """An agent: a named, versioned set of capabilities and an interpreter.

    ``max_messages`` bounds the conversation kept in the checkpoint.
    ``compatible_fingerprints`` lists older fingerprints whose checkpoints this
    agent may resume. ``replies`` words the kernel's own reply lines (see
    :class:`~intention_kernel.Replies`); it is not part of the fingerprint.
    ``max_rounds`` bounds how often an interpreter that works in
    rounds is asked within one turn (see :class:`~intention_kernel.Interpreter`); it
    is not part of the fingerprint.
    ``on_busy`` is what a turn does when another turn on its thread is running. It is
    not part of the fingerprint.

    - ``"wait"`` queues behind it, up to the store's lock timeout, then raises
      ``ThreadBusyError``.
    - ``"reject"`` raises ``ThreadBusyError`` at once and changes nothing. It suits
      front ends that prefer to tell the person to wait.
    - ``"queue"`` commits the turn to the thread's durable inbox. It runs after the
      running one (see :class:`~intention_kernel.Queued`).
    - ``"interrupt"`` queues it too, and stops the running turn at its next safe point.
    - ``"steer"`` queues it too, and hands it to the running turn at its next round
      boundary. Its turn ID then replays that turn's result. A message that no round
      boundary took runs as its own turn, as with ``"queue"``.
    """

    name: str
    version: str
    capabilities: Sequence[Capability]
    interpreter: Interpreter
    max_messages: int = 50
    max_receipts: int = 100
    compatible_fingerprints: Sequence[str] = field(default=())
    replies: Replies = field(default_factory=Replies)
    max_rounds: int = 8
    on_busy: Literal["wait", "reject", "queue", "steer", "interrupt"] = "wait"


@dataclass(frozen=True)
class CompiledAgent:
    """A checked agent, ready for the runtime.

    ``max_rounds`` is 1 for an interpreter that does not work in rounds.
    """

    agent: Agent
    fingerprint: str
    capabilities: Mapping[str, Capability]
    catalog: tuple[CapabilitySpec, ...]
    compatible: frozenset[str]
    max_rounds: int = 1


def compile_agent(agent: Agent) -> CompiledAgent:
    """Check an agent definition; raise :class:`CompilationError` listing every problem."""
    problems: list[str] = []
    if not agent.name:
        problems.append("the agent needs a name")
    if not agent.version:
        problems.append("the agent needs a version")
    if agent.max_messages < 2:
        problems.append("max_messages must be at least 2")
    if agent.max_receipts < 1:
        problems.append("max_receipts must be at least 1")
    if isinstance(agent.max_rounds, bool) or not isinstance(agent.max_rounds, int):
        problems.append(f"max_rounds must be an integer, not {agent.max_rounds!r}")
    elif agent.max_rounds < 1:
        problems.append("max_rounds must be at least 1")
    if agent.on_busy not in ("wait", "reject", "queue", "steer", "interrupt"):
        problems.append(
            f"on_busy must be 'wait', 'reject', 'queue', 'steer' or 'interrupt', not "
            f"{agent.on_busy!r}"
        )
    if not callable(getattr(agent.interpreter, "interpret", None)):
        problems.append("the interpreter needs an async interpret(request) method")
    if not isinstance(agent.replies, Replies):
        problems.append("replies must be a Replies (subclass intention_kernel.Replies)")
    seen: dict[str, Capability] = {}
    for cap in agent.capabilities:
        if not isinstance(cap, Capability):
            problems.append(f"{cap!r} is not a Capability (decorate it with @capability)")
            continue
        problems.extend(cap.definition_errors)
        if not CAPABILITY_ID.fullmatch(cap.id):
            problems.append(
                f"capability ID {cap.id!r} must look like 'area.action' "
                "(lower-case words joined by dots)"
            )
        if cap.id in seen:
            problems.append(f"duplicate capability ID {cap.id!r}")
        seen[cap.id] = cap
        if cap.effect not in _EFFECTS:
            problems.append(f"{cap.id}: effect must be 'read' or 'write', not {cap.effect!r}")
        if cap.confirmation not in _CONFIRMATIONS:
            problems.append(
                f"{cap.id}: confirmation must be one of {_CONFIRMATIONS}, not {cap.confirmation!r}"
            )
        if cap.confirm_within is not None and cap.confirmation == "none":
            problems.append(
                f"{cap.id}: confirm_within needs a confirmation to expire; this capability "
                "has confirmation='none'"
            )
        if cap.remind_before is not None and cap.confirmation == "none":
            problems.append(
                f"{cap.id}: remind_before needs a confirmation to remind of; this capability "
                "has confirmation='none'"
            )
        elif (
            isinstance(cap.remind_before, timedelta)
            and isinstance(cap.confirm_within, timedelta)
            and cap.remind_before >= cap.confirm_within
        ):
            # The reminder would be due when the question opens, or before: never sent.
            problems.append(
                f"{cap.id}: remind_before={cap.remind_before} must be shorter than "
                f"confirm_within={cap.confirm_within}, or no reminder is ever sent"
            )
        if cap.approvals != 1 and cap.confirmation != "required" and not cap.definition_errors:
            # Only a held operation has accepts to count. A capability that confirms on
            # its own judges its answer itself. One that never asks has none.
            problems.append(
                f"{cap.id}: approvals={cap.approvals} needs confirmation='required' (the "
                f"kernel holds the operation and counts the accepts); this capability has "
                f"confirmation={cap.confirmation!r}"
            )
        if not cap.definition_errors:
            # A Capability built directly (the MCP bridge's) skipped the decorator's checks.
            problem = approvers_problem(cap.id, cap.approvers)
            if problem is not None:
                problems.append(problem)
        if cap.confirmation == "none" and (cap.approvers is not None or not cap.self_approval):
            problems.append(
                f"{cap.id}: an approver policy needs a confirmation to answer; this "
                "capability has confirmation='none'"
            )
        if cap.effect == "write" and cap.confirmation == "none":
            problems.append(
                f"{cap.id}: a write capability cannot use confirmation='none'; use 'required' "
                "(the kernel asks) or 'capability' (the capability asks and validates the answer)"
            )
    if isinstance(agent.interpreter, RuleInterpreter):
        # Caught here rather than as a failed step at the first matching message.
        for rule in agent.interpreter.rules:
            if rule.capability_id is not None and rule.capability_id not in seen:
                known = ", ".join(sorted(seen)) or "none"
                problems.append(
                    f"rule {rule.pattern!r} names capability {rule.capability_id!r}, which "
                    f"the agent does not have (it has: {known})"
                )
    if problems:
        raise CompilationError(problems)
    catalog = tuple(
        CapabilitySpec(c.id, c.effect, c.confirmation, c.description, c.input_schema)
        for c in agent.capabilities
    )
    return CompiledAgent(
        agent=agent,
        fingerprint=fingerprint(agent.name, agent.version, catalog),
        capabilities=seen,
        catalog=catalog,
        compatible=frozenset(agent.compatible_fingerprints),
        max_rounds=agent.max_rounds if works_in_rounds(agent.interpreter) else 1,
    )


def fingerprint(name: str, version: str, catalog: Sequence[CapabilitySpec]) -> str:
    document = {
        "name": name,
        "version": version,
        "capabilities": sorted(
            (
                {
                    "id": c.id,
                    "effect": c.effect,
                    "confirmation": c.confirmation,
                    "input_schema": c.input_schema,
                }
                for c in catalog
            ),
            key=lambda c: str(c["id"]),
        ),
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
