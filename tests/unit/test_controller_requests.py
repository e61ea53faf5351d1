"""The history of handled manual requests (``status.recentRequests``): an id is executed once,
however the annotations come and go."""

from __future__ import annotations

from typing import Any

from scalable_topics.core.resources import (
    REQUEST_HISTORY,
    handled_request,
    remember_request,
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


def test_last_request_is_folded_into_the_history_once() -> None:
    status: dict[str, Any] = {"lastRequest": outcome("a")}
    remember_request(status)
    assert status["recentRequests"] == [outcome("a")]
    before = [dict(e) for e in status["recentRequests"]]
    remember_request(status)
    assert status["recentRequests"] == before, "folding again changes nothing"
    status["lastRequest"] = outcome("b", "Rejected")
    remember_request(status)
    assert [e["id"] for e in status["recentRequests"]] == ["a", "b"]
    _status_ok(status)


def test_nothing_to_fold() -> None:
    status: dict[str, Any] = {}
    remember_request(status)
    assert status == {}
    status = {"lastRequest": {"op": "split"}}
    remember_request(status)
    assert "recentRequests" not in status


def test_the_history_is_bounded_and_drops_the_oldest() -> None:
    status: dict[str, Any] = {}
    for k in range(REQUEST_HISTORY + 4):
        status["lastRequest"] = outcome(f"r{k}")
        remember_request(status)
    ids = [e["id"] for e in status["recentRequests"]]
    assert ids == [f"r{k}" for k in range(4, REQUEST_HISTORY + 4)]
    _status_ok(status)
    assert handled_request(status, "r3") is None, "beyond the history"
    assert handled_request(status, "r4") == outcome("r4")


def test_handled_request_finds_the_last_and_older_ones() -> None:
    status: dict[str, Any] = {
        "recentRequests": [outcome("a"), outcome("b", "Failed")],
        "lastRequest": outcome("c", "Rejected"),
    }
    assert handled_request(status, "c") == outcome("c", "Rejected")
    assert handled_request(status, "b") == outcome("b", "Failed")
    assert handled_request(status, "zzz") is None
    assert handled_request({}, "a") is None


def test_long_messages_are_cut_in_the_history() -> None:
    status: dict[str, Any] = {"lastRequest": outcome("a", message="x" * 5000)}
    remember_request(status)
    assert len(status["recentRequests"][0]["message"]) == 256
    assert len(status["lastRequest"]["message"]) == 5000
