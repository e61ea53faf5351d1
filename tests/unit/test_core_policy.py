"""AutoScalePolicy defaults, validation, parsing and resolution (DESIGN §3, PIP-483)."""

from __future__ import annotations

from typing import Any

import pytest

from scalable_topics.core.policy import (
    DEFAULT_POLICY,
    MIB,
    AutoScalePolicy,
    PolicyMode,
    PolicySource,
    format_duration,
    parse_duration,
    parse_quantity,
    resolve_policy,
)

METRICS = ("msg_rate_in", "bytes_rate_in", "msg_rate_out", "bytes_rate_out")


def test_defaults() -> None:
    p = AutoScalePolicy()
    assert p == DEFAULT_POLICY
    assert p.enabled is True
    assert p.mode is PolicyMode.AUTO
    assert (p.max_segments, p.min_segments, p.max_dag_depth) == (64, 1, 10)
    assert (p.split_cooldown, p.merge_cooldown, p.merge_window) == (60.0, 300.0, 300.0)
    assert p.evaluation_interval == 60.0
    assert p.split_msg_rate_in_threshold == 10_000
    assert p.split_bytes_rate_in_threshold == 50 * 1024 * 1024
    assert p.split_msg_rate_out_threshold == 50_000
    assert p.split_bytes_rate_out_threshold == 250 * 1024 * 1024
    assert p.merge_msg_rate_in_threshold == 1_000
    assert p.merge_bytes_rate_in_threshold == 5 * 1024 * 1024
    assert p.merge_msg_rate_out_threshold == 5_000
    assert p.merge_bytes_rate_out_threshold == 25 * 1024 * 1024
    assert p.split_threshold("msg_rate_out") == 50_000.0
    assert p.merge_threshold("bytes_rate_in") == 5 * MIB


def test_camel_case_aliases() -> None:
    p = AutoScalePolicy.model_validate(
        {"maxSegments": 8, "splitCooldown": "2m", "mergeBytesRateOutThreshold": "1Mi"}
    )
    assert p.max_segments == 8 and p.split_cooldown == 120.0
    assert p.merge_bytes_rate_out_threshold == MIB
    dumped = p.model_dump(by_alias=True)
    assert dumped["maxSegments"] == 8 and dumped["maxDagDepth"] == 10
    assert "splitMsgRateInThreshold" in dumped


def test_policy_is_frozen_and_closed() -> None:
    with pytest.raises(ValueError):
        DEFAULT_POLICY.max_segments = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="bogus"):
        AutoScalePolicy.model_validate({"bogus": 1})


