"""What the kernel says to the person in the conversation, and how an application words it.

The kernel writes a reply line of its own in a few situations:

- there is nothing to do.
- an answer comes with nothing pending, or answers another question.
- an approval is counted toward a quorum, or not counted.
- a request is cancelled, superseded or expired.
- a step completed without a reply of its own.
- a step failed, or may or may not have taken effect.
- a turn reached its agent's ``max_rounds``.

Each situation is one method of :class:`Replies`.
You may word them yourself: another language, your product's tone, a support link.
Subclass it and override the methods you want.
Then pass an instance as ``Agent(replies=...)``::

    class MyReplies(Replies):
        def uncertain(self, capability, step):
            return "We could not confirm this went through; support will check it."

    agent = Agent("billing", "1", [charge], interpreter, replies=MyReplies())

A reply is for a person.
The defaults name what was asked, and what happens next.
What was asked is the capability's ``description``, as a label before a colon.
They never name an exception class, a parser position, a receipt ID or an interaction ID.
That detail stays in ``StepResult.error`` and in the logs, for machines and operators.
The wording is not part of the agent's fingerprint.
So changing it needs no deploy check.
Each method must return a ``str``.
One that raises fails the turn before anything is committed.
The same delivery may then be retried.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from intention_kernel._json import dump_value
from intention_kernel.errors import EffectNotAppliedError

if TYPE_CHECKING:
    from intention_kernel._capabilities import Capability
    from intention_kernel._checkpoint import Interaction
    from intention_kernel._turns import StepResult

__all__ = ["Replies"]


class Replies:
    """The kernel's own reply lines, one method per situation (see the module docstring)."""

    def label(self, capability: Capability) -> str:
        """How a capability is named to the person: its description, else its ID."""
        return capability.description or capability.id

    # -- answers ------------------------------------------------------------------------------

    def nothing_to_do(self) -> str:
        """The turn produced no reply at all: no intent, no answer, no interpreter reply."""
        return "Sorry, I could not find anything to do for that."

    def reminder(self, interaction: Interaction) -> str:
        """``interaction`` still waits for an answer and expires soon (``remind_before``)."""
        when = (
            interaction.expires_at.isoformat(timespec="minutes") if interaction.expires_at else ""
        )
        return f"Reminder: {interaction.prompt} This request expires at {when}."

    def nothing_pending(self) -> str:
        """An answer arrived while no question waits for one; nothing ran."""
        return "There is nothing waiting for an answer, so nothing was done."

    def not_the_pending_question(self, pending: Interaction) -> str:
        """An answer named another question than ``pending``; nothing ran."""
        return (
            "That answer is for an earlier question, so nothing was done. The question "
            f"waiting for an answer is: {pending.prompt}"
        )

    def request_changed(self, pending: Interaction) -> str:
        """An answer's ``digest`` is not ``pending``'s.

        The request changed since it was shown.
        Nothing ran, and ``pending`` still waits.
        """
        return (
            "That request changed since it was shown, so nothing was done. The question "
            f"waiting for an answer is: {pending.prompt}"
        )

    def expired(self, interaction: Interaction) -> str:
        """``interaction`` was not answered by its ``expires_at``.

        It is closed, and its request was not carried out.
        An accept that came too late changes nothing.
        """
        return (
            "That request expired before it was confirmed, so nothing was done. Ask again "
            "if you still want it."
        )

    def edit_refused(self, pending: Interaction, step: StepResult) -> str:
        """An accept edited ``pending``'s held input into something that cannot run.

        The edit came as ``Answer(input=...)``, and ``step.error`` says why it fails.
        Nothing ran, and ``pending`` still waits.
        """
        return (
            "Those changes could not be used, so nothing was done. The question waiting for "
            f"an answer is still: {pending.prompt}"
        )

    def approval_recorded(self, pending: Interaction) -> str:
        """An accept of ``pending`` was counted toward its quorum.

        The quorum is not reached yet: see ``pending.approved_by`` and ``pending.approvals``.
        Nothing ran.
        """
        left = pending.approvals - len(pending.approved_by)
        who = ", ".join(pending.approved_by)
        more = "1 more approval" if left == 1 else f"{left} more approvals"
        return f"Approved by {who}; this needs {more} before it is done: {pending.prompt}"

    def approval_refused(self, pending: Interaction, step: StepResult) -> str:
        """An accept of ``pending`` did not count toward its quorum.

        It had no actor, or one who already approved; ``step.error`` says which.
        Nothing ran, and ``pending`` still waits.
        """
        return (
            "That approval was not counted, so nothing was done. The question waiting for "
            f"other approvers is still: {pending.prompt}"
        )

    def answer_not_allowed(
        self, pending: Interaction, capability: Capability, step: StepResult
    ) -> str:
        """The sender may not answer ``pending``.

        The capability's approver policy refuses them; ``step.error`` says why.
        Nothing ran, and ``pending`` still waits.
        """
        return (
            "You may not answer this request, so nothing was done. It may be answered by "
            f"{capability.who_may_answer}. The question is still: {pending.prompt}"
        )

    def cancelled(self, interaction: Interaction) -> str:
        """The person said no to ``interaction`` (a ``"required"`` confirmation)."""
        return "Cancelled: nothing was done."

    def turn_cancelled(self, reason: str | None) -> str:
        """The turn was asked to stop (``Kernel.cancel``) and stopped before its end."""
        return (
            f"Cancelled before it finished: {reason}"
            if reason
            else ("Cancelled before it finished.")
        )

    def turn_interrupted(self) -> str:
        """A new message interrupted the turn (``Agent(on_busy="interrupt")``)."""
        return "Interrupted by a new message."

    def superseded(self, interaction: Interaction) -> str:
        """``interaction`` opened earlier in this turn was replaced by a later request."""
        return f"Not asked, superseded by a later request: {interaction.prompt}"

    def cannot_resume(self, interaction: Interaction, step: StepResult) -> str:
        """An accepted request can no longer run.

        Its capability is gone, or its stored input no longer passes validation.
        ``step.error`` says which.
        """
        return "That request can no longer be carried out as it was asked, so nothing was done."

    # -- steps --------------------------------------------------------------------------------

    def not_understood(self, capability: Capability | None, step: StepResult) -> str:
        """The interpreter asked for something that cannot run.

        It named a capability the agent does not have; ``capability`` is then ``None``.
        Or it gave input that does not validate.
        """
        if capability is None:
            return "Sorry, I could not work out what to do for that, so nothing was done."
        return (
            f"{self.label(capability)}: I could not make out the details of the request, "
            "so nothing was done."
        )

    def done(self, capability: Capability, value: Any) -> str:
        """A step completed without a reply of its own; ``value`` is its JSON value.

        It is the whole reply of a turn that only answers (``Kernel.turn(answer=...)``).
        No model words it.
        So it is a sentence, never a JSON document.
        A short value is shown in brackets: a string, a number, a few named scalars.
        Any other value stays in the step's ``value``.
        """
        summary = _summary(value)
        if summary is None:
            return f"Done: {self.label(capability)}."
        return f"Done: {self.label(capability)} ({summary})."

    def failed(self, capability: Capability, step: StepResult, error: BaseException) -> str:
        """A step failed.

        ``error`` is what the capability raised, or the kernel's own ``CapabilityError``.
        An ``EffectNotAppliedError`` says the write provably did not happen.
        The request may then be made again.
        """
        if isinstance(error, EffectNotAppliedError):
            return f"{self.label(capability)}: this did not go through. You can ask again."
        return f"{self.label(capability)}: something went wrong, so this was not completed."

    def uncertain(self, capability: Capability, step: StepResult) -> str:
        """A write may or may not have happened.

        It is not retried until an operator resolves its receipt.
        """
        return (
            f"{self.label(capability)}: I could not tell whether this went through, so it "
            "will not be tried again until someone has checked it."
        )

    # -- rounds -------------------------------------------------------------------------------

    def stopped_after_rounds(self, rounds: int) -> str:
        """An interpreter working in rounds asked for more after the agent's ``max_rounds``.

        The turn commits what it did, and says that it stopped.
        """
        return (
            f"I stopped after {rounds} rounds of work without finishing; what was done so far "
            "is above."
        )


