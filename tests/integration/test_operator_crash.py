"""Crash at every step of the split/merge protocol (DESIGN §5), with real processes.

For each fault point an operator started with ``SCALABLE_TOPICS_FAULT=crash-after:<point>``
executes a split (then a merge) and SIGKILLs itself right after that point; a fresh operator
takes the Lease over and finishes the operation (roll forward) or rolls it back. Afterwards the
active segments partition the ring, no operation is left in status, the Segment resources and
the brokers match the layout, and exactly the layout's active segments accept writes. While the
operation is stopped at the fault point, a parent and its children are never writable together:
children are created fenced and opened only after every parent is sealed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from scalable_topics.client.segment import SegmentError, SegmentProducer
from scalable_topics.controller.protocol import FAULT_POINTS
from scalable_topics.controller.segments import CREATION_FAULT_POINTS
from scalable_topics.core import wire
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.transfer import recorded_broker

from .operator_harness import (
    JsonObj,
    OperatorProcess,
    Stack,
    eventually,
    operator_stack,
    topic_body,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOPIC = "crashy"


async def start(stack: Stack, identity: str, fault: str | None = None) -> OperatorProcess:
    """An operator with a 2 s Lease, so a successor takes over 2 s after a crash."""
    return await stack.start_operator(
        identity, fault=fault, lease_duration=2.0, renew_deadline=1.5, retry_period=0.5
    )


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(tmp_path_factory.mktemp("crash"), operator_replicas=0) as running:
        operator = await start(running, "setup")
        await running.apply_topic(topic_body(TOPIC, segments=2))
        await running.wait_ready(TOPIC)
        await running.stop_operators()
        assert operator.proc.returncode == 0, operator.log()[-3000:]
        yield running


async def hello(
    http: aiohttp.ClientSession, url: str, segment_id: int, topic: str = TOPIC
) -> JsonObj:
    """The broker's ``HELLO_OK`` for a producer on the segment (docs/protocol.md, Produce)."""
    async with http.ws_connect(
        f"{url.replace('http', 'ws', 1)}/ws/v1/produce/default/{topic}/{segment_id}"
    ) as ws:
        await ws.send_bytes(wire.encode_hello(wire.PROTOCOL_VERSION, {"producerName": "probe"}))
        message = await ws.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.BINARY, message
        assert message.data[:1] == bytes((wire.FRAME_HELLO_OK,)), message.data[:200]
        return dict(wire.decode_hello_ok(message.data)[1])


async def accepts_writes(stack: Stack, url: str, segment_id: int, topic: str = TOPIC) -> bool:
    """Whether the broker takes a produce on the segment right now: not fenced (a fenced
    segment holds the handshake and then refuses it, tests/integration/test_broker_fence.py),
    not sealed at the handshake, and an entry sent is acknowledged (stored)."""
    stats = await stack.segment_stats(url, topic, segment_id)
    if stats is None or stats.get("writable") is False:
        return False
    async with aiohttp.ClientSession() as http:
        if (await hello(http, url, segment_id, topic)).get("sealed"):
            return False
    producer = await SegmentProducer.connect(url, "default", topic, segment_id, "probe")
    try:
        ack = await asyncio.wait_for(await producer.send_entry([wire.Message(b"probe")]), 10)
        return ack is not None
    except SegmentError:
        return False
    finally:
        await producer.close()


async def writable_segments(stack: Stack, name: str = TOPIC) -> set[int]:
    return {
        sid
        for sid, url in (await stack.broker_segments(name)).items()
        if await accepts_writes(stack, url, sid, name)
    }


async def consistent(stack: Stack, name: str = TOPIC) -> SegmentLayout:
    topic = await stack.topic(name)
    assert topic is not None
    assert not topic["status"].get("operation"), topic["status"].get("operation")
    layout = SegmentLayout.from_metadata(topic["status"]["layout"])
    layout.validate()
    segments = await stack.segments(name)
    assert set(segments) == set(layout.segments), (sorted(segments), sorted(layout.segments))
    on_brokers = await stack.broker_segments(name)
    assert set(on_brokers) == set(layout.segments)
    for sid, info in layout.segments.items():
        state = (segments[sid].get("status") or {}).get("state")
        assert state == ("Active" if info.active else "Sealed"), (sid, state)
    return layout


async def crash_and_recover(
    stack: Stack, point: str, request: JsonObj
) -> tuple[JsonObj, JsonObj, set[int]]:
    """Run ``request`` on an operator that dies after ``point``, then on a fresh one. Returns
    the status left by the crash, the recovered topic, and the segments writable in between."""
    await stack.request(TOPIC, request)
    # Whatever fails, no operator of this test outlives it: a leader left running would take
    # the next test's topics from that test's operators.
    try:
        doomed = await start(stack, f"doomed-{point}", f"crash-after:{point}")
        code = await doomed.wait(60)
        assert code == -9, f"exit {code}\n{doomed.log()[-3000:]}"
        assert f"fault injection: SIGKILL after {point}" in doomed.log()
        crashed = await stack.topic(TOPIC)
        assert crashed is not None
        writable_between = await writable_segments(stack)

        fresh: OperatorProcess = await start(stack, f"fresh-{point}")
        topic = await stack.wait_request(TOPIC, request["id"], within=60)
        await eventually(lambda: consistent(stack), 30, "a consistent topic")
    finally:
        await stack.stop_operators()
    assert fresh.proc.returncode == 0, fresh.log()[-3000:]
    return crashed["status"], topic, writable_between


