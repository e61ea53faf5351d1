"""Subscription cursors: ack floor plus individually acknowledged ranges, against a set model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scalable_topics.core.subscriptions import BrokerSubscriptionType
from segment_broker.storage.cursor import Cursor
from segment_broker.transfer import merge_cursor

ops = st.lists(st.tuples(st.sampled_from(["ack", "cumulative"]), st.integers(0, 60)), max_size=80)


@given(ops)
def test_cursor_matches_a_set_of_acked_positions(operations: list[tuple[str, int]]) -> None:
    cur = Cursor(name="s", type=BrokerSubscriptionType.QUEUE)
    acked: set[int] = set()
    for op, pos in operations:
        if op == "ack":
            cur.ack(pos)
            acked.add(pos)
        else:
            cur.ack_cumulative(pos)
            acked.update(range(pos + 1))
        floor = 0
        while floor in acked:
            floor += 1
        assert cur.ack_floor == floor
        for p in range(70):
            assert cur.is_acked(p) == (p in acked)
        assert cur.backlog(70) == 70 - len(acked)
        assert cur.backlog(30) == 30 - len([p for p in acked if p < 30])
        first_free = next(p for p in range(10, 200) if p not in acked)
        assert cur.next_unacked(10) == first_free
        assert all(s < e for s, e in zip(cur.starts, cur.ends, strict=True))
        assert all(e < s for e, s in zip(cur.ends, cur.starts[1:], strict=False))
    again = Cursor.from_json(cur.to_json())
    assert (again.ack_floor, again.starts, again.ends, again.acked_above) == (
        cur.ack_floor,
        cur.starts,
        cur.ends,
        cur.acked_above,
    )


def test_ack_reports_whether_anything_changed() -> None:
    cur = Cursor(name="s", type=BrokerSubscriptionType.EXCLUSIVE)
    assert cur.ack(3)
    assert not cur.ack(3)
    assert cur.ack_cumulative(5)
    assert not cur.ack(2)
    assert cur.ack_floor == 6 and not cur.starts


def test_subscription_type_aliases() -> None:
    assert BrokerSubscriptionType.parse("Stream") is BrokerSubscriptionType.EXCLUSIVE
    assert BrokerSubscriptionType.parse("key_shared") is BrokerSubscriptionType.KEY_SHARED
    assert BrokerSubscriptionType.parse("Shared") is BrokerSubscriptionType.QUEUE


def test_partial_acks_are_kept_until_the_entry_is_acknowledged_and_persisted() -> None:
    cur = Cursor(name="s", type=BrokerSubscriptionType.EXCLUSIVE)
    assert cur.ack_partial(3, frozenset({0}))
    assert cur.ack_partial(3, frozenset({1, 2}))
    assert not cur.ack_partial(3, frozenset({1})), "nothing new"
    assert cur.ack_partial(5, frozenset({4})) and cur.ack_partial(9, frozenset({0}))
    assert cur.partial == {3: {0, 1, 2}, 5: {4}, 9: {0}}
    version = cur.version
    restored = Cursor.from_json(cur.to_json())
    assert restored.partial == cur.partial and version > 0

    cur.ack(5)
    assert 5 not in cur.partial and not cur.ack_partial(5, frozenset({7})), "acked whole"
    cur.ack_cumulative(3)
    assert cur.partial == {9: {0}}
    cur.truncate(8)
    assert cur.partial == {} and "partialAcks" not in cur.to_json()
    # a stored record of an entry that is acknowledged by now is dropped on load
    body = cur.to_json() | {"partialAcks": [[2, [0]], [20, [1]], [21, []]]}
    assert Cursor.from_json(body).partial == {20: {1}}


def test_a_moved_cursor_keeps_the_batch_indexes_acknowledged_of_its_entries() -> None:
    source = Cursor(name="s", type=BrokerSubscriptionType.EXCLUSIVE)
    source.ack_cumulative(1)
    source.ack(4)
    source.ack_partial(3, frozenset({0, 1}))
    source.ack_partial(6, frozenset({2}))
    into = Cursor(name="s", type=BrokerSubscriptionType.EXCLUSIVE)
    into.ack_partial(6, frozenset({0}))
    assert merge_cursor(into, source)
    assert (into.ack_floor, into.is_acked(4)) == (2, True)
    assert into.partial == {3: {0, 1}, 6: {0, 2}}
    assert not merge_cursor(into, source), "merging again changes nothing"
