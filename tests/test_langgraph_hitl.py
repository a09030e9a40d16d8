"""LangChain's HumanInTheLoopMiddleware inside the LangGraph bridge: its review request
is a kernel interaction, and the answer becomes its approve / edit / reject / respond
decision, on every store and in both of the middleware's interrupt modes."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool

from intention_kernel import Answer, Kernel
from intention_kernel._turns import TurnResult
from intention_kernel.durability import Durability
from intention_kernel.integrations.langgraph import KernelAgent
from langgraph_support import ScriptedChatModel

Mode = Literal["batched", "per_call"]
MODES: list[Mode] = ["batched", "per_call"]


class Mail:
    """An agent that asks to email Alice once, then says what the tool answered."""

    def __init__(self, mode: Mode, allowed: list[str] | None = None) -> None:
        self.sent: list[tuple[str, str]] = []
        self.model = ScriptedChatModel(script=self.script)

        @tool
        def send_email(to: str, body: str) -> str:
            """Send an email."""
            self.sent.append((to, body))
            return f"sent to {to}"

        interrupt_on: Any = True if allowed is None else {"allowed_decisions": allowed}
        graph = create_agent(
            self.model,
            [send_email],
            middleware=[
                HumanInTheLoopMiddleware(
                    interrupt_on={"send_email": interrupt_on}, interrupt_mode=mode
                )
            ],
        )
        self.bridge = KernelAgent(graph, name="mail", writes={"send_email": lambda a: a["to"]})

    @staticmethod
    def script(messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            return AIMessage(f"tool said: {last.content}")
        call = {"name": "send_email", "args": {"to": "alice", "body": "hi"}, "id": "c1"}
        return AIMessage("", tool_calls=[call])

    async def ask(self, store: Durability, thread_id: str = "t") -> tuple[Kernel, TurnResult]:
        kernel = Kernel(self.bridge.as_agent(version="1"), store)
        asked = await kernel.turn(thread_id, "1", "email alice")
        assert asked.interaction is not None
        assert asked.interaction.prompt.startswith(
            'Run send_email with {"body": "hi", "to": "alice"}?'
        )
        assert self.sent == []
        return kernel, asked


def _answer(asked: TurnResult, **fields: Any) -> Answer:
    assert asked.interaction is not None
    return Answer(digest=asked.interaction.digest, **fields)


@pytest.mark.parametrize("mode", MODES)
async def test_an_accept_approves_the_shown_call_which_runs_once(
    store: Durability, mode: Mode
) -> None:
    mail = Mail(mode)
    kernel, asked = await mail.ask(store)
    done = await kernel.turn("t", "2", answer=_answer(asked))
    assert done.reply == "tool said: sent to alice"
    again = await kernel.turn("t", "2", answer=_answer(asked))
    assert again.replayed and mail.sent == [("alice", "hi")]
    [receipt] = await store.list_receipts("t")
    assert receipt.key == "mail.agent:send_email:alice"


@pytest.mark.parametrize("mode", MODES)
async def test_an_accept_with_args_edits_the_call(store: Durability, mode: Mode) -> None:
    mail = Mail(mode)
    kernel, asked = await mail.ask(store)
    edited = {"args": {"to": "bob", "body": "hello"}}
    done = await kernel.turn("t", "2", answer=_answer(asked, value=edited))
    assert mail.sent == [("bob", "hello")]
    assert "sent to bob" in str(done.reply)
    [receipt] = await store.list_receipts("t")
    assert receipt.key == "mail.agent:send_email:bob"  # the key of the call that ran


@pytest.mark.parametrize("mode", MODES)
async def test_a_rejects_reason_reaches_the_model_and_nothing_runs(
    store: Durability, mode: Mode
) -> None:
    mail = Mail(mode)
    kernel, asked = await mail.ask(store)
    done = await kernel.turn(
        "t", "2", answer=_answer(asked, decision="reject", reason="not on a Sunday")
    )
    assert mail.sent == [] and await store.list_receipts("t") == []
    assert "not on a Sunday" in str(done.reply)


@pytest.mark.parametrize("mode", MODES)
async def test_a_response_is_the_tools_result_and_the_tool_never_runs(
    store: Durability, mode: Mode
) -> None:
    mail = Mail(mode)
    kernel, asked = await mail.ask(store)
    answer = _answer(asked, value={"respond": "Alice was told in person."})
    done = await kernel.turn("t", "2", answer=answer)
    assert done.reply == "tool said: Alice was told in person."
    assert mail.sent == [] and await store.list_receipts("t") == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "value",
    [{"args": {"to": "bob", "body": "x"}}, {"respond": "no"}, {"what": 1}, "yes", {"args": 3}],
)
async def test_an_answer_the_review_does_not_allow_fails_the_step_and_runs_nothing(
    store: Durability, value: Any, mode: Mode
) -> None:
    mail = Mail(mode, allowed=["approve", "reject"])
    kernel, asked = await mail.ask(store)
    failed = await kernel.turn("t", "2", answer=_answer(asked, value=value))
    [step] = failed.steps
    assert step.status == "failed"
    assert step.error is not None
    # Batched, the bridge refuses it. Per call, LangGraph checks it against the
    # interrupt's response schema, which allows the tool's decisions only.
    assert "nothing ran" in step.error or (mode == "per_call" and "ValidationError" in step.error)
    assert mail.sent == [] and await store.list_receipts("t") == []


async def test_a_batched_review_of_one_call_takes_the_middlewares_decisions_as_given(
    store: Durability,
) -> None:
    mail = Mail("batched")
    kernel, asked = await mail.ask(store)
    decisions = {"decisions": [{"type": "reject", "message": "ask Bob instead"}]}
    done = await kernel.turn("t", "2", answer=_answer(asked, value=decisions))
    assert "ask Bob instead" in str(done.reply) and mail.sent == []
    # As many decisions as calls, or nothing runs.
    kernel, asked = await mail.ask(store, "t2")
    two = {"decisions": [{"type": "approve"}, {"type": "approve"}]}
    failed = await kernel.turn("t2", "2", answer=_answer(asked, value=two))
    assert failed.steps[0].status == "failed" and mail.sent == []
