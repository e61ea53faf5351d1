"""The auto split/merge decision (DESIGN §3, PIP-483, PIP-486 rebucket) with exact numbers."""

from __future__ import annotations

import math
from typing import Any

import pytest

from scalable_topics.core.buckets import rebucket
from scalable_topics.core.evaluator import (
    Decision,
    LoadSample,
    Merge,
    Rebucket,
    Split,
    Suppression,
    decide,
    decide_explained,
)
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.policy import MIB, AutoScalePolicy

NOW = 1_700_000_000.0
DEFAULT = AutoScalePolicy()
OLD = 3600.0  # well past the default 5-minute merge window


def sample(
    mi: float = 0.0, bi: float = 0.0, mo: float = 0.0, bo: float = 0.0, age: float = OLD
) -> LoadSample:
    return LoadSample(mi, bi, mo, bo, NOW - age)


def run(
    layout: SegmentLayout,
    load: dict[int, LoadSample] | None = None,
    consumers: dict[str, int] | None = None,
    policy: AutoScalePolicy = DEFAULT,
    *,
    last_split_at: float | None = None,
    last_merge_at: float | None = None,
    **kwargs: Any,
) -> Decision:
    decision = decide_explained(
        layout, load or {}, consumers or {}, policy, NOW, last_split_at, last_merge_at, **kwargs
    )
    plain = decide(
        layout, load or {}, consumers or {}, policy, NOW, last_split_at, last_merge_at, **kwargs
    )
    assert plain == decision.action
    return decision


# -- basics ------------------------------------------------------------------------------------


def test_disabled_policy_does_nothing() -> None:
    policy = AutoScalePolicy(enabled=False)
    layout = SegmentLayout.initial(2)
    decision = run(layout, {0: sample(mi=1e9), 1: sample(mi=1e9)}, {"s": 50}, policy)
    assert decision == Decision(None, (Suppression.DISABLED,))


def test_quiet_topic_does_nothing() -> None:
    assert run(SegmentLayout.initial(1)) == Decision(None, ())
    assert run(SegmentLayout.initial(1), {0: sample(mi=5000)}) == Decision(None, ())


def test_action_equality_ignores_detail() -> None:
    assert Split(1, "msg-rate-in", detail="x") == Split(1, "msg-rate-in")
    assert Merge((1, 2), "cold", detail="y") == Merge((1, 2), "cold")
    assert Rebucket((1,), 4, "consumer-count", detail="z") == Rebucket((1,), 4, "consumer-count")


@pytest.mark.parametrize(
    "values",
    [(-1, 0, 0, 0, 0), (0, math.nan, 0, 0, 0), (0, 0, math.inf, 0, 0), (0, 0, 0, 0, math.nan)],
)
def test_load_sample_validation(values: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        LoadSample(*values)


def test_bucket_max_validation() -> None:
    with pytest.raises(ValueError, match="bucket_max"):
        decide(SegmentLayout.initial(1), {}, {}, DEFAULT, NOW, None, None, bucket_max=0)


# -- load-driven split -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "threshold", "reason"),
    [
        ("mi", 10_000.0, "msg-rate-in"),
        ("bi", 50.0 * MIB, "bytes-rate-in"),
        ("mo", 50_000.0, "msg-rate-out"),
        ("bo", 250.0 * MIB, "bytes-rate-out"),
    ],
)
def test_load_split_is_strictly_above_threshold(field: str, threshold: float, reason: str) -> None:
    layout = SegmentLayout.initial(2)
    at = run(layout, {1: sample(**{field: threshold})})
    assert at.action is None
    above = run(layout, {1: sample(**{field: math.nextafter(threshold, math.inf)})})
    assert above.action == Split(1, reason)
    assert above.suppressed == ()


def test_load_split_detail_names_the_numbers() -> None:
    decision = run(SegmentLayout.initial(2), {0: sample(mi=12_000)})
    assert isinstance(decision.action, Split)
    assert decision.action.detail == (
        "segment 0000-7fff-0 msgRateIn 12000/s is 1.2x the split threshold 10000/s"
    )
    assert decision.action.at is None


def test_highest_score_is_split() -> None:
    layout = SegmentLayout.initial(3)
    load = {
        0: sample(mi=15_000),  # 1.5
        1: sample(bo=300 * MIB),  # 1.2
        2: sample(mo=80_000),  # 1.6
    }
    assert run(layout, load).action == Split(2, "msg-rate-out")


