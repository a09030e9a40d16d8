"""The billing agent, ready to serve over HTTP.

    intention-kernel serve --agent intention_kernel.demo:serve_agent --db sqlite:///app.db

The fake provider keeps its ledger in ``demo-provider.db`` in the current
directory (``$INTENTION_KERNEL_DEMO_PROVIDER_DB`` to put it elsewhere).
"""

from __future__ import annotations

import os

from intention_kernel.agent import Agent
from intention_kernel.demo.billing import build_agent
from intention_kernel.demo.provider import FakePaymentProvider

__all__ = ["PROVIDER_DB_ENV_VAR", "serve_agent"]

PROVIDER_DB_ENV_VAR = "INTENTION_KERNEL_DEMO_PROVIDER_DB"


def serve_agent() -> Agent:
    """The demo billing agent with its fake provider (a zero-argument factory for ``--agent``)."""
    path = os.environ.get(PROVIDER_DB_ENV_VAR, "demo-provider.db")
    return build_agent(FakePaymentProvider(path))
