"""The auto-scaler end to end: the real operator (one replica) and brokers on the embedded control
plane, idle topics whose segments turn cold once the brokers' load reporter writes their first
sample (every 10 s), and knobs small enough that each test takes seconds.

Auto-merge and ``status.lastMergeAt``, the suppression counter by reason, recommend mode, and
the namespace's ``scalabletopics.io/autoscale-policy`` annotation under a topic's own knobs; the
cluster defaults ConfigMap changed under a running operator, its master switch, and
``status.autoScale`` (effective policy, sources, last decision, suppression).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from scalable_topics.client import ScalableTopicProducer
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import parse_time

from .conftest import metric_samples
from .operator_harness import JsonObj, Stack, eventually, operator_stack, topic_body
from .test_cli import stopic

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
    """The leader's auto-scale counters of one topic: ``merges``, ``splits``, each
    suppression reason and each evaluation result (absent series left out)."""
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
        elif sample == "scalable_topic_autoscale_evaluations_total":
            counts[dict(labels)["result"]] = value
    return counts


async def counted(
    stack: Stack, name: str, reason: str, namespace: str = "default", at_least: int = 1
) -> dict[str, float]:
    """The topic's counters once ``reason`` (or an evaluation result) was counted
    ``at_least`` times."""
    url = await controller_url(stack, name, namespace)

    async def seen() -> dict[str, float] | None:
        counts = await autoscale_counts(url, name, namespace)
        return counts if counts.get(reason, 0) >= at_least else None

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

    # Three evaluations that would have merged; none did, and the one recommendation is
    # announced once (events are deduplicated per distinct recommendation).
    await counted(stack, name, "Recommended", at_least=3)
    events = [e for e in await stack.events(name) if e.get("reason") == "ScalingRecommended"]
    assert len(events) == 1, events
    (event,) = events
    assert event["type"] == "Normal"
    assert event["message"].startswith("merge [0, 1] (auto: "), event["message"]
    assert event["message"].endswith("not executed in recommend mode")
    topic = await stack.topic(name)
    assert epoch(topic) == 0
    assert not (topic or {})["status"].get("operation")
    assert "lastMergeAt" not in (topic or {})["status"]
    auto = (topic or {})["status"]["autoScale"]
    assert auto["mode"] == "recommend" and auto["sources"]["mode"] == "topic"
    assert auto["lastDecision"]["action"] == "merge" and auto["lastDecision"]["executed"] is False
    assert auto["lastEvaluation"]["result"] == "Recommended"
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


# -- the cluster defaults ConfigMap, the master switch, status.autoScale -----------------------

DEFAULTS = "scalable-topics-autoscale-defaults"
OPERATOR_NAMESPACE = "scalable-topics"


async def patch_defaults(stack: Stack, data: dict[str, str | None]) -> None:
    await stack.kubectl(
        "patch",
        "configmap",
        DEFAULTS,
        "-n",
        OPERATOR_NAMESPACE,
        "--type=merge",
        "-p",
        json.dumps({"data": data}),
    )


async def auto_scale_status(
    stack: Stack, name: str, check: Any, what: str, namespace: str = "default", within: float = 90
) -> JsonObj:
    """``status.autoScale`` once ``check(auto_scale)`` holds."""

    async def probe() -> JsonObj | None:
        topic = await stack.topic(name, namespace)
        auto = ((topic or {}).get("status") or {}).get("autoScale") or {}
        return auto if auto and check(auto) else None

    return await eventually(probe, within, f"{namespace}/{name}: {what}")


async def holder(stack: Stack) -> str:
    """The shard Lease's holder: ``<pod>_<process uuid>``, new with every operator process."""
    lease = await stack.lease()
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


