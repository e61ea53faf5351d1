"""``stopic dag``'s auto-scale lines from ``status.autoScale``."""

from __future__ import annotations

from scalable_topics.cli.topics import autoscale_lines


def test_nothing_without_status() -> None:
    assert autoscale_lines({}) == []


def test_mode_knobs_from_other_levels_outcome_and_decision() -> None:
    auto = {
        "mode": "recommend",
        "policy": {"mode": "recommend", "maxSegments": "64", "splitCooldown": "7m"},
        "sources": {"mode": "cluster", "maxSegments": "default", "splitCooldown": "namespace"},
        "problem": "the namespace's annotation is ignored: not JSON",
        "lastEvaluation": {
            "result": "Recommended",
            "reasons": [],
            "message": "split [0]: recorded, not executed",
            "since": "2026-11-25T07:00:00Z",
        },
        "lastDecision": {
            "action": "split",
            "segments": [0],
            "source": "auto",
            "executed": False,
            "reason": "msgRateIn 20000 > 10000",
            "decidedAt": "2026-11-25T07:00:00Z",
        },
    }
    assert autoscale_lines(auto) == [
        "auto-scale: mode recommend (from cluster)",
        "  policy: splitCooldown=7m (namespace); the rest default",
        "  problem: the namespace's annotation is ignored: not JSON",
        "  last evaluation: Recommended since 2026-11-25T07:00:00Z: split [0]: recorded, not "
        "executed",
        "  last decision: split [0] (auto, not executed) at 2026-11-25T07:00:00Z: "
        "msgRateIn 20000 > 10000",
    ]


def test_suppression_reasons_are_listed() -> None:
    auto = {
        "mode": "off",
        "sources": {"mode": "cluster"},
        "lastEvaluation": {
            "result": "Off",
            "reasons": ["mode-off"],
            "message": "the master switch is off",
            "since": "t",
        },
    }
    assert autoscale_lines(auto) == [
        "auto-scale: mode off (from cluster)",
        "  last evaluation: Off [mode-off] since t: the master switch is off",
    ]
