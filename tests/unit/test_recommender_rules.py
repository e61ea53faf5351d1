"""The recommender's pure planning: split points, coldness, the evaluator-driven plan."""

from __future__ import annotations

from typing import Any

import pytest

from scalable_topics.core.layout import HashRange, SegmentLayout
from scalable_topics.core.policy import DEFAULT_POLICY, AutoScalePolicy
from scalable_topics.core.resources import Recommendation
from scalable_topics.recommender.history import bin_bounds, histogram
from scalable_topics.recommender.rules import (
    SegmentStats,
    Window,
    balanced_split_point,
    cold_since,
    infer_layout,
    load_sample,
    plan_topic,
    rebin,
    recommendation,
    ring_covered,
    traffic_median,
    weight_below,
)

NOW = 1_795_392_000.0
WINDOW = Window(NOW - 3600, NOW, 10.0)
UNIFORM = [100] * 16
LOWER_QUARTER = [400, 400, 400, 400] + [0] * 12


def seg(
    segment_id: int,
    start: int,
    end: int,
    rate: float,
    *,
    hist: list[int] | None = None,
    slope: float = 0.0,
    last_hot_ts: float | None = None,
    first_ts: float | None = None,
    topic: str = "orders",
) -> SegmentStats:
    rates = {
        "msgRateIn": rate,
        "bytesRateIn": rate * 100,
        "msgRateOut": rate,
        "bytesRateOut": rate * 100,
    }
    return SegmentStats(
        namespace="prod",
        topic=topic,
        segment_id=segment_id,
        range_start=start,
        range_end=end,
        samples=360,
        first_ts=WINDOW.start + 10 if first_ts is None else first_ts,
        last_ts=NOW,
        mean=rates,
        p95={k: v * 1.1 for k, v in rates.items()},
        slope=slope,
        mid_ts=WINDOW.start + 1805,
        last_hot_ts=last_hot_ts,
        hist=hist if hist is not None else UNIFORM,
    )


def quarters() -> SegmentLayout:
    return SegmentLayout.initial(4)


def four(rates: list[float], **kwargs: Any) -> list[SegmentStats]:
    layout = quarters()
    return [
        seg(s.segment_id, s.hash_range.start, s.hash_range.end, rate, **kwargs)
        for s, rate in zip(layout.active(), rates, strict=True)
    ]


# -- histograms -------------------------------------------------------------------------------


def test_bins_match_the_load_history_contract() -> None:
    edges = bin_bounds(0x4000, 0x7FFF)
    assert edges[0] == 0x4000 and edges[16] == 0x8000
    assert edges[1] == 0x4000 + 0x4000 // 16
    hist = histogram(0x4000, 0x7FFF, [(0x4000, 3), (0x7FFF, 2), (0x3FFF, 9)])
    assert hist[0] == 3 and hist[15] == 2 and sum(hist) == 5


def test_uniform_traffic_splits_at_the_midpoint() -> None:
    full = HashRange.full()
    assert traffic_median(full, UNIFORM) == pytest.approx(32768)
    assert balanced_split_point(full, UNIFORM) is None


def test_keys_in_the_lower_quarter_split_at_the_traffic_median() -> None:
    full = HashRange.full()
    at = balanced_split_point(full, LOWER_QUARTER)
    # Half of the traffic lies below 0x2000 (uniform within the first four bins).
    assert at == 0x1FFF
    assert weight_below(full, LOWER_QUARTER, at + 1) == pytest.approx(800)


def test_split_point_interpolates_inside_a_bin() -> None:
    hash_range = HashRange(0x1000, 0x1FFF)  # 4096 hashes, 256 per bin
    hist = [0] * 16
    hist[3] = 100  # every key in bin 3: [0x1300, 0x13ff]
    at = balanced_split_point(hash_range, hist)
    assert at == 0x1300 + 128 - 1


def test_split_point_within_tolerance_of_the_midpoint_is_the_midpoint() -> None:
    full = HashRange.full()
    slightly = [110] * 8 + [90] * 8
    assert balanced_split_point(full, slightly) is None
    assert balanced_split_point(full, slightly, tolerance=0.0) is not None


def test_split_point_edge_cases() -> None:
    assert balanced_split_point(HashRange.full(), [0] * 16) is None
    assert balanced_split_point(HashRange(7, 7), UNIFORM) is None
    # A range narrower than 16 hashes has empty bins; the point stays inside the range.
    narrow = HashRange(100, 109)
    hist = histogram(100, 109, [(100, 50), (101, 50)])
    at = balanced_split_point(narrow, hist, tolerance=0.0)
    assert at is not None and narrow.start <= at < narrow.end
    everything_last = [0] * 15 + [5]
    at = balanced_split_point(HashRange.full(), everything_last)
    assert at is not None and at < 0xFFFF
    with pytest.raises(ValueError):
        balanced_split_point(HashRange.full(), [1] * 15)
    with pytest.raises(ValueError):
        balanced_split_point(HashRange.full(), UNIFORM, tolerance=1.5)


