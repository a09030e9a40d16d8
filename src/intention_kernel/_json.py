"""Strict JSON for values the kernel stores: provider values, facts, payloads.

Stored values must survive a round trip unchanged. So everything the kernel keeps
is normalized through the same encoder that stores it. A tuple becomes a list on
first use, not only after a replay. A value is refused where it enters if JSON
cannot hold it. That is a set, an object, NaN, or a string with a lone surrogate,
which UTF-8 cannot encode. It is refused too if no reader can parse it back. That is
an integer of more than :data:`MAX_INT_DIGITS` digits.

Some keys and names are kept in a text column of their own: effect keys, fact keys,
event types. They have a rule of their own, :func:`text_problem`. PostgreSQL text
cannot hold NUL. JSON escapes NUL inside values, but a bare column cannot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "describe_error",
    "dump_value",
    "load_value",
    "normalize",
    "storable_copy",
    "storable_text",
    "text_problem",
    "too_deep",
]

#: Values nested deeper than this (objects and arrays) are refused where they enter.
#: Real inputs are a few levels deep. Far deeper ones exhaust the recursion of the
#: JSON encoders that store them. That gives a ``RecursionError``, not a clear refusal.
MAX_NESTING = 64

#: Integers of more digits than this are refused where they enter. By default Python
#: parses no longer integer from JSON: see ``sys.int_info.default_max_str_digits``.
#: Nor does pydantic's parser, which reads checkpoints and results. A longer one would
#: be written and then fail every later read of its thread. The number is fixed, not
#: read from ``sys.get_int_max_str_digits()`` in this process. A writer that raised its
#: own limit must not store what another process cannot read.
MAX_INT_DIGITS = 4300
_INT_BOUND = 10**MAX_INT_DIGITS


# One strict compact encoder for every stored value, built once. ``json.dumps`` with
# options builds an encoder per call. That costs more than encoding a small value.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_DEFAULT = _ENCODER.default  # the TypeError for what JSON cannot hold


def dump_value(value: Any) -> str:
    """Compact strict JSON; raises ``TypeError``/``ValueError`` for what JSON cannot hold,
    or no store can (``UnicodeEncodeError``, a ``ValueError``, for a lone surrogate)."""
    if c_make_encoder is None:  # an interpreter without the C accelerator
        text = _ENCODER.encode(value)
    else:
        # What ``_ENCODER.encode`` runs, without its two layers of Python: the C encoder
        # with ``_ENCODER``'s options. Made per call, as ``encode`` makes it. Its
        # ``markers`` dict detects a circular value (a ``ValueError``). One left
        # half-filled by a refused value must not be met by the next.
        encode = c_make_encoder(
            {}, _DEFAULT, encode_basestring, None, ":", ",", False, False, False
        )
        text = "".join(encode(value, 0))
    if not text.isascii():
        text.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError
    return text


def load_value(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def normalize(value: Any) -> Any:
    """``value`` as it will read back from the store (raises like :func:`dump_value`)."""
    kind = type(value)
    # The common values first, by exact type: a subclass (an enum, say) takes the
    # generic path below, which decides as it always did.
    if kind is dict or kind is list:
        plain = _plain(value, MAX_NESTING)
        if plain is not _NOT_PLAIN:
            return plain
        return _checked_round_trip(value)
    if kind is str and value.isascii():
        return value
    if isinstance(value, str):
        if not value.isascii():
            value.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT_BOUND < value < _INT_BOUND:
            raise ValueError(_TOO_LONG)
        return value
    return _checked_round_trip(value)


def _checked_round_trip(value: Any) -> Any:
    """``value`` through the encoder and back. Refused first, each with its reason, if
    it nests too deep or holds an integer too long."""
    problem = _refusal(value)
    if problem is not None:
        raise ValueError(problem)
    return json.loads(dump_value(value))


_TOO_LONG = (
    f"it holds an integer of more than {MAX_INT_DIGITS} digits, which no store can read "
    "back (store it as a string)"
)


def text_problem(text: str) -> str | None:
    """Why no store can keep ``text`` in a text column of its own (a key, an event
    type), or ``None`` if every store can."""
    if "\x00" in text:
        return "it holds a NUL character, which PostgreSQL cannot store in text"
    if not text.isascii() and not _storable(text):
        return "it holds a lone surrogate, which UTF-8 cannot encode"
    return None


def storable_text(text: str) -> str:
    """``text`` (an error message) as every store can keep it: NUL and lone surrogates
    escaped as ``\\x00`` and ``\\udXXX``, the rest unchanged."""
    if text.isascii():
        return text.replace("\x00", "\\x00") if "\x00" in text else text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def storable_copy(value: Any) -> Any:
    """``value`` with what no store can hold spelled out.

    NaN and infinities become the strings ``"NaN"``, ``"Infinity"`` and
    ``"-Infinity"``. Lone surrogates become ``\\udXXX`` escapes. Tuples become lists.
    Other values are kept, so :func:`normalize` may still refuse the copy (a set, an
    object). Lossy: only for what is shown, never run."""
    if isinstance(value, str):
        return value if value.isascii() or _storable(value) else storable_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {storable_copy(k): storable_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable_copy(item) for item in value]
    return value


def describe_error(exc: BaseException) -> str:
    """An exception as a receipt or a refusal stores it: its class name and its message.

    The message is escaped like :func:`storable_text`, the same on every store."""
    text = storable_text(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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


def _refusal(value: Any) -> str | None:
    """Why no store can keep ``value``, if it nests more than :data:`MAX_NESTING` deep
    or holds an integer of more than :data:`MAX_INT_DIGITS` digits; else ``None``.

    One iterative walk serves both rules, as :func:`too_deep` walks for one. A value
    that reaches this slow path is often large (a conversation, say). A walk per rule
    cost a turn of such values twice the calls. Exact types are tested first, the ABC
    ``isinstance`` only for what is left. The depth rule wins when both are broken,
    as it did when it was checked first.
    """
    too_long = False
    pending: list[tuple[Any, int]] = [((value,), 0)]
    while pending:
        item, depth = pending.pop()
        kind = type(item)
        children: Any = item.values() if kind is dict or isinstance(item, Mapping) else item
        for child in children:
            kind = type(child)
            if kind is str or kind is float or kind is bool or child is None:
                continue
            if kind is int:
                if not -_INT_BOUND < child < _INT_BOUND:
                    too_long = True
            elif kind is dict or kind is list or isinstance(child, (Mapping, list, tuple)):
                if depth + 1 > MAX_NESTING:
                    return f"value is nested more than {MAX_NESTING} levels deep"
                pending.append((child, depth + 1))
            elif (
                isinstance(child, int)
                and not isinstance(child, bool)
                and not -_INT_BOUND < child < _INT_BOUND
            ):
                too_long = True
    return _TOO_LONG if too_long else None


def _plain(value: Any, depth: int) -> Any:
    """A copy of the dict or list ``value`` if it is plain, else ``_NOT_PLAIN``.

    Plain means made only of dicts with ``str`` keys and lists. Their leaves are
    exact ``str``, ``int``, ``bool`` and ``None`` values or finite floats. They nest at
    most ``depth`` levels deep. JSON round-trips those unchanged, so they skip an
    encode and a decode. A finite float reads back as itself: the encoder writes the
    shortest exact ``repr`` of it. For a large value (a conversation) the copy is
    cheaper than the round trip. The round trip also walks the value first, for the
    rules the encoder does not check. Each item is checked inline, not by a call per
    item. Most values are a handful of scalars.
    The dict's loop and the list's are spelled out apart on purpose. One loop over a
    dict's values, zipped back with its keys, made the check slower than the rest."""
    if type(value) is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or _storable(key)):
                return _NOT_PLAIN
            kind = type(item)
            if kind is str:
                if not (item.isascii() or _storable(item)):
                    return _NOT_PLAIN
            elif kind is int:
                if not -_INT_BOUND < item < _INT_BOUND:
                    return _NOT_PLAIN  # refused, with its reason, by the slow path
            elif kind is float:
                if item - item != 0.0:  # NaN or an infinity, refused by the slow path
                    return _NOT_PLAIN
            elif kind is dict or kind is list:
                if depth == 1:
                    return _NOT_PLAIN
                item = _plain(item, depth - 1)
                if item is _NOT_PLAIN:
                    return _NOT_PLAIN
            elif item is not None and kind is not bool:
                return _NOT_PLAIN
            out[key] = item
        return out
    items = []
    for item in value:  # a list: the same rules as a dict's values
        kind = type(item)
        if kind is str:
            if not (item.isascii() or _storable(item)):
                return _NOT_PLAIN
        elif kind is int:
            if not -_INT_BOUND < item < _INT_BOUND:
                return _NOT_PLAIN
        elif kind is float:
            if item - item != 0.0:
                return _NOT_PLAIN
        elif kind is dict or kind is list:
            if depth == 1:
                return _NOT_PLAIN
            item = _plain(item, depth - 1)
            if item is _NOT_PLAIN:
                return _NOT_PLAIN
        elif item is not None and kind is not bool:
            return _NOT_PLAIN
        items.append(item)
    return items


def _storable(text: str) -> bool:
    """Whether UTF-8, hence every store, can hold ``text`` (not a lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
