"""``create_app``: the Starlette application that serves one kernel over HTTP."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from intention_kernel._kernel import Kernel
from intention_kernel._timer_runner import background_timers
from intention_kernel.host._access import Access, Principal
from intention_kernel.host._endpoints import Endpoints, guarded
from intention_kernel.host._guard import RequestGuard, check_host_patterns
from intention_kernel.host._openapi import openapi_document
from intention_kernel.host._problems import (
    PROBLEM_TYPES,
    HostProblem,
    ProblemType,
    problem_response,
)
from intention_kernel.host._turnstreams import check_keep_alive

__all__ = ["create_app"]

#: The console's files, shipped as package data: name → media type.
CONSOLE_ASSETS = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "console.css": "text/css",
}


def create_app(
    kernel: Kernel,
    *,
    tokens: Mapping[str, Principal | str | None] | None = None,
    allowed_hosts: Sequence[str] = (),
    timers: bool = True,
    timer_poll: float = 0.25,
    keep_alive: float = 15.0,
) -> Starlette:
    """An ASGI app serving ``kernel``.

    It serves the turn API, inspection, reconciliation and ``/openapi.json``.
    It serves the operator console at ``/console``.

    ``tokens`` maps bearer tokens to a :class:`Principal`: name, tenant, role.
    A token may map to a bare tenant ID instead, or ``None`` for no tenant.
    That token is a ``user`` of that tenant.
    A user posts turns and reads the tenant's threads.
    Listing and resolving receipts needs an ``operator``.
    Without ``tokens`` the API is unauthenticated and has no tenants.
    Every caller is then an operator, so put it behind your own gateway.
    The app does not open or close the kernel's store; the caller owns it.
    Adapters open lazily on first use.

    The app answers only requests whose ``Host`` is a loopback name or in ``allowed_hosts``.
    Patterns are ``ops.example.com``, ``*.example.com``, or ``*`` for any.
    It refuses browser requests from another origin that carry no bearer token.
    :mod:`intention_kernel.host._guard` says why.
    Request bodies must be ``application/json``.

    With ``timers`` (the default), the app's lifespan fires the store's due timers.
    It calls :meth:`Kernel.run_timers` in the background, if the store keeps timers.
    While idle, it polls every ``timer_poll`` seconds.
    Any number of hosts may do so at once.

    A turn's ``/events`` stream and an AG-UI run send an SSE comment while they wait.
    The comment is ``: ping``, every ``keep_alive`` seconds.
    So a proxy does not close them as idle.
    """
    from intention_kernel import __version__

    hosts = check_host_patterns(allowed_hosts)
    access = Access(tokens, kernel.durability)
    api = Endpoints(kernel, access)
    api.keep_alive = check_keep_alive(keep_alive)
    document = openapi_document(
        version=__version__,
        agent=kernel.agent.name,
        max_message_chars=kernel.max_message_chars,
        auth=access.enabled,
    )

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    routes = [
        # The turn route comes first.
        # For a path both match, a wrong method then answers 405 with this route's Allow.
        Route("/v1/threads/{thread_id:path}/turns", guarded(api.post_turn), methods=["POST"]),
        Route(
            "/v1/threads/{thread_id:path}/turns/{turn_id}/events",
            guarded(api.get_turn_events),
            methods=["GET"],
        ),
        Route(
            "/v1/threads/{thread_id:path}/turns/{turn_id}/events",
            _not_allowed("GET"),
            methods=["POST", "PUT", "PATCH", "DELETE"],
        ),
        Route(
            "/v1/threads/{thread_id:path}/turns/{turn_id}",
            guarded(api.get_turn),
            methods=["GET"],
        ),
        Route(
            "/v1/threads/{thread_id:path}/turns/{turn_id}",
            guarded(api.cancel_turn),
            methods=["DELETE"],
        ),
        # As for ".../turns": a GET of "x/turns/1" answers 405, not thread "x/turns/1".
        Route(
            "/v1/threads/{thread_id:path}/turns/{turn_id}",
            _not_allowed("GET", "DELETE"),
            methods=["POST", "PUT", "PATCH", "OPTIONS"],
        ),
        # Any other method on a turns path.
        # Without this route, a GET would match the thread route below.
        # Its thread ID would be "x/turns", and it would answer 404.
        Route(
            "/v1/threads/{thread_id:path}/turns",
            _not_allowed("POST"),
            methods=["GET", "PUT", "PATCH", "DELETE"],
        ),
        # As for ".../turns": "x/timers" is thread x's timers, not a thread "x/timers".
        Route("/v1/threads/{thread_id:path}/timers", guarded(api.get_timers), methods=["GET"]),
        Route(
            "/v1/threads/{thread_id:path}/timers",
            _not_allowed("GET"),
            methods=["POST", "PUT", "PATCH", "DELETE"],
        ),
        Route("/v1/threads/{thread_id:path}", guarded(api.get_thread), methods=["GET"]),
        Route("/v1/receipts", guarded(api.list_receipts), methods=["GET"]),
        Route("/v1/interactions", guarded(api.list_interactions), methods=["GET"]),
        Route("/v1/receipts/resolve", guarded(api.resolve_receipt), methods=["POST"]),
        Route("/v1/agui", guarded(_agui(api)), methods=["POST"]),
        Route("/healthz", guarded(api.health), methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/problems", _problem_types, methods=["GET"]),
        Route("/problems/{slug}", guarded(_problem_type), methods=["GET"]),
        Route("/console", _console_asset("index.html"), methods=["GET"]),
        *(
            Route(f"/console/{name}", _console_asset(name), methods=["GET"])
            for name in CONSOLE_ASSETS
            if name != "index.html"
        ),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(RequestGuard, allowed_hosts=hosts)],
        exception_handlers={HTTPException: _http_problem},
        lifespan=background_timers(kernel, poll_interval=timer_poll) if timers else None,
    )


def _agui(api: Endpoints) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/agui`` (:mod:`._agui`), imported at its first request.

    The ``ag-ui-protocol`` package is an extra, and its import is not free.
    """
    handler: Callable[[Request], Awaitable[Response]] | None = None

    async def run(request: Request) -> Response:
        nonlocal handler
        if handler is None:
            try:
                from intention_kernel.host._agui import AgUiEndpoint
            except ImportError as exc:
                raise HostProblem("not-found", str(exc)) from exc
            handler = AgUiEndpoint(api).post
        return await handler(request)

    return run


