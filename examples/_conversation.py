"""What the examples share: the command line, a scripted conversation, the printout.

An example is an agent factory and a script. :func:`run` opens the store named by
``--db`` with :func:`~intention_kernel.durability.open_durability`, builds the
agent, and plays the script turn by turn on one thread, printing each turn. A
``Restart`` closes the store and drops the kernel, the agent and the interpreter,
as a process restart would; the next turn starts from what the store kept. A
``Redeliver`` sends the previous turn again under the same turn ID, as a client
retrying after a lost response would: the stored result comes back, nothing runs.

Turn IDs are ``turn-1``, ``turn-2``... on the thread: running an example again
on the same store and thread replays every turn. Pass another ``--thread`` to
start a new conversation.

``--llm`` interprets with :class:`~intention_kernel.interpreters.openai.OpenAIInterpreter`
instead of the example's rules, configured here (not in the library) from
``OPENAI_MODEL``, ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``. The model works in
rounds: it reads what its tools returned before it acts again or writes the reply.
``examples/scripted_chat.py`` serves a transcript in its place, offline.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

from intention_kernel import Agent, InterpretationError, Interpreter, Kernel, TurnResult
from intention_kernel.durability import open_durability

__all__ = [
    "Meanwhile",
    "Options",
    "Redeliver",
    "Restart",
    "Say",
    "Step",
    "Tally",
    "parse_args",
    "print_provider",
    "print_summary",
    "run",
]


@dataclass(frozen=True, slots=True)
class Say:
    """The person sends a message: a new turn."""

    message: str


@dataclass(frozen=True, slots=True)
class Redeliver:
    """The previous turn is delivered again, with the same turn ID and message."""


@dataclass(frozen=True, slots=True)
class Restart:
    """The process restarts: the store is closed and everything is built again."""


@dataclass(frozen=True, slots=True)
class Meanwhile:
    """Something happens outside the conversation (the world moves on)."""

    note: str
    action: Callable[[], None]


Step = Say | Redeliver | Restart | Meanwhile


@dataclass(frozen=True, slots=True)
class Options:
    db: str
    thread: str
    llm: bool


@dataclass(slots=True)
class Tally:
    """What the conversation did, for the summary line."""

    committed: int = 0
    replayed: int = 0
    failed_steps: int = 0

    @classmethod
    def of(cls, result: TurnResult) -> Tally:
        """What one delivered turn did (a crash script's one turn)."""
        failed = sum(step.status == "failed" for step in result.steps)
        return cls(int(not result.replayed), int(result.replayed), failed)


def print_summary(tally: Tally, provider_calls: int) -> None:
    """The line every example ends with (the tests read it)."""
    print(
        f"summary: committed={tally.committed} replayed={tally.replayed} "
        f"failed_steps={tally.failed_steps} provider_calls={provider_calls}"
    )


def print_provider(calls: Sequence[str], did: str) -> None:
    """``provider: <key> <did> <n>x``: how often the provider applied each call."""
    for key in sorted(set(calls)):
        print(f"provider: {key} {did} {calls.count(key)}x")


def parse_args(name: str, description: str, argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog=f"python -m examples.{name}", description=description)
    parser.add_argument(
        "--db",
        default=f"sqlite:///{name}.db",
        help="durability URL: sqlite:///path.db or postgresql://user@host:5432/db "
        f"(default: sqlite:///{name}.db)",
    )
    parser.add_argument("--thread", default=f"{name}-demo", help="the conversation's thread ID")
    parser.add_argument(
        "--llm",
        action="store_true",
        help="interpret with OpenAIInterpreter (OPENAI_MODEL, OPENAI_BASE_URL, OPENAI_API_KEY)",
    )
    args = parser.parse_args(argv)
    return Options(db=args.db, thread=args.thread, llm=args.llm)


def llm_interpreter() -> Interpreter:
    """An OpenAIInterpreter configured from the environment (the example's choice)."""
    model = os.environ.get("OPENAI_MODEL")
    if not model:
        sys.exit("--llm needs OPENAI_MODEL (and OPENAI_BASE_URL for a server other than OpenAI's)")
    base_url = os.environ.get("OPENAI_BASE_URL") or None
    # A local OpenAI-compatible server usually needs no key, but the SDK insists on one.
    api_key = os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
    from intention_kernel.interpreters.openai import OpenAIInterpreter

    # Rounds (the default): the model sees what its tools returned and writes the reply.
    return OpenAIInterpreter(model, base_url=base_url, api_key=api_key)


AgentFactory = Callable[[Interpreter | None], Agent]


async def run(options: Options, script: Sequence[Step], build_agent: AgentFactory) -> Tally:
    """Play ``script`` on ``options.thread``; ``build_agent(None)`` uses the example's rules."""
    print(f"store: {options.db}")
    print(f"thread: {options.thread}")
    print(f"interpreter: {'OpenAIInterpreter' if options.llm else 'rules'}")
    tally = Tally()
    number = 0
    last: Say | None = None
    async with AsyncExitStack() as process:
        kernel = await _start(process, options, build_agent)
        for step in script:
            if isinstance(step, Restart):
                await process.aclose()
                print("-- restart: the store is closed, the kernel and agent are built again --")
                kernel = await _start(process, options, build_agent)
                continue
            if isinstance(step, Meanwhile):
                step.action()
                print(f"-- meanwhile: {step.note} --")
                continue
            if isinstance(step, Say):
                number, last = number + 1, step
                print(f"[turn-{number}] you: {step.message}")
            elif last is None:
                raise ValueError("nothing to deliver again yet")
            else:
                print(f"[turn-{number}] delivered again: {last.message}")
            try:
                result = await kernel.turn(options.thread, f"turn-{number}", last.message)
            except InterpretationError as exc:
                print(f"[turn-{number}] the interpreter failed, nothing was committed: {exc}")
                raise SystemExit(1) from exc
            _show(number, result, tally)
    return tally


async def _start(process: AsyncExitStack, options: Options, build_agent: AgentFactory) -> Kernel:
    store = await process.enter_async_context(open_durability(options.db))
    interpreter = llm_interpreter() if options.llm else None
    close = getattr(interpreter, "aclose", None)
    if close is not None:
        process.push_async_callback(close)
    return Kernel(build_agent(interpreter), store)


def _show(number: int, result: TurnResult, tally: Tally) -> None:
    tag = f"[turn-{number}]"
    if result.replayed:
        tally.replayed += 1
        print(f"{tag} replayed: the stored result came back; nothing ran")
    else:
        tally.committed += 1
    for line in result.reply.splitlines():
        print(f"{tag} agent: {line}")
    for step in result.steps:
        tally.failed_steps += step.status == "failed"
        error = f" ({step.error})" if step.error else ""
        print(f"{tag} step {step.capability_id}: {step.status}{error}")
    if result.interaction is not None and result.interaction.prompt not in result.reply:
        print(f"{tag} waiting for an answer: {result.interaction.prompt}")
