"""Runnable examples, one command each, from the repository root.

- ``python examples/quickstart.py [STORE_URL]``: the quick start, a write
  capability behind a confirmation, rules as the interpreter;
- ``python -m examples.billing``: charges that wait for the person's confirmation;
- ``python -m examples.travel``: bookings that confirm on their own, with a
  small-operation policy;
- ``python -m examples.pydantic_ai_desk``: a Pydantic AI agent inside durable turns
  (``KernelAgent``), its model a ``FunctionModel`` (no API key);
- ``python -m examples.openai_agents_desk``: an OpenAI Agents SDK agent inside durable
  turns (``KernelAgent``), its model a scripted ``agents.Model`` (no API key).
- ``python -m examples.langgraph_desk``: a LangGraph ReAct agent inside durable turns
  (``KernelAgent``), its model a scripted LangChain chat model (no API key).

Both take ``--db sqlite:///file.db`` or ``--db postgresql://...``, ``--thread`` and
``--llm`` (see :mod:`examples._conversation`).
"""
