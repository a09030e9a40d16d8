"""The billing demo: an agent that charges invoices, and the scenes that show its guarantees.

Run it with ``intention-kernel demo``. Programmatically::

    run = await run_demo("demo.db")
    assert run.ok, [c for c in run.checks if not c.passed]

- :mod:`~intention_kernel._demo.billing`: the agent, built on the public API only
  (read it as an example of a write capability).
- :mod:`~intention_kernel._demo.provider`: a fake payment provider that records
  every call in the same SQLite file.
- :mod:`~intention_kernel._demo.scenes`: the scenes, played against a SQLite file.
- :mod:`~intention_kernel._demo.transcript`: what a run returns, as data.
- :mod:`~intention_kernel._demo.checks`: the guarantees verified from that data.
- :func:`serve_agent`: the agent ready to serve (``intention-kernel serve --agent
  intention_kernel._demo:serve_agent``).
"""

from __future__ import annotations

from intention_kernel._demo.billing import (
    INVOICES,
    BalanceInput,
    ChargeInput,
    Invoice,
    build_agent,
    build_interpreter,
)
from intention_kernel._demo.provider import (
    ChargeRejected,
    FakePaymentProvider,
    ProviderCall,
    ProviderTimeout,
)
from intention_kernel._demo.scenes import ACTOR, THREAD_ID, run_demo
from intention_kernel._demo.serve import serve_agent
from intention_kernel._demo.transcript import (
    Check,
    DemoRun,
    OperatorAction,
    Restart,
    Scene,
    SceneStep,
    Summary,
    TurnView,
)

__all__ = [
    "ACTOR",
    "INVOICES",
    "THREAD_ID",
    "BalanceInput",
    "ChargeInput",
    "ChargeRejected",
    "Check",
    "DemoRun",
    "FakePaymentProvider",
    "Invoice",
    "OperatorAction",
    "ProviderCall",
    "ProviderTimeout",
    "Restart",
    "Scene",
    "SceneStep",
    "Summary",
    "TurnView",
    "build_agent",
    "build_interpreter",
    "run_demo",
    "serve_agent",
]