def test_rebin_keeps_the_weight() -> None:
    full = HashRange.full()
    low, high = full.split(0x1FFF)
    lower = rebin(full, LOWER_QUARTER, low)
    upper = rebin(full, LOWER_QUARTER, high)
    assert sum(lower) == pytest.approx(800) and sum(upper) == pytest.approx(800)
    assert lower == pytest.approx([50.0] * 16)


# -- load samples -----------------------------------------------------------------------------


def test_cold_since() -> None:
    always_cold = seg(0, 0, 0xFFFF, 5)
    assert cold_since(always_cold, WINDOW) == WINDOW.start
    recently_hot = seg(0, 0, 0xFFFF, 5, last_hot_ts=NOW - 600)
    assert cold_since(recently_hot, WINDOW) == NOW - 600
    young = seg(0, 0, 0xFFFF, 5, first_ts=NOW - 900)
    assert cold_since(young, WINDOW) == NOW - 900


def test_load_sample_uses_the_trend_estimate_when_it_is_higher() -> None:
    ramp = seg(0, 0, 0xFFFF, 8000, slope=4000 / 3600, last_hot_ts=NOW)
    sample = load_sample(ramp, WINDOW)
    assert sample.msg_rate_in == pytest.approx(8000 + 4000 / 3600 * (NOW - ramp.mid_ts))
    falling = seg(0, 0, 0xFFFF, 8000, slope=-1.0, last_hot_ts=NOW)
    assert load_sample(falling, WINDOW).msg_rate_in == 8000


# -- plans ------------------------------------------------------------------------------------


def test_hot_segment_with_skewed_keys_is_split_at_the_traffic_median() -> None:
    stats = four([3000, 15000, 3000, 3000], last_hot_ts=NOW)
    skewed = seg(1, 0x4000, 0x7FFF, 15000, hist=LOWER_QUARTER, last_hot_ts=NOW)
    stats[1] = skewed
    plan = plan_topic(stats, quarters(), DEFAULT_POLICY, WINDOW)
    assert len(plan.actions) == 1
    action = plan.actions[0]
    assert action["kind"] == "split" and action["segments"] == [1]
    assert action["at"] == 0x4000 + 0x4000 // 8 - 1  # median: end of the lower eighth
    assert action["at"] != HashRange(0x4000, 0x7FFF).midpoint()
    assert action["reason"] == "msg-rate-in"
    assert "traffic median" in action["detail"] and "15,000" in action["detail"]
    assert action["stats"]["lowerShare"] == pytest.approx(0.5)
    assert plan.recommended_segments == 5


def test_uniform_hot_segment_is_split_at_the_midpoint() -> None:
    stats = four([3000, 15000, 3000, 3000], last_hot_ts=NOW)
    plan = plan_topic(stats, quarters(), DEFAULT_POLICY, WINDOW)
    assert [a["at"] for a in plan.actions] == [None]
    assert "midpoint" in plan.actions[0]["detail"]


def test_very_hot_segment_counts_follow_up_splits() -> None:
    stats = four([3000, 45000, 3000, 3000], last_hot_ts=NOW)
    plan = plan_topic(stats, quarters(), DEFAULT_POLICY, WINDOW)
    # 45k -> 2 x 22.5k -> 4 x 11.25k -> 8 x 5.6k: seven splits, one of them on the current layout.
    assert len(plan.actions) == 1 and plan.actions[0]["segments"] == [1]
    assert plan.follow_ups == 6
    assert plan.recommended_segments == 11


def test_pair_cold_for_the_whole_window_is_merged() -> None:
    stats = four([3000, 3000, 20, 30])
    stats[0] = seg(0, 0, 0x3FFF, 3000, last_hot_ts=NOW)
    stats[1] = seg(1, 0x4000, 0x7FFF, 3000, last_hot_ts=NOW)
    plan = plan_topic(stats, quarters(), DEFAULT_POLICY, WINDOW)
    assert [(a["kind"], a["segments"]) for a in plan.actions] == [("merge", [2, 3])]
    assert plan.actions[0]["reason"] == "cold"
    assert "cold for 1h" in plan.actions[0]["detail"]
    assert plan.recommended_segments == 3


