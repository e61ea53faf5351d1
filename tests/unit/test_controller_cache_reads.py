"""A reconcile pass starts from the watch cache's copy of a settled topic (``reconciler.settled``)
and the cache never goes back to an earlier version of a topic (``TopicCache.put_topic``).

The pass itself against the real API server, with a copy one write behind, is
``tests/integration/test_operator_cache_reads.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.reconciler import settled
from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.core.resources import ANNOTATION_REQUEST


def _topic(
    *,
    layout: bool = True,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
    rv: str = "10",
    uid: str = "uid-1",
) -> JsonObj:
    meta: dict[str, Any] = {
        "namespace": "ns",
        "name": "orders",
        "uid": uid,
        "resourceVersion": rv,
        "annotations": annotations or {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T06:00:00Z"
    body: dict[str, Any] = {"metadata": meta, "spec": {"initialSegments": 2}}
    body["status"] = {**({"layout": {"epoch": 0}} if layout else {}), **(status or {})}
    return body


def _request(request_id: str) -> dict[str, str]:
    return {ANNOTATION_REQUEST: json.dumps({"id": request_id, "op": "split", "segment": 0})}


def test_a_steady_topic_is_settled() -> None:
    assert settled(_topic(), has_segments=True)


def test_a_new_topic_without_segments_is_settled() -> None:
    assert settled(_topic(layout=False), has_segments=False)


@pytest.mark.parametrize(
    ("topic", "has_segments", "why"),
    [
        (_topic(deleting=True), True, "a deletion is finalized on a fresh read"),
        (
            _topic(status={"operation": {"id": "op-1", "phase": "IntentRecorded"}}),
            True,
            "an operation in flight is resumed on a fresh read",
        ),
        (_topic(layout=False), True, "a lost layout is rebuilt from a fresh read"),
        (_topic(annotations=_request("r-2")), True, "a request never served"),
        (
            _topic(annotations=_request("r-2"), status={"lastRequest": {"id": "r-1"}}),
            True,
            "a request newer than the last one served",
        ),
        (_topic(annotations={ANNOTATION_REQUEST: "{not json"}), True, "an unreadable request"),
    ],
)
def test_what_a_copy_one_write_behind_could_act_on_is_read_fresh(
    topic: JsonObj, has_segments: bool, why: str
) -> None:
    assert not settled(topic, has_segments=has_segments), why


def test_a_served_request_leaves_the_topic_settled() -> None:
    topic = _topic(annotations=_request("r-1"), status={"lastRequest": {"id": "r-1"}})
    assert settled(topic, has_segments=True)


def _cache() -> TopicCache:
    return TopicCache(controller_url=lambda namespace, name: "http://controller")


def test_the_cache_keeps_the_later_version_of_a_topic() -> None:
    """The answer of the operator's own write (version 12) can come before the watch event of
    an earlier write (version 11): the cache stays at 12."""
    cache = _cache()
    cache.put_topic(_topic(rv="12", status={"epoch": 2}))
    cache.put_topic(_topic(rv="11", status={"epoch": 1}))
    assert cache.topics[("ns", "orders")]["metadata"]["resourceVersion"] == "12"
    # Versions compare as numbers, not as text ("9" < "10").
    cache.put_topic(_topic(rv="9"))
    assert cache.topics[("ns", "orders")]["metadata"]["resourceVersion"] == "12"
    cache.put_topic(_topic(rv="100"))
    assert cache.topics[("ns", "orders")]["metadata"]["resourceVersion"] == "100"


def test_a_recreated_topic_replaces_the_old_one_whatever_its_version() -> None:
    cache = _cache()
    cache.put_topic(_topic(rv="50", uid="uid-1"))
    cache.put_topic(_topic(rv="7", uid="uid-2"))
    assert cache.topics[("ns", "orders")]["metadata"]["uid"] == "uid-2"


def test_a_version_that_is_not_a_number_is_taken_as_newer() -> None:
    cache = _cache()
    cache.put_topic(_topic(rv="50"))
    cache.put_topic(_topic(rv="opaque"))
    assert cache.topics[("ns", "orders")]["metadata"]["resourceVersion"] == "opaque"


def test_a_layout_is_parsed_once_per_version_of_its_topic() -> None:
    """``layout_of`` keeps one parsed layout per topic and version: a pass and an evaluation
    over the same version share it; a new version is parsed again."""
    from scalable_topics.controller.cache import layout_of
    from scalable_topics.core.layout import SegmentLayout

    first = SegmentLayout.initial(2)
    topic = _topic(rv="40", uid="uid-layout")
    topic["status"] = {"layout": first.to_metadata()}
    parsed = layout_of(topic)
    assert parsed == first
    assert layout_of(topic) is parsed
    split = first.split(0)
    later = _topic(rv="41", uid="uid-layout")
    later["status"] = {"layout": split.to_metadata()}
    assert layout_of(later) == split
    assert layout_of(_topic(rv="42", uid="uid-layout", layout=False)) is None
