"""What a paused run holds, as JSON.

That is the calls awaiting approval, the capability's input,
and the ``<name>.conversation`` fact.
The fact holds the thread's input items and the paused ``RunState``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from intention_kernel.integrations._bridge import BridgeInput, dump

__all__ = ["AgentInput", "Call", "Conversation", "load"]


class Call(pydantic.BaseModel):
    """One tool call held for approval: what the person sees and the digest binds."""

    model_config = pydantic.ConfigDict(extra="forbid")

    tool_name: str
    call_id: str
    arguments: dict[str, Any]


class AgentInput(BridgeInput):
    """The capability's input: a message for the agent, or the calls to approve."""

    model_config = pydantic.ConfigDict(extra="forbid")

    approvals: list[Call] | None = None


@dataclass(frozen=True)
class Conversation:
    """The ``<name>.conversation`` fact.

    ``items`` are the thread's input items (``RunResult.to_input_list()`` of its last
    finished run), the history the next message is added to. ``state`` is the paused
    run's ``RunState.to_json()`` while calls wait for approval (``pending``), else
    ``None``; ``asked`` says whether the person was asked yet.
    """

    items: list[Any] = field(default_factory=list)
    state: dict[str, Any] | None = None
    pending: list[Call] = field(default_factory=list)
    asked: bool = False

    @classmethod
    def load(cls, value: Any) -> Conversation:
        """The fact's value, or an empty conversation for a thread without one.
        ``ValueError`` for a value that is not a conversation."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise ValueError(f"the conversation fact is not an object: {type(value).__name__}")
        items = value.get("items") or []
        state = value.get("state")
        if not isinstance(items, list) or not (state is None or isinstance(state, dict)):
            raise ValueError("the conversation fact's items or state has the wrong shape")
        pending = [Call.model_validate(call) for call in value.get("pending") or []]
        if bool(pending) != (state is not None):
            raise ValueError(
                "the conversation fact holds calls without their run, or a run without its calls"
            )
        return cls(list(items), state, pending, bool(value.get("asked", False)))

    def dump(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "state": self.state,
            "pending": dump(self.pending),
            "asked": self.asked,
        }


def load(value: Any) -> Conversation:
    """What the interpreter reads: the fact, or an empty conversation.

    It reads an empty one when the fact cannot be read.
    The capability reports that, as a failed step.
    """
    try:
        return Conversation.load(value)
    except ValueError:
        return Conversation()
