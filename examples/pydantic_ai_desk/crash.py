"""A process killed mid-turn, then the turn delivered again:
``python -m examples.pydantic_ai_desk.crash --db URL --thread ID --ledger PATH
--model-log PATH [--die]``.

The turn asks the desk to cancel order 42. With ``--die`` the process exits (status
137, as if killed) right after the shop applied the cancel and its receipt was
stored, before the turn commits: nothing of the turn is committed. Run it again
without ``--die`` and the same turn is delivered again: the agent runs again from the
model response recorded before the cancel ran (the model is not asked for it again),
the cancel meets its completed receipt, the shop is not called, and the model is asked
only for the request that reads the cancel's result. The turn commits with the stored
result. The shop's calls are lines of the ``--ledger`` file and the model's requests
lines of the ``--model-log`` file (both outlive the process), so the output reads
``model: requests=2 asked=2`` (each request asked once, across both processes) and
``provider_calls=1``.
"""

from __future__ import annotations

import asyncio

from examples._desk import crash_turn
from examples.pydantic_ai_desk.agent import build_agent

if __name__ == "__main__":
    asyncio.run(crash_turn("pydantic_ai_desk", build_agent))
