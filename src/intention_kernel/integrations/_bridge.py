"""What the Pydantic AI and the OpenAI Agents SDK bridges share.

Each bridge runs its framework's agent loop inside one kernel capability, ``<name>.agent``.
It runs in rounds: the run, the approval it asks for, the reply.

The frameworks differ in three ways, and each bridge keeps its own:

- how a run starts, pauses and resumes.
- what a held call looks like.
- what the ``<name>.conversation`` fact holds.

The rest is the same logic, and it lives here:

- the rounds interpreter.
- the capability's input.
- the results a run ends in.
- the write tools' receipts.

Nothing here imports either framework.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import pydantic
from pydantic_core import to_jsonable_python

from intention_kernel._agent import Agent
from intention_kernel._authority import Approvers
from intention_kernel._capabilities import (
    Capability,
    CapabilityContext,
    CapabilityResult,
    Handler,
    capability,
)
from intention_kernel._effects import EffectAuthority
from intention_kernel._facts import Fact
from intention_kernel._interpretation import (
    Answer,
    Decision,
    Intent,
    Interpretation,
    InterpretationRequest,
)
from intention_kernel._json import dump_value
from intention_kernel._replies import Replies
from intention_kernel._turns import StepStatus
from intention_kernel.errors import CapabilityError

__all__ = [
    "CLOSED_UNANSWERED",
    "REJECTED",
    "BridgeAgent",
    "BridgeInput",
    "BridgeInterpreter",
    "KeyFunction",
    "dump",
    "effect_authority",
    "find_cause",
    "listing_problems",
    "run_write",
    "tool_names",
    "unlisted_tool",
]

#: Derives a write tool's business operation ID from the call's arguments.
#: The arguments are as the framework validated or parsed them.
KeyFunction = Callable[[dict[str, Any]], str]

#: What the model reads when an approval closed without an answer.
#: It expired, or an operator resolved the interaction.
#: The model reads it before the next message.
CLOSED_UNANSWERED = "The approval request closed unanswered."
#: What the model reads for a reject without a reason.
REJECTED = "The person rejected the tool call."

_AUTHORITY: ContextVar[EffectAuthority | None] = ContextVar("ik_bridge_authority", default=None)

E = TypeVar("E", bound=BaseException)


def tool_names(what: str, names: Collection[str] | None) -> frozenset[str]:
    """``names``, a bridge's ``reads``, as a set.

    A bare string would be read letter by letter, so it is refused (``TypeError``).
    """
    if names is None:
        return frozenset()
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{what} must be a collection of tool names, got {names!r}")
    return frozenset(names)


def unlisted_tool(name: str) -> str:
    """What a bridge says of tool ``name``, in neither ``writes`` nor ``reads``."""
    return (
        f"tool {name!r} is in neither writes nor reads: list it in writes (with the "
        "function that derives its operation ID) if it changes anything, or in reads if "
        "it only reads; an unlisted tool is not run"
    )


def listing_problems(
    tools: Iterable[str], writes: Mapping[str, KeyFunction], reads: frozenset[str]
) -> list[str]:
    """Why ``tools`` are not each in exactly one of ``writes`` and ``reads``.

    The bridges fail closed.
    Run as a read, an unlisted write would run again on every redelivery.
    No receipt would stop it.
    """
    problems = [
        f"tool {name!r} is in both writes and reads: a tool is one or the other"
        for name in sorted(reads & set(writes))
    ]
    problems += [
        unlisted_tool(name)
        for name in sorted(set(tools))
        if name not in writes and name not in reads
    ]
    return problems


def effect_authority() -> EffectAuthority:
    """The receipt's authority for the write tool running now.

    Pass its ``idempotency_key`` to the provider, so that it too deduplicates.
    Raises ``LookupError`` outside a write tool run by the kernel.
    """
    authority = _AUTHORITY.get()
    if authority is None:
        raise LookupError("effect_authority() is only set inside a write tool run by the kernel")
    return authority


async def run_write(
    ctx: CapabilityContext,
    tool_name: str,
    args: dict[str, Any],
    key_of: KeyFunction,
    call: Callable[[], Awaitable[Any]],
) -> Any:
    """Run a write tool's body (``call``) through a receipt of step ``ctx``.

    The receipt's key is ``"<tool_name>:<key_of(args)>"``.
    The stored value is returned.
    The key function may fail, or give no non-empty string.
    Then the step fails before anything is held.
    """
    try:
        operation = key_of(args)
    except Exception as exc:
        raise CapabilityError(
            f"the key function of write tool {tool_name!r} failed on {args!r}: "
            f"{type(exc).__name__}: {exc}; nothing ran",
            capability_id=ctx.capability_id,
        ) from exc
    if not isinstance(operation, str) or not operation:
        raise CapabilityError(
            f"the key function of write tool {tool_name!r} must return a non-empty "
            f"string, got {operation!r}; nothing ran",
            capability_id=ctx.capability_id,
        )

    async def apply(authority: EffectAuthority) -> Any:
        token = _AUTHORITY.set(authority)
        try:
            value = await call()
        finally:
            _AUTHORITY.reset(token)
        # The model reads back the stored JSON, on the first call and every replay.
        # So the two never differ.
        return to_jsonable_python(value)

    effect = await ctx.run_effect(f"{tool_name}:{operation}", apply)
    return effect.value


def find_cause(exc: BaseException, kind: type[E]) -> E | None:
    """``exc`` or the first of its causes and contexts that is a ``kind``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def dump(calls: Sequence[pydantic.BaseModel]) -> list[dict[str, Any]]:
    """Held calls as the JSON the fact, the input and the interaction store."""
    return [call.model_dump(mode="json") for call in calls]


