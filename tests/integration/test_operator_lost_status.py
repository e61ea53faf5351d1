"""A topic whose status is gone loses nothing (docs/correctness.md, "Lost status"), with the real
operator, brokers and client on the embedded control plane.

Each test builds a DAG by a split and a merge with data on every segment, then takes records
away as a restore from a backup, a migration or a re-created object would, and checks that the
topic comes back with the same DAG (ids, ranges, states, links), an epoch above the old one, and
every segment still on its broker with all its entries — or, where the records cannot make a
DAG, that it stalls with ``LayoutLost`` and deletes nothing. The operator is started by the test
(2 s resync) so that it can be stopped while records are removed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from scalable_topics.client import StreamConsumer
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import layout_status

from .operator_harness import (
    SEGMENTS,
    TOPICS,
    JsonObj,
    OperatorProcess,
    Stack,
    condition_of,
    eventually,
    operator_stack,
    topic_body,
)
from .test_operator_retention import metric, produce, split, start

pytestmark = pytest.mark.asyncio(loop_scope="module")

Shape = dict[int, tuple[str, bool, tuple[int, ...], tuple[int, ...]]]
Stored = dict[int, tuple[str, int]]
"""Segment id → (broker URL, last position)."""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(tmp_path_factory.mktemp("lost"), operator_replicas=0) as running:
        yield running


_started = 0


async def operator(stack: Stack) -> OperatorProcess:
    """The running operator, started if none is."""
    global _started
    running = [op for op in stack.operators if op.proc.returncode is None]
    if running:
        return running[0]
    _started += 1
    return await start(stack, f"lost-{_started}")


def layout_of(topic: JsonObj | None) -> SegmentLayout:
    assert topic is not None and (topic.get("status") or {}).get("layout"), topic
    return SegmentLayout.from_metadata(topic["status"]["layout"])


def shape(layout: SegmentLayout) -> Shape:
    return {
        sid: (s.hash_range.hex(), s.active, s.parent_ids, s.child_ids)
        for sid, s in layout.segments.items()
    }


async def stored(stack: Stack, name: str) -> Stored:
    """Segment id → (broker URL, last position) of every segment of the topic on a broker."""
    found: Stored = {}
    for sid, url in (await stack.broker_segments(name)).items():
        stats = await stack.segment_stats(url, name, sid)
        assert stats is not None
        found[sid] = (url, int(stats["lastPosition"]))
    return found


async def split_and_merge(stack: Stack, name: str) -> tuple[SegmentLayout, Stored]:
    """#0 0000-7fff and #1 8000-ffff; #1 split into #2, #3; #0 and #2 merged into #4. Ten
    entries on each segment while it is active. Returns the layout once every Segment records
    its state and epochs, and what the brokers hold."""
    await operator(stack)
    await stack.apply_topic(topic_body(name, segments=2))
    await stack.wait_ready(name)
    for sid in (0, 1):
        await produce(stack, name, sid, 10)
    await split(stack, name, f"{name}-split", 1)
    for sid in (2, 3):
        await produce(stack, name, sid, 10)
    await stack.request(name, {"id": f"{name}-merge", "op": "merge", "segments": [0, 2]})
    topic = await stack.wait_request(name, f"{name}-merge")
    assert topic["status"]["lastRequest"]["result"] == "Succeeded", topic["status"]
    await produce(stack, name, 4, 10)
    layout = layout_of(topic)
    assert sorted(s.segment_id for s in layout.active()) == [3, 4]

    async def recorded() -> bool:
        segments = await stack.segments(name)
        return set(segments) == set(layout.segments) and all(
            (segments[sid].get("status") or {}).get("state")
            == ("Active" if info.active else "Sealed")
            and segments[sid]["status"].get("createdAtEpoch") == info.created_at_epoch
            and (segments[sid]["status"].get("sealedAtEpoch") or 0) == info.sealed_at_epoch
            for sid, info in layout.segments.items()
        )

    await eventually(recorded, 30, f"{name}'s Segments recording their states and epochs")
    data = await stored(stack, name)
    assert set(data) == set(layout.segments)
    assert all(last >= 9 for _, last in data.values()), data
    return layout, data


async def delete_segments(stack: Stack, name: str, ids: list[int]) -> None:
    """Delete the Segments and wait until those objects are gone (a running operator may have
    written a new one under the same name already: a different uid)."""
    uids = {sid: s["metadata"]["uid"] for sid, s in (await stack.segments(name)).items()}
    for sid in ids:
        await stack.api.delete(SEGMENTS, "default", f"{name}-{sid}")

    async def gone() -> bool:
        now = await stack.segments(name)
        return not any(now[sid]["metadata"]["uid"] == uids.get(sid) for sid in ids if sid in now)

    await eventually(gone, 30, f"Segments {ids} of {name} deleted")


async def events(stack: Stack, name: str, reason: str) -> list[str]:
    """The messages of the topic's ``reason`` events, once there is one: the operator posts an
    event after the status write the tests wait for, so a list read at once may miss it."""

    async def posted() -> list[str]:
        return [e["message"] for e in await stack.events(name) if e["reason"] == reason]

    return await eventually(posted, 30, f"a {reason} event")


async def rebuilds(stack: Stack, name: str, outcome: str) -> float:
    labels = f'namespace="default",outcome="{outcome}",topic="{name}"'
    return await metric(stack, "scalable_topic_layout_rebuilds_total", labels)


async def test_a_lost_status_is_rebuilt_from_the_segments(stack: Stack) -> None:
    name = "restored"
    before, data = await split_and_merge(stack, name)
    await stack.lose_status(name)

    topic = await stack.wait_ready(name)
    after = layout_of(topic)
    assert shape(after) == shape(before)
    assert after.next_segment_id == before.next_segment_id
    assert after.epoch > before.epoch, "clients ignore a DAG whose epoch went back"
    assert topic["status"]["epoch"] == after.epoch
    assert topic["status"]["layout"] == layout_status(after), "written as every layout is"
    assert set(await stack.segments(name)) == set(before.segments)
    assert await stored(stack, name) == data, "every segment kept every entry on its broker"
    rebuilt = await events(stack, name, "LayoutRebuilt")
    assert rebuilt == [
        f"status.layout was missing: rebuilt from 5 Segment(s) at epoch {after.epoch} "
        f"(5 segment(s), 2 active); request {name}-merge is not run again (whether it ran is "
        "unknown)"
    ], rebuilt
    assert await rebuilds(stack, name, "from-segments") == 1
    # The merge request's annotation is still on the topic; that it ran is lost with the status.
    last = topic["status"]["lastRequest"]
    assert (last["id"], last["result"]) == (f"{name}-merge", "Rejected"), last
    assert "not run again" in last["message"]


async def test_segments_gone_too_are_rebuilt_from_the_brokers(stack: Stack) -> None:
    name = "from-brokers"
    before, data = await split_and_merge(stack, name)
    await stack.stop_operators()
    await stack.lose_status(name)
    await delete_segments(stack, name, sorted(before.segments))
    await operator(stack)

    topic = await stack.wait_ready(name)
    after = layout_of(topic)
    assert shape(after) == shape(before)
    assert after.epoch > before.epoch
    assert await stored(stack, name) == data
    segments = await stack.segments(name)
    assert set(segments) == set(before.segments)
    for sid, info in before.segments.items():
        status = segments[sid]["status"]
        assert status["broker"]["url"] == data[sid][0], (sid, status)
        assert status["state"] == ("Active" if info.active else "Sealed"), (sid, status)
        assert segments[sid]["spec"]["parents"] == list(info.parent_ids)
    rebuilt = await events(stack, name, "LayoutRebuilt")
    assert len(rebuilt) == 1 and "segments [0, 1, 2, 3, 4] from their brokers" in rebuilt[0]
    assert await rebuilds(stack, name, "from-brokers") == 1


async def test_records_that_make_no_dag_stall_and_delete_nothing(stack: Stack) -> None:
    """#3's Segment and its broker's copy are both gone (a lost volume): nothing covers
    c000-ffff (#1's split lost a half). The topic stalls, says what to do, and deletes nothing;
    putting the layout back (from a backup) brings it back."""
    name = "unrecoverable"
    before, data = await split_and_merge(stack, name)
    await stack.stop_operators()
    saved = await stack.lose_status(name)
    await delete_segments(stack, name, [3])
    async with stack.http.delete(f"{data[3][0]}/admin/v1/segments/default/{name}/3") as response:
        assert response.status == 200, await response.text()
    kept = {sid: where for sid, where in data.items() if sid != 3}
    await operator(stack)

    async def stalled() -> JsonObj | None:
        topic = await stack.topic(name)
        ready = condition_of(topic, "Ready") or {}
        return topic if ready.get("reason") == "LayoutLost" else None

    topic = await eventually(stalled, 30, "Ready=False LayoutLost")
    message = (condition_of(topic, "Ready") or {})["message"]
    assert "segments [2] (8000-bfff) do not cover exactly the range of their parents [1]" in (
        message
    ), message
    assert "Nothing was deleted" in message, message
    assert "Restore status.layout from a backup" in message, message
    assert (condition_of(topic, "Stalled") or {}).get("status") == "True"
    assert not (topic.get("status") or {}).get("layout")
    assert await events(stack, name, "LayoutLost") == [message]
    assert await rebuilds(stack, name, "failed") >= 1
    assert await stored(stack, name) == kept
    assert set(await stack.segments(name)) == set(kept)

    await stack.api.patch(
        TOPICS,
        "default",
        name,
        {"status": {key: saved[key] for key in ("layout", "epoch", "nextSegmentId")}},
        subresource="status",
    )
    topic = await stack.wait_ready(name)
    assert shape(layout_of(topic)) == shape(before)
    assert set(await stack.segments(name)) == set(before.segments)
    after = await stored(stack, name)
    assert {sid: after[sid] for sid in kept} == kept
    assert after[3][1] == -1, "#3 is back, empty: its data went with the volume"


async def test_an_interrupted_split_is_finished_after_the_status_is_lost(stack: Stack) -> None:
    """The leader dies after creating the children (fenced), before sealing the parent; the
    status, with the operation's intent, is lost. The children are in the Segments, Pending:
    the rebuild resumes the split instead of deleting them."""
    name = "interrupted"
    await operator(stack)
    await stack.apply_topic(topic_body(name, segments=2))
    await stack.wait_ready(name)
    await produce(stack, name, 1, 10)
    await stack.stop_operators()
    doomed = await stack.start_operator("doomed", fault="crash-after:children-created")
    await stack.request(name, {"id": "split-1", "op": "split", "segments": [1]})
    assert await doomed.wait(60) == -9, doomed.log()[-3000:]
    stack.operators.remove(doomed)
    crashed = await stack.lose_status(name)
    assert crashed["operation"]["phase"] == "ChildrenCreated", crashed
    assert set(await stack.broker_segments(name)) == {0, 1, 2, 3}
    await operator(stack)

    async def split_done() -> JsonObj | None:
        topic = await stack.topic(name)
        status = (topic or {}).get("status") or {}
        if status.get("layout") and not status.get("operation"):
            layout = layout_of(topic)
            return topic if layout.segments[1].child_ids == (2, 3) else None
        return None

    topic = await eventually(split_done, 60, "the split finished")
    layout = layout_of(topic)
    assert sorted(s.segment_id for s in layout.active()) == [0, 2, 3]
    await stack.wait_ready(name)
    segments = await stack.segments(name)
    assert {sid: segments[sid]["status"]["state"] for sid in segments} == {
        0: "Active",
        1: "Sealed",
        2: "Active",
        3: "Active",
    }
    on_brokers = await stack.broker_segments(name)
    parent = await stack.segment_stats(on_brokers[1], name, 1)
    assert parent is not None and parent["sealed"] and parent["lastPosition"] == 9
    assert {int(s["segmentId"]) for s in parent["seal"]["successors"]} == {2, 3}
    for child in (2, 3):
        stats = await stack.segment_stats(on_brokers[child], name, child)
        assert stats is not None and stats["writable"] is True, stats
    assert topic["status"]["lastRequest"]["id"] == "split-1", topic["status"]
    assert topic["status"]["lastRequest"]["result"] == "Succeeded", topic["status"]
    rebuilt = await events(stack, name, "LayoutRebuilt")
    assert len(rebuilt) == 1 and "resuming the interrupted operation rebuilt-" in rebuilt[0]
    splits = await events(stack, name, "Split")
    assert any("(rebuilt: found interrupted in the Segment records" in m for m in splits), splits


async def test_a_recreated_topic_takes_its_segments_over(stack: Stack) -> None:
    """The topic object is deleted without its finalizer running (its Segments orphaned, not
    deleted) and created again: a new uid and no status. The Segments become the new object's
    and the DAG is the old one."""
    name = "recreated"
    before, data = await split_and_merge(stack, name)
    await stack.stop_operators()
    old = await stack.topic(name)
    assert old is not None
    await stack.api.patch(TOPICS, "default", name, {"metadata": {"finalizers": None}})
    await stack.api.delete(TOPICS, "default", name, propagation_policy="Orphan")

    async def orphaned() -> bool:
        segments = await stack.segments(name)
        assert len(segments) == 5, f"the Segments must survive the delete: {sorted(segments)}"
        return await stack.topic(name) is None and all(
            not s["metadata"].get("ownerReferences") for s in segments.values()
        )

    await eventually(orphaned, 60, "the topic deleted and its Segments orphaned")
    await stack.apply_topic(topic_body(name, segments=2))
    await operator(stack)

    topic = await stack.wait_ready(name)
    uid = topic["metadata"]["uid"]
    assert uid != old["metadata"]["uid"]
    assert shape(layout_of(topic)) == shape(before)
    assert await stored(stack, name) == data
    for segment in (await stack.segments(name)).values():
        owners = segment["metadata"]["ownerReferences"]
        assert [(o["uid"], o["controller"]) for o in owners] == [(uid, True)], owners
    rebuilt = await events(stack, name, "LayoutRebuilt")
    assert any("5 Segment(s) taken over from a previous uid" in m for m in rebuilt), rebuilt


async def test_a_new_leader_serves_the_backlog_of_sealed_segments(stack: Stack) -> None:
    """Nobody has read #0 when it is split and the status is lost; a new leader restores the
    subscriptions from the rebuilt status. A stream consumer must get all of #0 before its
    children (the hub would take a subscription without status for a new one, with every
    sealed segment drained)."""
    name = "backlog"
    await operator(stack)
    await stack.apply_topic(topic_body(name, segments=1))
    await stack.wait_ready(name)
    await produce(stack, name, 0, 10)
    await split(stack, name, f"{name}-split", 0)
    for sid in (1, 2):
        await produce(stack, name, sid, 10)
    await stack.stop_operators()
    await stack.lose_status(name)
    leader = await operator(stack)
    topic = await stack.wait_ready(name)
    entries = {e["name"]: e for e in topic["status"]["subscriptions"]}
    assert entries["billing"]["drainedSegments"] == [], entries

    consumer = StreamConsumer(leader.url, "default", name, "billing", "reader")
    await consumer.start()
    try:
        read: list[int] = []
        async with asyncio.timeout(60):
            while len(read) < 30:
                message = await consumer.receive()
                read.append(message.segment_id)
                consumer.ack_nowait(message)
    finally:
        await consumer.close()
    assert read[:10] == [0] * 10, read
    assert sorted(read[10:]) == [1] * 10 + [2] * 10, read


async def test_a_deleted_segment_resource_is_written_again_from_its_broker(stack: Stack) -> None:
    """With the layout in place, the Segments of a sealed and an active segment are deleted: they
    come back naming the broker that holds the data (not placed afresh, empty, elsewhere)."""
    name = "segment-gone"
    before, data = await split_and_merge(stack, name)
    await operator(stack)
    old = await stack.segments(name)
    await delete_segments(stack, name, [1, 3])

    async def back() -> dict[int, JsonObj] | None:
        segments = await stack.segments(name)
        ok = set(segments) == set(before.segments) and all(
            (segments[sid].get("status") or {}).get("state") for sid in (1, 3)
        )
        return segments if ok else None

    segments = await eventually(back, 30, "Segments #1 and #3 written again")
    for sid in (1, 3):
        assert segments[sid]["metadata"]["uid"] != old[sid]["metadata"]["uid"]
        assert segments[sid]["status"]["broker"] == old[sid]["status"]["broker"], sid
        assert segments[sid]["spec"]["range"] == old[sid]["spec"]["range"]
    assert segments[1]["status"]["state"] == "Sealed"
    assert await stored(stack, name) == data
    topic = await stack.wait_ready(name)
    assert shape(layout_of(topic)) == shape(before)
    recovered = await events(stack, name, "SegmentsRecovered")
    for sid in (1, 3):
        assert any(f"#{sid} on {old[sid]['status']['broker']['pod']}" in m for m in recovered), (
            recovered
        )
