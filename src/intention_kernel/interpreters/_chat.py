"""The chat-completions wire format of an interpretation: pure, no SDK, no I/O.

Three translations, each a plain function over dicts as they travel on the wire:

- :func:`toolset`: the capability catalog → ``tools`` (one function per capability,
  plus ``answer_accept`` / ``answer_reject`` while an interaction is active), with
  the table that maps function names back to capability IDs;
- :func:`chat_messages`: the request → ``messages`` (a system message carrying the
  instructions, the facts and the pending question; the recent conversation; the
  new user message);
- :func:`interpretation_from_completion`: a ``chat.completion`` body →
  :class:`~intention_kernel.Interpretation`.

The last one never raises for what the model *said*: an unknown function becomes
an intent for that (unknown) capability and arguments that are not JSON are passed
on unparsed, so the kernel records a ``failed`` step with its own clear error. It
raises only when the body is not a chat completion at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from intention_kernel.checkpoint import Interaction
from intention_kernel.errors import InterpretationError
from intention_kernel.facts import FactRecord
from intention_kernel.interpretation import (
    Answer,
    CapabilitySpec,
    Decision,
    Intent,
    Interpretation,
    InterpretationRequest,
)

__all__ = [
    "ANSWER_TOOLS",
    "DEFAULT_SYSTEM_PROMPT",
    "Toolset",
    "capability_id_for",
    "chat_messages",
    "function_name",
    "interpretation_from_completion",
    "toolset",
]

log = logging.getLogger("intention_kernel.interpreters")

# Capability IDs always contain a dot, so their function names always contain "__"
# (or end in a digest): these two names can never collide with a capability.
ANSWER_TOOLS: Mapping[str, Decision] = {"answer_accept": "accept", "answer_reject": "reject"}

#: OpenAI function names match ``^[a-zA-Z0-9_-]{1,64}$``.
MAX_NAME = 64

#: How much of the thread's facts goes into the system message (characters of JSON).
MAX_FACTS_CHARS = 8_000

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
    # "a.b__c" and "a.b.c" both map to "a__b__c": keep the mapping reversible by
    # giving every colliding name a digest of its capability ID.
    counts = Counter(names.values())
    for capability_id, name in names.items():
        if counts[name] > 1:
            names[capability_id] = _digested(name, capability_id)
    tools = [
        _function(names[spec.id], _describe(spec), spec.input_schema or {"type": "object"})
        for spec in catalog
    ]
    if interaction is not None:
        no_arguments = {"type": "object", "properties": {}, "additionalProperties": False}
        tools.append(
            _function(
                "answer_accept",
                f"The user accepts the pending request: {interaction.prompt}",
                no_arguments,
            )
        )
        tools.append(
            _function(
                "answer_reject",
                f"The user declines the pending request: {interaction.prompt}",
                no_arguments,
            )
        )
    return Toolset(tuple(tools), {name: cid for cid, name in names.items()}, interaction)


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
        context.append(
            f"A request is waiting for the user's answer (interaction {active.id}, "
            f"{active.capability_id}): {active.prompt}\n"
            "If the user's message accepts it, call answer_accept; if it declines it, call "
            "answer_reject; otherwise leave it pending and handle the message."
        )
    messages: list[dict[str, Any]] = [{"role": "system", "content": "\n\n".join(context)}]
    messages.extend({"role": m.role, "content": m.content} for m in request.messages)
    messages.append({"role": "user", "content": request.message})
    return messages


def _facts(facts: Mapping[str, FactRecord]) -> str:
    """The facts as JSON lines, the most recently recorded first, within a budget."""
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
    decisions: list[Decision] = []
    for name, arguments in _calls(message):
        if name in ANSWER_TOOLS:
            decisions.append(ANSWER_TOOLS[name])
            continue
        capability_id = tools.capability_id(name)
        intents.append(_intent(capability_id, arguments))
    reply = _text(message.get("content")) or _text(message.get("refusal"))
    answer: Answer | None = None
    if len(set(decisions)) == 1:
        active = tools.interaction
        answer = Answer(active.id if active is not None else None, decisions[0])
    elif decisions:
        # Both answer tools at once: never guess "accept" for a write.
        log.warning("the model both accepted and declined the pending request; ignoring both")
        prompt = tools.interaction.prompt if tools.interaction is not None else ""
        reply = "\n".join(
            filter(None, [reply, f"I could not tell whether you accept. {prompt}".strip()])
        )
    return Interpretation(intents=intents, answer=answer, reply=reply or None)


def _calls(message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(function name, raw arguments)`` of every tool call, in order."""
    calls: list[tuple[str, Any]] = []
    raw_calls = message.get("tool_calls")
    for call in raw_calls if isinstance(raw_calls, list) else ():
        if not isinstance(call, Mapping):
            continue
        # "function" tool calls; servers that also offer custom tools send "custom".
        function = call.get("function") or call.get("custom")
        if isinstance(function, Mapping):
            arguments = function.get("arguments", function.get("input"))
            calls.append((str(function.get("name") or ""), arguments))
    legacy = message.get("function_call")  # the deprecated single-call form
    if not calls and isinstance(legacy, Mapping):
        calls.append((str(legacy.get("name") or ""), legacy.get("arguments")))
    return calls


def _intent(capability_id: str, arguments: Any) -> Intent:
    """An intent from a tool call's raw arguments; undecodable ones carry the reason."""
    if isinstance(arguments, Mapping):
        return Intent(capability_id, arguments)
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return Intent(capability_id, {})
    if not isinstance(arguments, str):
        return Intent(
            capability_id, error=f"the model's arguments are a {type(arguments).__name__}"
        )
    try:
        decoded = json.loads(arguments)
    except ValueError as exc:
        return Intent(capability_id, error=f"the model's arguments are not valid JSON: {exc}")
    if not isinstance(decoded, Mapping):
        return Intent(
            capability_id,
            error=f"the model's arguments are a JSON {type(decoded).__name__}, not an object",
        )
    return Intent(capability_id, decoded)


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, list):  # content parts: keep the text ones
        parts = [p.get("text") for p in value if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str)).strip() or None
    return None
