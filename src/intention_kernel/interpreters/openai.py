"""OpenAIInterpreter: a language model behind an OpenAI-compatible chat API.

::

    from intention_kernel.interpreters.openai import OpenAIInterpreter

    async with OpenAIInterpreter("gpt-4o-mini") as interpreter:          # api.openai.com
        agent = Agent(name="billing", version="1", capabilities=[...],
                      interpreter=interpreter)

    OpenAIInterpreter("llama3.1", base_url="http://127.0.0.1:11434/v1",  # any compatible
                      api_key="unused")                                  # server

The model works in rounds (``multi_round=True``, the default).
After the tools it called have run, it is asked again.
The request carries its assistant message and one ``role: "tool"`` message per call.
Each tool message holds that step's outcome as JSON: status, value, error.
This goes on until it answers in plain text, or the agent's ``max_rounds`` is reached.
Unknown tools, bad arguments and failed steps reach it as tool results.
So the model can correct itself.
A write held for confirmation reaches it as waiting for the user.
The model then writes the reply.
``multi_round=False`` makes each turn exactly one request.

Every round is one ``chat.completions`` request.

- Every capability is offered as a function tool.
  Its parameters are the capability's input JSON schema.
  Function names allow no dots, so ``payments.charge`` becomes ``payments__charge``.
- While an interaction is active, ``answer_accept`` and ``answer_reject`` are offered too.
  The pending question is then in the system message, with the thread's facts.
- A capability may ask on its own (``confirmation="capability"``).
  Then the question's details are in the system message as well.
  Both answer tools then take an optional ``value`` that becomes ``Answer.value``.

The reply maps back:

- tool calls become intents, in order.
- an answer tool becomes the answer to the active interaction.
- assistant text becomes the reply.

Arguments may arrive as a JSON string (OpenAI) or as an object (some compatible servers).

What the model says never crashes a turn.
Some tool calls become ``failed`` steps with a clear error, and the turn commits:

- an unknown function.
- a tool call that names no function.
- arguments that are not JSON, not an object, or nested more than 64 deep.

An answer whose arguments cannot be read answers nothing, and the question is asked again.
What the *server* does may fail a turn.
An API or transport error is raised after the SDK's own retries.
A 500, a timeout or a refused connection is such an error.
The kernel turns it into ``InterpretationError``, and nothing is committed.
The same delivery can then be retried.

Needs the ``openai`` extra: ``pip install 'intention-kernel[openai]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self, cast

try:
    import openai
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionChunk,
        ChatCompletionMessageParam,
        ChatCompletionToolUnionParam,
    )
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "OpenAIInterpreter needs the official openai SDK: pip install 'intention-kernel[openai]'"
    ) from exc

from intention_kernel._interpretation import Interpretation, InterpretationRequest
from intention_kernel.interpreters._chat import (
    DEFAULT_SYSTEM_PROMPT,
    chat_messages,
    function_name,
    interpretation_from_completion,
    toolset,
)

__all__ = ["DEFAULT_SYSTEM_PROMPT", "OpenAIInterpreter", "function_name"]


class OpenAIInterpreter:
    """Interprets messages with a model served by any OpenAI-compatible API.

    - ``model``: the model name the server knows (``gpt-4o-mini``, ``llama3.1``...).
    - ``client``: an ``openai.AsyncOpenAI`` to use, and not close.
      Without one, a client is built from ``base_url`` and ``api_key``.
      For those, the SDK falls back to ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``.
      A server that needs no key accepts any ``api_key``.
    - ``system_prompt``: the instructions.
      The facts and the pending question are always appended to them.
    - ``temperature``: the sampling temperature.
      With 0, answers are as repeatable as the server allows.
    - ``timeout``: seconds per request.
    - ``max_retries``: the SDK's retries of connection errors, 408, 409, 429 and 5xx.
      It and ``timeout`` apply to a given client too.
    - ``multi_round``: ask the model again after its tools ran (see the module docstring).
      ``False`` makes one request per turn.

    An async context manager: ``aclose()`` closes the client it built.
    """

    def __init__(
        self,
        model: str,
        *,
        client: openai.AsyncOpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        system_prompt: str | None = None,
        temperature: float = 0,
        timeout: float = 30.0,
        max_retries: int = 2,
        multi_round: bool = True,
    ) -> None:
        if not model:
            raise ValueError("OpenAIInterpreter needs a model name")
        if client is not None and (base_url is not None or api_key is not None):
            raise ValueError("pass either a client or base_url/api_key, not both")
        if timeout <= 0 or max_retries < 0:
            raise ValueError("timeout must be positive and max_retries not negative")
        self.model = model
        self.system_prompt = system_prompt or DEFAULT_SYSTEM_PROMPT
        self.temperature = temperature
        self.multi_round = multi_round
        self._owns_client = client is None
        if client is None:
            self._client = openai.AsyncOpenAI(
                base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries
            )
        else:
            self._client = client.with_options(timeout=timeout, max_retries=max_retries)

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        """One chat-completions request: tool calls become intents, text the reply."""
        # The answer tools only in the first round: later rounds answer nothing.
        tools = toolset(request.catalog, None if request.rounds else request.interaction)
        # The wire dicts are exactly what the SDK would build from its TypedDicts.
        messages = cast(
            Iterable[ChatCompletionMessageParam], chat_messages(request, self.system_prompt)
        )
        offered = cast(Iterable[ChatCompletionToolUnionParam], tools.tools)
        # Some servers refuse an empty tool list: offer none rather than [].
        offer = offered if tools.tools else openai.omit
        body: object
        if request.stream is not None:
            body = await self._streamed(messages, offer, request.stream)
        else:
            completion = await self._client.chat.completions.create(
                model=self.model, messages=messages, temperature=self.temperature, tools=offer
            )
            # A lenient server may send JSON that is no completion; the SDK hands it back.
            body = (
                completion.to_dict(mode="json", warnings=False)
                if isinstance(completion, ChatCompletion)
                else completion
            )
        return interpretation_from_completion(
            body,
            tools,
            thread_id=request.thread_id,
            turn_id=request.turn_id,
        )

    async def _streamed(
        self,
        messages: Iterable[ChatCompletionMessageParam],
        tools: Iterable[ChatCompletionToolUnionParam] | openai.Omit,
        emit: Callable[[str], None],
    ) -> object:
        """The completion, asked for with ``stream=True``.

        Each piece of text goes to ``emit`` as it arrives.
        The chunks are put back together into the body a plain request answers.
        Tool calls are joined by their ``index``.
        """
        # The SDK's own accumulator; given no tools, it parses no arguments.
        # The kernel reads them, leniently, in interpretation_from_completion.
        state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
        received = False
        stream = await self._client.chat.completions.create(
            model=self.model,
            messages=messages,
            temperature=self.temperature,
            tools=tools,
            stream=True,
        )
        async with stream:
            async for chunk in stream:
                if not isinstance(chunk, ChatCompletionChunk) or not isinstance(
                    chunk.choices, list
                ):
                    continue  # a keep-alive or a filter notice, not a piece of the answer
                state.handle_chunk(chunk)
                received = True
                for choice in chunk.choices:
                    if choice.index == 0 and choice.delta and isinstance(choice.delta.content, str):
                        emit(choice.delta.content)
        if not received:
            return {}  # no chunk at all: interpretation_from_completion says so
        return state.current_completion_snapshot.to_dict(mode="json", warnings=False)

    async def aclose(self) -> None:
        """Close the HTTP client, if this interpreter built it."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIInterpreter(model={self.model!r}, base_url={str(self._client.base_url)!r})"
