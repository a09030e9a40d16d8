"""The HTTP host: serve a :class:`~intention_kernel.Kernel` as an ASGI app.

Needs the ``http`` extra, which brings starlette and uvicorn.
Install it with ``pip install 'intention-kernel[http]'``.
``create_app(kernel, tokens={...})`` returns a Starlette app to serve ``kernel``.
Run it with any ASGI server, or with ``intention-kernel serve --agent module:attr``.

Each token stands for a :class:`Principal`: a name, a tenant and a role.
A ``user`` posts turns and reads its tenant's threads.
An ``operator`` also lists and resolves receipts; others get 403 ``forbidden``.
The operator is recorded by name as the actor.

Endpoints (described by the app's own ``/openapi.json``):

- ``POST /v1/threads/{thread_id}/turns``: one turn, ``{turn_id?, message?, answer?}``.
  The turn ID may come from an ``Idempotency-Key`` header.
  It answers 200 with the ``TurnResult`` JSON, replays included (``Idempotency-Replayed: true``).
  A message may queue behind a running turn of a ``"queue"`` or ``"interrupt"`` agent.
  That answers 202 with the ``Queued`` JSON.
- ``DELETE /v1/threads/{thread_id}/turns/{turn_id}?reason=``: stop one turn (``Kernel.cancel``).
  It answers 200 with the ``Cancellation`` JSON.
  Whoever may post a turn to the thread may cancel one.
- ``GET /v1/threads/{thread_id}``: version, messages, facts with evidence.
  It also shows the pending interaction and the agenda.
- ``GET /v1/receipts?thread_id=&status=`` and ``POST /v1/receipts/resolve``.
- ``GET /v1/interactions?limit=&after=``: pending confirmations across the caller's threads.
  The operator console shows this list as its queue.
- ``POST /v1/agui``: one turn as an AG-UI run: ``RunAgentInput`` in, AG-UI events out.
  It needs the ``agui`` extra (see :mod:`intention_kernel.host._agui`).
- ``GET /healthz``, ``GET /openapi.json``, ``GET /problems[/{slug}]``.
- The operator console at ``GET /console``.

Errors are ``application/problem+json`` (RFC 9457) with stable ``type`` URIs.
They are mapped from the :class:`~intention_kernel.KernelError` tree by class:

- ``invalid-request`` 422, ``malformed-request`` 400 and ``interpretation-failed`` 502.
- ``unauthorized`` 401, ``forbidden`` 403 and ``method-not-allowed`` 405.
- ``not-found`` 404, also for another tenant's thread.
- ``unsupported-media-type`` 415, for a body that is not ``application/json``.
- ``turn-conflict`` 409 and ``receipt-state`` 409.
- ``incompatible-checkpoint`` 409: the thread needs a compatible agent, so retrying cannot help.
- ``turn-cancelled`` 409: a queued turn was cancelled before it ran.
- ``thread-busy`` 409: another turn runs, and the agent has ``on_busy="reject"``.
- ``steer-orphaned`` 409: a steer's taker stopped uncommitted; deliver ``taken_by`` again.
- ``lock-timeout`` 503: a turn waited for the thread's whole lock timeout.
- ``turn-fenced`` 503 and ``store-unavailable`` 503.

Every 503 comes with a ``Retry-After`` header.

Before any endpoint, the request guard checks two things (see :mod:`intention_kernel.host._guard`).
A ``Host`` the app does not serve gets ``host-not-allowed`` 400.
A browser request of another origin without a bearer token gets ``cross-origin`` 403.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "intention_kernel.host needs starlette and uvicorn: pip install 'intention-kernel[http]'",
        name=exc.name,
    ) from exc

from intention_kernel.host._access import Principal, Role
from intention_kernel.host._app import create_app
from intention_kernel.host._problems import PROBLEM_TYPES, ProblemType

__all__ = ["PROBLEM_TYPES", "Principal", "ProblemType", "Role", "create_app"]
