"""The chat-model seam: every model call of a graph run goes through the journal.

The turn's journal answers the call, or records it, before the graph sees the response.

LangChain's chat models consult an LLM cache before they call their provider.
They update it with the response before returning it.
:class:`JournalCache` is that cache, installed process-wide once.
Inside a kernel run it answers a call from the journal.
Or it records the response the model gave.
Outside, it defers to the cache installed before it.
:class:`JournalGuard` is a callback handler on each kernel run.
It refuses a model response that did not pass through the journal.
Some calls skip the cache: a model with its own cache, ``cache=False``, a direct ``astream``.
Without the guard, such a model would be asked again on every redelivery.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.caches import RETURN_VAL_TYPE, BaseCache
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.globals import get_llm_cache, set_llm_cache
from langchain_core.messages import message_to_dict, messages_from_dict
from langchain_core.outputs import ChatGeneration, LLMResult

from intention_kernel.errors import CapabilityError, CorruptRecordError
from intention_kernel.integrations.langgraph._step import STEP, KernelStep
from intention_kernel.integrations.langgraph._tools import IN_TOOL_NODE

__all__ = ["JournalCache", "JournalGuard", "install_journal_cache"]

# The kwargs of a serialized message that say what the model was asked.
# The message ID is left out; LangChain strips it from cache keys too.
# The usage is left out too, since a cache hit rewrites it to a cost of 0.
_ASKED = ("content", "name", "tool_calls", "tool_call_id", "status", "additional_kwargs")


class _NotRecorded(Exception):
    """A journal lookup that found nothing (nothing is recorded for it)."""


def prompt_digest(prompt: str, llm_string: str) -> str:
    """The digest of a model call: its messages and the model's parameters."""
    try:
        messages = json.loads(prompt)
    except ValueError:
        messages = prompt
    if isinstance(messages, list):
        messages = [_asked(message) for message in messages]
    text = json.dumps([messages, llm_string], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _asked(message: Any) -> Any:
    if not isinstance(message, dict) or not isinstance(message.get("kwargs"), dict):
        return message
    kwargs = message["kwargs"]
    calls = [
        {"name": c.get("name"), "args": c.get("args"), "id": c.get("id")}
        for c in kwargs.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return {
        "kind": message.get("id"),
        **{k: kwargs[k] for k in _ASKED if k in kwargs and k != "tool_calls"},
        "tool_calls": calls,
    }


class JournalCache(BaseCache):
    """The LLM cache that routes a kernel run's model calls through its journal."""

    def __init__(self, fallback: BaseCache | None) -> None:
        self.fallback = fallback

    async def alookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        step = STEP.get()
        if step is None:
            return await self.fallback.alookup(prompt, llm_string) if self.fallback else None
        digest = prompt_digest(prompt, llm_string)
        key = step.next_key(digest)
        try:
            value = await step.ctx.recorded(key, _absent)
        except _NotRecorded:
            step.missed[digest].append(key)
            return None
        generations = _load(value, step, key)
        for generation in generations:
            step.journaled[id(generation)] = generation
        return generations

    async def aupdate(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        step = STEP.get()
        if step is None:
            if self.fallback is not None:
                await self.fallback.aupdate(prompt, llm_string, return_val)
            return
        pending = step.missed[prompt_digest(prompt, llm_string)]
        if not pending:  # pragma: no cover - every update follows its own missed lookup
            return
        value = _dump(return_val)

        async def response() -> Any:
            return value

        await step.ctx.recorded(pending.pop(0), response)
        for generation in return_val:
            step.journaled[id(generation)] = generation

    def lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        step = STEP.get()
        if step is None:
            return self.fallback.lookup(prompt, llm_string) if self.fallback else None
        return step.call(lambda: self.alookup(prompt, llm_string))

    def update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        step = STEP.get()
        if step is None:
            if self.fallback is not None:
                self.fallback.update(prompt, llm_string, return_val)
            return
        step.call(lambda: self.aupdate(prompt, llm_string, return_val))

    def clear(self, **kwargs: Any) -> None:
        if self.fallback is not None:
            self.fallback.clear(**kwargs)


async def _absent() -> Any:
    raise _NotRecorded


def _dump(generations: Sequence[Any]) -> list[dict[str, Any]]:
    dumped: list[dict[str, Any]] = []
    for generation in generations:
        if not isinstance(generation, ChatGeneration):
            raise TypeError(f"a chat model returned {type(generation).__name__}")
        dumped.append(
            {
                "message": message_to_dict(generation.message),
                "info": generation.generation_info,
            }
        )
    return dumped


def _load(value: Any, step: KernelStep, key: str) -> list[ChatGeneration]:
    ctx = step.ctx
    try:
        if not isinstance(value, list) or not value:
            raise ValueError(f"it is {type(value).__name__}, not a list of generations")
        messages = messages_from_dict([entry["message"] for entry in value])
        return [
            ChatGeneration(message=message, generation_info=entry.get("info"))
            for message, entry in zip(messages, value, strict=True)
        ]
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptRecordError(
            f"the recorded model response {key!r} of step {ctx.step_id!r} cannot be "
            f"decoded: {type(exc).__name__}: {exc}",
            thread_id=ctx.thread_id,
            turn_id=ctx.turn_id,
            key=key,
        ) from exc


_INSTALL = threading.Lock()


def install_journal_cache() -> None:
    """Install :class:`JournalCache` as LangChain's global LLM cache, once.

    A cache the application installed before it keeps serving calls outside kernel runs.
    """
    with _INSTALL:  # two agents built at once in two threads would wrap each other
        current = get_llm_cache()
        if not isinstance(current, JournalCache):
            set_llm_cache(JournalCache(current))


class JournalGuard(BaseCallbackHandler):
    """Refuses what escaped the journal or the tool seam in a kernel run.

    A model response that did not pass through the journal is refused.
    The graph never reads it.
    A tool that ran outside a ``ToolNode`` is refused, unless it is a listed read.
    """

    raise_error = True  # a refusal must stop the node, not be logged
    run_inline = True  # checked before the model call returns, in its context

    def __init__(self, step: KernelStep, reads: frozenset[str]) -> None:
        self.step = step
        self.reads = reads

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        for generations in response.generations:
            for generation in generations:
                if id(generation) not in self.step.journaled:
                    raise CapabilityError(
                        f"{self.step.ctx.capability_id}: a chat model answered without the "
                        "turn's journal (a model with its own cache, cache=False, or a "
                        "direct stream); call it with invoke or ainvoke and no cache of its "
                        "own, so that a redelivered turn does not ask it again",
                        capability_id=self.step.ctx.capability_id,
                    )

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        name = (serialized or {}).get("name") or kwargs.get("name")
        if IN_TOOL_NODE.get() == name or name in self.reads:
            return
        raise CapabilityError(
            f"{self.step.ctx.capability_id}: tool {name!r} ran outside a ToolNode; only "
            "tools listed in reads may, since a write runs once only through a ToolNode",
            capability_id=self.step.ctx.capability_id,
        )
