"""The leader's auto-scaler (``controller.autoscale``) in process, on the real cache, reconciler
and executor objects: what it counts when the evaluator holds an action back, and that an
evaluation asked for while the topic's lock is held is run once the lock is released.

The Kubernetes client and broker admin are real objects but never reached: every scenario here
ends without an operation. What the auto-scaler writes (``status.autoScale``) and posts (events)
goes to an in-memory stand-in of the topic's status subresource (resourceVersion-checked) and
event list, so that what it says about each outcome is checked here.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import REGISTRY

from scalable_topics.controller.autoscale import AutoScaler
from scalable_topics.controller.autoscalestatus import suppression_message
from scalable_topics.controller.brokers import BrokerAdmin
from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.kube import Conflict, KubeApi
from scalable_topics.controller.protocol import OperationExecutor
from scalable_topics.controller.reconciler import TopicReconciler, kube_events
from scalable_topics.core.evaluator import Suppression
from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.policy import (
    AutoScalePolicy,
    ClusterDefaults,
    ClusterMode,
    resolve_policy,
)
from scalable_topics.core.resources import LABEL_TOPIC, format_time

NAMESPACE = "autoscale-test"
NOW = 1_000_000.0
HOT = 20_000.0
"""msgRateIn above the default split threshold (10000/s)."""
AGED = 1_000.0
"""Seconds since a load sample was written: beyond the default merge window (300 s)."""


@dataclass
class World:
    cache: TopicCache
    reconciler: TopicReconciler
    scaler: AutoScaler
    consumers: dict[str, int] = field(default_factory=dict)
    evaluations: int = 0
    leads_calls: int = 0
    status_writes: int = 0
    events: list[tuple[str, str]] = field(default_factory=list)

    def auto_scale(self, name: str) -> dict[str, Any]:
        return dict((self.cache.topics[(NAMESPACE, name)].get("status") or {})["autoScale"])


def _in_memory_status(kube: KubeApi, holder: list[World]) -> None:
    """The topic's status subresource and events, kept in the cache instead of an API server."""

    async def get_topic(namespace: str, name: str) -> JsonObj | None:
        return copy.deepcopy(holder[0].cache.topics.get((namespace, name)))

    async def replace_topic_status(body: JsonObj) -> JsonObj:
        meta = body["metadata"]
        stored = holder[0].cache.topics[(meta["namespace"], meta["name"])]
        version = int(stored["metadata"].get("resourceVersion", "1"))
        if meta.get("resourceVersion", "1") != str(version):
            raise Conflict("stale resourceVersion")
        written = copy.deepcopy(body)
        written["metadata"]["resourceVersion"] = str(version + 1)
        holder[0].status_writes += 1
        return written

    async def post_event(
        obj: JsonObj, *, type_: str, reason: str, message: str, component: str
    ) -> None:
        holder[0].events.append((reason, message))

    kube.get_topic = get_topic  # type: ignore[method-assign]
    kube.replace_topic_status = replace_topic_status  # type: ignore[method-assign]
    kube.post_event = post_event  # type: ignore[method-assign]


async def _no_events(topic: JsonObj, type_: str, reason: str, message: str) -> None:
    raise AssertionError(f"unexpected event {reason}: {message}")


@pytest.fixture
async def world() -> AsyncIterator[World]:
    api = k8s.ApiClient()
    kube = KubeApi(api)
    brokers = BrokerAdmin()
    cache = TopicCache(controller_url=lambda namespace, name: "http://controller")
    executor = OperationExecutor(kube, brokers, cache, events=_no_events)
    reconciler = TopicReconciler.wired(
        kube,
        brokers,
        cache,
        executor,
        events=kube_events(kube),
        leads=lambda namespace, name: True,
        controller_ref=lambda namespace, name: {},
        defaults=AutoScalePolicy(),
    )
    holder: list[World] = []
    _in_memory_status(kube, holder)

    def leads(namespace: str, name: str) -> bool:
        holder[0].leads_calls += 1
        return True

    def stream_consumers(namespace: str, name: str) -> dict[str, int]:
        """Called once per evaluation that reaches the evaluator: the count of those."""
        holder[0].evaluations += 1
        return dict(holder[0].consumers)

    scaler = AutoScaler(
        cache,
        kube,
        executor,
        locks=reconciler.locks,
        policies=reconciler.policies,
        plan=reconciler.requests.plan,
        events=kube_events(kube),
        leads=leads,
        stream_consumers=stream_consumers,
        tick=0.01,
        clock=lambda: NOW,
    )
    holder.append(World(cache, reconciler, scaler))
    yield holder[0]
    await scaler.stop()
    await api.close()


