"""The operator end to end on the real control plane: CRDs and ``manifests/overlays/local``
applied with kubectl, three broker pods and two operator pods running as real processes under
their ServiceAccounts, authorized by the Roles of ``manifests/``.

Create → Ready, manual split/merge/rejected request, invalid spec and its fix, auto-split under
load, delete with the finalizer. One stack per module (start-up costs seconds); every test uses
its own topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scalable_topics.client.segment import SegmentError, SegmentProducer, SegmentSealedError
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import LABEL_TOPIC
from scalable_topics.core.wire import Message

from .conftest import metric_samples
from .operator_harness import (
    NAMESPACE,
    OPERATOR_SERVICE_ACCOUNT,
    REPO,
    SEGMENTS,
    TOPICS,
    JsonObj,
    Stack,
    condition_of,
    eventually,
    operator_stack,
    topic_body,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(tmp_path_factory.mktemp("operator")) as running:
        yield running


def layout(topic: JsonObj) -> SegmentLayout:
    return SegmentLayout.from_metadata(topic["status"]["layout"])


async def assert_consistent(stack: Stack, name: str, within: float = 30) -> SegmentLayout:
    """Eventually (Segment states follow the committed layout, DESIGN §5 step 6): layout valid,
    no operation in flight, Segment resources and broker logs match the layout."""
    return await eventually(lambda: _consistent(stack, name), within, f"{name} consistent")


async def _consistent(stack: Stack, name: str) -> SegmentLayout:
    topic = await stack.topic(name)
    assert topic is not None
    current = layout(topic)
    current.validate()
    assert not topic["status"].get("operation")
    segments = await stack.segments(name)
    assert set(segments) == set(current.segments)
    on_brokers = await stack.broker_segments(name)
    assert set(on_brokers) == set(current.segments)
    for sid, info in current.segments.items():
        status = segments[sid].get("status") or {}
        assert status.get("state") == ("Active" if info.active else "Sealed"), (sid, status)
        assert status["broker"]["url"] == on_brokers[sid]
        stats = await stack.segment_stats(on_brokers[sid], name, sid)
        assert stats is not None
        assert bool(stats.get("sealed")) is (not info.active), (sid, stats.get("sealed"))
        if not info.active:
            successors = {
                int(s["segmentId"]) for s in (stats.get("seal") or {}).get("successors", [])
            }
            assert successors == set(info.child_ids), (sid, stats.get("seal"))
    return current


TOPIC_GAUGES = ("scalable_topic_active_segments", "scalable_topic_layout_epoch")


async def topic_gauges(controller_url: str, name: str) -> dict[str, float]:
    """The leader's per-topic gauges of ``default/name`` (absent series are left out)."""
    samples = await metric_samples(controller_url)
    labels = (("namespace", "default"), ("topic", name))
    return {g: samples[(g, labels)] for g in TOPIC_GAUGES if (g, labels) in samples}


async def segment_status_writes(controller_url: str) -> float:
    samples = await metric_samples(controller_url)
    key = (("kind", "Segment"), ("outcome", "written"))
    return samples.get(("scalable_topic_status_writes_total", key), 0.0)


async def wait_gauges(controller_url: str, name: str, wanted: dict[str, float]) -> None:
    async def reached() -> bool:
        return await topic_gauges(controller_url, name) == wanted

    await eventually(reached, 30, f"{name}: gauges {wanted}")