async def test_cluster_defaults_change_the_effective_policy_without_a_restart(
    stack: Stack,
) -> None:
    name = "sourced"
    await stack.apply_topic(
        topic_body(name, segments=2, autoScale={"minSegments": 2, "evaluationInterval": "1s"})
    )
    await stack.wait_ready(name)
    auto = await auto_scale_status(
        stack, name, lambda a: a.get("policy", {}).get("splitCooldown") == "1m", "defaults"
    )
    assert auto["mode"] == "auto" and auto["sources"]["mode"] == "default"
    assert auto["sources"]["minSegments"] == "topic" and auto["policy"]["minSegments"] == "2"
    assert auto["sources"]["splitCooldown"] == "default"
    process = await holder(stack)
    try:
        await patch_defaults(stack, {"splitCooldown": "7m"})
        auto = await auto_scale_status(
            stack, name, lambda a: a["policy"]["splitCooldown"] == "7m", "the cluster's 7m"
        )
        assert auto["sources"]["splitCooldown"] == "cluster"
        assert auto["sources"]["minSegments"] == "topic", "the topic still wins over the cluster"

        # An invalid key: a Warning event on the ConfigMap names it; the previous values stay.
        await patch_defaults(stack, {"maxSegments": "many"})

        async def warned() -> list[JsonObj] | None:
            found = [
                e
                for e in await stack.events(DEFAULTS, OPERATOR_NAMESPACE)
                if e.get("reason") == "InvalidSetting"
            ]
            return found or None

        (event, *_) = await eventually(warned, 60, "an InvalidSetting event on the ConfigMap")
        assert event["type"] == "Warning" and "key maxSegments" in event["message"], event
        auto = (await stack.topic(name) or {})["status"]["autoScale"]
        assert auto["policy"]["splitCooldown"] == "7m"
        assert (auto["policy"]["maxSegments"], auto["sources"]["maxSegments"]) == ("64", "default")
        assert await holder(stack) == process, "the operator was not restarted"
    finally:
        await patch_defaults(stack, {"splitCooldown": None, "maxSegments": None})
    await auto_scale_status(
        stack, name, lambda a: a["sources"]["splitCooldown"] == "default", "back to the default"
    )


async def test_the_master_switch_off_stops_decisions_and_says_why(stack: Stack) -> None:
    name = "switched-off"
    try:
        await patch_defaults(stack, {"mode": "off"})
        await stack.apply_topic(
            topic_body(name, segments=2, autoScale={**FAST_MERGE, "minSegments": 1})
        )
        await stack.wait_ready(name)
        # The pair turns cold (its first load samples) and would merge within a second.
        auto = await auto_scale_status(
            stack,
            name,
            lambda a: (a.get("lastEvaluation") or {}).get("result") == "Off",
            "the Off outcome",
        )
        assert auto["mode"] == "off" and auto["sources"]["mode"] == "cluster"
        assert auto["lastEvaluation"]["reasons"] == ["mode-off"]
        assert DEFAULTS in auto["lastEvaluation"]["message"]
        assert "lastDecision" not in auto
        await counted(stack, name, "mode-off")

        async def cold() -> bool:
            segments = await stack.segments(name)
            return len(segments) == 2 and all(
                (s.get("status") or {}).get("load") for s in segments.values()
            )

        await eventually(cold, 60, "both segments' load samples")
        assert epoch(await stack.topic(name)) == 0
        described = (await stack.kubectl("describe", "stopic", name)).stdout
        assert "Auto Scale" in described and "mode-off" in described, described
        dag = await stopic(stack, "dag", name)
        assert dag.returncode == 0, dag.stderr
        assert "auto-scale: mode off (from cluster)" in dag.stdout, dag.stdout
        assert "last evaluation: Off [mode-off]" in dag.stdout, dag.stdout
    finally:
        await patch_defaults(stack, {"mode": "auto"})
    # Only the switch held it: switched back on, the pair merges.
    topic = await merged(stack, name)
    auto = topic["status"]["autoScale"]
    assert auto["mode"] == "auto"
    decision = auto["lastDecision"]
    assert decision["action"] == "merge" and decision["segments"] == [0, 1]
    assert decision["executed"] is True and decision["source"] == "auto"
    assert auto["lastEvaluation"]["result"] == "Acted"

    async def announced() -> bool:
        reasons = {e["reason"] for e in await stack.events(name)}
        return {"ScalingDecided", "Merged"} <= reasons

    await eventually(announced, 30, "the ScalingDecided and Merged events")


