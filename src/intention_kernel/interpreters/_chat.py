"""The chat-completions wire format of an interpretation: pure, no SDK, no I/O.

Three translations, each a plain function over dicts as they travel on the wire:

- :func:`toolset`: the capability catalog → ``tools``.
  There is one function per capability.
  ``answer_accept`` and ``answer_reject`` join them while an interaction is active.
  It also gives the table that maps function names back to capability IDs.
- :func:`chat_messages`: the request → ``messages``.
  First comes a system message with the instructions, facts and pending question.
  Then come the recent conversation and the new user message.
  A later round then adds each earlier round's assistant message.
  After each comes one ``role: "tool"`` message per tool call.
  That message holds the step's outcome as JSON.
- :func:`interpretation_from_completion`: a ``chat.completion`` body →
  :class:`~intention_kernel.Interpretation`.
  Its ``response`` keeps the assistant message, with its tool-call IDs, for the next round.

The last one never raises for what the model *said*.
An unknown function becomes an intent for that unknown capability.
Some tool calls become an intent carrying the reason:

- a tool call that names no function.
- arguments that are not JSON or not an object.
- arguments nested deeper than :data:`MAX_ARGUMENTS_DEPTH`.

The kernel then records a ``failed`` step with a clear error.
An answer tool may have arguments that cannot be read.
Or they hold what no store can, such as NaN or a lone surrogate.
Such an answer answers nothing.
It raises only when the body is not a chat completion at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from intention_kernel._checkpoint import Interaction
from intention_kernel._facts import FactRecord
from intention_kernel._interpretation import (
    MAX_ANSWER_TEXT,
    Answer,
    CapabilitySpec,
    Decision,
    Intent,
    Interpretation,
    InterpretationRequest,
    Round,
)
from intention_kernel._json import MAX_NESTING, normalize, too_deep
from intention_kernel._turns import StepResult, StepStatus
from intention_kernel.errors import InterpretationError

__all__ = [
    "ANSWER_TOOLS",
    "DEFAULT_SYSTEM_PROMPT",
    "MAX_ARGUMENTS_DEPTH",
    "Toolset",
    "capability_id_for",
    "chat_messages",
    "function_name",
    "interpretation_from_completion",
    "round_messages",
    "toolset",
]

log = logging.getLogger("intention_kernel.interpreters")

# Capability IDs always contain a dot.
# So their function names always contain "__", or end in a digest.
# These two names can never collide with a capability.
ANSWER_TOOLS: Mapping[str, Decision] = {"answer_accept": "accept", "answer_reject": "reject"}

#: OpenAI function names match ``^[a-zA-Z0-9_-]{1,64}$``.
MAX_NAME = 64

#: How much of the thread's facts goes into the system message, in characters of JSON.
MAX_FACTS_CHARS = 8_000

#: How much of a pending request's details goes into the system message.
MAX_DETAILS_CHARS = 2_000

#: Tool-call arguments nested deeper than this are refused as a failed step.
#: Objects and arrays both count.
#: Real input schemas are a few levels deep.
#: Far deeper values exhaust the decoder's recursion (a RecursionError, formerly a 502).
#: Or they could not be stored with the checkpoint.
MAX_ARGUMENTS_DEPTH = MAX_NESTING

#: The longest reason for a reject taken from the model; a longer one is cut.
#: It is the kernel's bound on ``Answer.reason``.
MAX_REASON_CHARS = MAX_ANSWER_TEXT

#: The system message the interpreter sends when it is given none.
DEFAULT_SYSTEM_PROMPT = (
    "You are an assistant that acts for the user through the tools provided. Call a tool "
    "to look something up or to do something; call several when the user asks for several "
    "things. Never say that something was done unless a tool did it. Do not ask for "
    "confirmation yourself: writes that need it are confirmed by the system after your "
    "tool call. When no tool fits, answer briefly in plain text."
)


def function_name(capability_id: str) -> str:
    """``payments.charge`` → ``payments__charge`` (dots are not allowed in names)."""
    name = capability_id.replace(".", "__")
    return name if len(name) <= MAX_NAME else _digested(name, capability_id)


def capability_id_for(name: str) -> str:
    """The capability ID a function name stands for, without a catalog to look it up."""
    return name.replace("__", ".")


def _digested(name: str, capability_id: str) -> str:
    digest = hashlib.sha256(capability_id.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


@dataclass(frozen=True, slots=True)
class Toolset:
    """The tools offered for one request and how to read the calls back."""

    tools: tuple[dict[str, Any], ...]
    capabilities: Mapping[str, str]
    interaction: Interaction | None

    def capability_id(self, name: str) -> str:
        return self.capabilities.get(name) or capability_id_for(name)


def toolset(catalog: Sequence[CapabilitySpec], interaction: Interaction | None) -> Toolset:
    """One function per capability; the answer tools only while ``interaction`` is active."""
    names = {spec.id: function_name(spec.id) for spec in catalog}
    # "a.b__c" and "a.b.c" both map to "a__b__c".
    # Each colliding name gets a digest of its capability ID, so the mapping reverses.
    counts = Counter(names.values())
    for capability_id, name in names.items():
        if counts[name] > 1:
            names[capability_id] = _digested(name, capability_id)
    tools = [
        _function(names[spec.id], _describe(spec), spec.input_schema or {"type": "object"})
        for spec in catalog
    ]
    if interaction is not None:
        held = next((s for s in catalog if s.id == interaction.capability_id), None)
        tools.extend(_answer_tools(interaction, held.input_schema if held is not None else None))
    return Toolset(tuple(tools), {name: cid for cid, name in names.items()}, interaction)


def _answer_tools(
    interaction: Interaction, input_schema: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """``answer_accept`` and ``answer_reject``.

    A capability may ask on its own (``kind="capability"``).
    It validates the answer itself, and may want data with it.
    Which quote is accepted is such data.
    For it, both tools take an optional ``value``, passed on as ``Answer.value``.
    A kernel-held confirmation has no use for one.

    A kernel-held confirmation of one approver lets ``answer_accept`` carry an edited ``input``.
    Its schema is the held capability's ``input_schema``.
    The user accepts with a change: "yes, but 300".
    The kernel validates it.
    The step records what was proposed beside what ran.
    A quorum refuses edits, so its accept takes none.
    """
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    accept = parameters
    if interaction.kind == "confirmation" and interaction.approvals <= 1:
        schema = dict(input_schema or {"type": "object"})
        schema["description"] = (
            "Optional: the request's whole input with the user's corrections, only when the "
            "user accepts with a change. Omit it when they accept it as it is."
        )
        accept = {**parameters, "properties": {"input": schema}}
    note = ""
    if interaction.kind == "capability":
        parameters["properties"]["value"] = {
            "description": (
                "Optional: data the pending request needs with the answer, such as the ID "
                "of the quote the user accepts, taken from the request's details. Omit it "
                "unless the user's message or the details call for it."
            )
        }
        note = (
            " Pass `value` only when the answer must carry data (for example the quote ID "
            "from the request's details); it is handed to the request as the answer's value."
        )
    return [
        _function(
            "answer_accept",
            f"The user accepts the pending request: {interaction.prompt}{note}"
            + (
                " Pass `input` only when the user accepts with a change to its arguments."
                if accept is not parameters
                else ""
            ),
            accept,
        ),
        _function(
            "answer_reject",
            f"The user declines the pending request: {interaction.prompt}{note} Pass "
            "`reason` when the user's message says why.",
            {
                **parameters,
                "properties": {
                    **parameters["properties"],
                    "reason": {
                        "type": "string",
                        "description": "Optional: why the user declines, in their words.",
                    },
                },
            },
        ),
    ]


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _describe(spec: CapabilitySpec) -> str:
    text = spec.description or spec.id
    if spec.effect == "read":
        if spec.confirmation == "required":
            return f"{text} (read-only; the user is asked to confirm before it runs)"
        return f"{text} (read-only)"
    if spec.confirmation == "required":
        return f"{text} (a write: the user is asked to confirm before it runs)"
    return f"{text} (a write: it asks the user to confirm when it needs to)"


def chat_messages(request: InterpretationRequest, system_prompt: str) -> list[dict[str, Any]]:
    """System instructions and context, the recent conversation, the new message."""
    context = [system_prompt]
    if request.facts:
        context.append(_facts(request.facts))
    active = request.interaction
    if active is not None:
        pending = (
            f"A request is waiting for the user's answer (interaction {active.id}, "
            f"{active.capability_id}): {active.prompt}\n"
        )
        if active.kind == "capability" and active.details is not None:
            details = json.dumps(active.details, default=str, ensure_ascii=False)
            if len(details) > MAX_DETAILS_CHARS:
                details = details[:MAX_DETAILS_CHARS] + " ... (truncated)"
            pending += f"Its details (JSON): {details}\n"
        if request.rounds:
            # Only the person answers, so the answer tools leave after round one.
            pending += (
                "It waits for the user's own answer to this reply; do not answer it for them. "
                "Tell them what it will do if they accept."
            )
        else:
            pending += (
                "If the user's message accepts it, call answer_accept; if it declines it, call "
                "answer_reject; otherwise leave it pending and handle the message."
            )
        context.append(pending)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "\n\n".join(context)}]
    messages.extend({"role": m.role, "content": m.content} for m in request.messages)
    messages.append({"role": "user", "content": request.message})
    messages.extend(round_messages(request.rounds))
    return messages


#: What the model is told about a step held for the person's confirmation.
HELD_NOTE = (
    "Not run: it waits for the user's confirmation, which they give in their next message. "
    "Tell them what will happen if they confirm."
)


def round_messages(rounds: Sequence[Round]) -> list[dict[str, Any]]:
    """Each earlier round as the chat-completions protocol carries it.

    First comes the assistant message as the model sent it.
    Then comes one ``tool`` message per tool call, in order.
    Each holds that call's ``tool_call_id`` and its step's outcome as JSON.
    """
    messages: list[dict[str, Any]] = []
    for earlier in rounds:
        sent = earlier.interpretation.response
        if not isinstance(sent, Mapping):
            continue  # not a round of this interpreter: nothing to hand back
        messages.append(dict(sent))
        steps = iter(earlier.steps)
        for call in _calls(sent):
            if call.name in ANSWER_TOOLS:
                outcome = _answer_outcome(earlier)
            else:
                step = next(steps, None)
                outcome = _step_outcome(step) if step else {"status": "not_run"}
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id or "",
                    "content": json.dumps(outcome, default=str, ensure_ascii=False),
                }
            )
        # What the person said while the round ran, after its outcomes (steering).
        messages.extend({"role": "user", "content": text} for text in earlier.steered)
    return messages


def _reason(arguments: Mapping[str, Any]) -> str | None:
    """The model's ``reason`` for a reject, if it is text a store can hold."""
    reason = arguments.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        return None
    try:
        reason.encode("utf-8")
    except UnicodeEncodeError:
        return None  # a lone surrogate: no store can hold it
    return reason[:MAX_REASON_CHARS]