async def test_example_topic_becomes_ready(stack: Stack) -> None:
    started = time.monotonic()
    # --validate=strict: unknown fields would fail the request (metadata must not count).
    orders = REPO / "manifests" / "examples" / "orders.yaml"
    await stack.kubectl("apply", "--validate=strict", "-f", str(orders))
    await stack.kubectl(
        "wait", "--for=condition=Ready", "stopic/orders", "--timeout=60s", within=90
    )
    elapsed = time.monotonic() - started
    print(f"\nkubectl apply -> Ready (incl. kubectl wait): {elapsed:.2f}s")
    topic = await stack.wait_ready("orders")
    assert topic["status"]["activeSegments"] == 2
    assert topic["status"]["epoch"] == 0
    assert "scalabletopics.io/finalizer" in topic["metadata"]["finalizers"]
    controller = topic["status"]["controller"]
    assert controller["pod"] == await stack.leader()
    assert re.fullmatch(rf"http://127\.\d+\.\d+\.\d+:{stack.broker_port + 1}", controller["url"])
    current = await assert_consistent(stack, "orders")
    segments = await stack.segments("orders")
    on_brokers = await stack.broker_segments("orders")
    for sid in current.segments:
        seg = segments[sid]
        assert seg["status"]["broker"]["pod"].startswith("segment-broker-")
        assert seg["spec"]["buckets"] == 4
        stats = await stack.segment_stats(on_brokers[sid], "orders", sid)
        assert stats is not None
        assert set(stats["subscriptions"]) == {"billing", "audit"}
    # spread over two brokers (least-loaded placement), one Created event naming both
    assert len(set(on_brokers.values())) == 2
    events = await stack.events("orders")
    assert not [e for e in events if e["reason"] == "Placed"], events
    created = [e["message"] for e in events if e["reason"] == "Created"]
    assert created == [
        f"created {len(current.segments)} segment(s) at epoch 0: "
        + "; ".join(
            f"segment #{sid} {current.segments[sid].hash_range.hex()} on "
            f"{segments[sid]['status']['broker']['pod']}"
            for sid in sorted(current.segments)
        )
    ], created
    stats = await stack.segment_stats(on_brokers[0], "orders", 0)
    assert stats is not None
    wide = await stack.kubectl("get", "stopic", "orders", "-o", "wide")
    assert "orders" in wide.stdout and "True" in wide.stdout


async def test_split_merge_and_rejected_request(stack: Stack) -> None:
    name = "split-merge"
    await stack.apply_topic(topic_body(name, segments=2))
    await stack.wait_ready(name)

    leader_url = (await stack.topic(name) or {})["status"]["controller"]["url"]
    before = await segment_status_writes(leader_url)
    await stack.request(name, {"id": "r1", "op": "split", "segments": [0]})
    topic = await stack.wait_request(name, "r1")
    assert topic["status"]["lastRequest"]["result"] == "Succeeded"
    assert topic["status"]["epoch"] == 1
    assert topic["status"]["activeSegments"] == 3
    current = await assert_consistent(stack, name)
    assert sorted(s.segment_id for s in current.active()) == [1, 2, 3]
    assert current.segments[0].child_ids == (2, 3)
    assert topic["status"]["lastSplitAt"]
    controller_url = topic["status"]["controller"]["url"]
    await wait_gauges(
        controller_url,
        name,
        {"scalable_topic_active_segments": 3, "scalable_topic_layout_epoch": 1},
    )
    # Segment status writes of the split: two children placed and made Active, the parent
    # sealed (5), at least.
    assert await segment_status_writes(controller_url) - before >= 5

    # #2 (0000-3fff) and #1 (8000-ffff) are not adjacent: rejected, nothing changes.
    await stack.request(name, {"id": "r2", "op": "merge", "segments": [2, 1]})
    topic = await stack.wait_request(name, "r2")
    assert topic["status"]["lastRequest"]["result"] == "Rejected"
    assert topic["status"]["epoch"] == 1
    assert layout(topic).to_metadata() == current.to_metadata()

    await stack.request(name, {"id": "r3", "op": "merge", "segments": [2, 3]})
    topic = await stack.wait_request(name, "r3")
    assert topic["status"]["lastRequest"]["result"] == "Succeeded"
    assert topic["status"]["epoch"] == 2
    merged = await assert_consistent(stack, name)
    assert sorted(s.segment_id for s in merged.active()) == [1, 4]
    await wait_gauges(
        controller_url,
        name,
        {"scalable_topic_active_segments": 2, "scalable_topic_layout_epoch": 2},
    )
    assert merged.segments[4].parent_ids == (2, 3)

    async def events() -> list[JsonObj] | None:
        found = await stack.events(name)
        reasons = {e["reason"] for e in found}
        return found if {"Split", "Merged", "RequestRejected"} <= reasons else None

    found = await eventually(events, 30, "Split, Merged and RequestRejected events")
    rejected = [e for e in found if e["reason"] == "RequestRejected"]
    assert rejected[0]["type"] == "Warning"
    assert "r2" in rejected[0]["message"]

    # The same request id again is not executed twice.
    await stack.kubectl("annotate", f"stopic/{name}", "unrelated=1")
    await asyncio.sleep(0)
    topic = await stack.wait_ready(name)
    assert topic["status"]["epoch"] == 2

    described = (await stack.kubectl("describe", "stopic", name)).stdout
    assert "epoch 2, 2 active" in described
    assert re.search(r"0000 \|.*#4.*#1.*\| ffff", described), described
    assert "RequestRejected" in described and "Merged" in described


