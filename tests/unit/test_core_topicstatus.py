"""core.topicstatus: each status change of a ScalableTopic as a pure function on the typed
status, and a round trip that loses nothing the operator does not own."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalable_topics.core import topicstatus as ts
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.operation import Operation, plan_merge, plan_split
from scalable_topics.core.policy import ClusterDefaults, ClusterMode, resolve_policy
from scalable_topics.core.resources import (
    REQUEST_HISTORY,
    AutoScaleDecision,
    ControllerRef,
    LastRequest,
    SegmentStatus,
    format_time,
    layout_status,
)

from .test_crds import _status_ok

T0 = 1_700_000_000.0


def written(raw: dict[str, Any] | None, change: ts.StatusChange) -> dict[str, Any]:
    return ts.apply_change(raw, change)


def outcome(request_id: str, result: str = "Succeeded", **extra: Any) -> dict[str, Any]:
    return {
        "id": request_id,
        "op": "split",
        "result": result,
        "message": f"split for {request_id}",
        "completedAt": "2026-11-22T04:00:00Z",
        **extra,
    }


def full_status() -> dict[str, Any]:
    """A status as the operator, the consumer hub, the auto-scaler and the recommender leave it,
    with fields no model knows at several depths (a newer operator's, say)."""
    layout = SegmentLayout.initial(2)
    return {
        "observedGeneration": 3,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Reconciled",
                "message": "2 active segment(s) at epoch 0",
                "lastTransitionTime": "2026-11-22T04:00:00+00:00",
                "observedGeneration": 3,
            }
        ],
        "layout": layout_status(layout),
        "epoch": 0,
        "nextSegmentId": 2,
        "activeSegments": 2,
        "dag": "whatever an older operator drew",
        "controller": {
            "pod": "op-1",
            "url": "http://op-1",
            "shard": 0,
            "since": "2026-11-22T04:00:00Z",
            "zone": "a",
        },
        "subscriptions": [
            {"name": "orders", "type": "Queue", "consumers": [], "queueCursor": {"0": 12}}
        ],
        "recommendation": {"computedAt": "2026-11-22T04:00:00Z", "window": "20m", "actions": []},
        "autoScale": {
            "mode": "auto",
            "policy": {"maxSegments": "8"},
            "sources": {"maxSegments": "default"},
            "lastDecision": {
                "action": "split",
                "segments": [0],
                "source": "auto",
                "executed": True,
                "reason": "hot",
                "decidedAt": "2026-11-22T04:00:00Z",
                "future": 1,
            },
        },
        "someNewerField": {"a": [1, 2]},
    }


# -- the round trip ----------------------------------------------------------------------------


def test_no_change_writes_back_exactly_what_was_read() -> None:
    raw = full_status()
    assert written(raw, lambda s: s) == raw


def test_a_change_keeps_everything_it_does_not_touch() -> None:
    raw = full_status()
    layout = SegmentLayout.initial(2).split(0)
    after = written(raw, lambda s: ts.with_layout(s, layout))
    assert after["layout"] == layout_status(layout)
    assert after["epoch"] == layout.epoch and after["nextSegmentId"] == 4
    assert after["activeSegments"] == 3
    for key in ("someNewerField", "subscriptions", "recommendation", "autoScale", "controller"):
        assert after[key] == raw[key], key
    # a timestamp spelled another valid way is not rewritten when its condition is not touched
    assert after["conditions"] == raw["conditions"]
    assert raw == full_status(), "the input is not modified"


def test_a_changed_object_keeps_its_unknown_keys() -> None:
    raw = full_status()
    resolution = resolve_policy(None, None, ClusterDefaults(mode=ClusterMode.RECOMMEND))
    after = written(raw, lambda s: ts.with_policy(s, resolution, None))
    assert after["autoScale"]["mode"] == "recommend"
    assert after["autoScale"]["lastDecision"] == raw["autoScale"]["lastDecision"]
    assert after["autoScale"]["lastDecision"]["future"] == 1


