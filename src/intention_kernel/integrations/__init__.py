"""Bridges to other agent frameworks and tool protocols, each behind its own extra.

- :mod:`intention_kernel.integrations.mcp`: the tools of an MCP server as
  capabilities (``pip install 'intention-kernel[mcp]'``).
- :mod:`intention_kernel.integrations.pydantic_ai`: a Pydantic AI agent as the loop
  of a durable turn (``pip install 'intention-kernel[pydantic-ai]'``).
- :mod:`intention_kernel.integrations.openai_agents`: an OpenAI Agents SDK agent's
  ``Runner`` loop inside a durable turn (``pip install 'intention-kernel[openai-agents]'``).

Nothing is imported here, so that this package loads without any of their SDKs
installed; import a bridge from its module.
"""

from __future__ import annotations

__all__: list[str] = []
