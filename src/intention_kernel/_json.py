"""Strict JSON for values the kernel stores: provider values, facts, payloads.

Stored values must survive a round trip unchanged, so everything the kernel
keeps is normalized through the same encoder that stores it: a tuple becomes a
list on first use, not only after a replay, and a value that JSON cannot hold
(a set, an object, NaN) is refused where it enters.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dump_value", "load_value", "normalize"]


def dump_value(value: Any) -> str:
    """Compact strict JSON; raises ``TypeError``/``ValueError`` for what JSON cannot hold."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def load_value(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def normalize(value: Any) -> Any:
    """``value`` as it will read back from the store (raises like :func:`dump_value`)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    return json.loads(dump_value(value))
