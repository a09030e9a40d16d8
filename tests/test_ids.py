"""The IDs the kernel makes: receipts and outbox events, time-ordered and never repeated."""

from __future__ import annotations

import os
import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from intention_kernel._effects import new_receipt_id
from intention_kernel._ids import TimeOrderedIds, new_id
from intention_kernel._turns import EventDraft

MS = 1_000_000  # nanoseconds


class SteppedClock:
    """A clock that reads the next of the given times, in nanoseconds."""

    def __init__(self, start: int, steps: list[int]) -> None:
        self.times = [start]
        for step in steps:
            self.times.append(self.times[-1] + step)
        self.reads = iter(self.times)

    def __call__(self) -> int:
        return next(self.reads)


def millis(id_: str, prefix: str) -> int:
    return int(id_.removeprefix(prefix)[:12], 16)


def test_receipt_and_event_ids_keep_their_prefix_and_length() -> None:
    receipt, event = new_receipt_id(), EventDraft("x").id
    for id_, prefix in ((receipt, "rcpt_"), (event, "evt_")):
        assert id_.startswith(prefix)
        digits = id_.removeprefix(prefix)
        assert len(digits) == 32 and int(digits, 16) < 2**128
        assert digits == digits.lower()


def test_ids_carry_the_current_millisecond() -> None:
    before = time.time_ns() // MS
    made = new_id("rcpt_")
    after = time.time_ns() // MS
    assert before <= millis(made, "rcpt_") <= after


@given(
    start=st.integers(min_value=0, max_value=2**47 * MS),
    # Most steps stay in the millisecond (a burst); some cross it; some step back.
    steps=st.lists(
        st.one_of(
            st.integers(min_value=0, max_value=MS - 1),
            st.integers(min_value=MS, max_value=10_000 * MS),
            st.integers(min_value=-5 * MS, max_value=-1),
        ),
        max_size=300,
    ),
)
def test_ids_sort_by_creation_and_never_repeat(start: int, steps: list[int]) -> None:
    clock = SteppedClock(start, steps)
    make = TimeOrderedIds(clock)
    made = [make("evt_") for _ in clock.times]
    # Text order is creation order (same prefix, same length, lowercase hex).
    assert made == sorted(made) and len(set(made)) == len(made)
    latest = 0
    for id_, now in zip(made, clock.times, strict=True):
        # Each ID carries the latest millisecond the clock has shown: its own, or, after
        # the clock stepped back, the one of the IDs before it, so that it sorts after them.
        latest = max(latest, now // MS)
        assert millis(id_, "evt_") == latest


@given(st.integers(min_value=1, max_value=5))
def test_an_id_made_in_a_later_millisecond_sorts_after_a_burst(extra: int) -> None:
    clock = SteppedClock(10**18, [0] * 200 + [extra * MS])
    make = TimeOrderedIds(clock)
    burst = [make("rcpt_") for _ in range(201)]
    later = make("rcpt_")
    assert len(set(burst)) == 201 and burst == sorted(burst)
    assert later > burst[-1] and millis(later, "rcpt_") == 10**18 // MS + extra


def test_threads_making_ids_at_once_never_share_one() -> None:
    made: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def burst(out: list[str]) -> None:
        start.wait()
        for _ in range(5_000):
            out.append(new_id("evt_"))

    threads = [threading.Thread(target=burst, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [id_ for out in made for id_ in out]
    assert len(set(every)) == len(every) == 40_000
    for out in made:  # each thread's IDs in the order it made them
        assert out == sorted(out)


def test_a_forked_child_never_makes_its_parents_next_id() -> None:
    """Random bits are drawn ahead, many IDs at a time: a child forked after its parent
    made an ID must not use the bytes its parent uses next, or both would make the
    same ID in one millisecond."""
    # The next ID, in the child and in the parent, is made a millisecond later: from
    # its random bits alone (an ID of the same millisecond could be the last one + 1).
    ids = TimeOrderedIds(clock=SteppedClock(1_700_000_000_000 * MS, [MS, 0]))
    ids("rcpt_")  # draws the pool the parent goes on using
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one ID, written to the pipe, then out without cleanup
        try:
            os.write(write, ids("rcpt_").encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == len("rcpt_") + 32
    assert child != ids("rcpt_")
