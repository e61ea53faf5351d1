"""``core.recommendation.accept``: when the controller may act on a recommendation."""

from __future__ import annotations

from typing import Any

import pytest

from scalable_topics.core.evaluator import Merge, Rebucket, Split
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.policy import DEFAULT_POLICY, AutoScalePolicy
from scalable_topics.core.recommendation import DEFAULT_FRESHNESS, accept
from scalable_topics.core.resources import format_time

NOW = 1_795_392_000.0


def rec(*actions: Any, epoch: int = 0, age: float = 60.0) -> dict[str, Any]:
    return {
        "computedAt": format_time(NOW - age),
        "window": "1h",
        "basedOnEpoch": epoch,
        "recommendedSegments": 4,
        "actions": list(actions),
    }


def rates(msg_in: float, msg_out: float = 0.0) -> dict[str, float]:
    return {"msgRateIn": msg_in, "bytesRateIn": 0.0, "msgRateOut": msg_out, "bytesRateOut": 0.0}


def split(
    segment: int, at: int | None = None, msg_in: float = 20_000.0, estimate: float = 0.0
) -> dict[str, Any]:
    """A load split as the recommender writes it, with its window figures."""
    return {
        "kind": "split",
        "segments": [segment],
        "at": at,
        "reason": "msg-rate-in",
        "detail": "hot",
        "stats": {"mean": rates(msg_in), "msgRateInEstimateNow": estimate},
    }


def merge(*segments: int, p95_in: float = 10.0) -> dict[str, Any]:
    figures = [{"segment": f"s{sid}", "p95": rates(p95_in)} for sid in segments]
    return {
        "kind": "merge",
        "segments": list(segments),
        "reason": "cold",
        "detail": "cold 1h",
        "stats": {"segments": figures},
    }


def run(recommendation: dict[str, Any] | None, **overrides: Any) -> Any:
    kwargs: dict[str, Any] = {
        "layout": SegmentLayout.initial(4),
        "now": NOW,
        "policy": DEFAULT_POLICY,
        "last_split_at": None,
        "last_merge_at": None,
    }
    kwargs.update(overrides)
    return accept(recommendation, **kwargs)


def test_fresh_current_split_is_accepted_with_its_point() -> None:
    verdict = run(rec(split(1, at=0x47FF)))
    assert verdict.action == Split(1, "msg-rate-in", at=0x47FF)
    assert verdict.index == 0 and verdict.source == "recommendation"
    assert "computed at" in verdict.action.detail and "hot" in verdict.action.detail


def test_merge_is_accepted() -> None:
    verdict = run(rec(merge(2, 3)))
    assert verdict.action == Merge((2, 3), "cold")


def test_rebucket_is_accepted_only_when_it_raises_buckets() -> None:
    action = {"kind": "rebucket", "segments": [0, 1], "buckets": 2, "reason": "consumer-count"}
    verdict = run(rec(action), buckets={0: 1, 1: 1, 2: 1, 3: 1})
    assert verdict.action == Rebucket((0, 1), 2, "consumer-count")
    verdict = run(rec(action), buckets={0: 2, 1: 1})
    assert verdict.action is None and "already has 2 buckets" in verdict.reason
    too_many = {**action, "buckets": 5000}
    assert run(rec(too_many)).action is None


def test_stale_recommendation_is_ignored() -> None:
    verdict = run(rec(split(1), age=DEFAULT_FRESHNESS + 1))
    assert verdict.action is None and "stale" in verdict.reason
    assert run(rec(split(1), age=DEFAULT_FRESHNESS)).action is not None
    assert run(rec(split(1), age=120), freshness=60).action is None


def test_other_epoch_is_ignored() -> None:
    verdict = run(rec(split(1), epoch=0), layout=SegmentLayout.initial(4).split(0))
    assert verdict.action is None
    assert "epoch 0" in verdict.reason and "epoch 1" in verdict.reason


@pytest.mark.parametrize(
    ("recommendation", "words"),
    [
        (None, "no recommendation"),
        ({}, "no recommendation"),
        ({"basedOnEpoch": 0, "actions": [split(1)]}, "computedAt"),
        ({**rec(split(1)), "computedAt": "yesterday"}, "computedAt"),
        (rec(), "no action"),
    ],
)
def test_unusable_recommendations(recommendation: dict[str, Any] | None, words: str) -> None:
    verdict = run(recommendation)
    assert verdict.action is None and words in verdict.reason


def test_disabled_policy_ignores_everything() -> None:
    verdict = run(rec(split(1)), policy=AutoScalePolicy(enabled=False))
    assert verdict.action is None and "disabled" in verdict.reason