def _step_outcome(step: StepResult) -> dict[str, Any]:
    outcome: dict[str, Any] = {"status": str(step.status)}
    if step.value is not None:
        outcome["value"] = step.value
    if step.error is not None:
        outcome["error"] = step.error
    if step.status is StepStatus.AWAITING_CONFIRMATION:
        outcome["note"] = HELD_NOTE
    return outcome


def _answer_outcome(earlier: Round) -> dict[str, Any]:
    if earlier.answer_refused is not None:
        return {"status": "refused", "error": earlier.answer_refused}
    if earlier.answer_step is not None:
        return _step_outcome(earlier.answer_step)
    return {"status": "not_applied", "error": "the answer was ambiguous or unreadable"}


def _facts(facts: Mapping[str, FactRecord]) -> str:
    """The facts as JSON lines, newest first, within a budget."""
    lines: list[str] = []
    size = 0
    for key in reversed(list(facts)):
        line = json.dumps({key: facts[key].value}, default=str, ensure_ascii=False)[1:-1]
        size += len(line) + 1
        if size > MAX_FACTS_CHARS:
            lines.append(f"... and {len(facts) - len(lines)} older facts not shown")
            break
        lines.append(line)
    return "Known facts (JSON, recorded by earlier tool calls):\n" + "\n".join(lines)


