"""Strict JSON for values the kernel stores: provider values, facts, payloads.

Stored values must survive a round trip unchanged, so everything the kernel
keeps is normalized through the same encoder that stores it: a tuple becomes a
list on first use, not only after a replay, and a value that JSON cannot hold
(a set, an object, NaN, a string with a lone surrogate, which UTF-8 cannot
encode) is refused where it enters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_NESTING", "dump_value", "load_value", "normalize", "too_deep"]

#: Values nested deeper than this (objects and arrays) are refused where they enter.
#: Real inputs are a few levels deep; far deeper ones exhaust the recursion of the
#: JSON encoders that store them (a ``RecursionError``, not a clear refusal).
MAX_NESTING = 64


# One strict compact encoder for every stored value, built once: ``json.dumps`` with
# options builds an encoder per call, which costs more than encoding a small value.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def dump_value(value: Any) -> str:
    """Compact strict JSON; raises ``TypeError``/``ValueError`` for what JSON cannot hold,
    or no store can (``UnicodeEncodeError``, a ``ValueError``, for a lone surrogate)."""
    text = _ENCODER.encode(value)
    if not text.isascii():
        text.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError
    return text


def load_value(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def normalize(value: Any) -> Any:
    """``value`` as it will read back from the store (raises like :func:`dump_value`)."""
    if isinstance(value, str):
        if not value.isascii():
            value.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError
        return value
    if value is None or isinstance(value, (bool, int)):
        return value
    plain = _plain(value, 4)
    if plain is not _NOT_PLAIN:
        return plain
    if too_deep(value, MAX_NESTING):
        raise ValueError(f"value is nested more than {MAX_NESTING} levels deep")
    return json.loads(dump_value(value))


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and arrays (dicts, lists, tuples) more than
    ``limit`` deep. Iterative: a recursive walk would fail on the very values it
    looks for."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        for child in children:
            if isinstance(child, (Mapping, list, tuple)):
                if depth + 1 > limit:
                    return True
                pending.append((child, depth + 1))
    return False


_NOT_PLAIN: Any = object()
_SCALARS = (str, int, bool, type(None))


def _plain(value: Any, depth: int) -> Any:
    """A copy of ``value`` if it is made only of dicts with ``str`` keys, lists and exact
    ``str``/``int``/``bool``/``None`` (which JSON round-trips unchanged), else
    ``_NOT_PLAIN``: the common small values skip an encode and a decode."""
    kind = type(value)
    if kind in _SCALARS:
        return value if kind is not str or _storable(value) else _NOT_PLAIN
    if depth == 0:
        return _NOT_PLAIN
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str or not _storable(key):
                return _NOT_PLAIN
            item = _plain(item, depth - 1)
            if item is _NOT_PLAIN:
                return _NOT_PLAIN
            out[key] = item
        return out
    if kind is list:
        items = [_plain(item, depth - 1) for item in value]
        return _NOT_PLAIN if any(item is _NOT_PLAIN for item in items) else items
    return _NOT_PLAIN


def _storable(text: str) -> bool:
    """Whether UTF-8, hence every store, can hold ``text`` (not a lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
