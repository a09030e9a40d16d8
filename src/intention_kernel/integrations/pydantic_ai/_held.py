"""What a paused run holds, as JSON.

It holds the calls awaiting approval and the capability's input.
It holds the ``<name>.conversation`` fact, the run's message history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic
from pydantic_ai import DeferredToolResults, ToolDenied
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, ToolCallPart

from intention_kernel.integrations._bridge import BridgeInput, dump

__all__ = ["AgentInput", "Call", "Conversation", "HeldCalls", "denied", "held_call"]


class Call(pydantic.BaseModel):
    """One tool call held for approval: what the person sees and the digest binds."""

    tool_name: str
    tool_call_id: str
    args: dict[str, Any]


class AgentInput(BridgeInput):
    """The capability's input: a message for the agent, or a call to approve."""

    approvals: list[Call] | None = None


@dataclass(frozen=True)
class Conversation:
    """The ``<name>.conversation`` fact: the run's history and its held calls.

    The held calls await approval; an empty list means none.
    """

    messages: list[ModelMessage]
    pending: list[Call] = field(default_factory=list)
    asked: bool = False

    @classmethod
    def load(cls, value: Any) -> Conversation:
        if not isinstance(value, Mapping):
            return cls([])
        return cls(
            list(ModelMessagesTypeAdapter.validate_python(value.get("messages") or [])),
            [Call.model_validate(call) for call in value.get("pending") or []],
            bool(value.get("asked", False)),
        )

    def dump(self) -> dict[str, Any]:
        return {
            "messages": ModelMessagesTypeAdapter.dump_python(self.messages, mode="json"),
            "pending": dump(self.pending),
            "asked": self.asked,
        }


@dataclass(frozen=True)
class HeldCalls:
    """What the bridge's interpreter reads of the conversation fact.

    It reads the calls held for approval, and whether they were asked.
    It skips the run's history.
    Validating all its messages at every turn made long threads cost more a turn.
    """

    pending: list[Call]
    asked: bool = False

    @classmethod
    def load(cls, value: Any) -> HeldCalls:
        if not isinstance(value, Mapping):
            return cls([])
        return cls(
            [Call.model_validate(call) for call in value.get("pending") or []],
            bool(value.get("asked", False)),
        )


def denied(calls: Sequence[Call], message: str) -> DeferredToolResults:
    return DeferredToolResults(approvals={c.tool_call_id: ToolDenied(message) for c in calls})


def held_call(messages: Sequence[ModelMessage], tool_call_id: str) -> ToolCallPart | None:
    """The call ``tool_call_id`` of the history's last model response."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id:
                    return part
            return None
    return None