def interpretation_from_completion(
    body: object, tools: Toolset, *, thread_id: str, turn_id: str
) -> Interpretation:
    """Tool calls → intents in order, an answer tool → the answer, text → the reply."""
    choices = body.get("choices") if isinstance(body, Mapping) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, Mapping) else None
    if not isinstance(message, Mapping):
        shape = f"keys {sorted(body)}" if isinstance(body, Mapping) else type(body).__name__
        raise InterpretationError(
            f"the model's response is not a chat completion with a message ({shape})",
            thread_id=thread_id,
            turn_id=turn_id,
        )
    intents: list[Intent] = []
    answers: list[Answer] = []
    unreadable_answer = False
    active = tools.interaction
    for call in _calls(message):
        if call.name in ANSWER_TOOLS:
            arguments, error = _arguments(call.arguments)
            if error is None:
                error = _unstorable(arguments)
            if error is not None:
                # Never guess what an answer to a write meant: ask again.
                log.warning("the model's %s call is unreadable: %s", call.name, error)
                unreadable_answer = True
                continue
            decision = ANSWER_TOOLS[call.name]
            edited = arguments.get("input") if decision == "accept" else None
            if edited is not None and not isinstance(edited, dict):
                # An edit that is not an object cannot be what the user approved.
                # So the question is asked again.
                log.warning("the model's %s call has an input that is not an object", call.name)
                unreadable_answer = True
                continue
            if active is not None and edited == active.input:
                edited = None  # accepted as proposed: no edit to record
            answers.append(
                Answer(
                    active.id if active is not None else None,
                    decision,
                    arguments.get("value"),
                    input=edited,
                    reason=_reason(arguments) if decision == "reject" else None,
                )
            )
            continue
        if call.error is not None:
            intents.append(Intent(call.name, error=call.error))
            continue
        capability_id = tools.capability_id(call.name)
        arguments, error = _arguments(call.arguments)
        intents.append(
            Intent(capability_id, error=error) if error else Intent(capability_id, arguments)
        )
    reply = _text(message.get("content")) or _text(message.get("refusal"))
    answer: Answer | None = None
    distinct = {json.dumps(a.to_dict(), sort_keys=True, default=repr) for a in answers}
    if len(distinct) == 1 and not unreadable_answer:
        answer = answers[0]
    elif answers or unreadable_answer:
        # Both answer tools at once, two different values, or unreadable arguments.
        # Never guess "accept" for a write.
        log.warning("the model's answer to the pending request is ambiguous; ignoring it")
        prompt = active.prompt if active is not None else ""
        reply = "\n".join(
            filter(None, [reply, f"I could not tell whether you accept. {prompt}".strip()])
        )
    return Interpretation(
        intents=intents, answer=answer, reply=reply or None, response=_sent(message)
    )


