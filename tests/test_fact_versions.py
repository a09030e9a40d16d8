"""Versions of a thread's facts read as they were built, in any order of reads."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from intention_kernel._facts import DerivedFacts, Evidence, FactRecord

KEYS = st.sampled_from([f"k{i}" for i in range(8)])


def record(key: str, version: int) -> FactRecord:
    return FactRecord(key, version, version, Evidence("cap", f"t{version}", "s"))


@given(
    first=st.sets(KEYS, max_size=4),
    turns=st.lists(st.sets(KEYS, min_size=1, max_size=3), min_size=1, max_size=8),
    reads=st.lists(
        st.tuples(st.integers(0, 8), st.sampled_from(["len", "items", "in", "get", "[]"]))
    ),
)
def test_every_version_reads_as_built_whatever_was_read_before(
    first: set[str], turns: list[set[str]], reads: list[tuple[int, str]]
) -> None:
    expected: list[dict[str, FactRecord]] = [{key: record(key, 0) for key in sorted(first)}]
    versions: list[Mapping[str, FactRecord]] = [dict(expected[0])]
    for number, keys in enumerate(turns, start=1):
        changes = {key: record(key, number) for key in sorted(keys)}
        versions.append(DerivedFacts(versions[-1], changes))
        expected.append({**expected[-1], **changes})
    # Reading an older version moves the shared dict to it. One key of a version next
    # to the holder is read through its changes instead. A later read of another
    # version must still see that version's own facts, its size included.
    for index, how in reads:
        index %= len(versions)
        version, want = versions[index], expected[index]
        if how == "len":
            assert len(version) == len(want)
        elif how == "items":
            assert dict(version.items()) == want
        elif how == "in":
            assert all(key in version for key in want)
            assert all(f"k{i}" not in version for i in range(8) if f"k{i}" not in want)
        elif how == "get":
            assert {key: version.get(key) for key in want} == want
            assert all(version.get(f"k{i}") is None for i in range(8) if f"k{i}" not in want)
        else:
            assert {key: version[key] for key in want} == want
            for missing in (f"k{i}" for i in range(8) if f"k{i}" not in want):
                with pytest.raises(KeyError):
                    version[missing]
    for version, want in zip(versions, expected, strict=True):
        assert len(version) == len(want)
        assert dict(version) == want