async def test_a_namespace_split_threshold_takes_effect_under_load(stack: Stack) -> None:
    """A producer well below the default split threshold (10,000 msg/s) and above the
    namespace's (5 msg/s): the topic splits, and its status says where the threshold is from."""
    namespace, name = "eager", "loaded"
    body: JsonObj = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "annotations": {
                "scalabletopics.io/autoscale-policy": json.dumps(
                    {
                        "splitMsgRateInThreshold": 5,
                        "mergeMsgRateInThreshold": 1,
                        "evaluationInterval": "1s",
                    }
                )
            },
        },
    }
    await stack.kubectl("apply", "-f", "-", input=json.dumps(body))
    await stack.apply_topic(with_namespace(topic_body(name, segments=1), namespace))
    await stack.wait_ready(name, namespace=namespace)
    auto = await auto_scale_status(
        stack, name, lambda a: "sources" in a, "the effective policy", namespace
    )
    assert auto["sources"]["splitMsgRateInThreshold"] == "namespace"
    assert auto["policy"]["splitMsgRateInThreshold"] == "5"
    url = await controller_url(stack, name, namespace)

    sent = 0
    rates: list[float] = []
    """Segment 0's reported msgRateIn while the producer runs; the last report stays on the
    sealed segment, so the rate the split was decided on is read after it too."""

    async def record_rate() -> None:
        segment = (await stack.segments(name, namespace)).get(0) or {}
        load = (segment.get("status") or {}).get("load")
        # Before the broker's first sample with traffic: the zero recorded with the placement.
        if load and (rates or float(load["msgRateIn"]) > 0):
            rates.append(float(load["msgRateIn"]))

    async with ScalableTopicProducer(url, namespace, name) as producer:

        async def split() -> JsonObj | None:
            nonlocal sent
            for _ in range(50):
                await producer.send(b"m%d" % sent, key=f"k{sent % 16}")
                sent += 1
            topic = await stack.topic(name, namespace)
            if epoch(topic) == 1:
                return topic
            await record_rate()
            return None

        topic = await eventually(split, 180, f"{namespace}/{name} split under load")
    await record_rate()
    auto = topic["status"]["autoScale"]
    decision = auto["lastDecision"]
    assert decision["action"] == "split" and decision["segments"] == [0], decision
    assert decision["source"] == "auto" and decision["executed"] is True
    assert "msg-rate-in" in decision["reason"] or "msgRateIn" in decision["reason"], decision
    assert rates and all(0 < rate < 10_000 for rate in rates), (
        f"the producer ran at {rates} msg/s: below the default threshold"
    )
    assert max(rates) > 5, rates


async def test_brokers_follow_the_load_report_threshold_of_the_configmap(stack: Stack) -> None:
    """``loadReportThreshold`` reaches every broker without a restart; an invalid value keeps
    the previous one and the operator names the key in an event."""
    urls = list((await stack.broker_urls()).values())
    assert urls

    async def thresholds(expected: float) -> bool:
        found = []
        for url in urls:
            samples = await metric_samples(url)
            found.append(samples.get(("segment_broker_load_report_threshold", ())))
        return all(value == expected for value in found)

    assert await eventually(lambda: thresholds(0.25), 30, "the default 25 % on every broker")
    try:
        await patch_defaults(stack, {"loadReportThreshold": "0.5"})
        await eventually(lambda: thresholds(0.5), 60, "50 % on every broker")
        await patch_defaults(stack, {"loadReportThreshold": "lots"})

        async def warned() -> JsonObj | None:
            return next(
                (
                    e
                    for e in await stack.events(DEFAULTS, OPERATOR_NAMESPACE)
                    if e.get("reason") == "InvalidSetting"
                    and "key loadReportThreshold" in e.get("message", "")
                ),
                None,
            )

        await eventually(warned, 60, "an InvalidSetting event naming loadReportThreshold")

        async def refused() -> bool:
            key = ("segment_broker_settings_problems_total", (("key", "loadReportThreshold"),))
            counts = [(await metric_samples(url)).get(key) or 0 for url in urls]
            return all(count >= 1 for count in counts)

        await eventually(refused, 60, "every broker read the invalid value")
        assert await thresholds(0.5), "the invalid value keeps the previous one"
    finally:
        await patch_defaults(stack, {"loadReportThreshold": None})
    await eventually(lambda: thresholds(0.25), 60, "back to 25 % on every broker")