def _sent(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message as a later round sends it back: its text and tool calls."""
    sent: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    for name in ("tool_calls", "function_call"):
        if message.get(name) is not None:
            sent[name] = message[name]
    return sent


@dataclass(frozen=True, slots=True)
class _Call:
    """One tool call as sent: its function name and raw arguments, or why it has none."""

    name: str
    arguments: Any = None
    error: str | None = None
    id: str | None = None


def _calls(message: Mapping[str, Any]) -> list[_Call]:
    """Every tool call, in order.

    One that names no function is kept with the reason.
    """
    calls: list[_Call] = []
    raw_calls = message.get("tool_calls")
    for index, call in enumerate(raw_calls if isinstance(raw_calls, list) else ()):
        if not isinstance(call, Mapping):
            calls.append(
                _Call(
                    "",
                    error=f"the model's tool call #{index + 1} is a "
                    f"{type(call).__name__}, not an object",
                )
            )
            continue
        # "function" tool calls; servers that also offer custom tools send "custom".
        function = call.get("function") or call.get("custom")
        call_id = call.get("id") if isinstance(call.get("id"), str) else None
        label = f"the model's tool call {call_id or f'#{index + 1}'}"
        if not isinstance(function, Mapping):
            calls.append(_Call("", error=f"{label} has no function (nothing to run)", id=call_id))
            continue
        name = function.get("name")
        if not isinstance(name, str) or not name:
            calls.append(_Call("", error=f"{label} names no function (nothing to run)", id=call_id))
            continue
        calls.append(_Call(name, function.get("arguments", function.get("input")), id=call_id))
    legacy = message.get("function_call")  # the deprecated single-call form
    if not calls and isinstance(legacy, Mapping):
        name = legacy.get("name")
        if isinstance(name, str) and name:
            calls.append(_Call(name, legacy.get("arguments")))
        else:
            calls.append(_Call("", error="the model's function call names no function"))
    return calls


def _arguments(arguments: Any) -> tuple[dict[str, Any], str | None]:
    """A tool call's raw arguments as an object, or why they cannot be one.

    Most servers send a JSON string; some send the object itself.
    """
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}, None
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except RecursionError:
            return {}, f"the model's arguments are nested more than {MAX_ARGUMENTS_DEPTH} deep"
        except ValueError as exc:
            return {}, f"the model's arguments are not valid JSON: {exc}"
        if not isinstance(decoded, Mapping):
            return {}, f"the model's arguments are a JSON {type(decoded).__name__}, not an object"
    elif isinstance(arguments, Mapping):
        decoded = arguments
    else:
        return {}, f"the model's arguments are a {type(arguments).__name__}"
    if too_deep(decoded, MAX_ARGUMENTS_DEPTH):
        return {}, f"the model's arguments are nested more than {MAX_ARGUMENTS_DEPTH} deep"
    return dict(decoded), None


def _unstorable(arguments: dict[str, Any]) -> str | None:
    """Why no store can hold an answer's arguments, if so.

    NaN and a lone surrogate are such arguments.
    An answer is recorded as it is before it applies.
    So such an answer is unreadable.
    """
    try:
        normalize(arguments)
    except (TypeError, ValueError) as exc:
        return f"the model's arguments hold a value no store can hold: {exc}"
    return None


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, list):  # content parts: keep the text ones
        parts = [p.get("text") for p in value if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str)).strip() or None
    return None