def test_a_field_that_does_not_validate_is_kept_and_stops_nothing() -> None:
    raw = full_status()
    raw["recommendation"] = {"computedAt": "yesterday"}
    raw["recentRequests"] = "not a list"
    after = written(raw, lambda s: ts.reject_request(s, "r1", "merge", "no", T0))
    assert after["recommendation"] == {"computedAt": "yesterday"}
    assert after["lastRequest"]["id"] == "r1"
    assert [e["id"] for e in after["recentRequests"]] == ["r1"]


def test_an_object_restored_without_status_gets_only_what_the_change_sets() -> None:
    layout = SegmentLayout.initial(3)
    after = written(None, lambda s: ts.with_layout(s, layout))
    assert after == {
        "layout": layout_status(layout),
        "epoch": 0,
        "nextSegmentId": 3,
        "activeSegments": 3,
        "dag": after["dag"],
    }
    assert "#0" in after["dag"] or "0" in after["dag"]
    _status_ok(after)


def test_segment_status_round_trip_keeps_what_brokers_write() -> None:
    """The same merge on a Segment's status: a change of the epochs the leader records leaves
    the broker's load, backlog and corruption report exactly as the broker wrote them."""
    raw = {
        "state": "Sealed",
        "broker": {"pod": "b-0", "url": "http://b-0"},
        "load": {"msgRateIn": 1.5, "bytesRateIn": 10, "updatedAt": "2026-11-22T04:00:00+00:00"},
        "backlog": {"orders": 12},
        "brokerOnly": True,
    }
    before = ts.read_model(SegmentStatus, raw)
    after = before.model_copy(update={"created_at_epoch": 0, "sealed_at_epoch": 2})
    out = ts.write_status(raw, before, after)
    assert out == {**raw, "createdAtEpoch": 0, "sealedAtEpoch": 2}
    assert ts.write_status(raw, before, before) == raw


_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=8).map(
    lambda k: "x" + k
)
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(
    top=st.dictionaries(_keys, _values, max_size=3),
    auto=st.dictionaries(_keys, _values, max_size=3),
    controller=st.dictionaries(_keys, _values, max_size=2),
    epochs=st.integers(min_value=0, max_value=3),
)
def test_unknown_fields_survive_any_change(
    top: dict[str, Any], auto: dict[str, Any], controller: dict[str, Any], epochs: int
) -> None:
    raw = full_status()
    raw.update(top)
    raw["autoScale"].update(auto)
    raw["controller"].update(controller)
    pristine = copy.deepcopy(raw)
    layout = SegmentLayout.initial(2)
    for _ in range(epochs):
        layout = layout.split(min(s.segment_id for s in layout.active()))
    ref = ControllerRef(pod="op-2", url="http://op-2", shard=1)
    after = written(
        raw,
        lambda s: ts.with_policy(
            ts.reconciled(ts.with_layout(s, layout), layout, generation=4, now=T0, controller=ref),
            None,
            "bad",
        ),
    )
    assert raw == pristine
    for key, value in top.items():
        assert after[key] == value
    for key, value in auto.items():
        assert after["autoScale"][key] == value
    for key, value in controller.items():
        assert after["controller"][key] == value
    assert after["controller"]["pod"] == "op-2"
    assert after["autoScale"]["problem"] == "bad"
    assert after["epoch"] == epochs


# -- conditions --------------------------------------------------------------------------------


def test_reasserting_the_same_conditions_changes_nothing() -> None:
    layout = SegmentLayout.initial(2)
    ref = ControllerRef(pod="op-1", url="http://op-1", shard=0)
    first = written({}, lambda s: ts.reconciled(s, layout, generation=1, now=T0, controller=ref))
    again = written(
        first, lambda s: ts.reconciled(s, layout, generation=1, now=T0 + 60, controller=ref)
    )
    assert again == first
    ready = next(c for c in first["conditions"] if c["type"] == "Ready")
    assert ready == {
        "type": "Ready",
        "status": "True",
        "reason": "Reconciled",
        "message": "2 active segment(s) at epoch 0",
        "lastTransitionTime": format_time(T0),
        "observedGeneration": 1,
    }
    assert first["observedGeneration"] == 1
    assert first["controller"]["since"] == format_time(T0)
    _status_ok(first)


