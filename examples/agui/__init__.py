"""The billing agent behind the host's AG-UI endpoint, with a browser page.

``python -m examples.agui [--db URL] [--port 8000]`` serves ``examples.billing``'s
agent over HTTP, ``POST /v1/agui`` included, and ``index.html`` at ``/``: open
``http://127.0.0.1:8000/`` and talk to the agent in a browser.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from intention_kernel import Kernel
from intention_kernel.host import create_app

__all__ = ["PAGE", "page_app"]

#: The browser page: a minimal AG-UI client in plain JavaScript.
PAGE = Path(__file__).with_name("index.html")


def page_app(kernel: Kernel) -> Starlette:
    """The host's app for ``kernel`` with the page at ``/``, on the API's own origin."""
    app = create_app(kernel)
    body = PAGE.read_text(encoding="utf-8")

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(body, headers={"Cache-Control": "no-cache"})

    app.router.routes.insert(0, Route("/", page, methods=["GET"]))
    return app
