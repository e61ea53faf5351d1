"""Retention pruning, controller-observed drains and manual request ids, with the real operator
and brokers (embedded control plane, local kubelet, processes).

The operator here is started by the test with a 2 s resync interval, so a stats round (a sealed
segment's broker is asked at most once per round) takes 2 s instead of the overlay's 30 s.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from scalable_topics.client.segment import SegmentConsumer, SegmentProducer
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import parse_time
from scalable_topics.core.wire import Message

from .operator_harness import (
    TOPICS,
    JsonObj,
    OperatorProcess,
    Stack,
    condition_of,
    eventually,
    operator_stack,
    topic_body,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGES = 30


async def start(stack: Stack, identity: str) -> OperatorProcess:
    """An operator with a 2 s resync, once it serves."""
    op = await stack.start_operator(identity, extra=("--resync-interval", "2"))

    async def up() -> str | None:
        if op.proc.returncode is not None:
            raise RuntimeError(f"operator {identity} exited:\n{op.log()[-3000:]}")
        async with aiohttp.ClientSession() as http, http.get(op.url + "/healthz") as r:
            return "serving" if r.status == 200 else None

    await eventually(up, 60, f"operator {identity} serving")
    return op


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(tmp_path_factory.mktemp("retention"), operator_replicas=0) as running:
        await start(running, "retention-0")
        yield running


def operator(stack: Stack) -> OperatorProcess:
    running = [op for op in stack.operators if op.proc.returncode is None]
    assert len(running) == 1, running
    return running[0]


async def metric(stack: Stack, name: str, labels: str = "") -> float:
    """A sample of the running operator's ``/metrics`` (0 when absent)."""
    async with aiohttp.ClientSession() as http, http.get(operator(stack).url + "/metrics") as r:
        text = await r.text()
    pattern = rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$"
    match = re.search(pattern, text, re.M)
    return float(match.group(1)) if match else 0.0


def layout_of(topic: JsonObj | None) -> SegmentLayout:
    assert topic is not None
    return SegmentLayout.from_metadata(topic["status"]["layout"])


def drained_for(topic: JsonObj | None, subscription: str) -> list[int]:
    for entry in ((topic or {}).get("status") or {}).get("subscriptions") or []:
        if entry.get("name") == subscription:
            return list(entry.get("drainedSegments") or [])
    return []


async def drain_observed(
    stack: Stack, name: str, subscription: str, segments: list[int]
) -> JsonObj:
    """The topic once the consumer hub records exactly ``segments`` drained for the
    subscription."""

    async def observed() -> JsonObj | None:
        topic = await stack.topic(name)
        return topic if drained_for(topic, subscription) == segments else None

    return await eventually(observed, 30, f"{subscription}'s drain of {segments} observed")


async def produce(stack: Stack, name: str, segment_id: int, count: int = MESSAGES) -> str:
    """``count`` acknowledged entries on the segment; returns its broker URL."""
    url = (await stack.broker_segments(name))[segment_id]
    producer = await SegmentProducer.connect(url, "default", name, segment_id, "loader")
    try:
        for k in range(count):
            await (await producer.send_entry([Message(f"m{k}".encode())]))
    finally:
        await producer.close()
    return url


async def consume_to_end(url: str, name: str, segment_id: int, subscription: str) -> int:
    """Read and acknowledge the sealed segment for ``subscription`` until the broker says it
    is at its end (everything up to the seal acknowledged); returns the entries read."""
    read = 0
    async with await SegmentConsumer.connect(
        url, "default", name, segment_id, subscription, f"reader-{subscription}"
    ) as consumer:
        while (item := await consumer.receive()) is not None:
            consumer.ack(item.position)
            read += 1
    return read


async def split(stack: Stack, name: str, request_id: str, segment: int) -> JsonObj:
    await stack.request(name, {"id": request_id, "op": "split", "segments": [segment]})
    topic = await stack.wait_request(name, request_id)
    assert topic["status"]["lastRequest"]["result"] == "Succeeded", topic["status"]
    return topic


async def checks_after(stack: Stack, instant: float) -> float:
    """Wait until ``instant`` (Unix seconds) has passed, then return the drain-check count."""

    async def passed() -> bool:
        return time.time() > instant

    await eventually(passed, 30, "the retention deadline")
    return await metric(stack, "scalable_topic_drain_checks_total", 'outcome="ok"')