def test_reason_is_the_metric_with_the_largest_ratio() -> None:
    layout = SegmentLayout.initial(1)
    load = {0: sample(mi=12_000, mo=75_000, bi=10 * MIB)}  # 1.2, 1.5, 0.2
    assert run(layout, load).action == Split(0, "msg-rate-out")


def test_metric_tie_goes_to_the_first_metric() -> None:
    layout = SegmentLayout.initial(1)
    load = {0: sample(mi=20_000, bi=100 * MIB, mo=100_000, bo=500 * MIB)}  # all 2.0
    assert run(layout, load).action == Split(0, "msg-rate-in")
    load = {0: sample(bi=100 * MIB, bo=500 * MIB)}
    assert run(layout, load).action == Split(0, "bytes-rate-in")


def test_score_tie_goes_to_the_lowest_id() -> None:
    layout = SegmentLayout.initial(2).split(0)  # active by range: 2, 3, 1
    load = {2: sample(mi=20_000), 3: sample(mo=100_000), 1: sample(bo=500 * MIB)}  # all 2.0
    assert run(layout, load).action == Split(1, "bytes-rate-out")


def test_segments_without_samples_never_split_on_load() -> None:
    assert run(SegmentLayout.initial(4), {}).action is None


def test_custom_thresholds() -> None:
    policy = AutoScalePolicy(split_msg_rate_in_threshold=2000, merge_msg_rate_in_threshold=100)
    layout = SegmentLayout.initial(1)
    assert run(layout, {0: sample(mi=2000)}, policy=policy).action is None
    assert run(layout, {0: sample(mi=2001)}, policy=policy).action == Split(0, "msg-rate-in")


# -- split gates -------------------------------------------------------------------------------


def test_split_cooldown_boundary() -> None:
    layout = SegmentLayout.initial(1)
    load = {0: sample(mi=20_000)}
    inside = run(layout, load, last_split_at=NOW - 59.999)
    assert inside == Decision(None, (Suppression.SPLIT_COOLDOWN,))
    assert run(layout, load, last_split_at=NOW - 60.0).action == Split(0, "msg-rate-in")
    assert run(layout, load, last_split_at=NOW - 600.0).action == Split(0, "msg-rate-in")
    no_cooldown = AutoScalePolicy(split_cooldown=0)
    assert run(layout, load, policy=no_cooldown, last_split_at=NOW).action == Split(
        0, "msg-rate-in"
    )


def test_max_segments_boundary() -> None:
    policy = AutoScalePolicy(max_segments=4)
    load = {0: sample(mi=20_000)}
    assert run(SegmentLayout.initial(3), load, policy=policy).action == Split(0, "msg-rate-in")
    at_max = run(SegmentLayout.initial(4), load, policy=policy)
    assert at_max == Decision(None, (Suppression.MAX_SEGMENTS,))
    above_max = run(SegmentLayout.initial(5), load, policy=policy)
    assert above_max == Decision(None, (Suppression.MAX_SEGMENTS,))


def test_both_split_gates_are_reported() -> None:
    policy = AutoScalePolicy(max_segments=1)
    decision = run(
        SegmentLayout.initial(1), {0: sample(mi=20_000)}, policy=policy, last_split_at=NOW
    )
    assert decision == Decision(None, (Suppression.MAX_SEGMENTS, Suppression.SPLIT_COOLDOWN))


def test_no_suppression_reported_when_nothing_was_wanted() -> None:
    policy = AutoScalePolicy(max_segments=1)
    assert run(SegmentLayout.initial(1), {0: sample(mi=10)}, policy=policy, last_split_at=NOW) == (
        Decision(None, ())
    )


def test_single_hash_segment_is_never_split() -> None:
    layout = SegmentLayout.initial(1).split(0, at=0)  # 1 = 0000-0000, 2 = 0001-ffff
    hot = run(layout, {1: sample(mi=50_000)})
    assert hot == Decision(None, (Suppression.UNSPLITTABLE,))
    # the consumer rule picks the busiest *splittable* segment
    busy = run(layout, {1: sample(mi=50_000), 2: sample(mi=10)}, {"s": 3})
    assert busy.action == Split(2, "consumer-count")


