"""The agent-loop rows: three model rounds (read, read, final text) in one turn.

A turn asks "what do I owe on invoice N?". A fake model with no latency answers round 1
with a call to ``account.balance``, round 2 (having seen the balance) with a call to
``account.invoice`` for invoice N, and round 3 with the final text. Both tools are reads
and count their calls; the model counts its calls and which round each one answered
(read from the request, as a model reads its context: the tool results since the
person's last message).

- ``loop-ik-*``: intention-kernel, an interpreter that works in rounds
  (``multi_round = True``), on ``SQLiteDurability`` / ``PostgresDurability``.
  ``loop-ik-*-stream``: the same turn through ``Kernel.stream_turn``, every event read
  (with ``--base``: today's stream beside this tree's resumable one).
- ``loop-langgraph-*``: LangGraph's prebuilt ReAct agent (``create_react_agent``).
  It has the same two tools as ``@tool`` functions, and a fake ``BaseChatModel`` that
  answers the same rounds. It runs on ``SqliteSaver`` / ``PostgresSaver``, invoked
  with ``durability="sync"``: each step's checkpoint is written before the next step
  starts. Its messages are bounded to the same 50 as the kernel's conversation.

``crash`` measures a turn that dies mid-loop. A child process (``python -m bench.loop``)
delivers a turn. It is killed with SIGKILL inside the model's third call, after rounds
1 and 2 were answered and their tools ran. Then the worker delivers the same turn again.
It counts the model rounds the redelivery asked and the tools it ran. Nothing here
assumes what the framework does: whichever rounds the redelivery asks for are the
figure. Once the kernel records model responses, the rounds it no longer asks for
disappear from it by themselves. LangGraph has no turn ID, so it is measured twice.
First, the same input is invoked again, as a redelivered message would be. Second,
``invoke(None)`` resumes the thread's interrupted run from its last checkpoint. That is
what a caller does that knows the run died and does not send the message again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from bench.peers import langgraph_saver
from bench.workload import MAX_MESSAGES

#: The round (0-based) inside whose model call the crashed delivery is killed.
KILLED_IN_ROUND = 2
DUE = 4200


def question(n: int) -> str:
    return f"what do I owe on invoice {n}?"


def final_text(invoice: str) -> str:
    return f"You owe {DUE} in all; invoice {invoice} is {DUE} of it."


class LoopCalls:
    """What ran in this process: tool calls (``calls``, like a provider's), model calls
    and the round each model call answered (0-based)."""

    def __init__(self) -> None:
        self.calls = 0
        self.model = 0
        self.rounds: list[int] = []
        #: Kill the process inside the model call of this round (the crash's child).
        self.kill_in_round: int | None = None

    def model_called(self, round_: int) -> None:
        if round_ == self.kill_in_round:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        self.model += 1
        self.rounds.append(round_)
        _tell({"model": round_})

    def tool_called(self, name: str) -> None:
        self.calls += 1
        _tell({"tool": name})


#: Whether this process is the crash's child, which reports each call (``_tell``).
#: Read once: a lookup per call cost the harness 20 calls a turn in the cost meter.
_CHILD = bool(os.environ.get("IKBENCH_LOOP_CHILD"))


def _tell(event: dict[str, Any]) -> None:
    """The crash's child reports each call on its stdout before it may be killed."""
    if _CHILD:
        print(json.dumps(event), flush=True)


# -- intention-kernel -----------------------------------------------------------------


class LoopKernelRow:
    def __init__(
        self, name: str, store: str, path: str, dsn: str, schema: str, stream: bool = False
    ) -> None:
        self.name, self.store, self.path, self.dsn, self.schema = name, store, path, dsn, schema
        self.provider = LoopCalls()
        self.stream = stream

    async def setup(self) -> None:
        from intention_kernel import Kernel

        if self.store == "sqlite":
            from intention_kernel.durability.sqlite import SQLiteDurability

            self.durability: Any = SQLiteDurability(self.path)
        else:
            from intention_kernel.durability.postgres import PostgresDurability

            self.durability = PostgresDurability(self.dsn, schema=self.schema)
        await self.durability.__aenter__()
        self.kernel = Kernel(kernel_agent(self.provider), self.durability)

    async def close(self) -> None:
        await self.durability.aclose()

    async def turn(self, thread: str, n: int) -> None:
        if self.stream:
            events = [e async for e in self.kernel.stream_turn(thread, str(n), question(n))]
            event = events[-1]
            assert event.type == "result" and not event.data["replayed"], event
            assert event.data["reply"] == final_text(str(n)), event
            return
        result = await self.kernel.turn(thread, str(n), question(n))
        assert not result.replayed and result.reply == final_text(str(n)), result
        assert [s.status for s in result.steps] == ["completed", "completed"], result

    async def replay(self, thread: str, n: int) -> None:
        result = await self.kernel.turn(thread, str(n), question(n))
        assert result.replayed and result.reply == final_text(str(n)), result

    async def redeliver(self, thread: str, n: int, how: str) -> None:
        """The crashed turn delivered again: the same turn ID and message."""
        await self.turn(thread, n)

    redeliveries = ("same turn ID",)


def kernel_agent(calls: LoopCalls) -> Any:
    from intention_kernel import (
        Agent,
        CapabilityContext,
        CapabilityResult,
        Intent,
        Interpretation,
        InterpretationRequest,
        capability,
    )

    @capability("account.balance", description="What the account owes in all")
    async def balance(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        calls.tool_called("account.balance")
        return CapabilityResult(value={"due": DUE})

    @capability("account.invoice", description="What one invoice owes")
    async def invoice(input: dict[str, Any], ctx: CapabilityContext) -> CapabilityResult:
        calls.tool_called("account.invoice")
        return CapabilityResult(value={"invoice_id": input["invoice_id"], "due": DUE})

    class FakeModel:
        """Answers round by round from what the earlier rounds produced."""

        multi_round = True

        async def interpret(self, request: InterpretationRequest) -> Interpretation:
            round_ = len(request.rounds)
            calls.model_called(round_)
            invoice_id = request.message.rsplit(" ", 1)[1].rstrip("?")
            if round_ == 0:
                return Interpretation(intents=[Intent("account.balance", {})])
            if round_ == 1:
                return Interpretation(
                    intents=[Intent("account.invoice", {"invoice_id": invoice_id})]
                )
            return Interpretation(reply=final_text(request.rounds[1].steps[0].value["invoice_id"]))

    return Agent(
        name="bench-loop",
        version="1",
        capabilities=[balance, invoice],
        interpreter=FakeModel(),
        max_messages=MAX_MESSAGES,
    )


# -- LangGraph's ReAct agent ----------------------------------------------------------


def _bounded_messages(left: Sequence[Any], right: Sequence[Any] | Any) -> list[Any]:
    from langgraph.graph.message import add_messages

    return list(add_messages(left, right))[-MAX_MESSAGES:]  # type: ignore[arg-type]


def _react_state() -> type:
    from langgraph.managed import RemainingSteps

    # The functional form: its annotations are objects, not strings this module's
    # ``from __future__ import annotations`` would leave LangGraph to resolve.
    fields = {
        "messages": Annotated[Sequence[Any], _bounded_messages],
        "remaining_steps": RemainingSteps,
    }
    state: type = TypedDict("LoopState", fields)  # type: ignore[misc]  # mypy reads only a literal dict
    return state


def _fake_chat_model(calls: LoopCalls) -> Any:
    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class FakeChatModel(BaseChatModel):
        """Answers round by round: the tool results since the person's last message."""

        @property
        def _llm_type(self) -> str:
            return "ikbench-fake"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self,
            messages: list[BaseMessage],
            stop: list[str] | None = None,
            run_manager: CallbackManagerForLLMRun | None = None,
            **kwargs: Any,
        ) -> ChatResult:
            last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
            results = [m for m in messages[last + 1 :] if isinstance(m, ToolMessage)]
            round_ = len(results)
            calls.model_called(round_)
            invoice_id = str(messages[last].content).rsplit(" ", 1)[1].rstrip("?")
            if round_ == 0:
                call = {"name": "account_balance", "args": {}, "id": f"call_b{invoice_id}"}
                message = AIMessage(content="", tool_calls=[call])
            elif round_ == 1:
                args = {"invoice_id": invoice_id}
                call = {"name": "account_invoice", "args": args, "id": f"call_i{invoice_id}"}
                message = AIMessage(content="", tool_calls=[call])
            else:
                invoice = json.loads(str(results[1].content))["invoice_id"]
                message = AIMessage(content=final_text(invoice))
            return ChatResult(generations=[ChatGeneration(message=message)])

    return FakeChatModel()


class LoopLangGraphRow:
    def __init__(self, name: str, store: str, path: str, dsn: str, schema: str) -> None:
        self.name, self.store, self.path, self.dsn, self.schema = name, store, path, dsn, schema
        self.provider = LoopCalls()

    async def setup(self) -> None:
        from langchain_core.tools import tool

        calls = self.provider

        @tool
        def account_balance() -> dict[str, int]:
            """What the account owes in all."""
            calls.tool_called("account.balance")
            return {"due": DUE}

        @tool
        def account_invoice(invoice_id: str) -> dict[str, Any]:
            """What one invoice owes."""
            calls.tool_called("account.invoice")
            return {"invoice_id": invoice_id, "due": DUE}

        self.conn, saver = langgraph_saver(self.store, self.path, self.dsn, self.schema)
        with warnings.catch_warnings():
            # Deprecated since LangGraph 1.0 for langchain's create_agent (another
            # package); still LangGraph's own prebuilt ReAct agent.
            warnings.simplefilter("ignore")
            from langgraph.prebuilt import create_react_agent

            self.graph = create_react_agent(
                _fake_chat_model(calls),
                [account_balance, account_invoice],
                state_schema=_react_state(),
                checkpointer=saver,
            )

    async def close(self) -> None:
        self.conn.close()

    def _invoke(self, thread: str, payload: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.graph.invoke(
            payload, {"configurable": {"thread_id": thread}}, durability="sync"
        )
        return out

    async def turn(self, thread: str, n: int) -> None:
        out = self._invoke(thread, {"messages": [{"role": "user", "content": question(n)}]})
        assert out["messages"][-1].content == final_text(str(n)), out["messages"][-1]

    replay = turn  # there is no turn ID: resubmitting runs the turn again

    async def redeliver(self, thread: str, n: int, how: str) -> None:
        if how == "same input":
            await self.turn(thread, n)
            return
        out = self._invoke(thread, None)  # resume the interrupted run from its checkpoint
        assert out["messages"][-1].content == final_text(str(n)), out["messages"][-1]

    redeliveries = ("same input", "resume: invoke(None)")


# -- the crash ------------------------------------------------------------------------


async def crash(row: Any, args: Sequence[str], thread: str, n: int) -> dict[str, Any]:
    """Kill a delivery of turn ``n`` inside round 3's model call, in a child process,
    then deliver it again here: once per way the row has of delivering it again."""
    out: dict[str, Any] = {}
    for k, how in enumerate(row.redeliveries):
        where = f"{thread}-{k}"
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.loop",
            *args,
            where,
            str(n),
            env={**os.environ, "IKBENCH_LOOP_CHILD": "1"},
            stdout=asyncio.subprocess.PIPE,
        )
        stdout, _ = await asyncio.wait_for(child.communicate(), timeout=120)
        told = [json.loads(line) for line in stdout.decode().splitlines() if line[:1] == "{"]
        answered = [e["model"] for e in told if "model" in e]
        if child.returncode != -signal.SIGKILL or answered != list(range(KILLED_IN_ROUND)):
            raise RuntimeError(
                f"the crashed delivery did not die as planned (exit {child.returncode}, "
                f"rounds answered {answered})"
            )
        calls = row.provider
        model, rounds, tools = calls.model, len(calls.rounds), calls.calls
        await row.redeliver(where, n, how)
        asked = calls.rounds[rounds:]
        out[how] = {
            "first_delivery_rounds_answered": answered,
            "first_delivery_tools_run": sum("tool" in e for e in told),
            "redelivery_rounds_asked": asked,
            "model_calls": calls.model - model,
            "tool_calls": calls.calls - tools,
            "answered_rounds_asked_again": sum(r < KILLED_IN_ROUND for r in asked),
        }
    return out


async def _child(argv: Sequence[str]) -> None:
    """``python -m bench.loop ROW DIR DSN SCHEMA THREAD N``: deliver turn N, to be killed."""
    from bench.worker import make_row

    name, directory, dsn, schema, thread, n = argv
    row = make_row(name, directory, dsn, schema)
    await row.setup()
    row.provider.kill_in_round = KILLED_IN_ROUND
    await row.turn(thread, int(n))
    raise SystemExit("the turn finished: it was to be killed in its third model call")


if __name__ == "__main__":
    asyncio.run(_child(sys.argv[1:]))