PHASE_AT_CRASH = {
    "intent-recorded": "Intent",
    "children-created": "ChildrenCreated",
    # Sealed and even activated, the phase is not recorded yet: the producers' window holds no
    # API server write, and the fresh leader learns the seal from the parents' brokers.
    "parents-sealed": "ChildrenCreated",
    "children-activated": "ChildrenCreated",
}


def assert_one_side_writable(
    point: str, parents: list[int], children: list[int], writable: set[int]
) -> None:
    """Before the seal only the parents accept writes; once sealed, only the activated
    children; stopped between the seal and the activation, neither (and with the phase not
    recorded yet: the fresh leader learns the seal from the parents' brokers)."""
    expected = {
        "intent-recorded": set(parents),
        "children-created": set(parents),
        "parents-sealed": set(),
        "children-activated": set(children),
        "layout-committed": set(children),
    }[point]
    assert writable & {*parents, *children} == expected, (point, sorted(writable))


@pytest.mark.parametrize("point", FAULT_POINTS)
async def test_split_then_merge_survive_crash(stack: Stack, point: str) -> None:
    before = await consistent(stack)
    parent = min(s.segment_id for s in before.active())
    children = [before.next_segment_id, before.next_segment_id + 1]

    status, topic, between = await crash_and_recover(
        stack, point, {"id": f"split-{point}", "op": "split", "segments": [parent]}
    )
    if point == "layout-committed":
        assert not status.get("operation")
        assert status["epoch"] == before.epoch + 1
    else:
        assert status["operation"]["kind"] == "split"
        assert status["epoch"] == before.epoch
        assert status["operation"]["phase"] == PHASE_AT_CRASH[point], status["operation"]
    assert_one_side_writable(point, [parent], children, between)
    assert topic["status"]["lastRequest"]["result"] == "Succeeded", topic["status"]
    after = await consistent(stack)
    assert after.epoch == before.epoch + 1
    assert after.segments[parent].child_ids == tuple(children)
    assert await writable_segments(stack) == {s.segment_id for s in after.active()}

    merged_child = after.next_segment_id
    status, topic, between = await crash_and_recover(
        stack, point, {"id": f"merge-{point}", "op": "merge", "segments": children}
    )
    if point != "layout-committed":
        assert status["operation"]["kind"] == "merge"
    assert_one_side_writable(point, children, [merged_child], between)
    assert topic["status"]["lastRequest"]["result"] == "Succeeded", topic["status"]
    final = await consistent(stack)
    assert final.epoch == after.epoch + 1
    assert final.segments[merged_child].parent_ids == tuple(children)
    assert await writable_segments(stack) == {s.segment_id for s in final.active()}


@pytest.mark.parametrize("point", CREATION_FAULT_POINTS)
async def test_a_new_topic_survives_a_crash_before_its_layout_is_recorded(
    stack: Stack, point: str
) -> None:
    """A new topic's layout is recorded with its Ready status, after its Segments exist. An
    operator that dies in between (one segment placed, or all of them) leaves Segments without
    a layout. The next leader finds only Segments of the first layout
    (``core.rebuild.unfinished_creation``) and finishes the creation: Ready at epoch 0 with
    the first layout's ranges, each segment on the broker first chosen for it."""
    name = f"born-{point}"
    try:
        doomed = await start(stack, f"doomed-{point}", f"crash-after:{point}")
        await stack.apply_topic(topic_body(name, segments=2))
        code = await doomed.wait(60)
        assert code == -9, f"exit {code}\n{doomed.log()[-3000:]}"
        crashed = await stack.topic(name)
        assert crashed is not None
        assert not (crashed.get("status") or {}).get("layout"), crashed.get("status")
        left = await stack.segments(name)
        assert len(left) == (1 if point == "first-segment-placed" else 2), sorted(left)
        placed = {sid: recorded_broker(seg) for sid, seg in left.items()}
        assert all(placed.values()), left

        fresh = await start(stack, f"fresh-{point}")
        topic = await stack.wait_ready(name)
        layout = await eventually(
            lambda: consistent(stack, name), 30, f"{name}: a consistent topic"
        )
    finally:
        await stack.stop_operators()
    assert fresh.proc.returncode == 0, fresh.log()[-3000:]
    # Finished as the creation it was, not rebuilt as a lost layout (no new epoch, no warning).
    assert "finishing the creation a pass began" in fresh.log(), fresh.log()[-3000:]
    assert "status.layout was missing" not in fresh.log()
    assert topic["status"]["epoch"] == 0, topic["status"]

    first = SegmentLayout.initial(2)
    assert {s.hash_range for s in layout.active()} == {s.hash_range for s in first.active()}
    segments = await stack.segments(name)
    for sid, pod in placed.items():
        assert recorded_broker(segments[sid]) == pod, (sid, segments[sid].get("status"))
    assert await writable_segments(stack, name) == {s.segment_id for s in layout.active()}
