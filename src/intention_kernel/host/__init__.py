"""The HTTP host: serve a :class:`~intention_kernel.Kernel` as an ASGI app.

Needs the ``http`` extra (``pip install 'intention-kernel[http]'``: starlette and
uvicorn). ``create_app(kernel, tokens={...})`` returns a Starlette app; run it
with any ASGI server, or ``intention-kernel serve --agent module:attr``. Tokens
stand for a :class:`Principal`: a ``user`` posts turns and reads its tenant's
threads, an ``operator`` also lists and resolves receipts (403 ``forbidden``
otherwise), recorded by name as the actor.

Endpoints (described by the app's own ``/openapi.json``):

- ``POST /v1/threads/{thread_id}/turns``: one turn, ``{turn_id?, message?, answer?}``;
  the turn ID may come from an ``Idempotency-Key`` header. 200 with the
  ``TurnResult`` JSON, replays included (``Idempotency-Replayed: true``).
  A ``"queue"`` or ``"interrupt"`` agent answers 202 with the ``Queued`` JSON for a
  message queued behind a running turn.
- ``DELETE /v1/threads/{thread_id}/turns/{turn_id}?reason=``: stop one turn
  (``Kernel.cancel``). 200 with the ``Cancellation`` JSON; allowed to whoever may post
  a turn to the thread.
- ``GET /v1/threads/{thread_id}``: version, messages, facts with evidence, the
  pending interaction, the agenda.
- ``GET /v1/receipts?thread_id=&status=`` and ``POST /v1/receipts/resolve``.
- ``GET /v1/interactions?limit=&after=``: pending confirmations across the caller's
  threads (the console's queue).
- ``POST /v1/agui``: one turn as an AG-UI run (``RunAgentInput`` in, AG-UI events out;
  needs the ``agui`` extra, see :mod:`intention_kernel.host._agui`).
- ``GET /healthz``, ``GET /openapi.json``, ``GET /problems[/{slug}]``, and the
  operator console at ``GET /console``.

Errors are ``application/problem+json`` (RFC 9457) with stable ``type`` URIs,
mapped from the :class:`~intention_kernel.KernelError` tree by class:
``invalid-request`` 422, ``malformed-request`` 400, ``unauthorized`` 401,
``forbidden`` 403, ``not-found`` 404 (also another tenant's thread), ``method-not-allowed`` 405,
``unsupported-media-type`` 415 (a body that is not ``application/json``),
``turn-conflict`` 409,
``incompatible-checkpoint`` 409 (the thread needs a compatible agent, retrying
cannot help), ``receipt-state`` 409, ``turn-cancelled`` 409 (a queued turn cancelled before it ran),
``thread-busy`` 409 (another turn runs and the
agent has ``on_busy="reject"``), ``interpretation-failed`` 502,
``lock-timeout`` (a turn waited for the thread's whole lock timeout) / ``turn-fenced`` /
``store-unavailable`` 503 with ``Retry-After``.

Before any endpoint, the request guard answers ``host-not-allowed`` 400 for a
``Host`` the app does not serve and ``cross-origin`` 403 for a browser request of
another origin without a bearer token (see :mod:`intention_kernel.host._guard`).
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
