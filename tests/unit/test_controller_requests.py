"""The history of handled manual requests (``status.recentRequests``): an id is executed once,
however the annotations come and go."""

from __future__ import annotations

from typing import Any

import pytest

from scalable_topics.controller.requests import loose_request
from scalable_topics.core import topicstatus as ts
from scalable_topics.core.resources import (
    REQUEST_HISTORY,
    ResourceValidationError,
    parse_manual_request,
)

from .test_crds import _status_ok


def outcome(request_id: str, result: str = "Succeeded", **extra: Any) -> dict[str, Any]:
    return {
        "id": request_id,
        "op": "split",
        "result": result,
        "message": f"split for {request_id}",
        "completedAt": "2026-11-22T04:00:00Z",
        **extra,
    }


def remembered(status: dict[str, Any]) -> dict[str, Any]:
    return ts.apply_change(status, ts.remember_request)


def handled(status: dict[str, Any], request_id: str) -> dict[str, Any] | None:
    found = ts.find_handled(ts.read_status(status), request_id)
    return None if found is None else found.model_dump(mode="json", by_alias=True)


def test_last_request_is_folded_into_the_history_once() -> None:
    status = remembered({"lastRequest": outcome("a")})
    assert status["recentRequests"] == [outcome("a")]
    assert remembered(status) == status, "folding again changes nothing"
    status["lastRequest"] = outcome("b", "Rejected")
    status = remembered(status)
    assert [e["id"] for e in status["recentRequests"]] == ["a", "b"]
    _status_ok(status)


def test_nothing_to_fold() -> None:
    assert remembered({}) == {}
    assert remembered({"lastRequest": {"op": "split"}}) == {"lastRequest": {"op": "split"}}


def test_the_history_is_bounded_and_drops_the_oldest() -> None:
    status: dict[str, Any] = {}
    for k in range(REQUEST_HISTORY + 4):
        status["lastRequest"] = outcome(f"r{k}")
        status = remembered(status)
    ids = [e["id"] for e in status["recentRequests"]]
    assert ids == [f"r{k}" for k in range(4, REQUEST_HISTORY + 4)]
    _status_ok(status)
    assert handled(status, "r3") is None, "beyond the history"
    assert handled(status, "r4") == outcome("r4")


def test_handled_request_finds_the_last_and_older_ones() -> None:
    status: dict[str, Any] = {
        "recentRequests": [outcome("a"), outcome("b", "Failed")],
        "lastRequest": outcome("c", "Rejected"),
    }
    assert handled(status, "c") == outcome("c", "Rejected")
    assert handled(status, "b") == outcome("b", "Failed")
    assert handled(status, "zzz") is None
    assert handled({}, "a") is None


def test_long_messages_are_cut_in_the_history() -> None:
    status = remembered({"lastRequest": outcome("a", message="x" * 5000)})
    assert len(status["recentRequests"][0]["message"]) == 256
    assert len(status["lastRequest"]["message"]) == 5000


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"id": "m1", "op": "merge", "segments": [1]}', ("m1", "merge")),
        ('{"id": "m2", "op": "merge", "segments": [1, 1]}', ("m2", "merge")),
        ('{"id": "s1", "op": "split", "segments": [1, 2]}', ("s1", "split")),
        ('{"id": 7, "op": "split", "segments": []}', ("7", "split")),
        ('{"id": "x", "op": "explode", "segments": [1]}', ("x", "split")),
        ('{"op": "merge"}', ("invalid", "merge")),
        ("[1, 2]", ("invalid", "split")),
        ("not json", ("invalid", "split")),
    ],
)
def test_an_invalid_request_is_recorded_under_its_own_op(
    raw: str, expected: tuple[str, str]
) -> None:
    """A request the operator rejects at validation keeps the op it asked for in
    ``status.lastRequest`` and the history (a one-segment merge was recorded as a split)."""
    with pytest.raises(ResourceValidationError):
        parse_manual_request(raw)
    assert loose_request(raw) == expected
    request_id, op = expected
    _status_ok(remembered({"lastRequest": outcome(request_id, "Rejected", op=op)}))