async def test_a_drained_parent_is_pruned_once_every_subscription_is_done(stack: Stack) -> None:
    name = "short-lived"
    body = topic_body(name, segments=1, retention={"time": "2s"})
    body["spec"]["subscriptions"].append({"name": "audit", "type": "Queue"})
    await stack.apply_topic(body)
    await stack.wait_ready(name)
    url = await produce(stack, name, 0)
    await split(stack, name, "split-0", 0)

    assert await consume_to_end(url, name, 0, "billing") == MESSAGES

    # The leader sees billing's drain in the broker's stats and tells the consumer hub.
    topic = await drain_observed(stack, name, "billing", [0])
    sealed_at = parse_time((await stack.segments(name))[0]["status"]["sealedAt"])
    # audit has read nothing: past the retention time, after two more checks of #0, it stays.
    before = await checks_after(stack, sealed_at + 2 + 1)

    async def checked_twice() -> bool:
        return await metric(stack, "scalable_topic_drain_checks_total", 'outcome="ok"') >= (
            before + 2
        )

    await eventually(checked_twice, 30, "two more stats checks of #0")
    assert 0 in layout_of(await stack.topic(name)).segments
    assert 0 in await stack.broker_segments(name)
    assert 0 in await stack.segments(name)
    labels = f'namespace="default",topic="{name}"'
    assert await metric(stack, "scalable_topic_pruned_segments_total", labels) == 0

    assert await consume_to_end(url, name, 0, "audit") == MESSAGES

    async def pruned() -> JsonObj | None:
        topic = await stack.topic(name)
        return topic if 0 not in layout_of(topic).segments else None

    topic = await eventually(pruned, 30, "#0 pruned from status.layout")
    current = layout_of(topic)
    current.validate()
    assert sorted(current.segments) == [1, 2]
    assert all(not s.parent_ids and s.active for s in current.segments.values())
    assert current.epoch == 2 and topic["status"]["epoch"] == 2
    assert "#0" not in topic["status"]["dag"]

    async def gone() -> bool:
        return 0 not in await stack.broker_segments(name) and set(await stack.segments(name)) == {
            1,
            2,
        }

    await eventually(gone, 30, "#0 deleted from its broker and as a Segment")
    assert await stack.segment_stats(url, name, 0) is None
    events = [e for e in await stack.events(name) if e["reason"] == "Pruned"]
    assert len(events) == 1 and "#0 0000-ffff" in events[0]["message"], events
    assert await metric(stack, "scalable_topic_pruned_segments_total", labels) == 1
    assert await metric(stack, "scalable_topic_observed_drains_total", labels) >= 1
    await stack.wait_ready(name)


async def test_without_retention_a_drained_parent_is_kept(stack: Stack) -> None:
    name = "kept-forever"
    await stack.apply_topic(topic_body(name, segments=1))
    await stack.wait_ready(name)
    url = await produce(stack, name, 0)
    await split(stack, name, "split-0", 0)
    assert await consume_to_end(url, name, 0, "billing") == MESSAGES

    # Nobody reported the drain over a consumer session: the controller saw it in the stats.
    await drain_observed(stack, name, "billing", [0])
    # A fully drained segment is never asked about again: over later resync passes (several
    # stats rounds), the check count stays where it is, and #0 stays without retention.
    checks = await metric(stack, "scalable_topic_drain_checks_total", 'outcome="ok"')
    passes = await metric(stack, "scalable_topic_reconciles_total", 'outcome="ok"')

    async def resynced() -> bool:
        now = await metric(stack, "scalable_topic_reconciles_total", 'outcome="ok"')
        return now >= passes + 3 * len(await topics(stack))

    await eventually(resynced, 60, "three resync passes")
    assert await metric(stack, "scalable_topic_drain_checks_total", 'outcome="ok"') == checks
    topic = await stack.topic(name)
    assert 0 in layout_of(topic).segments
    assert 0 in await stack.broker_segments(name)
    assert not [e for e in await stack.events(name) if e["reason"] == "Pruned"]


async def topics(stack: Stack) -> list[JsonObj]:
    items, _ = await stack.api.list(TOPICS, "default")
    return items


