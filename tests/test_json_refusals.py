"""The two rules a stored value's slow path checks in one walk (``_json._refusal``):
no nesting deeper than ``MAX_NESTING``, no integer longer than ``MAX_INT_DIGITS``
digits, wherever the value hides it, with the depth rule's reason when both break."""

from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Any

import pytest

from intention_kernel._json import MAX_INT_DIGITS, MAX_NESTING, normalize

LONG = 10**MAX_INT_DIGITS


class Big(enum.IntEnum):
    VALUE = LONG


def nested(depth: int, leaf: Any = 1) -> Any:
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1.5, "b": (LONG,)},  # a tuple: not the fast path
        OrderedDict(x=[{"y": LONG}]),  # a Mapping that is not a dict
        [1.0, {"k": [Big.VALUE]}],  # an int subclass
        (Big.VALUE,),
    ],
)
def test_an_integer_too_long_is_refused_wherever_it_is(value: Any) -> None:
    with pytest.raises(ValueError, match="digits"):
        normalize(value)


def test_nesting_is_refused_past_the_limit_and_kept_up_to_it() -> None:
    assert normalize(nested(MAX_NESTING, 1.5)) == nested(MAX_NESTING, 1.5)
    with pytest.raises(ValueError, match="nested more than"):
        normalize(nested(MAX_NESTING + 1, 1.5))
    with pytest.raises(ValueError, match="nested more than"):
        normalize(OrderedDict(a=nested(MAX_NESTING, 1.5)))


def test_the_depth_rule_gives_its_reason_when_both_rules_break() -> None:
    value = [LONG, nested(MAX_NESTING + 1, 1.5)]
    with pytest.raises(ValueError, match="nested more than"):
        normalize(value)
    with pytest.raises(ValueError, match="nested more than"):
        normalize([nested(MAX_NESTING + 1, 1.5), LONG])


def test_values_within_both_rules_round_trip() -> None:
    value = (1.5, {"a": [True, None, "é", LONG - 1]}, OrderedDict(b=(2,)))
    assert normalize(value) == [1.5, {"a": [True, None, "é", LONG - 1]}, {"b": [2]}]