# -- consumer-driven split ---------------------------------------------------------------------


def test_consumer_count_split() -> None:
    layout = SegmentLayout.initial(2)
    load = {0: sample(mi=100), 1: sample(mi=900)}
    decision = run(layout, load, {"orders": 3, "audit": 1})
    assert decision.action == Split(1, "consumer-count")
    assert isinstance(decision.action, Split)
    assert decision.action.detail == (
        "3 ordered consumers on a subscription exceed 2 active segments; busiest segment "
        "8000-ffff-1 (msgRateIn 900/s)"
    )


def test_consumer_count_equal_to_segments_does_not_split() -> None:
    layout = SegmentLayout.initial(2)
    assert run(layout, {0: sample(mi=100)}, {"orders": 2, "audit": 1}).action is None


def test_consumer_count_uses_the_largest_subscription_not_the_sum() -> None:
    layout = SegmentLayout.initial(3)
    assert run(layout, {}, {"a": 2, "b": 2, "c": 3}).action is None
    assert run(layout, {}, {"a": 2, "b": 4}).action == Split(0, "consumer-count")


def test_consumer_split_missing_samples_count_as_zero_and_ties_go_to_lowest_id() -> None:
    layout = SegmentLayout.initial(2).split(0)  # active by range: 2, 3, 1
    assert run(layout, {}, {"s": 4}).action == Split(1, "consumer-count")
    assert run(layout, {3: sample(mi=1)}, {"s": 4}).action == Split(3, "consumer-count")
    load = {2: sample(mi=7), 3: sample(mi=7), 1: sample(mi=5)}
    assert run(layout, load, {"s": 4}).action == Split(2, "consumer-count")


def test_consumer_rule_comes_before_load_rule() -> None:
    layout = SegmentLayout.initial(2)
    load = {0: sample(mi=100, bo=1000 * MIB), 1: sample(mi=200)}  # 0 is hot on bytes out
    assert run(layout, load, {"s": 3}).action == Split(1, "consumer-count")
    assert run(layout, load, {"s": 2}).action == Split(0, "bytes-rate-out")


def test_consumer_split_respects_the_cooldown() -> None:
    layout = SegmentLayout.initial(1)
    decision = run(layout, {}, {"s": 2}, last_split_at=NOW - 30)
    assert decision == Decision(None, (Suppression.SPLIT_COOLDOWN,))
    assert run(layout, {}, {"s": 2}, last_split_at=NOW - 60).action == Split(0, "consumer-count")


# -- rebucket (PIP-486) ------------------------------------------------------------------------


MAX4 = AutoScalePolicy(max_segments=4)


def test_rebucket_at_max_segments() -> None:
    layout = SegmentLayout.initial(4)
    decision = run(layout, {}, {"s": 10}, MAX4, buckets={0: 1, 1: 1, 2: 1, 3: 1})
    assert decision.action == Rebucket((0, 1, 2, 3), 3, "consumer-count")
    assert decision.suppressed == (Suppression.MAX_SEGMENTS,)
    assert isinstance(decision.action, Rebucket)
    assert decision.action.detail.endswith("buckets 4 -> 12")


def test_rebucket_raises_only_the_smallest_counts() -> None:
    layout = SegmentLayout.initial(4)
    buckets = {0: 4, 1: 1, 2: 1, 3: 1}
    # level 2 gives 4 + 2 + 2 + 2 = 10 >= 8; level 1 gives 7
    assert run(layout, {}, {"s": 8}, MAX4, buckets=buckets).action == Rebucket(
        (1, 2, 3), 2, "consumer-count"
    )
    # level 4 gives 16 >= 13; level 3 gives 13 as well
    assert run(layout, {}, {"s": 13}, MAX4, buckets=buckets).action == Rebucket(
        (1, 2, 3), 3, "consumer-count"
    )
    # level 5 gives 20 >= 17 and raises segment 0 too
    assert run(layout, {}, {"s": 17}, MAX4, buckets=buckets).action == Rebucket(
        (0, 1, 2, 3), 5, "consumer-count"
    )


def test_rebucket_not_needed_when_buckets_already_cover_the_consumers() -> None:
    layout = SegmentLayout.initial(4)
    decision = run(layout, {}, {"s": 7}, MAX4, buckets={0: 4, 1: 1, 2: 1, 3: 1})
    assert decision == Decision(None, (Suppression.BUCKETS_SUFFICE,))