def default_prompt(tool_name: str, args: dict[str, Any]) -> str:
    return f"Run {tool_name} with {json.dumps(args, sort_keys=True)}? Accept or reject."


class BridgeInput(pydantic.BaseModel):
    """The base of a bridge's capability input.

    It holds exactly one of a message for the agent and the calls to approve.
    Each bridge narrows ``approvals`` to its own call model.
    """

    prompt: str | None = None
    approvals: Sequence[pydantic.BaseModel] | None = None

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> BridgeInput:
        if (self.prompt is None) == (self.approvals is None):
            raise ValueError("give exactly one of prompt and approvals")
        if self.approvals is not None and not self.approvals:
            raise ValueError("approvals holds at least one call")
        return self


class Held(Protocol):
    """What the interpreter reads of a conversation fact."""

    @property
    def pending(self) -> Sequence[pydantic.BaseModel]: ...

    @property
    def asked(self) -> bool: ...


class BridgeInterpreter:
    """Routes each message to the agent's capability, in rounds.

    The first round is the run.
    The second is the approval it asked for, if any.
    Then nothing more: the run's output is the reply.
    ``load`` reads the conversation fact's value, or ``None`` when there is no fact yet.
    """

    multi_round = True

    def __init__(
        self,
        capability_id: str,
        fact_key: str,
        read_answer: Callable[[str], Answer | Decision | None] | None,
        load: Callable[[Any], Held],
    ) -> None:
        self._capability_id = capability_id
        self._fact_key = fact_key
        self._read_answer = read_answer
        self._load = load

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        if not request.rounds:
            active = request.interaction
            if active is not None and active.capability_id == self._capability_id:
                answer = self._read_answer(request.message) if self._read_answer else None
                if answer is not None:
                    # The person's own words answer the question they were shown.
                    # The kernel calls the capability again, which resumes the run.
                    return Interpretation(answer=answer)
                return Interpretation(reply=f"Answer this first: {active.prompt}")
            raw = request.facts.get(self._fact_key)
            conversation = self._load(raw.value if raw is not None else None)
            if conversation.pending and not conversation.asked:
                # A resumed run paused on another approval, with no rounds left to ask it.
                # It is asked now, before the agent reads anything new.
                return Interpretation(
                    intents=[self._approval(dump(conversation.pending))],
                    reply="Before anything else, the agent needs an approval.",
                )
            return Interpretation(
                intents=[Intent(self._capability_id, {"prompt": request.message})]
            )
        last = request.rounds[-1]
        # After the answer resumed the run, its step is the round's answer step.
        step = last.steps[-1] if last.steps else last.answer_step
        if step is None:
            return Interpretation()
        if step.status == StepStatus.AWAITING_CONFIRMATION:
            return Interpretation(reply="The agent asks for your approval.")
        value = step.value
        if step.status == StepStatus.COMPLETED and isinstance(value, dict) and "approvals" in value:
            return Interpretation(intents=[self._approval(value["approvals"])])
        return Interpretation()

    def _approval(self, calls: Any) -> Intent:
        return Intent(self._capability_id, {"approvals": calls})