def _not_allowed(*methods: str) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint answering 405 with ``Allow: methods``.

    It serves paths a route of other methods would otherwise take.
    """
    allow = ", ".join(methods)

    async def refuse(request: Request) -> Response:
        detail = f"{request.url.path} takes {allow}, not {request.method}"
        return problem_response(HostProblem("method-not-allowed", detail, headers={"Allow": allow}))

    return refuse


def _describe(kind: ProblemType) -> dict[str, object]:
    return {
        "type": kind.uri,
        "title": kind.title,
        "status": kind.status,
        "description": kind.description,
    }


async def _problem_types(request: Request) -> Response:
    return JSONResponse([_describe(kind) for kind in PROBLEM_TYPES.values()])


async def _problem_type(request: Request) -> Response:
    kind = PROBLEM_TYPES.get(request.path_params["slug"])
    if kind is None:
        raise HostProblem("not-found", f"no problem type {request.path_params['slug']!r}")
    return JSONResponse(_describe(kind))


def _console_asset(name: str) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint serving one console file, read once from the package."""
    body = resources.files("intention_kernel.host").joinpath("console").joinpath(name).read_bytes()
    headers = {
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
        # The console renders conversation text, and only ever inserts it as text.
        # This policy forbids inline and foreign scripts besides.
        "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    }

    async def serve(request: Request) -> Response:
        return Response(body, media_type=CONSOLE_ASSETS[name], headers=headers)

    return serve


async def _http_problem(request: Request, exc: Exception) -> Response:
    """Routing errors (no route, wrong method) as problem details."""
    assert isinstance(exc, HTTPException)
    slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code)
    if slug is None:
        slug = next(
            (t.slug for t in PROBLEM_TYPES.values() if t.status == exc.status_code),
            "internal-error",
        )
    detail = (
        f"no route for {request.method} {request.url.path}"
        if exc.status_code == 404
        else str(exc.detail)
    )
    return problem_response(HostProblem(slug, detail, headers=exc.headers))