async def test_invalid_policy_then_fixed(stack: Stack) -> None:
    name = "bad-policy"
    body = topic_body(
        name,
        autoScale={"splitBytesRateInThreshold": "1Mi", "mergeBytesRateInThreshold": "2Mi"},
    )
    await stack.apply_topic(body)

    async def not_ready() -> JsonObj | None:
        topic = await stack.topic(name)
        cond = condition_of(topic, "Ready")
        return cond if cond and cond["status"] == "False" else None

    cond = await eventually(not_ready, 60, "Ready=False")
    assert cond["reason"] in ("InvalidAutoScalePolicy", "InvalidSpec"), cond
    assert "bytes" in cond["message"].lower() or "threshold" in cond["message"].lower(), cond
    assert (condition_of(await stack.topic(name), "Stalled") or {}).get("status") == "True"

    async def warning() -> list[JsonObj] | None:
        found = [e for e in await stack.events(name) if e["type"] == "Warning"]
        return found or None

    warnings = await eventually(warning, 30, "a Warning event")
    assert warnings[0]["reason"] == cond["reason"]

    body["spec"]["autoScale"]["mergeBytesRateInThreshold"] = "512Ki"
    await stack.apply_topic(body)
    topic = await stack.wait_ready(name)
    assert (condition_of(topic, "Stalled") or {}).get("status") == "False"
    await assert_consistent(stack, name)


async def _stalled(stack: Stack, name: str, reason: str, namespace: str = "default") -> JsonObj:
    async def probe() -> JsonObj | None:
        topic = await stack.topic(name, namespace)
        stalled = condition_of(topic, "Stalled") or {}
        return topic if stalled.get("status") == "True" and stalled["reason"] == reason else None

    topic = await eventually(probe, 60, f"{namespace}/{name} Stalled with {reason}")
    ready = condition_of(topic, "Ready")
    assert ready is not None and ready["status"] == "False" and ready["reason"] == reason, ready
    return topic


async def _warning(stack: Stack, name: str, reason: str, namespace: str = "default") -> JsonObj:
    async def probe() -> JsonObj | None:
        found = [
            e
            for e in await stack.events(name, namespace)
            if e["type"] == "Warning" and e["reason"] == reason
        ]
        return found[0] if found else None

    return await eventually(probe, 30, f"a Warning event {reason} on {name}")


async def test_name_at_the_limit_becomes_ready(stack: Stack) -> None:
    name = "n" * 63  # the CRD's maxLength: the value of the topic label on its Segments
    await stack.apply_topic(topic_body(name, segments=2))
    topic = await stack.wait_ready(name)
    assert topic["status"]["activeSegments"] == 2
    segments = await stack.segments(name)
    assert {s["metadata"]["name"] for s in segments.values()} == {f"{name}-0", f"{name}-1"}
    await assert_consistent(stack, name)


