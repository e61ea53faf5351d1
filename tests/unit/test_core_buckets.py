"""Entry buckets (DESIGN §3, PIP-486): geometry, counts and the rebucket rollover."""

from __future__ import annotations

import bisect
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalable_topics.core.buckets import (
    DEFAULT_BUCKET_BUDGET,
    N_MAX,
    bucket_boundaries,
    bucket_of,
    bucket_range,
    child_buckets,
    initial_buckets,
    initial_layout_buckets,
    layout_buckets,
    merge_child_buckets,
    rebucket,
    split_child_buckets,
)
from scalable_topics.core.hashing import bucket_hash
from scalable_topics.core.layout import HashRange, SegmentInfo, SegmentLayout, SegmentState


def test_constants() -> None:
    assert N_MAX == 1024
    assert DEFAULT_BUCKET_BUDGET == 4


def test_boundaries() -> None:
    assert bucket_boundaries(1) == [0]
    assert bucket_boundaries(2) == [0, 0x8000]
    assert bucket_boundaries(3) == [0, 21845, 43690]
    assert bucket_boundaries(4) == [0, 0x4000, 0x8000, 0xC000]
    assert bucket_boundaries(7) == [0, 9362, 18724, 28086, 37449, 46811, 56173]
    assert bucket_boundaries(65536) == list(range(65536))


def test_ranges_inclusive() -> None:
    assert bucket_range(0, 1) == (0, 0xFFFF)
    assert [bucket_range(i, 4) for i in range(4)] == [
        (0x0000, 0x3FFF),
        (0x4000, 0x7FFF),
        (0x8000, 0xBFFF),
        (0xC000, 0xFFFF),
    ]
    assert [bucket_range(i, 3) for i in range(3)] == [(0, 21844), (21845, 43689), (43690, 65535)]


def test_bucket_of() -> None:
    assert bucket_of(0, 4) == 0
    assert bucket_of(0x3FFF, 4) == 0
    assert bucket_of(0x4000, 4) == 1
    assert bucket_of(0xFFFF, 4) == 3
    assert bucket_of(21844, 3) == 0 and bucket_of(21845, 3) == 1
    assert bucket_of(43689, 3) == 1 and bucket_of(43690, 3) == 2
    assert bucket_of(0xFFFF, 1) == 0
    assert bucket_of(bucket_hash("hello"), 4) == 3  # hashB 0xfa47
    assert bucket_of(bucket_hash("key-1"), 4) == 0  # hashB 0x15a0


@pytest.mark.parametrize(
    "call",
    [
        lambda: bucket_boundaries(0),
        lambda: bucket_boundaries(65537),
        lambda: bucket_boundaries(True),
        lambda: bucket_of(-1, 4),
        lambda: bucket_of(0x10000, 4),
        lambda: bucket_of(5, 0),
        lambda: bucket_range(4, 4),
        lambda: bucket_range(-1, 4),
        lambda: bucket_range(0, 0),
    ],
)
def test_geometry_rejects(call: Any) -> None:
    with pytest.raises(ValueError):
        call()


@given(st.integers(1, 65536), st.integers(0, 0xFFFF))
def test_bucket_of_agrees_with_boundaries(n: int, hash_b: int) -> None:
    starts = bucket_boundaries(n) if n <= 4096 else None
    index = bucket_of(hash_b, n)
    if starts is not None:
        assert index == bisect.bisect_right(starts, hash_b) - 1
    start, end = bucket_range(index, n)
    assert start <= hash_b <= end
    assert start == index * 65536 // n


@given(st.integers(1, 4096))
def test_buckets_partition_the_ring(n: int) -> None:
    expected = 0
    for i in range(n):
        start, end = bucket_range(i, n)
        assert start == expected and start <= end
        expected = end + 1
    assert expected == 0x10000


def test_initial_buckets() -> None:
    assert initial_buckets() == 4
    assert initial_buckets(4, 1) == 4
    assert initial_buckets(4, 2) == 2
    assert initial_buckets(4, 3) == 1
    assert initial_buckets(4, 4) == 1
    assert initial_buckets(4, 64) == 1
    assert initial_buckets(10, 3) == 3
    assert initial_buckets(5000, 1) == 1024
    assert initial_buckets(5000, 1, n_max=2048) == 2048
    for bad in [(0, 1), (4, 0), (-1, 2)]:
        with pytest.raises(ValueError):
            initial_buckets(*bad)


def test_split_and_merge_child_buckets() -> None:
    assert split_child_buckets(4) == 2
    assert split_child_buckets(5) == 2
    assert split_child_buckets(2) == 1
    assert split_child_buckets(1) == 1
    assert merge_child_buckets(1, 1) == 2
    assert merge_child_buckets(2, 3, 4) == 9
    assert merge_child_buckets(1000, 100) == 1024
    assert merge_child_buckets(1000, 100, n_max=4096) == 1100
    with pytest.raises(ValueError, match="two or more"):
        merge_child_buckets(4)
    with pytest.raises(ValueError):
        split_child_buckets(0)
    with pytest.raises(ValueError):
        merge_child_buckets(1, 0)


