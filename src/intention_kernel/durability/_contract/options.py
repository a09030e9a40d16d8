"""Checks of adapter options shared by the contract package and the adapters.

The adapters import these from here rather than from the contract package's
private names.
"""

from __future__ import annotations

import math
from collections.abc import Collection

__all__ = ["check_seconds", "take_url_options"]


def take_url_options(url: str, names: Collection[str]) -> tuple[str, dict[str, str]]:
    """Split the query parameters called ``names`` off ``url``.

    Return the URL without them, and their percent-decoded values. Every other
    parameter is kept byte for byte, so that libpq decodes it as it would have. A
    parameter given twice is a ``ValueError``.
    """
    base, sep, query = url.partition("?")
    if not sep:
        return url, {}
    # Imported here, once a store is opened from a URL: ``urllib.parse`` loads
    # ``ipaddress``, which a plain ``import intention_kernel`` does not need.
    from urllib.parse import unquote

    kept: list[str] = []
    taken: dict[str, str] = {}
    for item in query.split("&"):
        name, _, value = item.partition("=")
        key = unquote(name)
        if key not in names:
            kept.append(item)
        elif key in taken:
            raise ValueError(f"the durability URL gives {key}= twice")
        else:
            taken[key] = unquote(value)
    return base + ("?" + "&".join(kept) if kept else ""), taken


def check_seconds(name: str, value: float) -> float:
    """``value`` if it is a finite, non-negative number of seconds; ``ValueError`` otherwise.

    Every adapter checks its waits with this. NaN compares false with everything. So a
    wait of NaN seconds never ends, and neither does an infinite one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return float(value)