async def _api_server_count(stack: Stack, name: str, **labels: str) -> float:
    """The sum of the API server's own ``name`` samples whose labels include ``labels``."""
    text = (await stack.kubectl("get", "--raw", "/metrics")).stdout
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def _segment_lists_by_namespace(stack: Stack) -> float:
    """Namespace-scoped LISTs of Segments the API server has served (the operator's
    label-selected listing of one topic's Segments; the recommender lists cluster-wide)."""
    return await _api_server_count(
        stack, "apiserver_request_total", resource="segments", verb="LIST", scope="namespace"
    )


async def test_new_topics_do_not_list_the_namespaces_segments(stack: Stack) -> None:
    """A new topic is known to be new from the operator's complete Segment cache and the
    brokers' per-topic index: no label-selected LIST, which scans every Segment of the
    namespace at the API server (issue 17: the costliest request of a new topic at 10,000)."""
    before = await _segment_lists_by_namespace(stack)
    names = [f"fresh-{i}" for i in range(3)]
    for name in names:
        await stack.apply_topic(topic_body(name, segments=2))
    for name in names:
        await stack.wait_ready(name)
    assert await _segment_lists_by_namespace(stack) == before


MARKER = "test/marker"


@contextlib.asynccontextmanager
async def recorded_writes(
    stack: Stack, resource: Any, select: Callable[[JsonObj], bool]
) -> AsyncIterator[Callable[[], Awaitable[dict[str, list[JsonObj]]]]]:
    """Record every write (ADDED, MODIFIED) of the ``default`` objects of ``resource`` that
    ``select`` picks, from now on. The context gives ``finish``: it patches a marker annotation
    on each recorded object and returns the writes of each, the marker's last, once every marker
    came back. Watch events come in resourceVersion order, so every write made before the marker
    is in the record: a write counted that way cannot be missed by a watch that lags."""
    _, since = await stack.api.list(resource, "default")
    seen: dict[str, list[JsonObj]] = {}
    marked: set[str] = set()
    arrived = asyncio.Event()

    async def watch() -> None:
        async for etype, obj in stack.api.watch(resource, since):
            if etype not in ("ADDED", "MODIFIED") or not select(obj):
                continue
            meta = obj["metadata"]
            seen.setdefault(meta["name"], []).append(obj)
            if (meta.get("annotations") or {}).get(MARKER) == "1":
                marked.add(meta["name"])
                arrived.set()

    async def finish() -> dict[str, list[JsonObj]]:
        names = set(seen)
        for name in names:
            patch = {"metadata": {"annotations": {MARKER: "1"}}}
            await stack.api.patch(resource, "default", name, patch)
        async with asyncio.timeout(30):
            while not names <= marked:
                arrived.clear()
                await arrived.wait()
        return {name: seen[name] for name in names}

    watcher = asyncio.create_task(watch())
    try:
        yield finish
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_a_new_topic_is_one_status_write(stack: Stack) -> None:
    """A new topic's status is written once: Ready, which records the first layout and already
    carries the consumer hub's subscription entries and the auto-scaler's first evaluation. The
    hub's restore and the evaluation that follow find them there and write nothing (issue 17:
    each was one more topic status write, the costliest request of a new topic at the API
    server; the first layout was one too)."""
    name = "two-writes"
    body = topic_body(
        name,
        segments=2,
        subscriptions=[{"name": "billing", "type": "Stream"}, {"name": "jobs", "type": "Queue"}],
    )
    async with recorded_writes(stack, TOPICS, lambda o: o["metadata"]["name"] == name) as finish:
        await stack.api.create(TOPICS, "default", body)
        topic = await stack.wait_ready(name)
        controller_url = topic["status"]["controller"]["url"]
        idle = (
            "scalable_topic_autoscale_evaluations_total",
            (("namespace", "default"), ("result", "Idle"), ("topic", name)),
        )

        async def evaluated() -> bool:
            return (await metric_samples(controller_url)).get(idle, 0.0) >= 1

        await eventually(evaluated, 60, f"{name}: the auto-scaler's first evaluation")
        seen = (await finish())[name]

    statuses: list[JsonObj] = [obj.get("status") or {} for obj in seen[:-1]]
    changes = [s for before, s in itertools.pairwise(statuses) if s != before]
    assert len(changes) == 1, [sorted(s) for s in changes]
    # Besides it, the operator's finalizer patch, and nothing else.
    assert len(seen) == 1 + 1 + len(changes) + 1, [o["metadata"]["resourceVersion"] for o in seen]
    (ready,) = changes
    assert ready["layout"]["segments"], ready
    assert (condition_of({"status": ready}, "Ready") or {}).get("status") == "True"
    entries = {e["name"]: e for e in ready["subscriptions"]}
    assert entries == {
        "billing": {
            "name": "billing",
            "type": "Stream",
            "layoutEpoch": 0,
            "consumers": [],
            "drainedSegments": [],
        },
        "jobs": {**entries["jobs"], "name": "jobs", "type": "Queue"},
    }
    assert ready["autoScale"]["lastEvaluation"]["result"] == "Idle"