@pytest.mark.parametrize(
    "knobs",
    [
        {"min_segments": 0},
        {"max_segments": 0},
        {"min_segments": 5, "max_segments": 4},
        {"max_dag_depth": -1},
        {"split_cooldown": -1},
        {"merge_cooldown": -0.5},
        {"merge_window": -1},
        {"split_cooldown": "-5s"},
        {"split_msg_rate_in_threshold": 0},
        {"split_bytes_rate_in_threshold": 0},
        {"split_msg_rate_out_threshold": -1},
        {"split_bytes_rate_out_threshold": 0},
        {"merge_msg_rate_in_threshold": -1},
        {"merge_bytes_rate_in_threshold": -1},
        {"merge_msg_rate_out_threshold": -0.1},
        {"merge_bytes_rate_out_threshold": "-1Mi"},
        {"max_segments": 5.5},
        {"split_cooldown": "5 minutes"},
    ],
)
def test_validation_rejects(knobs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        AutoScalePolicy(**knobs)


@pytest.mark.parametrize("metric", METRICS)
def test_split_threshold_must_be_above_merge_threshold(metric: str) -> None:
    merge = AutoScalePolicy().merge_threshold(metric)
    with pytest.raises(ValueError, match="must be above"):
        AutoScalePolicy(**{f"split_{metric}_threshold": merge})
    with pytest.raises(ValueError, match="must be above"):
        AutoScalePolicy(**{f"split_{metric}_threshold": merge / 2})
    ok = AutoScalePolicy(**{f"split_{metric}_threshold": merge + 1})
    assert ok.split_threshold(metric) == merge + 1


def test_split_merge_error_names_the_knobs() -> None:
    with pytest.raises(
        ValueError, match=r"splitMsgRateInThreshold \(500\) .* mergeMsgRateInThreshold"
    ):
        AutoScalePolicy(split_msg_rate_in_threshold=500)


@pytest.mark.parametrize(
    "knobs",
    [
        {"min_segments": 1, "max_segments": 1},
        {"min_segments": 64, "max_segments": 64},
        {"max_dag_depth": 0},
        {"split_cooldown": 0, "merge_cooldown": 0, "merge_window": 0},
        {"merge_msg_rate_in_threshold": 0, "merge_bytes_rate_in_threshold": 0},
        {"merge_msg_rate_out_threshold": 0, "merge_bytes_rate_out_threshold": 0},
        {"split_msg_rate_in_threshold": 1001},
    ],
)
def test_validation_accepts_edges(knobs: dict[str, Any]) -> None:
    AutoScalePolicy(**knobs)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1h", 3600.0),
        ("250ms", 0.25),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("2h0m5s", 7205.0),
        ("0", 0.0),
        ("45", 45.0),
        ("2.5", 2.5),
        (" 5m ", 300.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "  ", "1d", "5 m", "m5", "5x", "5m-", "-5s", "1h 30m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_parse_duration_passes_numbers_through() -> None:
    assert parse_duration(12) == 12
    assert parse_duration(0.5) == 0.5


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("50Mi", 50 * MIB),
        ("50MiB", 50 * MIB),
        ("50MB", 50 * MIB),
        ("50M", 50 * MIB),
        ("1Gi", 1024 * MIB),
        ("1Ti", 1024 * 1024 * MIB),
        ("5K", 5 * 1024),
        ("5k", 5 * 1024),
        ("5kB", 5 * 1024),
        ("1.5Ki", 1536),
        ("50B", 50),
        ("52428800", 52428800),
        ("  50 Mi ", 50 * MIB),
    ],
)
def test_parse_quantity(text: str, value: float) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-5Mi", "50mb", "5Pi", "Mi", "1e6"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_parse_quantity_passes_numbers_through() -> None:
    assert parse_quantity(1024) == 1024


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (45, "45s"),
        (60, "1m"),
        (90, "1m30s"),
        (3600, "1h"),
        (5405, "1h30m5s"),
        (0.25, "0.25s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def resolve(
    topic: PolicySource,
    namespace: dict[str, Any] | None,
    defaults: AutoScalePolicy = DEFAULT_POLICY,
) -> AutoScalePolicy:
    """The policy :func:`resolve_policy` resolves without a cluster level."""
    return resolve_policy(topic, namespace, None, defaults).policy


def test_resolve_defaults_only() -> None:
    assert resolve(None, None) == DEFAULT_POLICY
    assert resolve({}, {}) == DEFAULT_POLICY


def test_resolve_field_by_field() -> None:
    topic = {"maxSegments": 8, "splitCooldown": "2m", "minSegments": None}
    namespace = {"maxSegments": 16, "minSegments": 2, "mergeWindow": "10m", "enabled": True}
    p = resolve(topic, namespace)
    assert p.max_segments == 8  # topic wins
    assert p.split_cooldown == 120.0  # topic only
    assert p.min_segments == 2  # topic says None: falls through to the namespace
    assert p.merge_window == 600.0  # namespace only
    assert p.merge_cooldown == 300.0  # default
    assert p.max_dag_depth == 10


def test_resolve_accepts_snake_case_and_policy_objects() -> None:
    p = resolve(AutoScalePolicy(max_segments=5), {"min_segments": 3})
    assert (p.max_segments, p.min_segments) == (5, 3)
    # only the knobs the topic's policy object set explicitly take part
    assert p.split_cooldown == 60.0
    custom_defaults = AutoScalePolicy(max_dag_depth=2)
    assert resolve(None, None, custom_defaults).max_dag_depth == 2
    assert resolve({"maxDagDepth": 4}, None, custom_defaults).max_dag_depth == 4


def test_resolve_validates_the_combination() -> None:
    with pytest.raises(ValueError, match=r"maxSegments \(10\) must be >= minSegments \(20\)"):
        resolve({"minSegments": 20}, {"maxSegments": 10})
    with pytest.raises(ValueError, match="must be above"):
        resolve({"splitMsgRateInThreshold": 2000}, {"mergeMsgRateInThreshold": 3000})


def test_resolve_rejects_unknown_knobs_of_the_topic_and_ignores_an_unknown_namespace() -> None:
    with pytest.raises(ValueError, match="unknown auto-scale policy knob 'maxSegmets'"):
        resolve({"maxSegmets": 3}, None)
    ignored = resolve_policy(None, {"bogus": True, "maxSegments": 3})
    assert ignored.policy == DEFAULT_POLICY
    assert "unknown auto-scale policy knob 'bogus'" in ignored.problems[0]


def test_resolve_disabled_at_namespace_unless_topic_enables() -> None:
    assert resolve(None, {"enabled": False}).enabled is False
    assert resolve({"enabled": True}, {"enabled": False}).enabled is True
    assert resolve({"mode": "recommend"}, None).mode is PolicyMode.RECOMMEND
