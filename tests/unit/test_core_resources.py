"""core.resources: the ScalableTopic/Segment models, conditions, manual requests."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalable_topics.core import resources as r
from scalable_topics.core.layout import HashRange, SegmentState
from scalable_topics.core.policy import MIB, AutoScalePolicy, PolicyMode

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "orders.yaml"


# -- ScalableTopic spec ------------------------------------------------------------------------


def test_empty_spec_gets_the_documented_defaults() -> None:
    spec = r.parse_topic_spec({})
    assert spec.initial_segments == 1
    assert spec.entry_buckets == 4
    assert spec.consumer_grace_period == 60.0
    assert spec.subscriptions == []
    assert spec.auto_scale is None
    assert spec.retention is None
    assert spec.policy() == AutoScalePolicy()
    assert r.parse_topic_spec(None) == spec


def test_example_manifest_validates_and_means_what_its_comments_say() -> None:
    topic = r.parse_topic(yaml.safe_load(EXAMPLE.read_text()))
    assert topic.metadata["name"] == "orders"
    spec = topic.spec
    assert spec.initial_segments == 2
    assert [(s.name, s.type, s.assignment) for s in spec.subscriptions] == [
        ("billing", r.SubscriptionType.STREAM, r.AssignmentStrategy.STICKY),
        ("audit", r.SubscriptionType.QUEUE, r.AssignmentStrategy.STICKY),
    ]
    assert spec.retention is not None
    assert (spec.retention.time, spec.retention.size) == (3600.0, 1024 * MIB)
    policy = spec.policy()
    assert policy.split_msg_rate_in_threshold == 300.0
    assert policy.merge_bytes_rate_in_threshold == 64 * 1024
    assert (policy.min_segments, policy.max_segments) == (2, 8)
    assert (policy.split_cooldown, policy.merge_cooldown, policy.merge_window) == (30, 120, 60)
    assert policy.mode is PolicyMode.AUTO
    # Not set in the example: comes from the operator's defaults.
    assert policy.max_dag_depth == AutoScalePolicy().max_dag_depth


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"initialSegments": 0},
            "spec.initialSegments: Input should be greater than or equal to 1",
        ),
        (
            {"initialSegments": 1025},
            "spec.initialSegments: Input should be less than or equal to 1024",
        ),
        ({"initialSegments": "2"}, "spec.initialSegments: Input should be a valid integer"),
        ({"initialSegments": True}, "spec.initialSegments: Input should be a valid integer"),
        ({"entryBuckets": 0}, "spec.entryBuckets: Input should be greater than or equal to 1"),
        ({"entryBuckets": 2048}, "spec.entryBuckets: Input should be less than or equal to 1024"),
        ({"partitions": 3}, "spec.partitions: Extra inputs are not permitted"),
        (
            {"consumerGracePeriod": "1 minute"},
            "spec.consumerGracePeriod: invalid duration '1 minute': use e.g. '90s', '5m', '1h30m'",
        ),
        (
            {"consumerGracePeriod": 1.5},
            "spec.consumerGracePeriod: must be a whole number of seconds or a string such as "
            "'90s', '5m', '1h30m'",
        ),
        (
            {"autoScale": {"splitBytesRateInThreshold": 0.5}},
            "spec.autoScale.splitBytesRateInThreshold: must be a whole number of bytes or a "
            "string such as 52428800, '50Mi', '1.5Gi'",
        ),
        (
            {"consumerGracePeriod": -1},
            "spec.consumerGracePeriod: Input should be greater than or equal to 0",
        ),
        (
            {"autoScale": {"maxSegments": 2, "minSegments": 3}},
            "spec.autoScale: maxSegments (2) must be >= minSegments (3)",
        ),
        (
            {"autoScale": {"splitMsgRateInThreshold": 100, "mergeMsgRateInThreshold": 100}},
            "spec.autoScale: splitMsgRateInThreshold (100) must be above "
            "mergeMsgRateInThreshold (100)",
        ),
        (
            {
                "autoScale": {
                    "splitBytesRateOutThreshold": "1Mi",
                    "mergeBytesRateOutThreshold": "2Mi",
                }
            },
            "spec.autoScale: splitBytesRateOutThreshold (1Mi) must be above "
            "mergeBytesRateOutThreshold (2Mi)",
        ),
        (
            {"autoScale": {"splitMsgRateInThreshold": 0}},
            "spec.autoScale.splitMsgRateInThreshold: Input should be greater than 0",
        ),
        (
            {"autoScale": {"mode": "yolo"}},
            "spec.autoScale.mode: Input should be 'auto' or 'recommend'",
        ),
        (
            {"autoScale": {"splitCooldwon": "1m"}},
            "spec.autoScale.splitCooldwon: Extra inputs are not permitted",
        ),
        (
            {"autoScale": {"splitBytesRateInThreshold": "lots"}},
            "spec.autoScale.splitBytesRateInThreshold: invalid quantity 'lots': use e.g. "
            "52428800, '50Mi', '1.5Gi'",
        ),
        (
            {"subscriptions": [{"name": "a", "type": "Stream"}, {"name": "a", "type": "Queue"}]},
            "spec.subscriptions: duplicate subscription name 'a'",
        ),
        (
            {"subscriptions": [{"name": "billing", "type": "Topic"}]},
            "spec.subscriptions[0].type: Input should be 'Stream' or 'Queue'",
        ),
        (
            {"subscriptions": [{"name": "billing", "type": "Stream", "assignment": "random"}]},
            "spec.subscriptions[0].assignment: Input should be 'sticky' or 'round-robin'",
        ),
        (
            {"subscriptions": [{"type": "Stream"}]},
            "spec.subscriptions[0].name: Field required",
        ),
        (
            {"subscriptions": [{"name": "-x", "type": "Stream"}]},
            "spec.subscriptions[0].name: String should match pattern "
            "'^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$'",
        ),
        (
            {"retention": {"time": "forever"}},
            "spec.retention.time: invalid duration 'forever': use e.g. '90s', '5m', '1h30m'",
        ),
    ],
)
def test_invalid_specs_are_rejected_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(r.ResourceValidationError) as info:
        r.parse_topic_spec(spec)
    assert str(info.value) == f"invalid ScalableTopic spec: {message}"
    assert isinstance(info.value, ValueError)


def test_every_bad_field_is_reported_at_once() -> None:
    with pytest.raises(r.ResourceValidationError) as info:
        r.parse_topic_spec({"initialSegments": 0, "entryBuckets": 0})
    assert [path for path, _ in info.value.problems] == [
        "spec.initialSegments",
        "spec.entryBuckets",
    ]


def test_durations_and_quantities_accept_numbers_and_unit_strings() -> None:
    spec = r.parse_topic_spec(
        {
            "consumerGracePeriod": "1h30m",
            "retention": {"time": 90, "size": "50MB"},
            "autoScale": {"splitCooldown": "250ms", "splitBytesRateInThreshold": 1000},
        }
    )
    assert spec.consumer_grace_period == 5400.0
    assert spec.retention is not None
    assert (spec.retention.time, spec.retention.size) == (90.0, 50 * MIB)
    assert spec.auto_scale is not None
    knobs = spec.auto_scale.knobs()
    assert knobs == {"split_cooldown": 0.25, "split_bytes_rate_in_threshold": 1000.0}
    # JSON output is what the int-or-string schema accepts (no 5400.0).
    dumped = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["consumerGracePeriod"] == "1h30m"
    assert dumped["retention"] == {"time": "1m30s", "size": 50 * MIB}
    assert dumped["autoScale"] == {"splitCooldown": "0.25s", "splitBytesRateInThreshold": 1000}
    assert r.parse_topic_spec(dumped) == spec


def test_auto_scale_override_mirrors_every_policy_knob() -> None:
    override_fields = r.AutoScaleOverride.model_fields
    policy_fields = AutoScalePolicy.model_fields
    assert list(override_fields) == list(policy_fields)
    for name, info in override_fields.items():
        assert info.alias == policy_fields[name].alias
        assert info.default is None
        assert info.description and not info.description.startswith(name), (
            f"describe the knob {name} in core.resources._KNOB_DOCS"
        )
    # Constraints are the policy's own (maxDagDepth >= 0, evaluationInterval > 0).
    with pytest.raises(ValueError, match=r"autoScale\.maxDagDepth"):
        r.parse_topic_spec({"autoScale": {"maxDagDepth": -1}})
    with pytest.raises(ValueError, match=r"autoScale\.evaluationInterval"):
        r.parse_topic_spec({"autoScale": {"evaluationInterval": 0}})


def test_policy_resolution_topic_then_namespace_then_defaults() -> None:
    spec = r.parse_topic_spec({"autoScale": {"maxSegments": 16, "splitCooldown": "2m"}})
    policy = spec.policy(namespace={"maxSegments": 32, "minSegments": 2})
    assert policy.max_segments == 16
    assert policy.min_segments == 2
    assert policy.split_cooldown == 120.0
    assert policy.merge_cooldown == AutoScalePolicy().merge_cooldown


def test_a_combination_invalid_only_after_resolution_names_the_knobs() -> None:
    spec = r.parse_topic_spec({"autoScale": {"minSegments": 100}})
    with pytest.raises(r.ResourceValidationError) as info:
        spec.policy()
    assert str(info.value) == (
        "invalid effective auto-scale policy: maxSegments (64) must be >= minSegments (100) "
        "(maxSegments from the operator's default, minSegments from spec.autoScale)"
    )


@pytest.mark.parametrize(
    ("spec", "namespace", "problem"),
    [
        ({"initialSegments": 5}, {"maxSegments": 8}, None),
        ({"initialSegments": 64}, None, None),
        (
            {"initialSegments": 5},
            {"maxSegments": 3},
            "spec.initialSegments (5) is above maxSegments (3) of the effective auto-scale "
            "policy (from the namespace's scalabletopics.io/autoscale-policy annotation)",
        ),
        (
            {"initialSegments": 65},
            None,
            "spec.initialSegments (65) is above maxSegments (64) of the effective auto-scale "
            "policy (from the operator's default)",
        ),
        (
            {"initialSegments": 2, "autoScale": {"minSegments": 3}},
            {"minSegments": 1},
            "spec.initialSegments (2) is below minSegments (3) of the effective auto-scale "
            "policy (from spec.autoScale)",
        ),
        # the topic's own bound wins over the namespace's
        ({"initialSegments": 5, "autoScale": {"maxSegments": 5}}, {"maxSegments": 3}, None),
    ],
)
def test_initial_segments_against_the_effective_policy_name_the_bound_and_its_source(
    spec: dict[str, Any], namespace: dict[str, Any] | None, problem: str | None
) -> None:
    parsed = r.parse_topic_spec(spec)
    found = parsed.initial_segments_problem(parsed.resolution(namespace))
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found
        assert "initialSegments is immutable" in found


def test_topic_name_must_fit_in_a_label_value() -> None:
    with pytest.raises(r.ResourceValidationError, match="longer than 63 characters"):
        r.parse_topic(
            {"apiVersion": r.API_VERSION, "kind": r.TOPIC_KIND, "metadata": {"name": "x" * 64}}
        )
    with pytest.raises(r.ResourceValidationError, match="kind: Input should be 'ScalableTopic'"):
        r.parse_topic({"apiVersion": r.API_VERSION, "kind": "Segment", "metadata": {}})


# -- status ------------------------------------------------------------------------------------


def test_status_reader_ignores_fields_it_does_not_know() -> None:
    status = r.ScalableTopicStatus.model_validate(
        {
            "observedGeneration": 3,
            "epoch": 2,
            "activeSegments": 3,
            "futureField": {"x": 1},
            "conditions": [
                r.condition("Ready", True, r.Reason.RECONCILED, "ok", 3, now=0.0),
            ],
            "lastSplitAt": "2026-11-22T04:00:00Z",
        }
    )
    ready = status.condition("Ready")
    assert ready is not None and ready.status is r.ConditionStatus.TRUE
    assert ready.last_transition_time == "1970-01-01T00:00:00Z"
    assert status.condition("Stalled") is None


def test_status_rejects_a_malformed_timestamp() -> None:
    with pytest.raises(ValueError, match="invalid RFC 3339 time 'yesterday'"):
        r.ScalableTopicStatus.model_validate({"lastSplitAt": "yesterday"})
    with pytest.raises(ValueError, match="has no time zone"):
        r.ScalableTopicStatus.model_validate({"lastSplitAt": "2026-11-22T04:00:00"})


def test_time_helpers_round_trip() -> None:
    assert r.format_time(1_700_000_000.9) == "2023-11-14T22:13:20Z"
    assert r.parse_time("2023-11-14T22:13:20Z") == 1_700_000_000.0
    assert r.parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000.0


# -- conditions --------------------------------------------------------------------------------


def test_condition_builds_a_metav1_condition() -> None:
    assert r.condition("Ready", False, "InvalidSpec", "bad", generation=4, now=60.0) == {
        "type": "Ready",
        "status": "False",
        "reason": "InvalidSpec",
        "message": "bad",
        "lastTransitionTime": "1970-01-01T00:01:00Z",
        "observedGeneration": 4,
    }
    assert r.condition("Ready", "Unknown", "Initializing", now=0.0)["status"] == "Unknown"
    assert "observedGeneration" not in r.condition("Ready", True, "Reconciled", now=0.0)


@pytest.mark.parametrize(
    ("status", "reason", "message"),
    [
        ("yes", "Reconciled", "condition Ready: status must be True, False or Unknown, got 'yes'"),
        (True, "not camel case", "condition Ready: reason must be CamelCase, got 'not camel case'"),
        (True, "", "condition Ready: reason must be CamelCase, got ''"),
    ],
)
def test_condition_rejects_bad_status_or_reason(status: Any, reason: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        r.condition("Ready", status, reason, now=0.0)
    assert str(info.value) == message


def test_set_condition_keeps_transition_time_when_status_is_unchanged() -> None:
    first = [
        r.condition("Ready", False, "Creating", "creating segments", 1, now=100.0),
        r.condition("Reconciling", True, "Creating", "", 1, now=100.0),
    ]
    again = r.set_condition(
        first, r.condition("Ready", False, "BrokersUnavailable", "no", 2, 500.0)
    )
    assert again[0]["lastTransitionTime"] == r.format_time(100.0)
    assert (again[0]["reason"], again[0]["message"], again[0]["observedGeneration"]) == (
        "BrokersUnavailable",
        "no",
        2,
    )
    flipped = r.set_condition(again, r.condition("Ready", True, "Reconciled", "", 2, now=900.0))
    assert flipped[0]["lastTransitionTime"] == r.format_time(900.0)
    assert [c["type"] for c in flipped] == ["Ready", "Reconciling"]
    assert first[0]["reason"] == "Creating", "the input list is not modified"
    added = r.set_condition(flipped, r.condition("Stalled", False, "Reconciled", now=1000.0))
    assert [c["type"] for c in added] == ["Ready", "Reconciling", "Stalled"]
    assert r.set_condition(None, first[0]) == [first[0]]
    assert r.get_condition(added, "Stalled") == added[2]
    assert r.get_condition(added, "Missing") is None


def test_re_asserting_a_condition_is_a_no_op() -> None:
    conditions = [r.condition("Ready", True, "Reconciled", "ok", 5, now=10.0)]
    assert r.set_condition(conditions, r.condition("Ready", True, "Reconciled", "ok", 5, 99.0)) == (
        conditions
    )


# -- manual requests ---------------------------------------------------------------------------


def test_manual_requests_parse() -> None:
    split = r.parse_manual_request('{"id": "r1", "op": "split", "segments": [3], "at": 4096}')
    assert (split.id, split.op, split.segments, split.at) == (
        "r1",
        r.ManualRequestOp.SPLIT,
        [3],
        4096,
    )
    merge = r.parse_manual_request('{"id": 7, "op": "merge", "segments": [4, 5, 6]}')
    assert (merge.id, merge.op, merge.segments, merge.at) == (
        "7",
        r.ManualRequestOp.MERGE,
        [4, 5, 6],
        None,
    )
    assert r.parse_manual_request(split.to_annotation()) == split
    assert json.loads(merge.to_annotation()) == {"id": "7", "op": "merge", "segments": [4, 5, 6]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("split 3", "not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("[1, 2]", "expected an object, got [1, 2]"),
        ('{"op": "split", "segments": [1]}', "id: Field required"),
        (
            '{"id": "", "op": "split", "segments": [1]}',
            "id: String should have at least 1 character",
        ),
        (
            '{"id": "a", "op": "prune", "segments": [1]}',
            "op: Input should be 'split', 'merge' or 'move'",
        ),
        (
            '{"id": "a", "op": "move", "segments": [1]}',
            "a move names the broker pod it goes 'to'; only a move does",
        ),
        (
            '{"id": "a", "op": "split", "segments": [1], "to": "broker-1"}',
            "a move names the broker pod it goes 'to'; only a move does",
        ),
        (
            '{"id": "a", "op": "move", "segments": [1, 2], "to": "broker-1"}',
            "a move names exactly one segment, got [1, 2]",
        ),
        (
            '{"id": "a", "op": "move", "segments": [1], "to": ""}',
            "to: String should have at least 1 character",
        ),
        (
            '{"id": "a", "op": "split", "segments": [1, 2]}',
            "a split names exactly one segment, got [1, 2]",
        ),
        (
            '{"id": "a", "op": "split", "segments": []}',
            "segments: List should have at least 1 item after validation, not 0",
        ),
        (
            '{"id": "a", "op": "merge", "segments": [1]}',
            "a merge names two or more segments, got [1]",
        ),
        (
            '{"id": "a", "op": "merge", "segments": [1, 1]}',
            "a merge names each segment once, got [1, 1]",
        ),
        (
            '{"id": "a", "op": "merge", "segments": [1, 2], "at": 5}',
            "'at' is only valid for a split",
        ),
        ('{"id": "a", "op": "split", "segments": [-1]}', "segments: segment ids are >= 0, got -1"),
        (
            '{"id": "a", "op": "split", "segments": [1], "at": 65535}',
            "at: Input should be less than 65535",
        ),
        (
            '{"id": "a", "op": "split", "segments": ["1"]}',
            "segments[0]: Input should be a valid integer",
        ),
        (
            '{"id": "a", "op": "split", "segments": [1], "force": true}',
            "force: Extra inputs are not permitted",
        ),
    ],
)
def test_bad_manual_requests_are_rejected(text: str, message: str) -> None:
    with pytest.raises(r.ResourceValidationError) as info:
        r.parse_manual_request(text)
    assert str(info.value) == f"invalid scalabletopics.io/request annotation: {message}"


# -- Segment -----------------------------------------------------------------------------------


def test_segment_manifest_is_named_labelled_owned_and_valid() -> None:
    body = r.segment_manifest(
        topic="orders",
        namespace="shop",
        topic_uid="uid-1",
        segment_id=5,
        hash_range=HashRange(0x8000, 0xBFFF),
        parents=[2],
        buckets=2,
    )
    assert body["metadata"]["name"] == "orders-5" == r.segment_name("orders", 5)
    assert body["metadata"]["labels"][r.LABEL_TOPIC] == "orders"
    assert body["metadata"]["labels"][r.LABEL_SEGMENT_ID] == "5"
    owner = body["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "ScalableTopic",
        "orders",
        "uid-1",
        True,
    )
    assert body["spec"] == {
        "topic": "orders",
        "segmentId": 5,
        "range": {"start": 0x8000, "end": 0xBFFF, "hex": "8000-bfff"},
        "parents": [2],
        "buckets": 2,
    }
    segment = r.parse_segment(body)
    assert segment.spec.range.to_hash_range() == HashRange(0x8000, 0xBFFF)
    assert segment.status is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"segmentId": 1, "range": {"start": 0, "end": 1}}, "spec.topic: Field required"),
        (
            {"topic": "t", "segmentId": 1, "range": {"start": 9, "end": 1}},
            "spec.range: invalid hash range [9, 1]: need 0 <= start <= end <= 0xffff",
        ),
        (
            {"topic": "t", "segmentId": 1, "range": {"start": 0, "end": 65536}},
            "spec.range.end: Input should be less than or equal to 65535",
        ),
        (
            {"topic": "t", "segmentId": 1, "range": {"start": 0, "end": 255, "hex": "0000-0fff"}},
            "spec.range: hex '0000-0fff' does not match start/end (0000-00ff)",
        ),
        (
            {"topic": "t", "segmentId": 1, "range": {"start": 0, "end": 1}, "buckets": 0},
            "spec.buckets: Input should be greater than or equal to 1",
        ),
        (
            {"topic": "Orders", "segmentId": 1, "range": {"start": 0, "end": 1}},
            "spec.topic: String should match pattern "
            "'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'",
        ),
    ],
)
def test_invalid_segment_specs(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(r.ResourceValidationError) as info:
        r.parse_segment_spec(spec)
    assert str(info.value) == f"invalid Segment spec: {message}"


def test_segment_range_hex_is_filled_in() -> None:
    spec = r.parse_segment_spec({"topic": "t", "segmentId": 0, "range": {"start": 0, "end": 65535}})
    assert spec.range.hex == "0000-ffff"
    assert spec.parents == [] and spec.buckets == 1


def test_segment_status_and_phase_mapping() -> None:
    status = r.SegmentStatus.model_validate(
        {
            "state": "Active",
            "broker": {"pod": "broker-0", "url": "http://127.0.0.2:8080"},
            "load": {"msgRateIn": 12.5, "bytesRateIn": 100, "updatedAt": "2026-11-22T04:00:00Z"},
            "backlog": {"billing": 10, "audit": 0},
        }
    )
    assert status.state is r.SegmentPhase.ACTIVE
    assert status.load is not None and status.load.msg_rate_out == 0.0
    assert r.SegmentPhase.from_layout(SegmentState.ACTIVE) is r.SegmentPhase.ACTIVE
    assert r.SegmentPhase.from_layout(SegmentState.SEALED) is r.SegmentPhase.SEALED
    with pytest.raises(ValueError, match="Input should be 'Pending', 'Active' or 'Sealed'"):
        r.SegmentStatus.model_validate({"state": "ACTIVE"})


@pytest.mark.parametrize("segment_id", [-1, True, 1.0])
def test_segment_name_rejects_bad_ids(segment_id: Any) -> None:
    with pytest.raises(ValueError, match="segment id must be a non-negative integer"):
        r.segment_name("orders", segment_id)


def test_docs_cover_every_knob_field_and_reason() -> None:
    docs = (ROOT / "docs" / "resources.md").read_text()
    for info in AutoScalePolicy.model_fields.values():
        assert f"`{info.alias}`" in docs, f"docs/resources.md does not document {info.alias}"
    for model in (r.ScalableTopicSpec, r.SubscriptionSpec, r.Retention, r.SegmentSpec):
        for info in model.model_fields.values():
            assert info.alias is not None and info.alias in docs, info.alias
    topic_docs, segment_docs = docs.split("\n## Segment\n")
    for status_model, section in (
        (r.ScalableTopicStatus, topic_docs),
        (r.SegmentStatus, segment_docs),
    ):
        for info in status_model.model_fields.values():
            assert f"`{info.alias}`" in section or f"`{info.alias}[]`" in section, (
                status_model.__name__,
                info.alias,
            )
    reasons = [v for k, v in vars(r.Reason).items() if k.isupper()]
    assert reasons
    for reason in reasons:
        assert f"`{reason}`" in docs, f"docs/resources.md does not list the reason {reason}"
    for condition_type in r.ConditionType:
        assert f"`{condition_type.value}`" in docs


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("time", "250ms"),
        ("time", "1.5h"),
        ("time", "2h30m15s"),
        ("time", 86400),
        ("size", "1.3Mi"),
        ("size", "10Gi"),
        ("size", 12345),
        ("size", "0.5"),
    ],
)
def test_json_output_parses_back_to_the_same_value_and_passes_the_pattern(
    field: str, text: Any
) -> None:
    retention = r.Retention.model_validate({field: text})
    dumped = retention.model_dump(mode="json", exclude_none=True)[field]
    assert isinstance(dumped, int | str) and not isinstance(dumped, bool)
    if isinstance(dumped, str):
        pattern = r.DURATION_PATTERN if field == "time" else r.QUANTITY_PATTERN
        assert re.match(pattern, dumped), dumped
    assert r.Retention.model_validate({field: dumped}) == retention