async def test_a_new_segment_is_one_status_write_and_its_idle_broker_adds_none(
    stack: Stack,
) -> None:
    """A new segment's placement carries its zero ``load`` (the broker is told with the
    create, ``zeroLoadRecorded``), so its broker's first samples, idle, write nothing: each
    Segment is created and written once (issue 17: the brokers' first zero report of each new
    segment was 2 of the 4 Segment status writes of a new topic)."""
    name = "one-segment-write"

    def of_topic(obj: JsonObj) -> bool:
        return (obj["metadata"].get("labels") or {}).get(LABEL_TOPIC) == name

    async with recorded_writes(stack, SEGMENTS, of_topic) as finish:
        await stack.api.create(
            TOPICS, "default", topic_body(name, segments=2, autoScale={"enabled": False})
        )
        await stack.wait_ready(name)
        passes = "segment_broker_load_samples_total", ()
        brokers = list((await stack.broker_urls()).values())
        baseline = {url: (await metric_samples(url)).get(passes, 0.0) for url in brokers}

        async def two_passes_each() -> bool:
            # The second pass that ends after Ready began after it: it sampled the segments.
            counts = {url: (await metric_samples(url)).get(passes, 0.0) for url in brokers}
            return all(counts[url] >= baseline[url] + 2 for url in brokers)

        await eventually(two_passes_each, 60, "two load sampling passes on every broker")
        seen = await finish()

    assert len(seen) == 2, sorted(seen)
    for segment, writes in seen.items():
        created, placed, marker = writes
        assert not created.get("status"), (segment, created.get("status"))
        load = placed["status"]["load"]
        assert {k: v for k, v in load.items() if k != "updatedAt"} == {
            "msgRateIn": 0.0,
            "bytesRateIn": 0.0,
            "msgRateOut": 0.0,
            "bytesRateOut": 0.0,
        }
        assert placed["status"]["state"] == "Active" and placed["status"]["broker"]["url"]
        assert marker["status"] == placed["status"], segment


async def _leader_election_requests(stack: Stack) -> float:
    return await _api_server_count(
        stack,
        "apiserver_flowcontrol_dispatched_requests_total",
        flow_schema="scalable-topics-leader-election",
        priority_level="leader-election",
    )


async def test_the_operators_lease_requests_have_the_leader_election_priority(
    stack: Stack,
) -> None:
    """manifests/base/operator-flowschema.yaml: the operator's Lease renewals are dispatched in
    the API server's leader-election priority level, not queued with every workload's requests
    in workload-low (issue 17: at 10,000 topics a renewal waited there past the renew deadline
    and the leader let go of every shard)."""
    flowschema = json.loads(
        (
            await stack.kubectl(
                "get", "flowschema", "scalable-topics-leader-election", "-o", "json"
            )
        ).stdout
    )
    dangling = condition_of(flowschema, "Dangling")
    assert dangling is not None and dangling["status"] == "False", dangling
    before = await _leader_election_requests(stack)

    async def renewed() -> bool:
        return await _leader_election_requests(stack) > before

    # The local overlay's leader renews every second (retry period 1 s).
    await eventually(renewed, 30, "a Lease request dispatched by the FlowSchema")