def test_buckets_covering_the_consumers_stop_consumer_splits_below_max_segments() -> None:
    """PIP-486: consumers beyond the segments but within their buckets share buckets; the
    topic neither splits nor rebuckets for them (the load rule still splits a hot segment)."""
    layout = SegmentLayout.initial(2)
    hot = {0: sample(mi=20_000), 1: sample(mi=900)}
    decision = run(layout, hot, {"s": 4}, buckets={0: 2, 1: 2})
    assert decision.action == Split(0, "msg-rate-in")
    assert decision.suppressed == (Suppression.BUCKETS_SUFFICE,)
    quiet = run(layout, {1: sample(mi=900)}, {"s": 4}, buckets={0: 2, 1: 2})
    assert quiet == Decision(None, (Suppression.BUCKETS_SUFFICE,))
    # beyond the buckets, a busy topic splits (segments first) ...
    busy = run(layout, {1: sample(mi=5000)}, {"s": 5}, buckets={0: 2, 1: 2})
    assert busy.action == Split(1, "consumer-count")


def test_rebucket_never_exceeds_bucket_max() -> None:
    layout = SegmentLayout.initial(4)
    ones = {0: 1, 1: 1, 2: 1, 3: 1}
    assert run(layout, {}, {"s": 10_000}, MAX4, buckets=ones).action == Rebucket(
        (0, 1, 2, 3), 1024, "consumer-count"
    )
    small = run(layout, {}, {"s": 20}, MAX4, buckets={0: 2, 1: 1, 2: 1, 3: 1}, bucket_max=2)
    assert small.action == Rebucket((1, 2, 3), 2, "consumer-count")
    full = run(layout, {}, {"s": 20}, MAX4, buckets={0: 2, 1: 2, 2: 3, 3: 2}, bucket_max=2)
    assert full == Decision(None, (Suppression.MAX_SEGMENTS, Suppression.BUCKET_MAX))


def test_rebucket_needs_every_active_bucket_count() -> None:
    layout = SegmentLayout.initial(4)
    missing = run(layout, {}, {"s": 10}, MAX4, buckets={0: 1, 1: 1, 2: 1})
    assert missing == Decision(None, (Suppression.MAX_SEGMENTS, Suppression.BUCKETS_UNKNOWN))
    absent = run(layout, {}, {"s": 10}, MAX4)
    assert absent == Decision(None, (Suppression.MAX_SEGMENTS, Suppression.BUCKETS_UNKNOWN))


def test_rebucket_rejects_invalid_counts() -> None:
    with pytest.raises(ValueError, match="bucket count of segment 3"):
        run(SegmentLayout.initial(4), {}, {"s": 10}, MAX4, buckets={0: 1, 1: 1, 2: 1, 3: 0})


def test_rebucket_respects_the_split_cooldown() -> None:
    layout = SegmentLayout.initial(4)
    ones = {0: 1, 1: 1, 2: 1, 3: 1}
    decision = run(layout, {}, {"s": 10}, MAX4, buckets=ones, last_split_at=NOW - 1)
    assert decision == Decision(None, (Suppression.MAX_SEGMENTS, Suppression.SPLIT_COOLDOWN))


def test_rebucket_names_segments_in_range_order() -> None:
    layout = rebucket(SegmentLayout.initial(2).split(0), [1])  # active by range: 2, 3, 4
    layout = layout.split(4)  # active by range: 2, 3, 5, 6
    buckets = {2: 1, 3: 2, 5: 1, 6: 1}
    assert run(layout, {}, {"s": 8}, MAX4, buckets=buckets).action == Rebucket(
        (2, 5, 6), 2, "consumer-count"
    )


def test_below_max_segments_a_busy_topic_splits_and_a_quiet_one_rebuckets() -> None:
    """Segments first only where throughput justifies one: a busiest segment below the merge
    threshold would split into cold children that merge back (PIP-486 use case 2)."""
    layout = SegmentLayout.initial(3)
    busy = run(layout, {0: sample(mi=1000)}, {"s": 10}, MAX4, buckets={0: 1, 1: 1, 2: 1})
    assert busy.action == Split(0, "consumer-count")
    quiet = run(layout, {0: sample(mi=999)}, {"s": 10}, MAX4, buckets={0: 1, 1: 1, 2: 1})
    assert quiet.action == Rebucket((0, 1, 2), 4, "consumer-count")
    assert isinstance(quiet.action, Rebucket)
    assert "below the merge threshold 1000/s" in quiet.action.detail
    assert quiet.suppressed == ()