def put_topic(
    world: World,
    name: str,
    layout: SegmentLayout,
    policy: AutoScalePolicy,
    *,
    rates: dict[int, float] | None = None,
    age: float = 0.0,
    buckets: dict[int, int] | None = None,
    missing: frozenset[int] = frozenset(),
    status: dict[str, Any] | None = None,
) -> None:
    """A topic with ``layout`` in the cache, its policy resolved, and a Segment per active
    segment (except ``missing``) whose load sample is ``age`` seconds old."""
    world.cache.put_topic(
        {
            "metadata": {"namespace": NAMESPACE, "name": name, "resourceVersion": "1"},
            "status": {"layout": layout.to_metadata(), "epoch": layout.epoch, **(status or {})},
        }
    )
    for segment in layout.active():
        sid = segment.segment_id
        if sid in missing:
            continue
        rate = (rates or {}).get(sid, 0.0)
        world.cache.put_segment(
            {
                "metadata": {
                    "namespace": NAMESPACE,
                    "name": f"{name}-{sid}",
                    "labels": {LABEL_TOPIC: name},
                },
                "spec": {"segmentId": sid, "buckets": (buckets or {}).get(sid, 1)},
                "status": {
                    "state": "Active",
                    "load": {
                        "msgRateIn": rate,
                        "bytesRateIn": 0.0,
                        "msgRateOut": 0.0,
                        "bytesRateOut": 0.0,
                        "updatedAt": format_time(NOW - age),
                    },
                },
            }
        )
    world.reconciler.policies.put(
        (NAMESPACE, name), resolve_policy(policy, None, world.reconciler.cluster)
    )


def evaluations(name: str) -> dict[str, float]:
    """``scalable_topic_autoscale_evaluations_total`` of the topic, by result."""
    found: dict[str, float] = {}
    for family in REGISTRY.collect():
        if family.name != "scalable_topic_autoscale_evaluations":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["topic"] == name:
                found[sample.labels["result"]] = sample.value
    return found


def suppressed(name: str) -> dict[str, float]:
    """``scalable_topic_autoscale_suppressed_total`` of the topic, by reason."""
    found: dict[str, float] = {}
    for family in REGISTRY.collect():
        if family.name != "scalable_topic_autoscale_suppressed":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels["topic"] == name:
                assert labels["namespace"] == NAMESPACE
                found[labels["reason"]] = sample.value
    return found


Scenario = Callable[[World, str], None]


def _disabled(world: World, name: str) -> None:
    put_topic(world, name, SegmentLayout.initial(2), AutoScalePolicy(enabled=False))


def _max_segments(world: World, name: str) -> None:
    put_topic(
        world, name, SegmentLayout.initial(2), AutoScalePolicy(max_segments=2), rates={0: HOT}
    )


def _split_cooldown(world: World, name: str) -> None:
    put_topic(
        world,
        name,
        SegmentLayout.initial(2),
        AutoScalePolicy(),
        rates={0: HOT},
        status={"lastSplitAt": format_time(NOW - 1)},
    )


def _unsplittable(world: World, name: str) -> None:
    layout = SegmentLayout.initial(1).split(0, at=0)
    (single,) = [s.segment_id for s in layout.active() if s.hash_range.size == 1]
    put_topic(world, name, layout, AutoScalePolicy(), rates={single: HOT})


def _buckets_unknown(world: World, name: str) -> None:
    world.consumers = {"billing": 3}
    put_topic(
        world,
        name,
        SegmentLayout.initial(2),
        AutoScalePolicy(max_segments=2),
        missing=frozenset({1}),
    )