async def test_initial_segments_above_the_namespace_max_builds_nothing(stack: Stack) -> None:
    """A bound from the namespace's policy is the operator's to check: Ready=False InvalidSpec,
    a Warning event, no Segment; raising the bound on the topic lays it out."""
    namespace, name = "capped", "wide"
    await stack.kubectl("create", "namespace", namespace)
    await stack.kubectl(
        "annotate", "namespace", namespace, 'scalabletopics.io/autoscale-policy={"maxSegments": 3}'
    )
    body = topic_body(name, segments=5)
    body["metadata"]["namespace"] = namespace
    await stack.apply_topic(body)

    topic = await _stalled(stack, name, "InvalidSpec", namespace)
    message = condition_of(topic, "Ready")["message"]  # type: ignore[index]
    assert "spec.initialSegments (5) is above maxSegments (3)" in message, message
    assert "scalabletopics.io/autoscale-policy" in message, message
    assert topic["status"]["activeSegments"] == 0 and "layout" not in topic["status"]
    event = await _warning(stack, name, "InvalidSpec", namespace)
    assert "(5)" in event["message"] and "(3)" in event["message"], event
    assert await stack.segments(name, namespace) == {}
    assert await stack.broker_segments(name, namespace) == {}

    body["spec"]["autoScale"] = {"maxSegments": 8}
    await stack.apply_topic(body)
    topic = await stack.wait_ready(name, namespace=namespace)
    assert topic["status"]["activeSegments"] == 5
    assert len(await stack.segments(name, namespace)) == 5