# -- merge -------------------------------------------------------------------------------------


def test_merge_cold_pair() -> None:
    layout = SegmentLayout.initial(2)
    decision = run(layout, {0: sample(mi=10), 1: sample(mo=20)})
    assert decision == Decision(Merge((0, 1), "cold"), ())
    assert isinstance(decision.action, Merge)
    assert decision.action.detail == (
        "segments 0000-7fff-0 and 8000-ffff-1 cold for at least 300s: 30 msg/s, 0 bytes/s together"
    )


def test_merge_window_boundary() -> None:
    layout = SegmentLayout.initial(2)
    exactly = {0: sample(age=300.0), 1: sample(age=OLD)}
    assert run(layout, exactly).action == Merge((0, 1), "cold")
    young = {0: sample(age=299.999), 1: sample(age=OLD)}
    assert run(layout, young) == Decision(None, ())


def test_sample_from_the_future_is_not_cold() -> None:
    policy = AutoScalePolicy(merge_window=0)
    layout = SegmentLayout.initial(2)
    assert run(layout, {0: sample(age=0), 1: sample(age=0)}, policy=policy).action == Merge(
        (0, 1), "cold"
    )
    assert run(layout, {0: sample(age=-5), 1: sample(age=0)}, policy=policy).action is None


@pytest.mark.parametrize(
    ("field", "threshold"),
    [("mi", 1000.0), ("bi", 5.0 * MIB), ("mo", 5000.0), ("bo", 25.0 * MIB)],
)
def test_rate_at_merge_threshold_blocks(field: str, threshold: float) -> None:
    layout = SegmentLayout.initial(2)
    at = {0: sample(**{field: threshold}), 1: sample()}
    assert run(layout, at).action is None
    below = {0: sample(**{field: math.nextafter(threshold, 0)}), 1: sample()}
    assert run(layout, below).action == Merge((0, 1), "cold")


def test_zero_merge_threshold_never_merges_that_metric() -> None:
    policy = AutoScalePolicy(merge_msg_rate_in_threshold=0)
    assert run(SegmentLayout.initial(2), {0: sample(), 1: sample()}, policy=policy).action is None


def test_both_sides_need_a_sample() -> None:
    assert run(SegmentLayout.initial(2), {0: sample()}).action is None


def test_only_adjacent_pairs_merge() -> None:
    layout = SegmentLayout.initial(3)
    load = {0: sample(), 1: sample(mi=5000), 2: sample()}  # 1 is lukewarm: no split, no merge
    assert run(layout, load) == Decision(None, ())


def test_coldest_pair_by_msg_rates_then_bytes_then_ids() -> None:
    layout = SegmentLayout.initial(4)
    load = {0: sample(mi=10), 1: sample(mi=20), 2: sample(mi=5), 3: sample(mo=1)}
    assert run(layout, load).action == Merge((2, 3), "cold")  # sums 30, 25, 6
    # equal message sums (20 each): the byte sums 12, 8, 101 decide
    load = {
        0: sample(mi=10, bi=5),
        1: sample(mo=10, bo=7),
        2: sample(mi=10, bo=1),
        3: sample(mi=10, bi=100),
    }
    assert run(layout, load).action == Merge((1, 2), "cold")
    # in-rates and out-rates count alike
    load = {0: sample(mo=3), 1: sample(mi=1), 2: sample(mo=1), 3: sample(mi=2)}
    assert run(layout, load).action == Merge((1, 2), "cold")  # sums 4, 2, 3


def test_coldest_pair_tie_goes_to_lowest_ids_and_keeps_range_order() -> None:
    layout = SegmentLayout.initial(2).split(0)  # active by range: 2, 3, 1
    load = {2: sample(), 3: sample(), 1: sample()}
    # pairs (2, 3) and (3, 1) tie; {1, 3} has the lower ids; named lower range first
    assert run(layout, load).action == Merge((3, 1), "cold")
    child = layout.merge(3, 1)
    assert child.segments[4].parent_ids == (3, 1)


