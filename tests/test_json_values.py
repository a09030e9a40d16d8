"""Stored values: ``normalize`` gives what the store will read back, by any path.

``normalize`` copies the common plain values without a JSON round trip. Those are
dicts, lists, strings, ints, finite floats, booleans and None. Whatever path it takes,
the result must be exactly the round trip's. A value the store cannot hold must be
refused the same way.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from intention_kernel._json import dump_value, load_value, normalize

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def round_trip(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False, ensure_ascii=False))


@given(VALUES)
@example({"usage": {"seconds": -0.0, "tokens": 3}, "scores": [-1.5, 1.0, 2]})
@example([[{"at": 1e300, "under": -2.5e-300}]])
def test_normalize_is_the_json_round_trip_and_a_copy(value: Any) -> None:
    expected = round_trip(value)
    normalized = normalize(value)
    assert normalized == expected
    assert type(normalized) is type(expected)  # a tuple comes back a list, 1.0 a float
    # The same stored text, at every depth: -0.0 is not 0.0 there, nor 1.0 the integer 1.
    assert dump_value(normalized) == dump_value(expected)
    assert load_value(dump_value(normalized)) == expected
    if isinstance(value, dict | list) and value:
        assert normalized is not value  # the stored copy does not follow later changes


@pytest.mark.parametrize(
    "value",
    [
        {"amount": math.nan},
        [1, {"x": math.inf}],
        {"tags": {"a"}},
        {"at": object()},
        {"name": "\ud800"},  # a lone surrogate: UTF-8, hence no store, can hold it
        {"\ud800": 1},
    ],
)
def test_a_value_no_store_can_hold_is_refused(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        normalize(value)
    with pytest.raises((TypeError, ValueError)):
        dump_value(value)


def test_non_string_keys_read_back_as_strings() -> None:
    assert normalize({1: "a", 2.5: "b", None: "c"}) == {"1": "a", "2.5": "b", "null": "c"}


@given(VALUES)
def test_stored_text_is_the_strict_compact_encoding(value: Any) -> None:
    """Stored bytes must not depend on how ``dump_value`` reaches the encoder."""
    expected = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    assert dump_value(value) == expected


def test_a_circular_value_is_refused_and_leaves_nothing_behind() -> None:
    inner: list[Any] = []
    value = {"a": inner}
    inner.append(value)
    with pytest.raises(ValueError, match="Circular reference"):
        dump_value(value)
    with pytest.raises(ValueError, match="nested"):
        normalize(value)
    # A refused value met midway must not be taken for a circular one by a later call.
    inner.clear()
    unstorable = {"a": inner, "b": object()}
    with pytest.raises(TypeError):
        dump_value(unstorable)
    del unstorable["b"]
    assert dump_value(unstorable) == '{"a":[]}'