class BridgeAgent:
    """The kernel side of a bridge's ``KernelAgent``.

    It holds the capability, the interpreter, :meth:`as_agent`, and a run's results.
    The bridge calls :meth:`_setup_bridge` once, with its capability's handler.
    """

    capability_id: str
    fact_key: str
    capability: Capability
    interpreter: BridgeInterpreter
    _kernel_name: str
    _writes: dict[str, KeyFunction]
    _prompt: Callable[[str, dict[str, Any]], str]

    def _setup_bridge(
        self,
        name: str,
        handle: Handler,
        load: Callable[[Any], Held],
        *,
        prompt: Callable[[str, dict[str, Any]], str] | None,
        description: str | None,
        read_answer: Callable[[str], Answer | Decision | None] | None,
        approve_within: timedelta | None,
        approvers: Approvers = None,
        self_approval: bool = True,
    ) -> None:
        self._kernel_name = name
        self._prompt = prompt or default_prompt
        self.capability_id = f"{name}.agent"
        self.fact_key = f"{name}.conversation"
        self.capability = capability(
            self.capability_id,
            effect="write",
            confirmation="capability",
            description=description or f"Run the {name} agent",
            confirm_within=approve_within,
            approvers=approvers,
            self_approval=self_approval,
        )(handle)
        self.interpreter = BridgeInterpreter(self.capability_id, self.fact_key, read_answer, load)

    def as_agent(
        self,
        version: str,
        *,
        max_messages: int = 50,
        max_receipts: int = 100,
        compatible_fingerprints: Sequence[str] = (),
        replies: Replies | None = None,
    ) -> Agent:
        """The intention-kernel :class:`~intention_kernel.Agent` that runs this agent.

        It has one capability and its interpreter.
        It makes at most three rounds a turn: the run, its approval, the reply.
        The other parameters are ``Agent``'s.
        """
        return Agent(
            name=self._kernel_name,
            version=version,
            capabilities=[self.capability],
            interpreter=self.interpreter,
            max_messages=max_messages,
            max_receipts=max_receipts,
            compatible_fingerprints=compatible_fingerprints,
            replies=replies if replies is not None else Replies(),
            max_rounds=3,
        )

    def _require_key(self, tool_name: str) -> None:
        if tool_name not in self._writes:
            # Without a key the approved call would have no receipt.
            # A redelivered accepting turn would run it again.
            # So it is refused before asking.
            raise CapabilityError(
                f"{self.capability_id}: tool {tool_name!r} needs approval but has no key "
                "in writes; an approved call runs once only through its receipt",
                capability_id=self.capability_id,
            )

    def _ask(
        self,
        calls: Sequence[pydantic.BaseModel],
        shown: Iterable[tuple[str, dict[str, Any]]],
        asked: dict[str, Any],
    ) -> CapabilityResult:
        """The question for ``calls``, with ``asked`` as the conversation fact.

        ``shown`` holds each call's tool name and arguments.
        """
        return CapabilityResult.needs_confirmation(
            "\n".join(self._prompt(name, args) for name, args in shown),
            details=dump(calls),
            facts=[Fact(self.fact_key, asked)],
        )

    def _held(self, calls: Sequence[pydantic.BaseModel], held: dict[str, Any]) -> CapabilityResult:
        """A run paused on ``calls``: the interpreter proposes them as the next round."""
        return CapabilityResult(
            value={"approvals": dump(calls)},
            facts=[Fact(self.fact_key, held)],
            reply="",
        )

    def _done(self, output: Any, conversation: dict[str, Any]) -> CapabilityResult:
        """A finished run: its output (JSON) is the reply."""
        return CapabilityResult(
            value={"output": output},
            facts=[Fact(self.fact_key, conversation)],
            reply=output if isinstance(output, str) else dump_value(output),
        )
