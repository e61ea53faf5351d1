"""The auto-scaler end to end: the real operator (one replica) and brokers on the embedded control
plane, idle topics whose segments turn cold once the brokers' load reporter writes their first
sample (every 10 s), and knobs small enough that each test takes seconds.

Auto-merge and ``status.lastMergeAt``, the suppression counter by reason, recommend mode, and
the namespace's ``scalabletopics.io/autoscale-policy`` annotation under a topic's own knobs.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import parse_time

from .conftest import metric_samples
from .operator_harness import JsonObj, Stack, eventually, operator_stack, topic_body

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAST_MERGE = {"mergeWindow": "1s", "evaluationInterval": "1s", "mergeCooldown": "1h"}
"""Merge a pair one second after both segments' load samples say cold; then not again."""
TUNED = "tuned"
"""A namespace whose annotation carries FAST_MERGE and ``minSegments: 1``."""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(
        tmp_path_factory.mktemp("autoscale"), operator_replicas=1, brokers=2
    ) as running:
        yield running


async def controller_url(stack: Stack, name: str, namespace: str = "default") -> str:
    async def led() -> str | None:
        topic = await stack.topic(name, namespace)
        return (((topic or {}).get("status") or {}).get("controller") or {}).get("url")

    return str(await eventually(led, 30, f"{namespace}/{name} led"))


async def autoscale_counts(url: str, name: str, namespace: str = "default") -> dict[str, float]:
    """The leader's auto-scale counters of one topic: ``merges``, ``splits`` and each
    suppression reason (absent series left out)."""
    samples = await metric_samples(url)
    topic = {("namespace", namespace), ("topic", name)}
    counts: dict[str, float] = {}
    for (sample, labels), value in samples.items():
        pairs = set(labels)
        if not topic <= pairs:
            continue
        if sample == "scalable_topic_auto_merges_total":
            counts["merges"] = value
        elif sample == "scalable_topic_auto_splits_total":
            counts["splits"] = value
        elif sample == "scalable_topic_autoscale_suppressed_total":
            counts[dict(labels)["reason"]] = value
    return counts


async def counted(
    stack: Stack, name: str, reason: str, namespace: str = "default"
) -> dict[str, float]:
    """The topic's counters once ``reason`` was counted at least once."""
    url = await controller_url(stack, name, namespace)

    async def seen() -> dict[str, float] | None:
        counts = await autoscale_counts(url, name, namespace)
        return counts if counts.get(reason, 0) >= 1 else None

    return await eventually(seen, 60, f"{namespace}/{name}: {reason} counted")


async def merged(stack: Stack, name: str, namespace: str = "default") -> JsonObj:
    async def done() -> JsonObj | None:
        topic = await stack.topic(name, namespace)
        status = (topic or {}).get("status") or {}
        return topic if status.get("epoch") == 1 and not status.get("operation") else None

    return await eventually(done, 60, f"{namespace}/{name} merged")


def with_namespace(body: JsonObj, namespace: str) -> JsonObj:
    body["metadata"]["namespace"] = namespace
    return body


def epoch(topic: JsonObj | None) -> Any:
    return ((topic or {}).get("status") or {}).get("epoch")


async def test_cold_neighbours_merge_and_record_last_merge_at(stack: Stack) -> None:
    name = "cold"
    created = time.time()
    await stack.apply_topic(
        topic_body(name, segments=4, autoScale={**FAST_MERGE, "minSegments": 1})
    )
    await stack.wait_ready(name)
    topic = await merged(stack, name)
    status = topic["status"]
    assert status["activeSegments"] == 3
    layout = SegmentLayout.from_metadata(status["layout"])
    (child,) = [s for s in layout.active() if s.parent_ids]
    assert child.parent_ids == (0, 1), "all four equally cold: the lowest ids merge"
    merged_at = parse_time(status["lastMergeAt"])
    assert created - 1 <= merged_at <= time.time() + 1, status["lastMergeAt"]
    assert "lastSplitAt" not in status

    # The other cold pair (2, 3) is held back by mergeCooldown, and counted so.
    counts = await counted(stack, name, "merge-cooldown")
    assert counts.get("merges") == 1
    assert "splits" not in counts or counts["splits"] == 0
    assert epoch(await stack.topic(name)) == 1
    assert parse_time((await stack.topic(name) or {})["status"]["lastMergeAt"]) == merged_at


async def test_min_segments_holds_a_cold_pair_and_is_counted(stack: Stack) -> None:
    name = "floor"
    await stack.apply_topic(
        topic_body(name, segments=2, autoScale={**FAST_MERGE, "minSegments": 2})
    )
    await stack.wait_ready(name)
    counts = await counted(stack, name, "min-segments")
    assert counts.get("merges", 0) == 0
    topic = await stack.topic(name)
    assert epoch(topic) == 0
    assert "lastMergeAt" not in (topic or {})["status"]


async def test_recommend_mode_records_the_merge_as_an_event_and_does_not_merge(
    stack: Stack,
) -> None:
    name = "advice"
    await stack.apply_topic(
        topic_body(
            name, segments=2, autoScale={**FAST_MERGE, "minSegments": 1, "mode": "recommend"}
        )
    )
    await stack.wait_ready(name)

    async def recommended() -> list[JsonObj] | None:
        found = [e for e in await stack.events(name) if e.get("reason") == "ScalingRecommended"]
        return found if len(found) >= 2 else None

    # Two evaluations that would have merged; neither did.
    events = await eventually(recommended, 60, "two ScalingRecommended events")
    for event in events:
        assert event["type"] == "Normal"
        assert event["message"].startswith("merge [0, 1] (auto: "), event["message"]
        assert event["message"].endswith("not executed in recommend mode")
    topic = await stack.topic(name)
    assert epoch(topic) == 0
    assert not (topic or {})["status"].get("operation")
    assert "lastMergeAt" not in (topic or {})["status"]
    counts = await autoscale_counts(await controller_url(stack, name), name)
    assert counts.get("merges", 0) == 0


async def test_the_namespace_annotation_sets_knobs_a_topic_does_not(stack: Stack) -> None:
    namespace: JsonObj = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": TUNED,
            "annotations": {
                "scalabletopics.io/autoscale-policy": json.dumps({**FAST_MERGE, "minSegments": 1})
            },
        },
    }
    await stack.kubectl("apply", "-f", "-", input=json.dumps(namespace))
    # No knobs of its own: the namespace's one-second merge window applies (the operator's
    # default is 300 s, far beyond this test).
    await stack.apply_topic(with_namespace(topic_body("inherits", segments=2), TUNED))
    # Its own minSegments wins over the namespace's; the namespace's window still applies.
    await stack.apply_topic(
        with_namespace(topic_body("own", segments=2, autoScale={"minSegments": 2}), TUNED)
    )
    await stack.wait_ready("inherits", namespace=TUNED)
    await stack.wait_ready("own", namespace=TUNED)

    topic = await merged(stack, "inherits", TUNED)
    assert topic["status"]["activeSegments"] == 1
    counts = await counted(stack, "own", "min-segments", TUNED)
    assert counts.get("merges", 0) == 0
    assert epoch(await stack.topic("own", TUNED)) == 0
    url = await controller_url(stack, "inherits", TUNED)
    inherited = await autoscale_counts(url, "inherits", TUNED)
    assert inherited.get("merges") == 1
