"""bench/operator's report: each topic count is held to its own target (issue 17)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import operator as bench_operator
from bench.report import Report


def _result(topics: int, ready_seconds: float) -> dict[str, Any]:
    return {
        "topics": topics,
        "segments": 2 * topics,
        "ready_seconds": ready_seconds,
        "create_seconds": ready_seconds / 3,
        "operator_rss_at_rest": 100 * 2**20,
        "operator_rss": 100 * 2**20 + topics * 90 * 1024,
        "operator_metrics": {},
        "window_seconds": 70.0,
        "writes": {"Lease": 70},
        "writes_total": 70,
        "cpu_seconds": {"kube-apiserver": ready_seconds * 0.9, "operator": ready_seconds / 2},
        "api_requests": {"POST scalabletopics": topics, "PUT scalabletopics/status": 2 * topics},
    }


@pytest.mark.parametrize(
    ("topics", "seconds", "name", "passed"),
    [
        (1000, 59.0, "1,000 topics Ready with one operator", True),
        (10000, 714.0, "10,000 topics Ready with one operator", False),
        (10000, 290.0, "10,000 topics Ready with one operator", True),
    ],
)
def test_each_topic_count_has_its_own_target(
    topics: int, seconds: float, name: str, passed: bool
) -> None:
    section = Report(quick=False, command="test").section("operator", "Operator")
    bench_operator._record(section, _result(topics, seconds))
    [target] = section.targets
    assert (target.name, target.passed) == (name, passed)
    assert [t.title for t in section.tables][1].startswith(f"CPU while {topics} topics")
    per_topic = {row[0]: row[2] for row in section.tables[2].rows}
    assert per_topic["PUT scalabletopics/status"] == 2.0


def test_a_count_without_a_target_reports_figures_only() -> None:
    section = Report(quick=True, command="test").section("operator", "Operator")
    bench_operator._record(section, _result(100, 9.0))
    assert section.targets == []
    assert {f.name for f in section.figures} >= {"ready_seconds", "operator_memory_per_topic"}


def test_the_operator_runs_with_its_default_resync_and_lease_timings() -> None:
    from scalable_topics.controller.__main__ import parse_args

    assert parse_args([]).resync_interval == bench_operator.RESYNC_SECONDS
    overlay = (
        bench_operator.REPO / "manifests/overlays/local/operator-deployment.yaml"
    ).read_text()
    for flag in bench_operator.DEFAULT_ARGS:
        assert flag in overlay, f"{flag} is not in the local overlay: nothing to drop"
