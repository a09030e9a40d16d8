"""Interpretation: turning a user message into intents and answers.

An interpreter is any object with ``async interpret(request) -> Interpretation``. It
may be a language model behind a tool-calling API, a set of rules, or a script in
tests. The kernel validates what it returns. An intent naming an unknown capability
or carrying invalid input becomes a ``failed`` step, never a crash.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from intention_kernel._checkpoint import Interaction, Message
from intention_kernel._facts import FactRecord
from intention_kernel._turns import StepResult

__all__ = [
    "Answer",
    "CapabilitySpec",
    "Decision",
    "FiredTimer",
    "Intent",
    "Interpretation",
    "InterpretationRequest",
    "Interpreter",
    "Round",
    "Rule",
    "RuleInterpreter",
]

Decision = Literal["accept", "reject"]


@dataclass(frozen=True, slots=True)
class Intent:
    """A request to run one capability with the given input.

    An interpreter that could not build the input sets ``error`` instead. (Say, a
    model's tool-call arguments were not JSON.) The kernel records a ``failed`` step
    with that message and runs nothing. One that could not even
    tell which capability was meant (a tool call naming no function) leaves
    ``capability_id`` empty and says why in ``error``.
    """

    capability_id: str
    input: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


#: The longest ``reason``, ``actor`` or ``digest`` an answer may carry.
MAX_ANSWER_TEXT = 4096


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer to the active interaction.

    ``interaction_id=None`` addresses whichever interaction is active. Naming another
    interaction is refused. ``value`` carries extra data for capabilities that confirm
    on their own (``confirmation="capability"``).

    ``reason`` explains a reject. ``actor`` names the approver. ``digest`` binds the
    answer to the operation shown (``Interaction.digest``). That is the proposed
    operation, also when ``input`` edits it.

    ``input``, on an accept of a ``"required"`` confirmation, replaces the held input.
    It is validated against the capability's input model. What runs is the edited
    input. An invalid edit runs nothing, and the interaction stays open. The step and
    ``interaction.resolved`` record the proposed and approved input.
    """

    interaction_id: str | None = None
    decision: Decision = "accept"
    value: Any = None
    _: KW_ONLY
    input: dict[str, Any] | None = None
    reason: str | None = None
    actor: str | None = None
    digest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The answer as JSON values; unset optional fields are left out."""
        # The dict feeds the stored request digest. A key is added only when its field
        # is set. So an answer without them digests as it did before they existed.
        data: dict[str, Any] = {
            "interaction_id": self.interaction_id,
            "decision": self.decision,
            "value": self.value,
        }
        for key in ("input", "reason", "actor", "digest"):
            field_value = getattr(self, key)
            if field_value is not None:
                data[key] = field_value
        return data


@dataclass(frozen=True, slots=True)
class Interpretation:
    """What an interpreter understood: an optional answer, intents in order, a reply.

    ``response`` is a JSON value that an interpreter working in rounds wants handed
    back in its later rounds. It is the model's message as it came, with its tool-call
    IDs.
    """

    intents: Sequence[Intent] = ()
    answer: Answer | Decision | None = None
    reply: str | None = None
    response: Any = None


@dataclass(frozen=True, slots=True)
class Round:
    """One earlier round of the current turn: what the interpreter returned and what
    came of it.

    ``steps`` holds one step per intent, in the intents' order. ``answer_step`` is the
    step the round's answer ran (an accepted operation), if any. ``answer_refused`` says
    why the round's answer was not applied. Answers are taken from the first round
    only. A later round's answer would be the interpreter's, not the person's.

    ``steered`` holds the messages the person sent while this round's steps ran
    (``Agent(on_busy="steer")``), in order. They were handed to the turn after this
    round: the next round's request carries them, after this round's outcomes.
    """

    interpretation: Interpretation
    steps: tuple[StepResult, ...] = ()
    answer_step: StepResult | None = None
    answer_refused: str | None = None
    steered: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CapabilitySpec:
    """One entry of the capability catalog an interpreter sees."""

    id: str
    effect: Literal["read", "write"]
    confirmation: Literal["none", "required", "capability"]
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class InterpretationRequest:
    """Everything an interpreter may use to understand a message.

    ``rounds`` are the turn's earlier rounds, oldest first (empty in the first round).
    Only an interpreter that works in rounds is asked more than once.

    ``stream`` is set when the turn is streamed (:meth:`~intention_kernel.Kernel.stream_turn`):
    an interpreter may call it with each piece of the model's text as it arrives. It
    returns at once. It is ``None`` otherwise. An interpreter that never calls it still
    works; the stream then carries no text before the result.

    ``timer`` is set in a timer's turn (:class:`FiredTimer`), and ``None`` in a turn a
    person sent: an interpreter tells the two apart by it.
    """

    thread_id: str
    turn_id: str
    message: str
    messages: tuple[Message, ...]
    facts: Mapping[str, FactRecord]
    interaction: Interaction | None
    catalog: tuple[CapabilitySpec, ...]
    rounds: tuple[Round, ...] = ()
    stream: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    timer: FiredTimer | None = None


@dataclass(frozen=True, slots=True)
class FiredTimer:
    """The timer whose turn this is (:attr:`InterpretationRequest.timer`).

    ``key`` names it in its thread, ``due_at`` (UTC) is when it was due, and ``message``
    and ``data`` are what ``schedule`` gave it. A timer's turn is no person's message.
    Its request's ``message`` is the timer's message, or empty. No user message is
    added to the conversation.
    """

    key: str
    due_at: datetime
    message: str | None = None
    data: Any = None


@runtime_checkable
class Interpreter(Protocol):
    """Anything that can interpret a message.

    An interpreter works in rounds when it has a true ``multi_round`` attribute. The
    kernel then asks it again after the steps it asked for have run. Those rounds are
    in :attr:`InterpretationRequest.rounds`. This repeats until it asks for nothing more
    or the agent's ``max_rounds`` is reached. Any other interpreter is asked once per
    turn.
    """

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        """The intents, answer and reply that this request's message carries."""
        ...


def works_in_rounds(interpreter: object) -> bool:
    """Whether ``interpreter`` opted in to rounds (a ``multi_round`` attribute that is
    ``True``; anything else, or none, is one round)."""
    return getattr(interpreter, "multi_round", False) is True


InputBuilder = Callable[[re.Match[str]], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern of a :class:`RuleInterpreter`.

    Exactly one of ``capability_id`` and ``answer`` is set. For an intent the
    input is the pattern's named groups, or what ``input`` builds from the match.
    """

    pattern: str
    capability_id: str | None = None
    input: InputBuilder | Mapping[str, Any] | None = None
    answer: Decision | None = None
    reply: str | None = None

    def __post_init__(self) -> None:
        if (self.capability_id is None) == (self.answer is None):
            raise ValueError("a Rule needs exactly one of capability_id and answer")


class RuleInterpreter:
    """An offline interpreter: regular expressions to intents and answers.

    Rules are tried in order against the message (case-insensitive search); the
    first match wins. An answer rule yields an answer even when nothing is
    pending; the kernel then replies that there is nothing to answer.
    ``Kernel(...)`` refuses a rule that names a capability the agent does not have
    (``CompilationError``).
    """

    def __init__(self, rules: Sequence[Rule], *, fallback_reply: str | None = None) -> None:
        self._rules = [(re.compile(r.pattern, re.IGNORECASE), r) for r in rules]
        self._fallback = fallback_reply

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules, in the order they are tried."""
        return tuple(rule for _, rule in self._rules)

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        """What the first matching rule says; no match: the fallback reply."""
        text = request.message.strip()
        for pattern, rule in self._rules:
            match = pattern.search(text)
            if match is None:
                continue
            if rule.answer is not None:
                return Interpretation(answer=rule.answer, reply=rule.reply)
            assert rule.capability_id is not None
            if callable(rule.input):
                data = dict(rule.input(match))
            elif rule.input is not None:
                data = {**rule.input, **_groups(match)}
            else:
                data = _groups(match)
            return Interpretation(intents=[Intent(rule.capability_id, data)], reply=rule.reply)
        return Interpretation(reply=self._fallback)


def _groups(match: re.Match[str]) -> dict[str, Any]:
    return {k: v for k, v in match.groupdict().items() if v is not None}
