"""What a thread holds between turns, as the ``<name>.conversation`` fact's JSON.

It holds the graph's state, which is its LangGraph checkpoints.
It holds the interrupts awaiting an answer.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from intention_kernel.integrations._bridge import BridgeInput, dump

__all__ = ["AgentInput", "Call", "Conversation", "restore", "snapshot"]


class Call(pydantic.BaseModel):
    """One interrupt awaiting an answer: what the person sees and the digest binds.

    ``value`` is what the graph passed to ``interrupt()``.
    ``tool_name``, ``tool_call_id`` and ``args`` name the tool call it pauses.
    They are set only when it pauses one.
    """

    interrupt_id: str
    value: Any = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    args: dict[str, Any] | None = None


class AgentInput(BridgeInput):
    """The capability's input: a message for the graph, or interrupts to answer."""

    approvals: list[Call] | None = None


@dataclass(frozen=True)
class Conversation:
    """The ``<name>.conversation`` fact: the graph's saved state and awaited interrupts.

    An empty list of interrupts means the graph waits on none.
    ``state`` holds the latest LangGraph checkpoint of each namespace.
    Each comes with its pending writes.
    They are as the saver's serializer writes them, in base64 of its bytes.
    """

    state: list[dict[str, str]] = field(default_factory=list)
    pending: list[Call] = field(default_factory=list)
    asked: bool = False
    #: The arguments of each call accepted while the graph still waits on others.
    #: They are keyed by tool call ID.
    #: A resumed ``ToolNode`` task replays their answers.
    approved: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, value: Any) -> Conversation:
        if not isinstance(value, Mapping):
            return cls()
        return cls(
            [dict(entry) for entry in value.get("state") or []],
            [Call.model_validate(call) for call in value.get("pending") or []],
            bool(value.get("asked", False)),
            dict(value.get("approved") or {}),
        )

    def dump(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pending": dump(self.pending),
            "asked": self.asked,
            "approved": self.approved,
        }


async def snapshot(
    saver: BaseCheckpointSaver[Any], thread_id: str, pending: set[str]
) -> list[dict[str, str]]:
    """The checkpoints of ``thread_id`` in ``saver`` that a later run may read, as JSON.

    It keeps the latest checkpoint of each such namespace.
    Each comes with its pending writes, and an interrupt is one.
    ``pending`` holds the IDs of the graph's unfinished tasks.
    A subgraph's namespace names the task that ran it (``node:<task id>``).
    Once that task finished, nothing reads the namespace again.
    Keeping it would grow the fact by one entry a run.
    A namespace without a task ID is kept.
    That is a subgraph with a history of its own.
    """
    latest: dict[str, dict[str, str]] = {}
    async for saved in saver.alist({"configurable": {"thread_id": thread_id}}):
        ns = saved.config["configurable"].get("checkpoint_ns", "")
        if ns in latest:
            continue  # listed newest first: only the latest is kept
        _, _, task = ns.split("|", 1)[0].partition(":")
        if task and task not in pending:
            continue
        kind, data = saver.serde.dumps_typed(
            {
                "checkpoint": saved.checkpoint,
                "metadata": saved.metadata,
                "writes": list(saved.pending_writes or ()),
            }
        )
        latest[ns] = {"ns": ns, "type": kind, "data": base64.b64encode(data).decode("ascii")}
    return [latest[ns] for ns in sorted(latest)]


async def restore(state: Sequence[Mapping[str, str]], thread_id: str) -> InMemorySaver:
    """A saver that holds ``state`` for ``thread_id`` (see :func:`snapshot`).

    Raises ``ValueError`` when ``state`` cannot be decoded.
    """
    saver = InMemorySaver()
    for entry in state:
        try:
            saved = saver.serde.loads_typed(
                (entry["type"], base64.b64decode(entry["data"], validate=True))
            )
            checkpoint = saved["checkpoint"]
            config: RunnableConfig = {
                "configurable": {"thread_id": thread_id, "checkpoint_ns": entry["ns"]}
            }
            stored = await saver.aput(
                config, checkpoint, saved["metadata"], dict(checkpoint["channel_versions"])
            )
            by_task: dict[str, list[tuple[str, Any]]] = defaultdict(list)
            for task_id, channel, value in saved["writes"]:
                by_task[task_id].append((channel, value))
            for task_id, writes in by_task.items():
                await saver.aput_writes(stored, writes, task_id)
        except Exception as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from exc
    return saver
