"""``core.policy.resolve_policy``: topic → namespace → cluster → built-in defaults, each knob with
its source; the master switch; invalid levels; the cluster ConfigMap's parsing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalable_topics.core.policy import (
    DEFAULT_POLICY,
    AutoScalePolicy,
    ClusterDefaults,
    ClusterMode,
    PolicyError,
    PolicyLevel,
    PolicyMode,
    knob_alias,
    parse_cluster_defaults,
    resolve_policy,
)

LEVELS = (PolicyLevel.TOPIC, PolicyLevel.NAMESPACE, PolicyLevel.CLUSTER)


def _knob_values(name: str) -> st.SearchStrategy[Any]:
    """Values of one knob that combine validly with any other level's values: a split threshold
    is at least its default, a merge threshold at most its default, maxSegments >= 64 >=
    minSegments."""
    default = getattr(DEFAULT_POLICY, name)
    if name == "enabled":
        return st.booleans()
    if name == "mode":
        return st.sampled_from(list(PolicyMode))
    if name == "max_segments":
        return st.integers(64, 4096)
    if name == "min_segments":
        return st.integers(1, 64)
    if name == "max_dag_depth":
        return st.integers(0, 50)
    if name == "evaluation_interval":
        return st.integers(1, 7200).map(float)
    if name.startswith("split_"):
        return st.floats(default, default * 10, allow_nan=False)
    if name.startswith("merge_") and name.endswith("_threshold"):
        return st.floats(0, default, allow_nan=False)
    return st.integers(0, 7200).map(float)  # cooldowns and the merge window


KNOBS = list(AutoScalePolicy.model_fields)
level_knobs = st.lists(st.sampled_from(KNOBS), unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: _knob_values(n) for n in names})
)


def camel(knobs: dict[str, Any]) -> dict[str, Any]:
    """As written in a resource: camelCase, enums as their values."""
    return {knob_alias(n): getattr(v, "value", v) for n, v in knobs.items()}


@given(level_knobs, level_knobs, level_knobs, st.sampled_from(list(ClusterMode)))
def test_each_knob_comes_from_the_highest_level_that_sets_it(
    topic: dict[str, Any], namespace: dict[str, Any], cluster: dict[str, Any], master: ClusterMode
) -> None:
    resolution = resolve_policy(
        camel(topic),
        json.dumps(camel(namespace)),
        ClusterDefaults(mode=master, knobs=cluster),
    )
    assert set(resolution.sources) == set(KNOBS), "every knob is sourced"
    for name in KNOBS:
        levels = zip(LEVELS, (topic, namespace, cluster), strict=True)
        expected = next(
            ((lv, lk[name]) for lv, lk in levels if name in lk),
            (PolicyLevel.DEFAULT, getattr(DEFAULT_POLICY, name)),
        )
        assert (resolution.sources[name], getattr(resolution.policy, name)) == expected, name
    assert resolution.problems == ()
    shown, sources = resolution.shown(), resolution.shown_sources()
    assert set(shown) == set(sources) == {knob_alias(n) for n in KNOBS}
    # The master switch only ever restricts: off < recommend < auto.
    rank = [ClusterMode.OFF, ClusterMode.RECOMMEND, ClusterMode.AUTO]
    own = ClusterMode(resolution.policy.mode.value)
    assert resolution.mode == min(master, own, key=rank.index)
    if rank.index(master) < rank.index(own):
        assert resolution.mode_source is PolicyLevel.CLUSTER
    else:
        assert resolution.mode_source is resolution.sources["mode"]
    assert shown["mode"] == resolution.mode.value


invalid_annotations = st.sampled_from(
    [
        "{not json",
        "[1, 2]",
        '"maxSegments"',
        json.dumps({"maxSegmentz": 4}),
        json.dumps({"maxSegments": 0}),
        json.dumps({"splitCooldown": "soon"}),
        json.dumps({"mode": "sometimes"}),
    ]
)


@given(level_knobs, invalid_annotations, level_knobs)
def test_an_invalid_annotation_is_ignored_with_a_reason(
    topic: dict[str, Any], annotation: str, cluster: dict[str, Any]
) -> None:
    levels = ClusterDefaults(knobs=cluster)
    resolution = resolve_policy(camel(topic), annotation, levels)
    without = resolve_policy(camel(topic), None, levels)
    assert resolution.policy == without.policy
    assert PolicyLevel.NAMESPACE not in resolution.sources.values()
    (problem,) = resolution.problems
    assert "scalabletopics.io/autoscale-policy annotation is ignored" in problem


def test_the_problem_names_what_is_wrong_with_the_annotation() -> None:
    (problem,) = resolve_policy(None, json.dumps({"maxSegmentz": 4})).problems
    assert "unknown auto-scale policy knob 'maxSegmentz'" in problem
    (problem,) = resolve_policy(None, json.dumps({"splitCooldown": "soon"})).problems
    assert "splitCooldown" in problem and "invalid duration 'soon'" in problem


def test_an_invalid_combination_names_each_knob_and_its_level() -> None:
    with pytest.raises(PolicyError) as info:
        resolve_policy(
            {"minSegments": 5},
            json.dumps({"maxSegments": 3}),
            ClusterDefaults(knobs={"split_cooldown": 1.0}),
        )
    assert str(info.value) == (
        "maxSegments (3) must be >= minSegments (5) (maxSegments from the namespace's "
        "scalabletopics.io/autoscale-policy annotation, minSegments from spec.autoScale)"
    )
    with pytest.raises(PolicyError, match="unknown auto-scale policy knob 'bogus'"):
        resolve_policy({"bogus": 1})


def test_cluster_configmap_values_are_parsed_as_users_write_them() -> None:
    cluster, problems = parse_cluster_defaults(
        {
            "mode": "recommend",
            "maxBuckets": "16",
            "loadReportThreshold": "0.5",
            "splitCooldown": "2m",
            "maxSegments": "8",
        }
    )
    assert problems == ()
    assert cluster == ClusterDefaults(
        mode=ClusterMode.RECOMMEND,
        knobs={"split_cooldown": 120.0, "max_segments": 8},
        bucket_max=16,
        load_report_threshold=0.5,
    )
    assert parse_cluster_defaults(None, cluster) == (ClusterDefaults(), ())


@given(
    st.sampled_from(
        [
            ("mode", "sometimes", "not one of off, recommend, auto"),
            ("maxBuckets", "0", "not an integer from 1 to 1024"),
            ("maxBuckets", "2048", "not an integer from 1 to 1024"),
            ("loadReportThreshold", "1.5", "not a fraction from 0 to 1"),
            ("loadReportThreshold", "lots", "not a fraction from 0 to 1"),
            ("splitCooldown", "soon", "invalid duration"),
            ("maxSegmentz", "3", "unknown auto-scale policy knob"),
        ]
    ),
    st.sampled_from(list(ClusterMode)),
    st.integers(1, 1024),
    st.integers(64, 128),
    st.floats(0, 1),
)
def test_an_invalid_key_is_named_and_keeps_its_previous_value(
    bad: tuple[str, str, str],
    mode: ClusterMode,
    bucket_max: int,
    max_segments: int,
    threshold: float,
) -> None:
    key, value, words = bad
    previous = ClusterDefaults(
        mode=mode,
        knobs={"max_segments": max_segments, "split_cooldown": 5.0},
        bucket_max=bucket_max,
        load_report_threshold=threshold,
    )
    data = {"mode": mode.value, "maxBuckets": str(bucket_max), "maxSegments": str(max_segments)}
    data["loadReportThreshold"] = repr(threshold)
    data["splitCooldown"] = "5s"
    data[key] = value
    cluster, problems = parse_cluster_defaults(data, previous)
    assert cluster == previous
    (problem,) = problems
    assert problem.key == key and words in problem.message


def test_knob_defaults_that_do_not_combine_keep_the_previous_ones() -> None:
    previous = ClusterDefaults(knobs={"max_segments": 8})
    cluster, problems = parse_cluster_defaults({"minSegments": "100"}, previous)
    assert cluster.knobs == {"max_segments": 8}
    (problem,) = problems
    assert problem.key == "minSegments"
    assert "maxSegments (64) must be >= minSegments (100)" in problem.message
