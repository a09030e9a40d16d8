"""LangChain's ``HumanInTheLoopMiddleware`` answered through kernel interactions.

The middleware pauses on ``interrupt()`` with a review request.
With ``interrupt_mode="batched"`` the request is a ``HITLRequest``.
It holds ``action_requests`` and ``review_configs``.
With ``"per_call"`` it is a ``ToolApprovalRequest`` (``type="tool_approval"``).
The middleware resumes on decisions: ``approve``, ``edit``, ``reject`` or ``respond``.
The bridge holds such a pause as any other interrupt.
It becomes a kernel interaction whose digest covers the request.
The answer becomes the middleware's decisions:

- accept, no value: ``approve``.
- accept, ``value={"args": {...}}``: ``edit``, the same tool with those arguments.
- accept, ``value={"respond": "text"}``: ``respond``, the text is the tool's result.
- accept, ``value={"decisions": [...]}``: the middleware's decisions as given.
  They are one per action, for a batched request with different decisions.
- reject: ``reject``, its reason as the message the model reads.

A batched request may not allow a decision for its tool.
Such a decision is refused before the graph resumes.
The step fails, and nothing runs.
A per-call request keeps its allowed decisions in the interrupt's response schema.
LangGraph checks that schema on resume.
A decision it does not allow fails the step there, before the tool runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["is_review", "review_decisions", "shown_action"]


def _actions(value: Any) -> list[Mapping[str, Any]] | None:
    """The actions a review request shows, or None when ``value`` is not one."""
    if not isinstance(value, Mapping):
        return None
    if value.get("type") == "tool_approval" and isinstance(value.get("name"), str):
        return [value]
    actions, configs = value.get("action_requests"), value.get("review_configs")
    if (
        isinstance(actions, list)
        and isinstance(configs, list)
        and all(isinstance(a, Mapping) and isinstance(a.get("name"), str) for a in actions)
    ):
        return actions
    return None


def is_review(value: Any) -> bool:
    """Whether an interrupt's value is the middleware's review request."""
    return _actions(value) is not None


def shown_action(value: Any) -> tuple[str, dict[str, Any]] | None:
    """The one tool call a review request shows, as the approval's question names it."""
    actions = _actions(value)
    if actions is None or len(actions) != 1:
        return None
    args = actions[0].get("args")
    return str(actions[0]["name"]), dict(args) if isinstance(args, Mapping) else {}


def _allowed(value: Mapping[str, Any], name: str) -> list[str] | None:
    """The decisions the request allows for tool ``name`` (None: not said)."""
    for config in value.get("review_configs") or []:
        if isinstance(config, Mapping) and config.get("action_name") == name:
            allowed = config.get("allowed_decisions")
            return [str(d) for d in allowed] if isinstance(allowed, list) else None
    return None


def review_decisions(value: Any, answer: Mapping[str, Any]) -> Any:
    """What resumes the middleware's interrupt ``value`` for the kernel's ``answer``.

    The answer is ``{"decision", "reason", "value", "actor"}``.
    Raises ``ValueError`` when the request does not allow the answer.
    The error names what is wrong.
    """
    actions = _actions(value)
    assert actions is not None and isinstance(value, Mapping)
    given = answer.get("value")
    if answer.get("decision") != "accept":
        reason = answer.get("reason")
        reject = {"type": "reject"} if reason is None else {"type": "reject", "message": reason}
        decisions: list[Any] = [dict(reject) for _ in actions]
    elif isinstance(given, Mapping) and isinstance(given.get("decisions"), list):
        decisions = list(given["decisions"])
        if len(decisions) != len(actions):
            raise ValueError(
                f"the answer gives {len(decisions)} decisions for {len(actions)} tool calls"
            )
    elif given is None:
        decisions = [{"type": "approve"} for _ in actions]
    elif isinstance(given, Mapping) and len(actions) == 1 and set(given) == {"args"}:
        if not isinstance(given["args"], Mapping):
            raise ValueError("an edit's 'args' must be an object of the tool's arguments")
        edited = {"name": actions[0]["name"], "args": dict(given["args"])}
        decisions = [{"type": "edit", "edited_action": edited}]
    elif isinstance(given, Mapping) and len(actions) == 1 and set(given) == {"respond"}:
        if not isinstance(given["respond"], str):
            raise ValueError("a response's 'respond' must be the text the model reads")
        decisions = [{"type": "respond", "message": given["respond"]}]
    else:
        raise ValueError(
            "an accept of a tool review takes no value (approve), {'args': {...}} (edit), "
            "{'respond': 'text'} (respond) or {'decisions': [...]} (one per call)"
        )
    for action, decision in zip(actions, decisions, strict=True):
        kind = decision.get("type") if isinstance(decision, Mapping) else None
        # A per-call request keeps its allowed decisions in the response schema.
        # They are not in the interrupt's value.
        # LangGraph checks the decision against that schema on resume.
        allowed = _allowed(value, str(action["name"]))
        if kind not in ("approve", "edit", "reject", "respond") or (
            allowed is not None and kind not in allowed
        ):
            raise ValueError(
                f"the decision {kind!r} is not allowed for tool {action['name']!r}"
                + (f" (allowed: {', '.join(allowed)})" if allowed is not None else "")
            )
    if value.get("type") == "tool_approval":
        return decisions[0]
    return {"decisions": decisions}
