"""Agent factories for ``intention-kernel serve`` in the AG-UI process tests.

``--agent agui_support:dying_billing_agent`` serves :func:`host_support.billing_agent`
with the fault point named in ``$AGUI_TEST_DIE_AT`` armed to end the process there
(``os._exit``: no cleanup, as a kill would). The test arms it, not the library.
``--agent agui_support:charging_agent`` serves it with :class:`ChargingRounds`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

from host_support import billing_agent
from intention_kernel import Agent, Intent, Interpretation, InterpretationRequest
from intention_kernel.testing import faults

DIE_AT_ENV = "AGUI_TEST_DIE_AT"


def dying_billing_agent() -> Agent:
    """The demo billing agent; its process dies at ``$AGUI_TEST_DIE_AT`` if set."""
    point = os.environ.get(DIE_AT_ENV)
    if point:
        faults.inject(point, "exit")
    return billing_agent()


#: The seconds :class:`ChargingRounds` sleeps before its last round's text.
SLOW_ENV = "AGUI_TEST_SLOW"

CHARGE = {"payment_intent_id": "pi_42", "amount_cents": 500, "invoice_id": "42"}


class ChargingRounds:
    """A charge, then rounds that stream. The first turn streams ``r1a r1b`` and asks
    for the charge (held for confirmation). A turn saying ``yes`` accepts it in its
    first round, streaming ``r2a r2b``; its second round sleeps ``slow`` seconds, then
    streams ``r3a r3b`` and replies."""

    multi_round = True

    def __init__(self, slow: float = 0.0) -> None:
        self.slow = slow

    async def interpret(self, request: InterpretationRequest) -> Interpretation:
        stream = request.stream or (lambda text: None)
        if request.message != "yes":
            if request.rounds:  # the charge waits for its answer
                return Interpretation(reply="")
            stream("r1a ")
            stream("r1b ")
            return Interpretation(intents=[Intent("payments.charge", CHARGE)], reply="r1a r1b ")
        if not request.rounds:
            stream("r2a ")
            stream("r2b ")
            return Interpretation(answer="accept", reply="r2a r2b ")
        await asyncio.sleep(self.slow)
        stream("r3a ")
        stream("r3b ")
        return Interpretation(reply="r3a r3b ")


def charging_agent() -> Agent:
    """The demo billing agent with :class:`ChargingRounds` (``$AGUI_TEST_SLOW``)."""
    model = ChargingRounds(float(os.environ.get(SLOW_ENV, "0")))
    return dataclasses.replace(billing_agent(), interpreter=model)
