"""An agent factory for ``intention-kernel serve`` that dies at a named point.

``--agent agui_support:dying_billing_agent`` serves :func:`host_support.billing_agent`
with the fault point named in ``$AGUI_TEST_DIE_AT`` armed to end the process there
(``os._exit``: no cleanup, as a kill would). The test arms it, not the library.
"""

from __future__ import annotations

import os

from host_support import billing_agent
from intention_kernel import Agent
from intention_kernel.testing import faults

DIE_AT_ENV = "AGUI_TEST_DIE_AT"


def dying_billing_agent() -> Agent:
    """The demo billing agent; its process dies at ``$AGUI_TEST_DIE_AT`` if set."""
    point = os.environ.get(DIE_AT_ENV)
    if point:
        faults.inject(point, "exit")
    return billing_agent()