def test_transition_time_moves_only_when_the_status_does() -> None:
    layout = SegmentLayout.initial(1)
    ref = ControllerRef(pod="op-1")
    ok = written({}, lambda s: ts.reconciled(s, layout, generation=1, now=T0, controller=ref))
    other_message = written(
        ok,
        lambda s: ts.reconciled(s, layout.split(0), generation=2, now=T0 + 5, controller=ref),
    )
    ready = {c["type"]: c for c in other_message["conditions"]}["Ready"]
    assert ready["message"] == "2 active segment(s) at epoch 1"
    assert ready["lastTransitionTime"] == format_time(T0), "same status: time kept"
    broken = written(
        other_message,
        lambda s: ts.reconciled(
            s,
            layout,
            generation=2,
            now=T0 + 9,
            controller=ref,
            problem=("SegmentCorrupted", "segment 0 is quarantined"),
        ),
    )
    conditions = {c["type"]: c for c in broken["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["lastTransitionTime"] == format_time(T0 + 9)
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Stalled"]["reason"] == "SegmentCorrupted"
    _status_ok(broken)


def test_reconciling_says_what_is_in_flight() -> None:
    layout = SegmentLayout.initial(2)
    op = plan_split("split-1", layout, 0, parent_buckets=4, started_at=format_time(T0))
    status = ts.record_intent(ts.with_layout(ts.read_status({}), layout), op)
    assert ts.reconciling_state(status.operation, []) == (
        True,
        "Splitting",
        "split split-1 at phase Intent",
    )
    assert ts.reconciling_state(None, [4, 5])[:2] == (True, "Pruning")
    assert ts.reconciling_state(None, []) == (False, "Idle", "")


def test_controller_since_moves_only_with_the_pod() -> None:
    first = written({}, lambda s: ts.with_controller(s, ControllerRef(pod="a", shard=0), T0))
    moved_shard = written(
        first, lambda s: ts.with_controller(s, ControllerRef(pod="a", shard=1), T0 + 5)
    )
    assert moved_shard["controller"] == {"pod": "a", "shard": 1, "since": format_time(T0)}
    other_pod = written(
        moved_shard, lambda s: ts.with_controller(s, ControllerRef(pod="b", shard=1), T0 + 9)
    )
    assert other_pod["controller"]["since"] == format_time(T0 + 9)


@pytest.mark.parametrize("stalled", [True, False])
def test_not_ready(stalled: bool) -> None:
    raw = full_status()
    after = written(
        raw,
        lambda s: ts.not_ready(
            s, "InvalidSpec", "spec.x: bad", generation=4, now=T0, stalled=stalled
        ),
    )
    conditions = {c["type"]: c for c in after["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == (
        "False",
        "InvalidSpec",
    )
    assert conditions["Stalled"]["status"] == ("True" if stalled else "False")
    assert conditions["Reconciling"]["status"] == ("False" if stalled else "True")
    assert conditions["Reconciling"]["reason"] == ("Idle" if stalled else "Creating")
    assert after["observedGeneration"] == 4
    assert after["layout"] == raw["layout"], "a pass that stops keeps the layout"


def test_not_ready_unbuilt_says_nothing_exists() -> None:
    raw = full_status()
    after = written(
        raw,
        lambda s: ts.not_ready(
            s, "NameTooLong", "too long", generation=1, now=T0, stalled=True, unbuilt=True
        ),
    )
    for key in ("layout", "epoch", "nextSegmentId", "dag"):
        assert key not in after
    assert after["activeSegments"] == 0
    assert after["subscriptions"] == raw["subscriptions"]


# -- manual requests ---------------------------------------------------------------------------


def test_remember_folds_the_last_request_once_and_is_bounded() -> None:
    status = ts.read_status({})
    for k in range(REQUEST_HISTORY + 3):
        status = ts.remember_request(
            status.model_copy(update={"last_request": LastRequest.model_validate(outcome(f"r{k}"))})
        )
    assert [e.id for e in status.recent_requests] == [
        f"r{k}" for k in range(3, REQUEST_HISTORY + 3)
    ]
    assert ts.remember_request(status) == status
    assert ts.find_handled(status, "r2") is None
    found = ts.find_handled(status, "r5")
    assert found is not None and found.result.value == "Succeeded"


def test_reject_records_the_outcome_in_last_request_and_the_history() -> None:
    raw = {"lastRequest": outcome("old", message="m" * 400)}
    after = written(raw, lambda s: ts.reject_request(s, "r1", "explode", "x" * 2000, T0))
    assert after["lastRequest"] == {
        "id": "r1",
        "op": "split",
        "result": "Rejected",
        "message": "x" * 1024,
        "completedAt": format_time(T0),
    }
    assert [e["id"] for e in after["recentRequests"]] == ["old", "r1"]
    assert len(after["recentRequests"][0]["message"]) == 256
    assert (
        written(raw, lambda s: ts.reject_request(s, "r2", "move", "no", T0))["lastRequest"]["op"]
        == "move"
    )
    _status_ok(after)


def test_a_request_handled_before_is_reported_with_its_outcome() -> None:
    raw = {
        "recentRequests": [outcome("a", "Failed", message="rolled back")],
        "lastRequest": outcome("b"),
    }
    status = ts.read_status(raw)
    handled = ts.find_handled(status, "a")
    assert handled is not None
    after = ts.write_status(raw, status, ts.report_handled(status, handled))
    assert after["lastRequest"]["id"] == "a"
    assert after["lastRequest"]["message"] == (
        "already handled (Failed at 2026-11-22T04:00:00Z), not executed again: rolled back"
    )
    assert [e["id"] for e in after["recentRequests"]] == ["a", "b"]


# -- operations --------------------------------------------------------------------------------


def _with_layout(layout: SegmentLayout) -> dict[str, Any]:
    return written({}, lambda s: ts.with_layout(s, layout))


def test_intent_is_refused_while_another_is_in_flight_or_the_layout_moved() -> None:
    layout = SegmentLayout.initial(2)
    op = plan_split("split-1", layout, 0, parent_buckets=4, started_at=format_time(T0))
    recorded = written(_with_layout(layout), lambda s: ts.record_intent(s, op))
    assert Operation.from_status(recorded["operation"]) == op
    # written through the model, a child's range carries its hex form as the CRD describes it
    assert recorded["operation"]["children"][0]["range"]["hex"] == "0000-3fff"
    assert written(recorded, lambda s: ts.record_intent(s, op)) == recorded, "idempotent"
    other = plan_split("split-2", layout, 1, parent_buckets=4)
    with pytest.raises(ts.StatusConflict, match="split-1 is in flight"):
        written(recorded, lambda s: ts.record_intent(s, other))
    with pytest.raises(ts.StatusConflict, match="layout moved on"):
        written(_with_layout(layout.split(0)), lambda s: ts.record_intent(s, other))
    with pytest.raises(ts.StatusConflict, match="layout moved on"):
        written({}, lambda s: ts.record_intent(s, other))


def test_commit_applies_the_operation_once() -> None:
    layout = SegmentLayout.initial(2)
    op = plan_split(
        "split-1", layout, 0, parent_buckets=4, request_id="r1", started_at=format_time(T0)
    )
    recorded = written(_with_layout(layout), lambda s: ts.record_intent(s, op))
    committed = written(recorded, lambda s: ts.commit_operation(s, op, T0 + 3, "split #0"))
    new = op.apply(layout)
    assert committed["layout"] == layout_status(new)
    assert committed["epoch"] == 1 and committed["activeSegments"] == 3
    assert "operation" not in committed
    assert committed["lastSplitAt"] == format_time(T0 + 3)
    assert committed["lastRequest"] == {
        "id": "r1",
        "op": "split",
        "result": "Succeeded",
        "message": "split #0",
        "completedAt": format_time(T0 + 3),
    }
    assert written(committed, lambda s: ts.commit_operation(s, op, T0 + 9, "x")) == committed
    with pytest.raises(ts.StatusConflict, match="no longer in status"):
        written(_with_layout(layout), lambda s: ts.commit_operation(s, op, T0, "x"))
    _status_ok(committed)


def test_commit_of_a_merge_and_a_roll_back() -> None:
    layout = SegmentLayout.initial(2)
    op = plan_merge("merge-1", layout, [0, 1], parent_buckets={0: 2, 1: 2}, request_id="m")
    recorded = written(_with_layout(layout), lambda s: ts.record_intent(s, op))
    merged = written(recorded, lambda s: ts.commit_operation(s, op, T0, "merged"))
    assert merged["lastMergeAt"] == format_time(T0) and "lastSplitAt" not in merged
    rolled = written(recorded, lambda s: ts.roll_back_operation(s, op, "broker gone", T0))
    assert "operation" not in rolled
    assert rolled["layout"] == recorded["layout"]
    assert rolled["lastRequest"]["result"] == "Failed"
    assert rolled["lastRequest"]["message"] == "rolled back: broker gone"
    with pytest.raises(ts.StatusConflict):
        written(_with_layout(layout), lambda s: ts.record_phase(s, op))


# -- auto-scale policy -------------------------------------------------------------------------


def test_policy_is_shown_with_sources_and_removed_while_it_does_not_combine() -> None:
    raw = full_status()
    resolution = resolve_policy({"max_segments": 6}, None, ClusterDefaults())
    shown = written(raw, lambda s: ts.with_policy(s, resolution, None))
    assert shown["autoScale"]["mode"] == resolution.mode.value
    assert shown["autoScale"]["policy"] == resolution.shown()
    assert shown["autoScale"]["sources"] == resolution.shown_sources()
    assert shown["autoScale"]["sources"]["maxSegments"] == "topic"
    assert "problem" not in shown["autoScale"]
    gone = written(shown, lambda s: ts.with_policy(s, None, "minSegments above maxSegments"))
    assert gone["autoScale"] == {
        "problem": "minSegments above maxSegments",
        "lastDecision": raw["autoScale"]["lastDecision"],
    }
    back = written(gone, lambda s: ts.with_policy(s, resolution, None))
    assert back["autoScale"] == shown["autoScale"]


# -- a rebuilt layout --------------------------------------------------------------------------


def _subscriptions(layout: SegmentLayout) -> list[dict[str, Any]]:
    return [
        {
            "name": "orders",
            "type": "Stream",
            "layoutEpoch": layout.epoch,
            "consumers": [],
            "drainedSegments": [0],
        }
    ]


def test_a_rebuilt_layout_fills_a_lost_status_and_reports_the_request() -> None:
    layout = SegmentLayout.initial(1).split(0)
    request = '{"id": "r9", "op": "merge", "segments": [1, 2]}'
    raw = {"recommendation": {"computedAt": "2026-11-22T04:00:00Z"}}
    status = ts.read_status(raw)
    restored = ts.restore_layout(
        status,
        layout,
        subscriptions=_subscriptions(layout),
        operation=None,
        request_annotation=request,
        now=T0,
    )
    assert restored is not None
    assert (restored.resumed, restored.unrun) == (None, "r9")
    out = ts.write_status(raw, status, restored.status)
    assert out["layout"] == layout_status(layout) and out["epoch"] == 1
    assert out["subscriptions"] == _subscriptions(layout)
    assert out["lastRequest"]["id"] == "r9" and out["lastRequest"]["result"] == "Rejected"
    assert out["lastRequest"]["completedAt"] == format_time(T0)
    assert out["recommendation"] == raw["recommendation"]
    assert "operation" not in out
    _status_ok(out)
    again = ts.read_status(out)
    assert (
        ts.restore_layout(
            again,
            layout,
            subscriptions=[],
            operation=None,
            request_annotation=request,
            now=T0,
        )
        is None
    ), "a layout written meanwhile wins"


def test_a_surviving_intent_is_rebased_and_wins_over_the_records() -> None:
    before = SegmentLayout.initial(2)
    surviving = plan_split("split-7", before, 0, parent_buckets=2, request_id="r1")
    raw = written(_with_layout(before), lambda s: ts.record_intent(s, surviving))
    raw.pop("layout")
    raw["subscriptions"] = [{"name": "kept", "consumers": [], "drainedSegments": []}]
    rebuilt = SegmentLayout.from_metadata({**layout_status(before), "epoch": 4})
    from_records = plan_merge("rebuilt-1", rebuilt, [0, 1], parent_buckets={0: 1, 1: 1})
    status = ts.read_status(raw)
    restored = ts.restore_layout(
        status,
        rebuilt,
        subscriptions=_subscriptions(rebuilt),
        operation=from_records,
        request_annotation='{"id": "r1", "op": "split", "segments": [0]}',
        now=T0,
    )
    assert restored is not None
    assert (restored.resumed, restored.unrun) == ("split-7", None)
    out = ts.write_status(raw, status, restored.status)
    resumed = Operation.from_status(out["operation"])
    assert resumed.id == "split-7" and resumed.base_epoch == 4 and resumed.request_id == "r1"
    assert out["subscriptions"] == raw["subscriptions"], "the hub's entries are kept"
    assert "lastRequest" not in out


# -- the auto-scaler's outcome and decision ------------------------------------------------------


def test_evaluation_since_moves_only_when_the_outcome_does() -> None:
    raw = full_status()
    first = written(raw, lambda s: ts.with_evaluation(s, "Suppressed", ["maxSegments"], "m", T0))
    assert first["autoScale"]["lastEvaluation"] == {
        "result": "Suppressed",
        "reasons": ["maxSegments"],
        "message": "m",
        "since": format_time(T0),
    }
    assert first["autoScale"]["policy"] == raw["autoScale"]["policy"]
    same = written(
        first, lambda s: ts.with_evaluation(s, "Suppressed", ["maxSegments"], "m", T0 + 60)
    )
    assert same == first, "a repeated outcome writes nothing"
    idle = written(first, lambda s: ts.with_evaluation(s, "Idle", [], "nothing", T0 + 90))
    assert idle["autoScale"]["lastEvaluation"]["since"] == format_time(T0 + 90)
    assert idle["autoScale"]["lastEvaluation"]["reasons"] == []
    assert written(None, lambda s: ts.with_evaluation(s, "Off", [], "", T0))["autoScale"] == {
        "lastEvaluation": {"result": "Off", "reasons": [], "message": "", "since": format_time(T0)}
    }


def test_a_decision_replaces_the_last_one() -> None:
    raw = full_status()
    decision = AutoScaleDecision.model_validate(
        {
            "action": "merge",
            "segments": [2, 3],
            "source": "recommendation",
            "executed": False,
            "reason": "cold",
            "decidedAt": format_time(T0),
        }
    )
    out = written(raw, lambda s: ts.with_decision(s, decision))
    assert out["autoScale"]["lastDecision"] == {
        "action": "merge",
        "segments": [2, 3],
        "source": "recommendation",
        "executed": False,
        "reason": "cold",
        "decidedAt": format_time(T0),
        "future": 1,
    }, "what the model does not know of the old decision stays (the API server prunes it)"
    assert out["autoScale"]["mode"] == "auto"


def test_new_subscription_entries_fill_only_the_missing_ones_sorted() -> None:
    live = {"name": "m", "type": "Stream", "layoutEpoch": 3, "consumers": []}
    live["drainedSegments"] = [1]
    raw = {"subscriptions": [live]}
    entries = [
        {"name": "z", "type": "Queue", "layoutEpoch": 0, "consumers": [], "drainedSegments": []},
        {"name": "m", "type": "Stream", "layoutEpoch": 0, "consumers": [], "drainedSegments": []},
        {"name": "a", "type": "Stream", "layoutEpoch": 0, "consumers": [], "drainedSegments": []},
    ]
    out = written(raw, lambda s: ts.with_new_subscriptions(s, entries))
    assert [e["name"] for e in out["subscriptions"]] == ["a", "m", "z"]
    assert out["subscriptions"][1] == live  # the hub's entry is newer: kept as written
    assert written(out, lambda s: ts.with_new_subscriptions(s, entries)) == out
    _status_ok(out)
