"""Chunk sizing by rows and time (dblog.core.chunking.next_chunk_rows)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dblog.core.chunking import MOST_GROWTH, next_chunk_rows


def size(asked: int, read: int, seconds: float) -> int:
    return next_chunk_rows(asked, read, seconds, first=1000, most=16000, target_seconds=4.0)


def test_fast_full_chunks_grow_toward_the_target_up_to_the_cap() -> None:
    assert size(1000, 1000, 1.0) == 4000  # four times under the 4 s target
    assert size(1000, 1000, 1.6) == 2500
    assert size(1000, 1000, 0.1) == 8000  # at most eightfold
    assert size(1000, 1000, 0.0) == 8000
    sizes = [1000]
    for _ in range(4):
        sizes.append(size(sizes[-1], sizes[-1], 0.5))
    assert sizes == [1000, 8000, 16000, 16000, 16000]


def test_slow_chunks_halve_down_to_the_first_size() -> None:
    assert size(16000, 16000, 9.0) == 8000
    assert size(1000, 1000, 60.0) == 1000


def test_chunks_near_the_target_and_short_chunks_keep_their_size() -> None:
    assert size(4000, 4000, 3.0) == 4000
    assert size(4000, 10, 0.01) == 4000  # the range is ending: no reason to grow


@given(asked=st.integers(1, 10**6), read=st.integers(0, 10**6),
       seconds=st.floats(0, 1000), first=st.integers(1, 10**5), most=st.integers(1, 10**6),
       target=st.floats(0, 100))
def test_the_size_stays_between_the_first_size_and_the_cap(
    asked: int, read: int, seconds: float, first: int, most: int, target: float
) -> None:
    got = next_chunk_rows(asked, min(read, asked), seconds, first=first, most=most,
                          target_seconds=target)
    assert min(first, most) <= got <= most
    assert got <= max(MOST_GROWTH * asked, min(first, most))
    if read == asked and target > 0 and seconds < target / 2:
        assert got >= min(2 * asked, most)  # a fast full chunk grows