def test_initial_layout_buckets() -> None:
    assert initial_layout_buckets(SegmentLayout.initial(1)) == {0: 4}
    assert initial_layout_buckets(SegmentLayout.initial(2)) == {0: 2, 1: 2}
    assert initial_layout_buckets(SegmentLayout.initial(3)) == {0: 1, 1: 1, 2: 1}
    assert initial_layout_buckets(SegmentLayout.initial(2), budget=16) == {0: 8, 1: 8}


def test_child_buckets_after_split_merge_and_rebucket() -> None:
    layout = SegmentLayout.initial(1)
    counts = {0: 4}
    layout = layout.split(0)
    assert child_buckets(layout, 1, counts) == 2
    assert child_buckets(layout, 2, counts) == 2
    counts |= {1: 2, 2: 2}
    merged = layout.merge(1, 2)
    assert child_buckets(merged, 3, counts) == 4
    rolled = rebucket(merged, [3])
    with pytest.raises(ValueError, match="rebucket successor"):
        child_buckets(rolled, 4, counts | {3: 4})
    assert child_buckets(rolled, 4, counts | {3: 4}, rebucketed=16) == 16
    assert child_buckets(rolled, 4, counts | {3: 4}, rebucketed=5000) == 1024


def test_child_buckets_errors() -> None:
    layout = SegmentLayout.initial(2).merge(0, 1)
    with pytest.raises(ValueError, match="no parents"):
        child_buckets(layout, 0, {})
    with pytest.raises(ValueError, match=r"parent 8000-ffff-1 is unknown"):
        child_buckets(layout, 2, {0: 1})
    with pytest.raises(ValueError, match="not found"):
        child_buckets(layout, 9, {})
    # once one merge parent is pruned, the child looks like a single-parent segment that is
    # wider than its parent: the count cannot be recomputed
    pruned = layout.prune(1)
    with pytest.raises(ValueError, match="pruned"):
        child_buckets(pruned, 2, {0: 1})


def test_layout_buckets_follows_a_history() -> None:
    layout = SegmentLayout.initial(1)
    counts = initial_layout_buckets(layout)  # {0: 4}
    layout = layout.split(0)  # 1, 2
    layout = layout.split(1)  # 3, 4
    layout = layout.merge(4, 2)  # 5
    layout = rebucket(layout, [3, 5])  # 6 <- 3, 7 <- 5
    result = layout_buckets(layout, counts, rebucketed={6: 8, 7: 8})
    assert result == {0: 4, 1: 2, 2: 2, 3: 1, 4: 1, 5: 3, 6: 8, 7: 8}
    with pytest.raises(ValueError, match="rebucket successor"):
        layout_buckets(layout, counts)
    with pytest.raises(ValueError, match="no parents"):
        layout_buckets(layout, {})
    # known counts win, and counts of pruned segments are dropped
    pruned = layout.prune(0)
    assert layout_buckets(pruned, result) == {k: v for k, v in result.items() if k != 0}


def test_rebucket_layout() -> None:
    base = SegmentLayout.initial(3).split(1)  # active 0, 3, 4, 2; next id 5; epoch 1
    rolled = rebucket(base, [4, 0])
    assert rolled.epoch == 2
    assert rolled.next_segment_id == 7
    assert rolled.segments[5] == SegmentInfo(
        5, base.segments[4].hash_range, parent_ids=(4,), created_at_epoch=2
    )
    assert rolled.segments[6] == SegmentInfo(
        6, HashRange(0, 0x5554), parent_ids=(0,), created_at_epoch=2
    )
    assert rolled.segments[4].state is SegmentState.SEALED
    assert rolled.segments[4].child_ids == (5,) and rolled.segments[4].sealed_at_epoch == 2
    assert rolled.segments[0].child_ids == (6,) and rolled.segments[0].sealed_at_epoch == 2
    assert [s.hash_range for s in rolled.active()] == [s.hash_range for s in base.active()]
    assert [s.segment_id for s in rolled.active()] == [6, 3, 5, 2]
    assert rolled.merge_depth(5) == 0
    assert rolled.lineage(5) == [1, 4, 5]
    rolled.validate()
    assert SegmentLayout.from_metadata(rolled.to_metadata()) == rolled
    # the original is untouched
    assert base.segments[4].state is SegmentState.ACTIVE and base.epoch == 1


def test_rebucket_does_not_add_merge_depth() -> None:
    layout = rebucket(SegmentLayout.initial(2).merge(0, 1), [2])
    assert layout.merge_depth(3) == 1
    assert layout.merge_depth(2) == 1


def test_rebucket_errors() -> None:
    layout = SegmentLayout.initial(2).split(0)
    with pytest.raises(ValueError, match="no segment named"):
        rebucket(layout, [])
    with pytest.raises(ValueError, match="segment 9: not found"):
        rebucket(layout, [1, 9])
    with pytest.raises(ValueError, match=r"0000-7fff-0: it is SEALED, not ACTIVE"):
        rebucket(layout, [0])
    with pytest.raises(ValueError, match="named twice"):
        rebucket(layout, [1, 1])