def test_pair_cold_for_only_part_of_the_window_is_not_merged() -> None:
    stats = four([3000, 3000, 20, 30])
    stats[0] = seg(0, 0, 0x3FFF, 3000, last_hot_ts=NOW)
    stats[1] = seg(1, 0x4000, 0x7FFF, 3000, last_hot_ts=NOW)
    stats[3] = seg(3, 0xC000, 0xFFFF, 30, last_hot_ts=NOW - 1200)  # hot 20 minutes ago
    plan = plan_topic(stats, quarters(), DEFAULT_POLICY, WINDOW)
    assert plan.actions == []
    assert plan.recommended_segments == 4


def test_window_shorter_than_the_merge_window_never_merges() -> None:
    short = Window(NOW - 120, NOW, 10.0)
    stats = [
        seg(s.segment_id, s.hash_range.start, s.hash_range.end, 1, first_ts=short.start + 10)
        for s in quarters().active()
    ]
    assert plan_topic(stats, quarters(), DEFAULT_POLICY, short).actions == []


def test_rising_segment_is_split_before_its_mean_crosses() -> None:
    stats = four([3000, 8000, 3000, 3000], last_hot_ts=NOW)
    stats[1] = seg(1, 0x4000, 0x7FFF, 8000, slope=6000 / 3600, last_hot_ts=NOW)
    plan = plan_topic(stats, quarters(), DEFAULT_POLICY, WINDOW)
    assert [a["segments"] for a in plan.actions] == [[1]]
    assert "trend +6,000/s per hour" in plan.actions[0]["detail"]


def test_consumers_beyond_max_segments_get_a_rebucket() -> None:
    policy = AutoScalePolicy(max_segments=4)
    stats = four([3000, 3000, 3000, 3000], last_hot_ts=NOW)
    plan = plan_topic(
        stats,
        quarters(),
        policy,
        WINDOW,
        stream_consumers={"billing": 8},
        buckets={0: 1, 1: 1, 2: 1, 3: 1},
    )
    assert [(a["kind"], a["segments"], a["buckets"]) for a in plan.actions] == [
        ("rebucket", [0, 1, 2, 3], 2)
    ]
    assert plan.actions[0]["reason"] == "consumer-count"
    assert plan.recommended_segments == 4


def test_consumers_beyond_active_segments_get_splits() -> None:
    stats = four([3000, 5000, 3000, 3000], last_hot_ts=NOW)
    plan = plan_topic(stats, quarters(), DEFAULT_POLICY, WINDOW, stream_consumers={"s": 6})
    assert [(a["kind"], a["segments"]) for a in plan.actions] == [("split", [1]), ("split", [0])]
    assert plan.recommended_segments == 6


def test_history_of_sealed_or_mismatched_segments_is_ignored() -> None:
    layout = quarters().split(1)  # 1 sealed; children 4 and 5
    stats = [
        seg(0, 0, 0x3FFF, 3000, last_hot_ts=NOW),
        seg(1, 0x4000, 0x7FFF, 50000, last_hot_ts=NOW),  # sealed: ignored
        seg(4, 0x4000, 0x5FFF, 3000, last_hot_ts=NOW),
        seg(5, 0x6000, 0x6FFF, 90000, last_hot_ts=NOW),  # not id 5's range: ignored
        seg(2, 0x8000, 0xBFFF, 3000, last_hot_ts=NOW),
        seg(3, 0xC000, 0xFFFF, 3000, last_hot_ts=NOW),
    ]
    assert plan_topic(stats, layout, DEFAULT_POLICY, WINDOW).actions == []


def test_recommendation_matches_the_resource_schema() -> None:
    stats = four([3000, 15000, 20, 30])
    stats[0] = seg(0, 0, 0x3FFF, 3000, last_hot_ts=NOW)
    stats[1] = seg(1, 0x4000, 0x7FFF, 15000, hist=LOWER_QUARTER, last_hot_ts=NOW)
    plan = plan_topic(stats, quarters(), DEFAULT_POLICY, WINDOW)
    rec = recommendation(
        plan,
        computed_at="2026-11-23T00:00:00Z",
        window=WINDOW,
        based_on_epoch=0,
        based_on_generation=3,
    )
    model = Recommendation.model_validate(rec)
    assert model.window == 3600 and model.based_on_epoch == 0
    assert [a.kind.value for a in model.actions] == ["split", "merge"]
    assert model.actions[0].at == rec["actions"][0]["at"] == 0x47FF
    assert rec["window"] == "1h" and rec["recommendedSegments"] == 4


def test_infer_layout_from_the_latest_samples() -> None:
    stats = four([1, 1, 1, 1])
    stale = SegmentStats(**{**stats[1].__dict__, "segment_id": 9, "last_ts": NOW - 600})
    layout = infer_layout([*stats, stale], WINDOW)
    assert sorted(layout.segments) == [0, 1, 2, 3]
    assert layout.next_segment_id == 10 and ring_covered(layout)
    partial = infer_layout(stats[:2], WINDOW)
    assert not ring_covered(partial)
