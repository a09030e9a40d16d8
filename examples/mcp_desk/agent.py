"""The desk agent: the tickets server's tools as capabilities, and rules to call them.

:func:`connect` starts the server (``server.py``) as a subprocess and returns an
``mcp.Client`` for it; :func:`build_agent` makes the agent from the capabilities
``mcp_capabilities`` listed. The server is trusted, so ``lookup_order``
(``readOnlyHint: true``) is a read; ``create_ticket`` is a write the kernel holds
until the person says yes, then runs through a receipt keyed by the tool name and a
digest of its arguments: the same ticket is opened at most once in the thread.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import mcp

from intention_kernel import Agent, Capability, Interpreter, Rule, RuleInterpreter

__all__ = ["SERVER", "build_agent", "connect", "ledger_path", "rules"]

SERVER = Path(__file__).with_name("server.py")


def ledger_path(thread: str) -> Path:
    """Where the server records the tickets it opened for ``thread`` (it outlives every
    process of the example, as the outside world does)."""
    return Path(tempfile.gettempdir()) / f"intention-kernel-{thread}.tickets.jsonl"


def connect(thread: str) -> mcp.Client:
    """A client for a new server process (enter it to start the server)."""
    params = mcp.StdioServerParameters(
        command=sys.executable, args=[str(SERVER), str(ledger_path(thread))]
    )
    return mcp.Client(params)


def rules() -> RuleInterpreter:
    return RuleInterpreter(
        [
            Rule(r"where is order (?P<order_id>\d+)", "tickets.lookup_order"),
            Rule(
                r"ticket for the printer",
                "tickets.create_ticket",
                input={"title": "Printer jam on floor 3", "priority": 2},
            ),
            Rule(r"^(yes|ok)\b", answer="accept"),
            Rule(r"^no\b", answer="reject"),
        ]
    )


def build_agent(tools: Sequence[Capability], interpreter: Interpreter | None = None) -> Agent:
    return Agent(name="desk", version="1", capabilities=tools, interpreter=interpreter or rules())
