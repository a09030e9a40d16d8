"""The difference a commit writes: which message and fact rows change between the stored
checkpoint and the next one, as a ``TurnRecord`` carries them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from intention_kernel.checkpoint import KernelCheckpoint, continuation, encode_fact, encode_message
from intention_kernel.facts import DerivedFacts

__all__ = ["CheckpointRows", "checkpoint_rows"]


@dataclass(frozen=True, slots=True)
class CheckpointRows:
    """The message and fact rows of a commit, named as ``TurnRecord`` names them."""

    messages: Sequence[str]
    keep_messages: int
    trim_messages: int = 0
    facts: Sequence[tuple[str, str]] = ()
    removed_facts: Sequence[str] = ()
    rewrite: bool = False


def checkpoint_rows(
    previous: KernelCheckpoint | None, stored_in_rows: bool, checkpoint: KernelCheckpoint
) -> CheckpointRows:
    """The rows that turn the stored ``previous`` into ``checkpoint``; every row anew when
    ``previous`` is not stored exactly (``stored_in_rows`` false) or is no base of it."""
    messages = checkpoint.messages
    appended = continuation(previous.messages, messages) if stored_in_rows and previous else None
    if not stored_in_rows or (previous is not None and appended is None):
        # No stored base to compute a difference from: write every row anew.
        return CheckpointRows(
            messages=[encode_message(m) for m in messages],
            keep_messages=len(messages),
            facts=[(key, encode_fact(r)) for key, r in checkpoint.facts.items()],
            rewrite=True,
        )
    kept = len(previous.messages) if previous else 0
    if appended is None:  # the thread's first checkpoint
        appended = messages
    trimmed = max(kept + len(appended) - len(messages), 0)
    changed, removed = _changed_facts(previous.facts if previous else {}, checkpoint.facts)
    return CheckpointRows(
        messages=[encode_message(m) for m in appended],
        keep_messages=len(messages),
        trim_messages=trimmed,
        facts=[(key, encode_fact(checkpoint.facts[key])) for key in changed],
        removed_facts=removed,
    )


def _changed_facts(
    previous: Mapping[str, Any], current: Mapping[str, Any]
) -> tuple[Sequence[str], Sequence[str]]:
    """Keys of ``current`` that are new or replaced since ``previous``, and removed keys."""
    if current is previous:
        return (), ()
    if isinstance(current, DerivedFacts) and current.base is previous:
        return current.changed, ()  # what the runtime recorded: no need to look at the rest
    changed = [key for key, record in current.items() if previous.get(key) is not record]
    return changed, [key for key in previous if key not in current]
