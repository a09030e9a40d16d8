"""The Pydantic AI bridge row: a Pydantic AI agent run as a kernel turn (``bridge-ik-*``).

A turn asks "pay invoice N". A ``FunctionModel`` with no latency answers it.
Request 1 gets a call to ``invoice_due``, a read tool. Request 2 gets a call to
``pay_invoice``, a write tool keyed by the invoice: it runs through ``run_effect``.
Request 3 gets the final text. ``KernelAgent`` runs the agent inside the kernel's capability,
so a turn is the bridge's whole path: its model and toolset wrappers, the receipt of
the write, the conversation fact and the turn's commit. The cost meter
(``bench.cost``) reports it per turn and per model request.
"""

from __future__ import annotations

from inspect import signature
from typing import Any

#: Model requests a turn makes (read, write, final text).
REQUESTS = 3
#: Turns of the benchmark's sequence per conversation.
#: The bridge keeps a conversation's whole history.
#: Pydantic AI walks it at each request, so a turn costs more as its thread grows.
#: A new conversation every ``SPAN`` turns of the sequence bounds that growth.
#: That is about ten turns each, over ten threads round-robin.
#: A turn then costs the same from the first block to the last.
SPAN = 100
DUE = 4200


def question(n: int) -> str:
    return f"pay invoice {n}"


def final_text(invoice: str) -> str:
    return f"Paid {DUE} on invoice {invoice}."


class BridgeCalls:
    """What ran in this process: writes (``calls``, like a provider's) and requests."""

    def __init__(self) -> None:
        self.calls = 0
        self.model = 0


def pydantic_agent(calls: BridgeCalls) -> Any:
    """The Pydantic AI agent of the row: its ``FunctionModel`` and its two tools."""
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.model += 1
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        part = last.parts[-1]
        if isinstance(part, UserPromptPart):
            invoice = str(part.content).rsplit(" ", 1)[1]
            return ModelResponse(parts=[ToolCallPart("invoice_due", {"invoice_id": invoice})])
        assert isinstance(part, ToolReturnPart), part
        content: Any = part.content
        if part.tool_name == "invoice_due":
            call = ToolCallPart("pay_invoice", {"invoice_id": content["invoice_id"]})
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart(final_text(content["invoice_id"]))])

    agent: PydanticAgent[None, str] = PydanticAgent(FunctionModel(model), name="payer")

    @agent.tool_plain
    def invoice_due(invoice_id: str) -> dict[str, Any]:
        """What an invoice owes."""
        return {"invoice_id": invoice_id, "due": DUE}

    @agent.tool_plain
    def pay_invoice(invoice_id: str) -> dict[str, Any]:
        """Pay an invoice."""
        calls.calls += 1
        return {"invoice_id": invoice_id, "paid": DUE}

    return agent


def bridge_agent(calls: BridgeCalls) -> Any:
    """The same agent as a kernel agent, through ``KernelAgent``."""
    from intention_kernel.integrations.pydantic_ai import KernelAgent

    agent = pydantic_agent(calls)
    # A tree from before the bridge named its reads (an older ``--base``) has no
    # ``reads``: it takes every tool not in ``writes`` as a read, so the agent is the same.
    reads: dict[str, Any] = {}
    if "reads" in signature(KernelAgent).parameters:
        reads["reads"] = ["invoice_due"]
    bridge = KernelAgent(
        agent, name="payer", writes={"pay_invoice": lambda args: args["invoice_id"]}, **reads
    )
    return bridge.as_agent(version="1")


class BridgeKernelRow:
    """The bridge on ``SQLiteDurability`` (``FULL``) or ``PostgresDurability``."""

    def __init__(self, store: str, path: str, dsn: str, schema: str) -> None:
        self.store, self.path, self.dsn, self.schema = store, path, dsn, schema
        self.provider = BridgeCalls()

    async def setup(self) -> None:
        from intention_kernel import Kernel

        if self.store == "sqlite":
            from intention_kernel.durability.sqlite import SQLiteDurability

            self.durability: Any = SQLiteDurability(self.path)
        else:
            from intention_kernel.durability.postgres import PostgresDurability

            self.durability = PostgresDurability(self.dsn, schema=self.schema)
        await self.durability.__aenter__()
        self.kernel = Kernel(bridge_agent(self.provider), self.durability)

    async def close(self) -> None:
        await self.durability.aclose()

    async def turn(self, thread: str, n: int) -> None:
        result = await self.kernel.turn(f"{thread}-{n // SPAN}", str(n), question(n))
        assert not result.replayed and result.reply == final_text(str(n)), result

    async def replay(self, thread: str, n: int) -> None:
        result = await self.kernel.turn(f"{thread}-{n // SPAN}", str(n), question(n))
        assert result.replayed, result


class BridgeAloneRow:
    """The same Pydantic AI agent run alone: no kernel, no store (``bridge-alone``).

    Each conversation's history stays in memory, as a process without durability keeps
    it. A turn is one ``Agent.run`` with that history, its three model requests and
    two tools. The cost meter reports the bridge row against this one: what is left
    between them is the kernel's share of a round (its receipt, fact and commit)."""

    def __init__(self) -> None:
        self.provider = BridgeCalls()
        self.history: dict[str, list[Any]] = {}

    async def setup(self) -> None:
        self.agent = pydantic_agent(self.provider)

    async def close(self) -> None:
        self.history.clear()

    async def turn(self, thread: str, n: int) -> None:
        conversation = f"{thread}-{n // SPAN}"
        result = await self.agent.run(question(n), message_history=self.history.get(conversation))
        assert result.output == final_text(str(n)), result.output
        self.history[conversation] = result.all_messages()

    async def replay(self, thread: str, n: int) -> None:
        raise NotImplementedError("the agent alone keeps no turn to replay")
