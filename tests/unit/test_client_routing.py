"""Pure parts of the producer: routing over the DAG and SEALED successors, pinning, batching."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from scalable_topics.client.routing import RoutingTable, plan_entries
from scalable_topics.core.hashing import bucket_hash, segment_hash
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import DagMessage, dag_message
from scalable_topics.core.wire import Successor, bucket_of


def _dag(layout: SegmentLayout) -> DagMessage:
    return dag_message(
        "ns",
        "t",
        layout,
        brokers={i: f"http://b{i % 2}:8080" for i in layout.segments},
        buckets={i: 2 for i in layout.segments},
        controller_url=None,
    )


def _successors(layout: SegmentLayout, ids: list[int]) -> list[Successor]:
    return [
        Successor(i, layout.segments[i].hash_range.start, layout.segments[i].hash_range.end)
        for i in ids
    ]


def test_routes_keys_to_the_active_segment_holding_their_hash() -> None:
    layout = SegmentLayout.initial(4)
    table = RoutingTable()
    table.update_dag(_dag(layout))
    for key in ("hello", "key-1", "a", "zzz"):
        h = segment_hash(key)
        assert table.route(h).segment_id == layout.find_active(h).segment_id
    assert table.segment_ids() == [0, 1, 2, 3]
    assert table.broker_url(3) == "http://b1:8080"
    assert table.buckets(3) == 2


def test_sealed_frame_switches_to_successors_before_the_dag_knows() -> None:
    layout = SegmentLayout.initial(2)
    table = RoutingTable()
    table.update_dag(_dag(layout))
    split = layout.split(0)
    table.seal(0, _successors(split, [2, 3]))
    assert table.route(0x0000).segment_id == 2
    assert table.route(0x7FFF).segment_id == 3
    assert table.route(0x8000).segment_id == 1
    assert table.is_sealed(0)
    # The DAG catches up: same answer.
    table.update_dag(_dag(split))
    assert table.route(0x3FFF).segment_id == 2
    assert table.route(0x4000).segment_id == 3


def test_merge_child_learnt_from_one_parent_does_not_capture_the_other() -> None:
    layout = SegmentLayout.initial(2)
    table = RoutingTable()
    table.update_dag(_dag(layout))
    merged = layout.merge(0, 1)
    table.seal(0, _successors(merged, [2]))
    assert table.route(0x1000).segment_id == 2
    assert table.route(0x9000).segment_id == 1, "segment 1's seal is not known yet"
    table.seal(1, _successors(merged, [2]))
    assert table.route(0x9000).segment_id == 2
    assert table.segment_ids() == [2]


def test_an_older_dag_does_not_undo_a_known_seal() -> None:
    layout = SegmentLayout.initial(2)
    split = layout.split(1)
    table = RoutingTable()
    table.update_dag(_dag(layout))
    table.seal(1, _successors(split, [2, 3]))
    table.update_dag(_dag(layout))  # e.g. a lagging replica after a reconnect
    assert table.route(0xFFFF).segment_id == 3


def test_busy_retired_segment_stays_pinned_until_its_own_seal() -> None:
    """A DAG push that arrives before the producer saw SEALED must not send a key's new
    messages to a child while older ones are still in flight to the parent."""
    layout = SegmentLayout.initial(2)
    split = layout.split(0)
    table = RoutingTable()
    table.update_dag(_dag(layout))
    table.update_dag(_dag(split), busy=lambda i: i == 0)
    assert table.pinned() == [0]
    assert table.route(0x1234).segment_id == 0
    assert table.route(0x9000).segment_id == 1
    assert 0 not in table.segment_ids()
    table.seal(0, _successors(split, [2, 3]))
    assert table.pinned() == []
    assert table.route(0x1234).segment_id == 2


def test_idle_retired_segment_is_not_pinned() -> None:
    layout = SegmentLayout.initial(2)
    split = layout.split(0)
    table = RoutingTable()
    table.update_dag(_dag(layout))
    table.update_dag(_dag(split), busy=lambda i: False)
    assert table.pinned() == []
    assert table.route(0x1234).segment_id == 2


def test_seal_without_successors_keeps_the_route_and_reports_sealed() -> None:
    layout = SegmentLayout.initial(1)
    table = RoutingTable()
    table.update_dag(_dag(layout))
    table.seal(0, [])
    assert table.route(5).segment_id == 0
    assert table.is_sealed(0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=6), st.data())
def test_any_chain_of_seals_keeps_the_ring_partitioned(
    points: list[int], data: st.DataObject
) -> None:
    layout = SegmentLayout.initial(2)
    table = RoutingTable()
    table.update_dag(_dag(layout))
    dag_layout = layout
    for point in points:
        active = layout.find_active(point)
        if active.hash_range.size == 1:
            continue
        new = layout.split(active.segment_id)
        table.seal(
            active.segment_id, _successors(new, list(new.segments[active.segment_id].child_ids))
        )
        layout = new
        if data.draw(st.booleans()):
            dag_layout = layout
            table.update_dag(_dag(dag_layout))
    routes = table.routes()
    assert routes[0].start == 0 and routes[-1].end == 0xFFFF
    for left, right in itertools.pairwise(routes):
        assert left.end + 1 == right.start
    for route in routes:
        assert layout.segments[route.segment_id].active
        assert layout.segments[route.segment_id].hash_range.contains(route.start)


# -- batching ---------------------------------------------------------------------------------


def _plan(
    items: list[str | None], buckets: int, max_messages: int = 100, max_bytes: int = 10**6
) -> list[list[str | None]]:
    return plan_entries(
        items,
        bucket_hash_of=lambda k: None if k is None else bucket_hash(k),
        size_of=lambda k: 10,
        buckets=buckets,
        max_messages=max_messages,
        max_bytes=max_bytes,
    )


def test_entries_never_span_buckets_and_keep_key_order() -> None:
    keys: list[str | None] = [f"k{i % 17}" for i in range(200)]
    entries = _plan(keys, buckets=4, max_messages=7)
    for entry in entries:
        lanes = {bucket_of(bucket_hash(k), 4) for k in entry if k is not None}
        assert len(lanes) == 1
        assert 1 <= len(entry) <= 7
    flat = [k for e in entries for k in e]
    assert sorted(flat, key=str) == sorted(keys, key=str)
    for key in {k for k in keys if k is not None}:
        positions = [i for i, e in enumerate(entries) for k in e if k == key]
        assert positions == sorted(positions)


def test_unkeyed_messages_get_their_own_entries_and_byte_limit_applies() -> None:
    entries = _plan([None, "a", None, "a", None], buckets=1, max_bytes=25)
    assert entries == [[None, None], ["a", "a"], [None]]


def test_one_bucket_batches_everything_together() -> None:
    keys: list[str | None] = [f"x{i}" for i in range(10)]
    assert _plan(keys, buckets=1) == [keys]


def test_oversized_message_still_forms_an_entry() -> None:
    entries = plan_entries(
        ["big", "small"],
        bucket_hash_of=lambda k: None,
        size_of=lambda k: 10**9 if k == "big" else 1,
        buckets=1,
        max_messages=10,
        max_bytes=100,
    )
    assert entries == [["big"], ["small"]]