async def test_stored_overlong_name_is_stalled_and_builds_nothing(stack: Stack) -> None:
    """A topic stored under a CRD without the name limit (as an older embedded control plane
    accepted it) cannot have Segments: Stalled NameTooLong, a Warning event, no finalizer, and a
    status that claims no segment."""
    name = "x" * 250
    crd_path = REPO / "crds" / "scalabletopics.io_scalabletopics.yaml"
    lax = yaml.safe_load(crd_path.read_text())
    schema = lax["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["metadata"]["properties"]["name"]["maxLength"]
    try:
        await stack.kubectl("apply", "-f", "-", input=json.dumps(lax))
        await stack.apply_topic(topic_body(name, segments=2))
    finally:
        await stack.kubectl("apply", "-f", str(crd_path))
    rejected = await stack.kubectl(
        "apply", "-f", "-", input=json.dumps(topic_body("y" * 250)), check=False
    )
    assert "Too long: may not be more than 63 bytes" in rejected.stderr, rejected

    topic = await _stalled(stack, name, "NameTooLong")
    message = condition_of(topic, "Stalled")["message"]  # type: ignore[index]
    assert "250 characters, longer than 63" in message and "scalabletopics.io/topic" in message
    await _warning(stack, name, "NameTooLong")
    assert topic["status"]["activeSegments"] == 0 and "layout" not in topic["status"]
    assert "scalabletopics.io/finalizer" not in (topic["metadata"].get("finalizers") or [])

    # A status that claims segments (as the operator wrote before it checked names) is undone.
    claimed = {"status": {"activeSegments": 2, "layout": SegmentLayout.initial(2).to_metadata()}}
    await stack.kubectl(
        "patch", "stopic", name, "--subresource=status", "--type=merge", "-p", json.dumps(claimed)
    )

    async def unclaimed() -> JsonObj | None:
        topic = await stack.topic(name)
        status = (topic or {}).get("status") or {}
        return topic if status.get("activeSegments") == 0 and "layout" not in status else None

    await eventually(unclaimed, 30, "status.layout removed again")
    segments, _ = await stack.api.list(SEGMENTS, "default")
    assert [s for s in segments if s["spec"]["topic"] == name] == []
    # An older operator may have added its finalizer: deleting still completes.
    finalizer = {"metadata": {"finalizers": ["scalabletopics.io/finalizer"]}}
    await stack.kubectl("patch", "stopic", name, "--type=merge", "-p", json.dumps(finalizer))
    await stack.kubectl("delete", "stopic", name, "--wait=true", "--timeout=30s", within=60)


async def test_auto_split_under_load(stack: Stack) -> None:
    name = "hot"
    await stack.apply_topic(
        topic_body(
            name,
            segments=1,
            autoScale={
                "splitMsgRateInThreshold": 20,
                "mergeMsgRateInThreshold": 1,
                "splitCooldown": "1s",
                "evaluationInterval": "1s",
                "maxSegments": 2,
            },
        )
    )
    await stack.wait_ready(name)
    url = (await stack.broker_segments(name))[0]
    sent = 0
    failures: list[str] = []
    stop = asyncio.Event()

    async def load() -> None:
        """About 300 msg/s on segment 0 until told to stop or the segment is sealed (split),
        reconnecting after any other failure. Stopped by a flag, not by cancellation: the
        producer's ``close()`` swallows a cancellation that arrives while it closes."""
        nonlocal sent
        while not stop.is_set():
            try:
                producer = await SegmentProducer.connect(url, "default", name, 0, "load-test")
            except (SegmentError, aiohttp.ClientError, OSError) as exc:
                failures.append(repr(exc))
                await asyncio.sleep(0.5)
                continue
            try:
                while not stop.is_set():
                    acks = [
                        await producer.send_entry([Message(b"x" * 100, key=b"k%d" % (sent + j))])
                        for j in range(50)
                    ]
                    await asyncio.gather(*acks)
                    sent += 50
                    await asyncio.sleep(0.1)  # pacing of the load generator, not a wait
            except SegmentSealedError:
                return
            except (SegmentError, aiohttp.ClientError, OSError) as exc:
                failures.append(repr(exc))
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.close(), 5)

    generator = asyncio.create_task(load())

    async def split() -> JsonObj | None:
        topic = await stack.topic(name)
        return topic if (topic or {}).get("status", {}).get("epoch") == 1 else None

    # The broker's load reporter (segment_broker/k8s_reporter.py, every 10 s) writes the rate
    # into Segment.status.load; the operator's auto-scaler splits on it.
    try:
        topic = await eventually(split, 120, "an automatic split")
    except AssertionError as exc:
        segment = (await stack.segments(name)).get(0) or {}
        raise AssertionError(
            f"{exc}; sent {sent}, producer failures {failures[-3:]}, "
            f"Segment status {segment.get('status')}, topic status "
            f"{((await stack.topic(name)) or {}).get('status', {}).get('conditions')}"
        ) from None
    finally:
        stop.set()
        done, _ = await asyncio.wait({generator}, timeout=15)
        if not done:  # stuck in a send to the sealed segment
            generator.cancel()
    assert topic["status"]["activeSegments"] == 2
    await stack.wait_ready(name)
    await assert_consistent(stack, name)
    found = [e for e in await stack.events(name) if e["reason"] == "Split"]
    # e.g. "split #0 ... (auto: segment 0000-ffff-0 msgRateIn 468/s is 23x the split threshold
    # 20/s)": decided on the rate the broker reported.
    assert found and "auto" in found[0]["message"], found
    assert "msgRateIn" in found[0]["message"] and "threshold 20/s" in found[0]["message"], found

    controller_url = topic["status"]["controller"]["url"]

    async def counted() -> float | None:
        async with aiohttp.ClientSession() as http, http.get(controller_url + "/metrics") as r:
            text = await r.text()
        match = re.search(
            r'^scalable_topic_auto_splits_total\{namespace="default",topic="hot"\} (\S+)$',
            text,
            re.M,
        )
        return float(match.group(1)) if match else None

    assert await eventually(counted, 10, "the auto-split counter") == 1.0