def _bucket_max(world: World, name: str) -> None:
    world.consumers = {"billing": 3000}  # more than the 2 x 1024 buckets there are
    put_topic(
        world,
        name,
        SegmentLayout.initial(2),
        AutoScalePolicy(max_segments=2),
        buckets={0: 1024, 1: 1024},
    )


def _buckets_suffice(world: World, name: str) -> None:
    world.consumers = {"billing": 4}  # more than the 2 segments, not than their 4 buckets
    put_topic(world, name, SegmentLayout.initial(2), AutoScalePolicy(), buckets={0: 2, 1: 2})


def _rebucket_down_window(world: World, name: str) -> None:
    # segment 0 holds 8 buckets, the budget's share is 2, no consumer needs them; its sample is
    # cold but younger than rebucketDownWindow (1h): lowered later, held back now
    put_topic(
        world,
        name,
        SegmentLayout.initial(2),
        AutoScalePolicy(min_segments=2),
        buckets={0: 8, 1: 2},
        age=AGED,
    )


def _min_segments(world: World, name: str) -> None:
    put_topic(world, name, SegmentLayout.initial(2), AutoScalePolicy(min_segments=2), age=AGED)


def _merge_cooldown(world: World, name: str) -> None:
    put_topic(
        world,
        name,
        SegmentLayout.initial(2),
        AutoScalePolicy(),
        age=AGED,
        status={"lastMergeAt": format_time(NOW - 1)},
    )


def _max_dag_depth(world: World, name: str) -> None:
    layout = SegmentLayout.initial(3).merge(0, 1)
    put_topic(world, name, layout, AutoScalePolicy(max_dag_depth=1), age=AGED)


SCENARIOS: dict[str, tuple[Scenario, dict[str, float]]] = {
    "disabled": (_disabled, {"disabled": 1}),
    "max-segments": (_max_segments, {"max-segments": 1}),
    "split-cooldown": (_split_cooldown, {"split-cooldown": 1}),
    "unsplittable": (_unsplittable, {"unsplittable": 1}),
    "buckets-unknown": (_buckets_unknown, {"max-segments": 1, "buckets-unknown": 1}),
    "bucket-max": (_bucket_max, {"max-segments": 1, "bucket-max": 1}),
    "buckets-suffice": (_buckets_suffice, {"buckets-suffice": 1}),
    "min-segments": (_min_segments, {"min-segments": 1}),
    "rebucket-down-window": (
        _rebucket_down_window,
        {"min-segments": 1, "rebucket-down-window": 1},
    ),
    "merge-cooldown": (_merge_cooldown, {"merge-cooldown": 1}),
    "max-dag-depth": (_max_dag_depth, {"max-dag-depth": 1}),
}


@pytest.mark.parametrize("reason", sorted(SCENARIOS))
async def test_every_suppression_reason_is_counted_by_label(world: World, reason: str) -> None:
    scenario, expected = SCENARIOS[reason]
    name = f"held-{reason}"
    scenario(world, name)
    assert suppressed(name) == {}
    assert await world.scaler.evaluate((NAMESPACE, name)) is None
    assert world.evaluations == 1
    assert suppressed(name) == expected
    evaluation = world.auto_scale(name)["lastEvaluation"]
    assert evaluation["result"] == ("Off" if reason == "disabled" else "Suppressed")
    assert set(evaluation["reasons"]) == set(expected)
    assert evaluation["since"] == format_time(NOW)
    assert world.status_writes == 1
    assert await world.scaler.evaluate((NAMESPACE, name)) is None
    assert suppressed(name) == {label: 2 * value for label, value in expected.items()}
    assert world.status_writes == 1, "the same outcome again writes nothing"
    assert evaluations(name) == {evaluation["result"]: 2}


async def _until(predicate: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.005)


async def _trigger_and_wait_until_looked_at(world: World, key: tuple[str, str]) -> None:
    """Trigger an evaluation and wait until the scaler took it up (asked whether it leads)."""
    looked = world.leads_calls + 1
    world.scaler.trigger(*key)
    await _until(lambda: world.leads_calls == looked, "the trigger taken up")


