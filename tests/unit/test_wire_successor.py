from __future__ import annotations

import re
from typing import Any

import pytest

from scalable_topics.core.wire import Successor


def test_a_successor_round_trips() -> None:
    successor = Successor(3, 0x0000, 0x7FFF, "http://broker-1:8080")
    assert successor.to_json() == {
        "segmentId": 3,
        "range": {"start": 0, "end": 0x7FFF},
        "brokerUrl": "http://broker-1:8080",
    }
    assert Successor.from_json(successor.to_json()) == successor
    assert Successor.from_json({"segmentId": 4, "range": {"start": 1, "end": 1}}).broker_url is None


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([1], "successors must be objects"),
        ({"segmentId": 1, "range": [0, 1]}, "successor range must be an object"),
        ({"segmentId": 1, "range": {"start": "0", "end": 1}}, "start must be an integer"),
        ({"segmentId": 1, "range": {"start": 0, "end": True}}, "end must be an integer"),
        ({"segmentId": 1, "range": {"start": 5, "end": 4}}, "invalid successor range [5, 4]"),
        ({"segmentId": 1, "range": {"start": 0, "end": 0x10000}}, "invalid successor range"),
        ({"segmentId": 1, "range": {"start": 0, "end": 1}, "brokerUrl": 7}, "brokerUrl must be"),
        ({"segmentId": -1, "range": {"start": 0, "end": 1}}, "segmentId must be an integer"),
    ],
)
def test_a_malformed_successor_says_what_is_wrong(body: Any, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        Successor.from_json(body)
