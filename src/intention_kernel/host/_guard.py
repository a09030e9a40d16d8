"""What every request must pass before it reaches an endpoint.

The guard checks its ``Host``, and whether a browser sent it from another site.

Two attacks work on a host that answers any browser.
They work best on one without tokens, which trusts every caller that reaches it.

- **DNS rebinding.**
  A page on ``attacker.example`` re-resolves its own name to ``127.0.0.1``.
  It then reads the host's threads and receipts as same-origin responses.
  Its requests carry ``Host: attacker.example``.
  So the host answers only the names it was told it serves.
  Those are :class:`RequestGuard`'s ``allowed_hosts``.
  They are the loopback names, and those the operator adds.
- **Cross-site requests.**
  Any page the operator visits can make the browser post to ``http://127.0.0.1:8000``.
  It sends a ``no-cors`` form-like request, which needs no preflight.
  The page cannot read the answer, but the turn runs.
  An ``accept`` then charges the card.
  Such a request carries an ``Origin`` that is not the host's own.
  Or it carries ``Sec-Fetch-Site: cross-site`` or ``same-site``.
  Without a bearer token it is refused.
- A request with an ``Authorization`` header needs a CORS preflight to go cross-origin.
  This host never grants one.
- A top-level navigation is let through.
  That is a ``GET`` with ``Sec-Fetch-Mode: navigate``, such as a console link in an alert.
  Its answer goes to the operator's window, not to the page.

Starlette's ``TrustedHostMiddleware`` checks the same patterns.
But it answers a ``text/plain`` 400, and may redirect to ``www.``.
This middleware answers problem details, as every other error of the host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from intention_kernel.host._problems import HostProblem, problem_response

__all__ = ["LOOPBACK_HOSTS", "RequestGuard", "check_host_patterns", "is_loopback"]

#: The names a host always answers to: those of the loopback interface.
LOOPBACK_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")

#: ``Sec-Fetch-Site`` values of a request sent by a page of another origin.
_FOREIGN_SITES = frozenset({"cross-site", "same-site"})
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def check_host_patterns(patterns: Iterable[str]) -> tuple[str, ...]:
    """The allowed host patterns, normalized.

    A pattern is a name or an IP address without scheme or port.
    Examples are ``ops.example.com``, ``10.0.0.5`` and ``::1``.
    ``*.example.com`` stands for its subdomains, and ``*`` for any name.
    Raises ``ValueError`` for anything else.
    """
    checked: list[str] = []
    for raw in patterns:
        if not isinstance(raw, str):
            raise ValueError(f"an allowed host must be a string, got {type(raw).__name__}")
        pattern = raw.strip().lower()
        if pattern != "*":
            name = pattern[2:] if pattern.startswith("*.") else pattern
            if not name or "*" in name or any(c in name for c in "/@?#\\ \t"):
                raise ValueError(
                    f"not an allowed host: {raw!r} (a name such as ops.example.com, an IP "
                    "address, *.example.com or *; no scheme, path or port)"
                )
            if name.startswith("[") or ":" in name:  # an IPv6 address, bracketed as in Host
                try:
                    address = ipaddress.IPv6Address(name.strip("[]"))
                except ValueError:
                    raise ValueError(
                        f"not an allowed host: {raw!r} (give the name without a port)"
                    ) from None
                pattern = f"[{address.compressed}]"
        checked.append(pattern)
    return tuple(checked)


def is_loopback(host: str) -> bool:
    """Whether a listening address (``serve --host``) is only reachable from this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str | None:
    """The name part of a ``Host`` header, or ``None`` if it is not one.

    An IPv6 name (``[v6]``) keeps its brackets.
    """
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not _is_port(value[end + 1 :])):
            return None
        try:
            return f"[{ipaddress.IPv6Address(value[1:end]).compressed}]"
        except ValueError:
            return None
    name, sep, port = value.partition(":")
    if not name or (sep and not _is_port(sep + port)) or any(c in name for c in "/@?#\\ \t"):
        return None
    return name


def _is_port(text: str) -> bool:
    return text.startswith(":") and text[1:].isdigit() and len(text) <= 6


class RequestGuard:
    """ASGI middleware that checks each request's host and origin.

    A ``Host`` outside ``allowed_hosts`` gets 400 ``host-not-allowed``.
    Those are added to :data:`LOOPBACK_HOSTS`.
    A browser request from another origin without a bearer token gets 403 ``cross-origin``.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str] = ()) -> None:
        self.app = app
        patterns = check_host_patterns((*LOOPBACK_HOSTS, *allowed_hosts))
        self.allow_any = "*" in patterns
        self.names = frozenset(p for p in patterns if not p.startswith("*"))
        self.suffixes = tuple(p[1:] for p in patterns if p.startswith("*."))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self.refusal(scope)
        if problem is not None:
            await problem_response(problem)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def allows(self, name: str) -> bool:
        return (
            self.allow_any
            or name in self.names
            or any(name.endswith(suffix) for suffix in self.suffixes)
        )

    def refusal(self, scope: Scope) -> HostProblem | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        name = _host_name(host)
        if name is None or not self.allows(name):
            return HostProblem(
                "host-not-allowed",
                f"this host does not answer to the name {host!r}; an operator adds names "
                "with --allowed-host (create_app(..., allowed_hosts=[...]))",
            )
        origin = headers.get("origin")
        site = headers.get("sec-fetch-site", "").lower()
        foreign = (origin is not None and not _same_authority(origin, host)) or (
            site in _FOREIGN_SITES
            and not (
                scope["method"] in _SAFE_METHODS
                and headers.get("sec-fetch-mode", "").lower() == "navigate"
            )
        )
        if foreign and not headers.get("authorization", "").lower().startswith("bearer "):
            return HostProblem(
                "cross-origin",
                "a page of another origin sent this request without a bearer token; "
                "the host answers its own console, and API clients that send a token",
            )
        return None


def _same_authority(origin: str, host: str) -> bool:
    """Whether ``origin`` names the host the request was sent to.

    Only the authority is compared, not the scheme.
    Behind a proxy that ends TLS, the page's origin is ``https://``.
    The host is asked over plain HTTP all the same.
    A browser sends the port in both only when it is not the scheme's default.
    ``null`` names no host; a sandboxed or local page sends it.
    """
    scheme, sep, authority = origin.strip().lower().partition("://")
    return bool(sep) and scheme in ("http", "https") and authority == host.strip().lower()
