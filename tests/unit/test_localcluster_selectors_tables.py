"""Label/field selectors, the printer-column JSONPath subset and kubectl-style ages."""

from __future__ import annotations

import pytest

from scalable_topics.localcluster.errors import ApiError
from scalable_topics.localcluster.selectors import (
    format_selector,
    label_selector_from_api,
    make_filter,
    parse_label_selector,
)
from scalable_topics.localcluster.tables import human_duration, jsonpath


def _obj(labels: dict[str, str], **extra: object) -> dict[str, object]:
    return {"metadata": {"name": "n", "namespace": "ns", "labels": labels}, **extra}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),b", {"a": "2", "b": ""}, True),
        ("a notin (1,2)", {"a": "3"}, True),
        ("a notin (1,2)", {"a": "1"}, False),
        ("!a", {"b": "1"}, True),
        ("!a", {"a": "1"}, False),
        ("a,b=2", {"a": "x", "b": "2"}, True),
        ("x.io/team=blue", {"x.io/team": "blue"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    match = make_filter(selector, None)
    assert match is not None
    assert match(_obj(labels)) is expected


def test_field_selectors_and_errors() -> None:
    event = {
        "metadata": {"name": "e", "namespace": "ns"},
        "involvedObject": {"kind": "Widget", "name": "alpha", "uid": "u1"},
        "source": {"component": "kopf"},
    }
    match = make_filter(
        None, "involvedObject.kind=Widget,involvedObject.name=alpha,metadata.namespace=ns"
    )
    assert match is not None and match(event)
    negated = make_filter(None, "involvedObject.uid!=u1")
    assert negated is not None and not negated(event)
    source = make_filter(None, "source=kopf")
    assert source is not None and source(event)
    with pytest.raises(ApiError):
        parse_label_selector("a in (")


def test_label_selector_round_trip_from_api() -> None:
    reqs = label_selector_from_api(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}],
        }
    )
    assert format_selector(reqs) == "app=web,tier in (a,b)"


def test_jsonpath_subset() -> None:
    obj = {
        "metadata": {"labels": {"a.b/c": "v"}},
        "spec": {"items": [{"n": 1}, {"n": 2}]},
        "status": {
            "conditions": [
                {"type": "Synced", "status": "False"},
                {"type": "Ready", "status": "True"},
            ]
        },
    }
    assert jsonpath(obj, '.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert jsonpath(obj, ".metadata.labels.a\\.b/c") == ["v"]
    assert jsonpath(obj, ".metadata.labels['a.b/c']") == ["v"]
    assert jsonpath(obj, ".spec.items[1].n") == [2]
    assert jsonpath(obj, ".spec.items[*].n") == [1, 2]
    assert jsonpath(obj, "{.spec.missing}") == []


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "5s"),
        (119, "119s"),
        (150, "2m30s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 7200, "3d2h"),
        (40 * 86400, "40d"),
    ],
)
def test_human_duration_matches_kubectl(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text