async def test_delete_runs_finalizer(stack: Stack) -> None:
    name = "doomed"
    await stack.apply_topic(topic_body(name, segments=3))
    await stack.wait_ready(name)
    await stack.request(name, {"id": "s", "op": "split", "segments": [1]})
    topic = await stack.wait_request(name, "s")
    assert len(await stack.broker_segments(name)) == 5
    controller_url = topic["status"]["controller"]["url"]
    await wait_gauges(
        controller_url,
        name,
        {"scalable_topic_active_segments": 4, "scalable_topic_layout_epoch": 1},
    )

    await stack.kubectl("delete", "stopic", name, "--wait=true", "--timeout=60s", within=90)
    assert await stack.topic(name) is None
    # No stale series of the deleted topic is left on the leader.
    await wait_gauges(controller_url, name, {})

    async def gone() -> bool:
        return not await stack.segments(name) and not await stack.broker_segments(name)

    await eventually(gone, 30, "segments gone from the API and the brokers")


async def test_subscriptions_follow_the_spec_on_every_live_segment(stack: Stack) -> None:
    name = "subs"
    await stack.apply_topic(topic_body(name, segments=2))
    await stack.wait_ready(name)
    await stack.request(name, {"id": "s", "op": "split", "segments": [0]})
    await stack.wait_request(name, "s")

    subscriptions = [{"name": "billing", "type": "Stream"}, {"name": "reports", "type": "Queue"}]
    await stack.apply_topic(topic_body(name, segments=2, subscriptions=subscriptions))
    await stack.wait_ready(name)

    async def provisioned(expected: set[str]) -> bool:
        topic = await stack.topic(name)
        assert topic is not None
        active = [s.segment_id for s in layout(topic).active()]
        on_brokers = await stack.broker_segments(name)
        for sid in active:
            stats = await stack.segment_stats(on_brokers[sid], name, sid)
            if stats is None or set(stats["subscriptions"]) != expected:
                return False
        return True

    await eventually(
        lambda: provisioned({"billing", "reports"}), 30, "the added subscription on every segment"
    )
    await stack.apply_topic(
        topic_body(name, segments=2, subscriptions=[{"name": "reports", "type": "Queue"}])
    )
    await stack.wait_ready(name)
    await eventually(
        lambda: provisioned({"reports"}), 30, "the removed subscription gone from every segment"
    )


async def test_the_operator_pods_have_exactly_the_rights_of_their_roles(stack: Stack) -> None:
    """``kubectl auth can-i`` answers from the Roles of ``manifests/`` (real RBAC): the verbs
    the operator uses, in any namespace for topics and only in its own for Leases, and not one
    more; its pods run as that ServiceAccount."""
    account = f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"

    async def can(verb: str, resource: str, namespace: str) -> str:
        resource, _, subresource = resource.partition("/")
        result = await stack.kubectl(
            "auth", "can-i", verb, resource, f"--subresource={subresource}",
            "--as", account, "-n", namespace, check=False,
        )  # fmt: skip
        return result.stdout.strip()

    allowed = [
        ("watch", "scalabletopics.scalabletopics.io", "team-a"),
        ("update", "scalabletopics.scalabletopics.io/status", "team-a"),
        ("create", "segments.scalabletopics.io", "default"),
        ("patch", "segments.scalabletopics.io/status", "default"),
        ("list", "pods", NAMESPACE),
        ("update", "leases.coordination.k8s.io", NAMESPACE),
        ("create", "events", "team-a"),
    ]
    refused = [
        ("delete", "scalabletopics.scalabletopics.io", "default"),
        ("update", "scalabletopics.scalabletopics.io", "default"),
        ("update", "leases.coordination.k8s.io", "default"),
        ("get", "secrets", NAMESPACE),
        ("delete", "pods", NAMESPACE),
    ]
    assert [await can(*case) for case in allowed] == ["yes"] * len(allowed)
    assert [await can(*case) for case in refused] == ["no"] * len(refused)
    pods = await stack.ready_pods("app.kubernetes.io/name=scalable-topics-operator")
    assert len(pods) == 2
    assert {p["spec"]["serviceAccountName"] for p in pods} == {OPERATOR_SERVICE_ACCOUNT}
