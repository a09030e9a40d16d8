"""OpenTelemetry spans, when the application installed an SDK; nothing otherwise.

The kernel depends on ``opentelemetry-api`` only through the ``otel`` extra, imported
lazily on the first span. Without it, :func:`span` returns one shared no-op context
manager. So it does while no SDK tracer provider is installed (the API's default
proxy). A turn then pays a few attribute lookups per span. Nothing is allocated by
OpenTelemetry, and no context is switched. Once an application calls
``trace.set_tracer_provider(...)``, spans are recorded from the next turn on.

Spans of a turn, parent first::

    intention_kernel.turn             thread, turn, tenant; replayed, checkpoint version
    ├── intention_kernel.interpret    thread, turn
    ├── intention_kernel.step         thread, turn, step, capability; step status
    │   └── intention_kernel.effect   thread, turn, step, capability, key; receipt, status
    └── intention_kernel.commit       thread, turn, version, events

A timer's turn (:meth:`Kernel.fire_due_timers`) has the same spans. Its
``intention_kernel.turn`` also names the timer (``timer_key``, ``timer_due_at``). It
says what became of it (``timer_outcome``: fired, replayed, void, stale or failed).
``intention_kernel.outbox.publish`` is recorded per event the relay publishes. Attribute names
are ``intention_kernel.<name>`` (:data:`ATTRIBUTE_PREFIX`).
"""

from __future__ import annotations

import contextlib
import os
from contextlib import AbstractContextManager
from typing import Any

__all__ = ["ATTRIBUTE_PREFIX", "NOOP", "annotate", "enabled", "span"]

ATTRIBUTE_PREFIX = "intention_kernel."

#: What :func:`span` returns when nothing records. Hot paths check :func:`enabled` once
#: per turn and use this directly, so that an untraced turn builds no attributes at all.
NOOP: AbstractContextManager[Any] = contextlib.nullcontext()
_NOOP = NOOP
_api: Any = None  # the opentelemetry.trace module once looked up; False if not installed
_tracer: tuple[Any, Any] | None = None  # (provider, tracer) of the last recorded span


_fast = False  # whether the installed provider can be read without get_tracer_provider()


def _trace() -> Any:
    global _api, _fast
    if _api is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _api = False
        else:
            _api = trace
            # get_tracer_provider() looks the environment up on every call (a microsecond
            # or two, five times a turn) while nothing is installed. The module global it
            # returns is read directly instead. There are two exceptions. An environment
            # variable may name a provider to load lazily; the public function does it
            # then. A future API may lack the global; the public function is then always
            # used.
            _fast = hasattr(trace, "_TRACER_PROVIDER") and (
                "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ
            )
    return _api


def _active_tracer() -> Any:
    """The tracer of the installed SDK provider, or ``None`` (no API, or no SDK)."""
    global _tracer
    api = _api if _api is not None else _trace()
    if api is False:
        return None
    if _fast:
        provider = api._TRACER_PROVIDER
        if provider is None:  # nothing installed: the API's proxy
            return None
    else:
        provider = api.get_tracer_provider()
    cached = _tracer
    if cached is not None and cached[0] is provider:
        return cached[1]
    if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return None
    from intention_kernel import __version__

    tracer = provider.get_tracer("intention_kernel", __version__)
    _tracer = (provider, tracer)
    return tracer


def enabled() -> bool:
    """Whether spans are recorded (an SDK provider is installed)."""
    # Three calls a turn: while nothing is installed, the answer is read here, without
    # the frame of ``_active_tracer``.
    api = _api
    if api is False or (_fast and api._TRACER_PROVIDER is None):
        return False
    return _active_tracer() is not None


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span named ``name``, current for the block, with ``attributes``.

    ``None`` values are left out, and names are prefixed. When nothing records, this is
    the shared no-op context manager.
    The block receives the span (``None`` when nothing records): see :func:`annotate`."""
    tracer = _active_tracer()
    if tracer is None:
        return _NOOP
    manager: AbstractContextManager[Any] = tracer.start_as_current_span(
        name, attributes=_named(attributes)
    )
    return manager


def annotate(current: Any, **attributes: Any) -> None:
    """Add attributes to a span from :func:`span` (nothing when it is ``None``)."""
    if current is not None:
        current.set_attributes(_named(attributes))


def _named(attributes: dict[str, Any]) -> dict[str, Any]:
    return {ATTRIBUTE_PREFIX + k: v for k, v in attributes.items() if v is not None}