def test_merge_cooldown_boundary() -> None:
    layout = SegmentLayout.initial(2)
    load = {0: sample(), 1: sample()}
    inside = run(layout, load, last_merge_at=NOW - 299.999)
    assert inside == Decision(None, (Suppression.MERGE_COOLDOWN,))
    assert run(layout, load, last_merge_at=NOW - 300.0).action == Merge((0, 1), "cold")


def test_min_segments_boundary() -> None:
    policy = AutoScalePolicy(min_segments=2)
    two = run(SegmentLayout.initial(2), {0: sample(), 1: sample()}, policy=policy)
    assert two == Decision(None, (Suppression.MIN_SEGMENTS,))
    three = run(SegmentLayout.initial(3), {0: sample(), 1: sample(), 2: sample()}, policy=policy)
    assert three.action == Merge((0, 1), "cold")
    one = run(SegmentLayout.initial(1), {0: sample()})
    assert one == Decision(None, ())


def test_split_wins_over_merge_and_merge_runs_when_split_is_held_back() -> None:
    layout = SegmentLayout.initial(3)
    load = {0: sample(), 1: sample(), 2: sample(mi=20_000)}
    assert run(layout, load).action == Split(2, "msg-rate-in")
    held = run(layout, load, last_split_at=NOW)
    assert held == Decision(Merge((0, 1), "cold"), (Suppression.SPLIT_COOLDOWN,))


def test_merge_pass_runs_when_rebucket_cannot_help() -> None:
    """DESIGN §3 gates the merge pass only on splits: at max segments with too few buckets known,
    cold segments still merge."""
    policy = AutoScalePolicy(max_segments=2)
    decision = run(SegmentLayout.initial(2), {0: sample(), 1: sample()}, {"s": 5}, policy)
    assert decision == Decision(
        Merge((0, 1), "cold"), (Suppression.MAX_SEGMENTS, Suppression.BUCKETS_UNKNOWN)
    )


# -- DAG depth ---------------------------------------------------------------------------------


def test_max_dag_depth_on_the_sides() -> None:
    layout = SegmentLayout.initial(1).split(0).merge(1, 2).split(3)  # 4, 5: merge depth 1
    load = {4: sample(), 5: sample()}
    blocked = run(layout, load, policy=AutoScalePolicy(max_dag_depth=1))
    assert blocked == Decision(None, (Suppression.MAX_DAG_DEPTH,))
    # the child would have depth 2 (merges 3 and itself): allowed at 2
    allowed = run(layout, load, policy=AutoScalePolicy(max_dag_depth=2))
    assert allowed.action == Merge((4, 5), "cold")
    assert layout.merge(4, 5).merge_depth(6) == 2


def test_max_dag_depth_zero_never_merges() -> None:
    decision = run(
        SegmentLayout.initial(2),
        {0: sample(), 1: sample()},
        policy=AutoScalePolicy(max_dag_depth=0),
    )
    assert decision == Decision(None, (Suppression.MAX_DAG_DEPTH,))


def test_max_dag_depth_on_the_merged_child() -> None:
    """Two sides of depth 1 with disjoint histories make a child of depth 3: with
    ``max_dag_depth = 2`` neither side is at the cap, but the result would exceed it."""
    layout = SegmentLayout.initial(4).merge(0, 1).merge(2, 3)  # 4 = 0000-7fff, 5 = 8000-ffff
    assert (layout.merge_depth(4), layout.merge_depth(5)) == (1, 1)
    load = {4: sample(), 5: sample()}
    refused = run(layout, load, policy=AutoScalePolicy(max_dag_depth=2))
    assert refused == Decision(None, (Suppression.MAX_DAG_DEPTH,))
    assert run(layout, load, policy=AutoScalePolicy(max_dag_depth=3)).action == Merge(
        (4, 5), "cold"
    )
    assert layout.merge(4, 5).merge_depth(6) == 3


def test_depth_refused_pair_leaves_room_for_another() -> None:
    # 0000-7fff has merge depth 1 (segment 4); 8000-bfff and c000-ffff are fresh
    layout = SegmentLayout.initial(4).merge(0, 1)  # active: 4, 2, 3
    load = {4: sample(), 2: sample(), 3: sample(mi=500)}
    policy = AutoScalePolicy(max_dag_depth=1)
    # (4, 2) is colder but refused; (2, 3) merges and no suppression is reported
    assert run(layout, load, policy=policy) == Decision(Merge((2, 3), "cold"), ())