async def test_an_evaluation_asked_for_under_the_lock_runs_once_after_release(
    world: World,
) -> None:
    name = "locked"
    key = (NAMESPACE, name)
    put_topic(world, name, SegmentLayout.initial(2), AutoScalePolicy(evaluation_interval=3600))
    world.scaler.start()
    await _until(lambda: world.evaluations == 1, "the first periodic evaluation")

    lock = world.reconciler.locks(key)
    await lock.acquire()
    try:
        for _ in range(3):
            await _trigger_and_wait_until_looked_at(world, key)
        assert world.evaluations == 1, "evaluated while the lock was held"
    finally:
        lock.release()

    await _until(lambda: world.evaluations == 2, "the deferred evaluation after release")
    await _until(lambda: not world.scaler._deferred, "no evaluation still deferred")
    # Three requests under the lock, one evaluation after it: a fresh request runs on its own.
    world.scaler.trigger(*key)
    await _until(lambda: world.evaluations == 3, "a later trigger")
    assert world.evaluations == 3


def test_suppression_messages_name_the_knob_and_where_it_is_set() -> None:
    resolution = resolve_policy({"maxSegments": 2}, '{"splitCooldown": "5m"}')
    message = suppression_message(
        (Suppression.MAX_SEGMENTS, Suppression.SPLIT_COOLDOWN), resolution
    )
    assert "maxSegments 2 (maxSegments from spec.autoScale)" in message
    assert "splitCooldown from the namespace's scalabletopics.io/autoscale-policy" in message


async def test_nothing_called_for_is_idle(world: World) -> None:
    put_topic(world, "quiet", SegmentLayout.initial(2), AutoScalePolicy())
    assert await world.scaler.evaluate((NAMESPACE, "quiet")) is None
    evaluation = world.auto_scale("quiet")["lastEvaluation"]
    assert evaluation["result"] == "Idle" and evaluation["reasons"] == []
    assert evaluations("quiet") == {"Idle": 1}
    assert "nothing called for" in evaluation["message"]


async def test_the_master_switch_off_stops_decisions_and_says_so(world: World) -> None:
    world.reconciler.cluster = ClusterDefaults(mode=ClusterMode.OFF)
    put_topic(world, "off", SegmentLayout.initial(2), AutoScalePolicy(), rates={0: HOT})
    assert await world.scaler.evaluate((NAMESPACE, "off")) is None
    assert world.evaluations == 0, "the evaluator is not even asked"
    assert suppressed("off") == {"mode-off": 1}
    evaluation = world.auto_scale("off")["lastEvaluation"]
    assert evaluation["result"] == "Off" and evaluation["reasons"] == ["mode-off"]
    assert evaluations("off") == {"Off": 1}
    assert "scalable-topics-autoscale-defaults" in evaluation["message"]


async def test_recommend_mode_announces_each_distinct_recommendation_once(world: World) -> None:
    world.reconciler.cluster = ClusterDefaults(mode=ClusterMode.RECOMMEND)
    put_topic(world, "advice", SegmentLayout.initial(2), AutoScalePolicy(), rates={0: HOT})
    for _ in range(3):
        assert await world.scaler.evaluate((NAMESPACE, "advice")) is None
    assert [reason for reason, _ in world.events] == ["ScalingRecommended"]
    assert evaluations("advice") == {"Recommended": 3}
    assert world.events[0][1].startswith("split [0] (auto: ")
    auto = world.auto_scale("advice")
    assert auto["lastDecision"]["action"] == "split" and auto["lastDecision"]["segments"] == [0]
    assert auto["lastDecision"]["executed"] is False
    assert auto["lastDecision"]["decidedAt"] == format_time(NOW)
    assert auto["lastEvaluation"]["result"] == "Recommended"
    assert "master switch" in auto["lastEvaluation"]["message"]
    assert world.status_writes == 1

    # Another recommendation (segment 1 is now the hot one) is announced again.
    put_topic(world, "advice", SegmentLayout.initial(2), AutoScalePolicy(), rates={1: HOT})
    assert await world.scaler.evaluate((NAMESPACE, "advice")) is None
    assert [reason for reason, _ in world.events] == ["ScalingRecommended"] * 2
    assert world.events[1][1].startswith("split [1] (auto: ")