def test_split_guards() -> None:
    at_max = run(rec(split(1)), policy=AutoScalePolicy(max_segments=4))
    assert at_max.action is None and "maxSegments 4" in at_max.reason
    cooling = run(rec(split(1)), last_split_at=NOW - 30)
    assert cooling.action is None and "split cooldown" in cooling.reason
    assert run(rec(split(1)), last_split_at=NOW - 61).action is not None
    sealed = SegmentLayout.initial(4).split(1)
    gone = run(rec(split(1), epoch=1), layout=sealed)
    assert gone.action is None and "SEALED" in gone.reason
    outside = run(rec(split(1, at=0x0010)))
    assert outside.action is None and "outside" in outside.reason


def test_merge_guards() -> None:
    at_min = run(rec(merge(2, 3)), policy=AutoScalePolicy(min_segments=4))
    assert at_min.action is None and "minSegments 4" in at_min.reason
    cooling = run(rec(merge(2, 3)), last_merge_at=NOW - 60)
    assert cooling.action is None and "merge cooldown" in cooling.reason
    apart = run(rec(merge(1, 3)))
    assert apart.action is None and "not adjacent" in apart.reason


def test_merge_depth_guard_uses_the_merged_child_depth() -> None:
    layout = SegmentLayout.initial(4).merge(0, 1)  # child 4, depth 1
    recommendation = rec(merge(4, 2), epoch=1)
    assert run(recommendation, layout=layout).action == Merge((4, 2), "cold")
    refused = run(recommendation, layout=layout, policy=AutoScalePolicy(max_dag_depth=1))
    assert refused.action is None and "maxDagDepth 1" in refused.reason


def test_split_thresholds_of_the_resolved_policy_are_rechecked() -> None:
    """The recommender planned with 10,000 msg/s; a namespace raised the threshold to 50,000:
    the split does not get through (but the trend's estimate now counts, as in the plan)."""
    raised = AutoScalePolicy(split_msg_rate_in_threshold=50_000)
    refused = run(rec(split(1, msg_in=20_000)), policy=raised)
    assert refused.action is None
    assert "msgRateIn 20000 <= 50000" in refused.reason, refused.reason
    assert run(rec(split(1, msg_in=20_000, estimate=60_000)), policy=raised).action is not None
    assert run(rec(split(1, msg_in=60_000)), policy=raised).action is not None
    lowered = AutoScalePolicy(split_msg_rate_in_threshold=5_000)
    assert run(rec(split(1, msg_in=6_000)), policy=lowered).action is not None
    assert run(rec(split(1, msg_in=6_000))).action is None


def test_merge_thresholds_of_the_resolved_policy_are_rechecked() -> None:
    lowered = AutoScalePolicy(merge_msg_rate_in_threshold=5)
    refused = run(rec(merge(2, 3, p95_in=10)), policy=lowered)
    assert refused.action is None
    assert "p95 msgRateIn 10 is not below the policy's merge threshold 5" in refused.reason
    assert run(rec(merge(2, 3, p95_in=4)), policy=lowered).action == Merge((2, 3), "cold")


def test_actions_without_figures_cannot_be_checked_and_are_refused() -> None:
    bare_split = {k: v for k, v in split(1).items() if k != "stats"}
    verdict = run(rec(bare_split))
    assert verdict.action is None and "no window rates" in verdict.reason
    bare_merge = {k: v for k, v in merge(2, 3).items() if k != "stats"}
    verdict = run(rec(bare_merge))
    assert verdict.action is None and "no window figures" in verdict.reason
    consumer_split = {**bare_split, "reason": "consumer-count"}
    assert run(rec(consumer_split)).action is not None, "no threshold decides it"


def test_first_acceptable_action_wins_and_refusals_are_reported() -> None:
    verdict = run(rec(split(1), merge(2, 3)), last_split_at=NOW - 10)
    assert verdict.action == Merge((2, 3), "cold")
    assert verdict.index == 1
    assert verdict.rejected and verdict.rejected[0][0] == 0
    assert "split cooldown" in verdict.reason


def test_all_refused() -> None:
    verdict = run(
        rec(split(1), merge(2, 3), {"kind": "explode", "segments": [1]}, "junk"),
        last_split_at=NOW - 10,
        last_merge_at=NOW - 10,
    )
    assert verdict.action is None
    assert len(verdict.rejected) == 4
    assert "every recommended action was refused" in verdict.reason
    assert "unknown action kind" in verdict.reason and "malformed" in verdict.reason


def test_malformed_fields_are_refused_not_raised() -> None:
    bad = [
        {"kind": "split", "segments": "1"},
        {"kind": "split", "segments": [1, 2]},
        {"kind": "split", "segments": [1], "at": "0x10"},
        {"kind": "merge", "segments": [1]},
        {"kind": "rebucket", "segments": [1, 1], "buckets": 2},
    ]
    verdict = run(rec(*bad))
    assert verdict.action is None and len(verdict.rejected) == len(bad)
