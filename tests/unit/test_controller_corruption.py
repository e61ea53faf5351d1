"""The topic-level view of quarantined segments (controller/corruption.py)."""

from __future__ import annotations

from typing import Any

from scalable_topics.controller.corruption import corrupted_segments, corruption_changed
from scalable_topics.core.resources import Reason


def _segment(sid: int, corruption: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"state": "Active"}
    if corruption is not None:
        status["corruption"] = corruption
    return {"metadata": {"name": f"t-{sid}"}, "spec": {"segmentId": sid}, "status": status}


def _damage(position: int) -> dict[str, Any]:
    return {
        "position": position,
        "file": "log-00000000000000000000.log",
        "offset": 4096,
        "reason": "checksum mismatch",
        "source": "recovery",
    }


def test_no_quarantined_segment_is_no_problem() -> None:
    assert corrupted_segments([_segment(0), _segment(1)]) is None
    assert corrupted_segments([]) is None


def test_every_quarantined_segment_is_named_in_id_order() -> None:
    problem = corrupted_segments([_segment(3, _damage(7)), _segment(0), _segment(1, _damage(40))])
    assert problem is not None
    reason, message = problem
    assert reason == Reason.SEGMENT_CORRUPTED == "SegmentCorrupted"
    first = "t-1 at position 40 (checksum mismatch, log-00000000000000000000.log offset 4096)"
    assert first in message and "t-3 at position 7" in message
    assert message.index("t-1 at") < message.index("t-3 at")
    assert "docs/operations.md" in message


def test_only_a_change_of_the_corruption_report_asks_for_a_pass() -> None:
    assert corruption_changed(None, _segment(0, _damage(1)))
    assert corruption_changed(_segment(0, _damage(1)), _segment(0))
    assert corruption_changed(_segment(0, _damage(1)), _segment(0, _damage(2)))
    assert not corruption_changed(_segment(0, _damage(1)), _segment(0, _damage(1)))
    assert not corruption_changed(_segment(0), _segment(0))
    assert not corruption_changed(None, _segment(0))
