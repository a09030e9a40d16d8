"""Bridges to other agent frameworks and tool protocols, each behind its own extra.

- :mod:`intention_kernel.integrations.mcp`: an MCP server's tools as capabilities.
  Its extra installs with ``pip install 'intention-kernel[mcp]'``.
- :mod:`intention_kernel.integrations.pydantic_ai`: a Pydantic AI agent as a turn's loop.
  Its extra installs with ``pip install 'intention-kernel[pydantic-ai]'``.
- :mod:`intention_kernel.integrations.openai_agents`: an OpenAI Agents SDK ``Runner`` loop.
  The loop runs inside a durable turn.
  Its extra installs with ``pip install 'intention-kernel[openai-agents]'``.
- :mod:`intention_kernel.integrations.langgraph`: a compiled LangGraph graph as a turn's
  loop, and ``KernelSaver``, a LangGraph checkpointer on the kernel's store.
  Its extra installs with ``pip install 'intention-kernel[langgraph]'``.

Nothing is imported here, so this package loads without any of their SDKs installed.
Import a bridge from its module, once its extra is installed.
"""

from __future__ import annotations

__all__: list[str] = []