async def test_an_old_request_id_is_never_executed_again(stack: Stack) -> None:
    """A names segment #3 before it exists (Rejected); once B and C have created #3, applying A
    again would split it: it must not run, and is reported as handled."""
    name = "requests"
    await stack.apply_topic(topic_body(name, segments=1))
    await stack.wait_ready(name)
    a = {"id": "A", "op": "split", "segments": [3]}
    await stack.request(name, a)
    topic = await stack.wait_request(name, "A")
    assert topic["status"]["lastRequest"]["result"] == "Rejected"
    await split(stack, name, "B", 0)
    topic = await split(stack, name, "C", 1)
    assert topic["status"]["epoch"] == 2
    before = layout_of(topic)
    assert before.segments[3].active

    await stack.request(name, a)

    async def reported() -> JsonObj | None:
        topic = await stack.topic(name)
        last = ((topic or {}).get("status") or {}).get("lastRequest") or {}
        return topic if last.get("id") == "A" and "already handled" in last["message"] else None

    topic = await eventually(reported, 30, "A reported as already handled")
    status = topic["status"]
    assert status["lastRequest"]["result"] == "Rejected"
    assert status["epoch"] == 2 and layout_of(topic) == before
    assert [e["id"] for e in status["recentRequests"]] == ["A", "B", "C"]
    assert [e["result"] for e in status["recentRequests"]] == [
        "Rejected",
        "Succeeded",
        "Succeeded",
    ]

    async def reasons() -> list[str] | None:
        found = sorted(e["reason"] for e in await stack.events(name))
        return found if "RequestAlreadyHandled" in found else None

    found = await eventually(reasons, 30, "the RequestAlreadyHandled event")
    assert found.count("Split") == 2 and found.count("RequestAlreadyHandled") == 1, found

    # A new id still runs, and goes into the history.
    topic = await split(stack, name, "D", 3)
    assert topic["status"]["epoch"] == 3

    async def remembered() -> list[str] | None:
        topic = await stack.topic(name)
        ids = [e["id"] for e in (topic or {}).get("status", {}).get("recentRequests") or []]
        return ids if "D" in ids else None

    assert await eventually(remembered, 30, "D in the history") == ["A", "B", "C", "D"]


async def test_an_unreadable_layout_stalls_the_topic_and_deletes_nothing(stack: Stack) -> None:
    """Segments not in the layout are deleted, so a layout that does not read must stop the
    leader, not be replaced by a stand-in."""
    name = "broken-layout"
    await stack.apply_topic(topic_body(name, segments=2))
    topic = await stack.wait_ready(name)
    good = topic["status"]["layout"]
    broken = {**good, "segments": {"0": good["segments"]["0"]}}  # a gap: #1 is missing

    async def set_layout(value: JsonObj) -> None:
        await stack.api.patch(
            TOPICS,
            "default",
            name,
            [{"op": "replace", "path": "/status/layout", "value": value}],
            subresource="status",
            patch_type="json",
        )

    await set_layout(broken)

    async def stalled() -> JsonObj | None:
        topic = await stack.topic(name)
        ready = condition_of(topic, "Ready") or {}
        return topic if ready.get("reason") == "LayoutInvalid" else None

    topic = await eventually(stalled, 30, "Ready=False LayoutInvalid")
    assert (condition_of(topic, "Stalled") or {}).get("status") == "True"
    assert "gap" in (condition_of(topic, "Ready") or {})["message"]
    assert set(await stack.segments(name)) == {0, 1}
    assert set(await stack.broker_segments(name)) == {0, 1}
    await set_layout(good)
    topic = await stack.wait_ready(name)
    assert (condition_of(topic, "Stalled") or {}).get("status") == "False"


async def test_a_crash_after_the_layout_commit_is_completed_by_the_next_leader(
    stack: Stack,
) -> None:
    """The prune's first step is the layout CAS; a leader that dies right after it leaves the
    segment on its broker and as a Segment. The next leader deletes both (level-based)."""
    name = "half-pruned"
    await stack.apply_topic(topic_body(name, segments=1))
    await stack.wait_ready(name)
    await split(stack, name, "split-0", 0)
    await stack.stop_operators()
    topic = await stack.topic(name)
    assert topic is not None
    pruned = layout_of(topic).prune(0)
    await stack.api.patch(
        TOPICS,
        "default",
        name,
        [
            {"op": "replace", "path": "/status/layout", "value": pruned.to_metadata()},
            {"op": "replace", "path": "/status/epoch", "value": pruned.epoch},
        ],
        subresource="status",
        patch_type="json",
    )
    assert 0 in await stack.broker_segments(name) and 0 in await stack.segments(name)
    successor = await start(stack, "retention-1")

    async def completed() -> bool:
        return 0 not in await stack.broker_segments(name) and set(await stack.segments(name)) == {
            1,
            2,
        }

    try:
        await eventually(completed, 60, "#0 deleted from its broker and as a Segment")
    except AssertionError as exc:
        state = (await stack.broker_segments(name), sorted(await stack.segments(name)))
        raise AssertionError(
            f"{exc}; brokers/Segments {state}\n{successor.log()[-6000:]}"
        ) from None
    topic = await stack.wait_ready(name)
    assert sorted(layout_of(topic).segments) == [1, 2]
