"""Step 5: compose the reply, bound the conversation, and build the commit."""

from __future__ import annotations

from intention_kernel._checkpoint import (
    CheckpointDelta,
    KernelCheckpoint,
    Message,
    current_revision,
)
from intention_kernel._interpretation import Interpretation
from intention_kernel._runtime.state import TurnState
from intention_kernel._timers import interaction_timers, merge_writes
from intention_kernel._turns import TurnCommit, TurnResult, committed_event

__all__ = ["finish", "stopped"]


def finish(
    state: TurnState, interpretation: Interpretation, *, reply: str | None = None
) -> TurnCommit:
    """The commit of the turn.

    Its reply is ``reply`` when given: a turn of several rounds (see
    :mod:`~intention_kernel._runtime.rounds`). Otherwise it is the interpretation's
    text, followed by the kernel's account of each step."""
    lines = [interpretation.reply] if interpretation.reply else []
    lines.extend(state.replies)
    scope, request, agent = state.scope, state.request, state.agent.agent
    if reply is None:
        reply = "\n".join(lines) if lines else agent.replies.nothing_to_do()
    previous = state.previous
    base_messages = previous.messages if previous else ()
    said: tuple[Message, ...]
    if request.message is not None:
        said = (Message("user", request.message, scope.turn_id),)
    elif request.answer is not None:
        said = (Message("user", f"[{request.answer.decision}]", scope.turn_id),)
    else:
        said = ()
    said += (Message("assistant", reply, scope.turn_id),)
    messages = (*base_messages, *said)[-agent.max_messages :]
    # The messages of this turn that the bound keeps, and the base's oldest it drops.
    count = len(messages)
    appended = messages[count - min(len(said), count) :]
    version = (previous.version if previous else 0) + 1
    receipts, noted = state.receipts, state.noted_receipts
    moved: tuple[str, ...] = ()
    if state.noted_known_receipt:
        # A key used again moves to the end: its entry in the base is dropped.
        moved = tuple(noted)
        receipts = (*(r for r in receipts if r.key not in noted), *noted.values())
    elif noted:
        receipts = (*receipts, *noted.values())
    kept_receipts = receipts[-agent.max_receipts :]
    facts = state.fact_ledger
    checkpoint = KernelCheckpoint(
        schema_revision=current_revision(),
        agent_fingerprint=state.agent.fingerprint,
        version=version,
        messages=messages,
        facts=facts.merged(),
        agenda=tuple(state.agenda),
        interaction=state.interaction,
        receipts=kept_receipts,
    )
    delta = CheckpointDelta(
        base_version=version - 1,
        messages_appended=appended,
        messages_trimmed=len(base_messages) - (count - len(appended)),
        facts_set=facts.changed(),
        receipts_moved=moved,
        receipts_appended=tuple(noted.values()),
        receipts_trimmed=len(receipts) - len(kept_receipts),
    )
    result = TurnResult(
        thread_id=scope.thread_id,
        turn_id=scope.turn_id,
        replayed=False,
        reply=reply,
        interaction=state.interaction,
        steps=tuple(state.steps),
        facts=tuple(state.recorded),
        checkpoint_version=version,
    )
    state.events.append(committed_event(version, state.steps))
    interaction, before = state.interaction, previous.interaction if previous else None
    if interaction is not before and (
        (interaction is not None and interaction.expires_at is not None)
        or (before is not None and before.expires_at is not None)
    ):
        # A deadline opened or closed: its expiry (and reminder) timers follow.
        cap = state.agent.capabilities.get(interaction.capability_id) if interaction else None
        state.timers[:0] = interaction_timers(
            scope.thread_id,
            scope.tenant_id,
            before,
            interaction,
            cap.remind_before if cap is not None else None,
            state.now,
        )
    return TurnCommit(
        result,
        checkpoint,
        tuple(state.events),
        tuple(state.announced),
        delta,
        merge_writes(state.timers) if state.timers else (),
    )


async def stopped(
    state: TurnState, interpretation: Interpretation, *, at_once: bool = False
) -> TurnCommit | None:
    """At a safe point: the commit of a turn asked to stop, or ``None`` to go on.

    What the turn did so far commits: its steps, facts and events. So does any
    confirmation it opened, which stays open for the person to answer. The steps
    not yet run are dropped, and the reply ends with the stop's line."""
    check = state.request.stop
    base = state.previous.version if state.previous else 0
    line = None if check is None else await check(base, at_once)
    if line is None:
        return None
    lines = [interpretation.reply] if interpretation.reply else []
    lines.extend(state.replies)
    lines.append(line)
    state.emit("turn.cancelled", {"reply": line})
    return finish(state, interpretation, reply="\n".join(lines))