def test_rebucket_successor_does_not_count_as_a_merge() -> None:
    layout = rebucket(SegmentLayout.initial(2), [0, 1])  # 2 <- 0, 3 <- 1
    decision = run(layout, {2: sample(), 3: sample()}, policy=AutoScalePolicy(max_dag_depth=1))
    assert decision.action == Merge((2, 3), "cold")


# -- rebucket down: N lowered lazily after an idle window (PIP-486, issue 14) -----------------

TWO = AutoScalePolicy(min_segments=2)  # no merge gets in the way


def test_idle_surplus_buckets_are_lowered_to_what_the_consumers_need() -> None:
    layout = SegmentLayout.initial(2)
    cold = {0: sample(mi=10), 1: sample(mi=10)}
    decision = run(layout, cold, {"s": 5}, TWO, buckets={0: 8, 1: 2}, bucket_budget=4)
    assert decision.action == Rebucket((0,), 3, "idle-buckets")
    assert decision.suppressed == (Suppression.BUCKETS_SUFFICE, Suppression.MIN_SEGMENTS)
    assert "buckets 10 -> 5" in (decision.action.detail if decision.action else "")
    # without consumers: down to the budget's share (T / active = 2), never below it
    assert run(layout, cold, {}, TWO, buckets={0: 8, 1: 2}, bucket_budget=4).action == Rebucket(
        (0,), 2, "idle-buckets"
    )
    assert run(layout, cold, {}, TWO, buckets={0: 2, 1: 2}, bucket_budget=4).action is None
    assert run(layout, cold, {}, TWO, buckets={0: 8, 1: 2}, bucket_budget=16).action is None
    # ordered queue workers count like stream consumers: 9 workers need 7 of segment 0's 8
    queue = run(layout, cold, {"orders": 9}, TWO, buckets={0: 8, 1: 2}, bucket_budget=4)
    assert queue.action == Rebucket((0,), 7, "idle-buckets")


def test_buckets_are_lowered_only_after_the_idle_window() -> None:
    layout = SegmentLayout.initial(2)
    recent = {0: sample(mi=10, age=600), 1: sample(mi=10)}
    decision = run(layout, recent, {}, TWO, buckets={0: 8, 1: 2}, bucket_budget=4)
    assert decision == Decision(None, (Suppression.MIN_SEGMENTS, Suppression.REBUCKET_DOWN_WINDOW))
    short = AutoScalePolicy(min_segments=2, rebucket_down_window="5m")
    assert run(layout, recent, {}, short, buckets={0: 8, 1: 2}, bucket_budget=4).action == (
        Rebucket((0,), 2, "idle-buckets")
    )
    # a busy segment keeps its buckets; nothing is wanted, nothing is reported
    busy = {0: sample(mi=5000), 1: sample(mi=10)}
    assert run(layout, busy, {}, TWO, buckets={0: 8, 1: 2}, bucket_budget=4) == Decision(None)
    # a rollover seals segments: the split cooldown holds it back
    held = run(
        layout,
        recent | {0: sample(mi=10)},
        {},
        TWO,
        buckets={0: 8, 1: 2},
        bucket_budget=4,
        last_split_at=NOW - 10,
    )
    assert held == Decision(None, (Suppression.MIN_SEGMENTS, Suppression.SPLIT_COOLDOWN))


def test_buckets_the_consumers_need_are_never_lowered() -> None:
    layout = SegmentLayout.initial(2)
    cold = {0: sample(mi=10), 1: sample(mi=10)}
    decision = run(layout, cold, {"s": 10}, TWO, buckets={0: 8, 1: 2}, bucket_budget=4)
    assert decision == Decision(None, (Suppression.BUCKETS_SUFFICE, Suppression.MIN_SEGMENTS))
    assert run(layout, cold, {}, TWO, buckets={0: 8, 1: 2}).action is None, "no budget given"
    with pytest.raises(ValueError, match="bucket_budget"):
        run(layout, cold, {}, TWO, buckets={0: 8, 1: 2}, bucket_budget=0)