#: The longest value text :meth:`Replies.done` shows; a longer one stays in the step.
_MAX_SHOWN = 120
#: The most named values :meth:`Replies.done` shows of an object.
_MAX_FIELDS = 5


def _summary(value: Any) -> str | None:
    """``value`` as a short phrase for a person, or ``None`` when it has none.

    A string or number is shown as it is.
    An object is shown as ``name: value`` pairs of its few scalars.
    The scalars of the objects it holds count too.
    An MCP result's ``structuredContent`` is such an object.
    """
    if value is None:
        return None
    if isinstance(value, dict):
        pairs = _pairs(value, _DEPTH)
        if not pairs or len(pairs) > _MAX_FIELDS:
            return None
        text = ", ".join(f"{name}: {shown}" for name, shown in pairs)
    else:
        shown = _scalar(value)
        if shown is None:
            return None
        text = shown
    return text if len(text) <= _MAX_SHOWN else None


#: How deep :func:`_summary` looks into objects held by objects.
_DEPTH = 2


def _pairs(value: dict[str, Any], depth: int) -> list[tuple[str, str]]:
    """The scalars of ``value`` and of the objects it holds, ``depth`` levels down, in order.

    Lists and deeper objects are left out; they stay in the step's value.
    """
    pairs: list[tuple[str, str]] = []
    for name, item in value.items():
        if isinstance(item, dict):
            if depth > 1:
                pairs += _pairs(item, depth - 1)
            continue
        shown = _scalar(item)
        if shown is not None:
            pairs.append((str(name), shown))
    return pairs


def _scalar(value: Any) -> str | None:
    """A string, number or boolean as a person reads it; ``None`` for anything else."""
    if isinstance(value, bool):
        return dump_value(value)  # true, false: as the JSON value reads
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return value if value.strip() and "\n" not in value else None
    return None
