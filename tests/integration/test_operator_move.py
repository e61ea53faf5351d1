"""Manual moves (``op: move`` requests) on the real operator and brokers, and a crash of the
leader after every step of the transfer (DESIGN §9, ``controller.transfer``).

A segment with entries and a consumer's acknowledgements moves between broker pods; for each
fault point an operator started with ``SCALABLE_TOPICS_FAULT=crash-after:<point>`` SIGKILLs
itself right after that step, and a fresh operator completes the move. While the move is
stopped, at most one broker accepts writes for the segment; afterwards the Segment names the
destination, only the destination has the segment, every entry is there at its position, the
cursor came along, the request is ``Succeeded`` once (its id is not run again) with a ``Moved``
event.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
import pytest_asyncio

from scalable_topics.client import ScalableTopicProducer, StreamConsumer
from scalable_topics.client.segment import SegmentConsumer, SegmentError, SegmentProducer
from scalable_topics.controller.transfer import TRANSFER_FAULT_POINTS
from scalable_topics.core.transfer import DRAIN_ANNOTATION
from scalable_topics.core.wire import Message
from scalable_topics.localcluster.restclient import EVENTS, STATEFULSETS
from tests.chaos.checker import RestartKind, check
from tests.chaos.workload import ConsumerRunner, OpenLoopWriter, ReadingConsumer, Recorder

from .operator_harness import (
    JsonObj,
    Stack,
    eventually,
    operator_stack,
    topic_body,
)
from .test_operator_crash import start

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOPIC = "movable"
SID = 0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(tmp_path_factory.mktemp("move"), operator_replicas=0) as running:
        operator = await start(running, "setup")
        await running.apply_topic(topic_body(TOPIC, segments=2))
        await running.wait_ready(TOPIC)
        await running.stop_operators()
        assert operator.proc.returncode == 0, operator.log()[-3000:]
        url = (await running.broker_segments(TOPIC))[SID]
        producer = await SegmentProducer.connect(url, "default", TOPIC, SID, "seed")
        for i in range(50):  # one entry each
            await (await producer.send_entry([Message(b"entry-%d" % i, key=b"k%d" % i)]))
        await producer.close()
        subscription = "billing"
        consumer = await SegmentConsumer.connect(url, "default", TOPIC, SID, subscription, "c")
        for _ in range(10):
            entry = await consumer.receive()
            assert entry is not None
            consumer.ack(entry.position)

        async def acked() -> bool:
            stats = await running.segment_stats(url, TOPIC, SID)
            return bool(stats and stats["subscriptions"][subscription]["ackFloor"] == 10)

        await eventually(acked, 30, "the consumer's acks on the broker")
        await consumer.close()
        yield running


async def accepts_writes(url: str) -> bool:
    """The broker stores and acknowledges a produce on the segment right now."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/admin/v1/segments/default/{TOPIC}/{SID}") as resp,
    ):
        if resp.status != 200 or (await resp.json())["writable"] is False:
            return False
    producer = await SegmentProducer.connect(url, "default", TOPIC, SID, "probe")
    try:
        return (
            await asyncio.wait_for(await producer.send_entry([Message(b"probe")]), 10) is not None
        )
    except SegmentError:
        return False
    finally:
        await producer.close()


async def placement(stack: Stack) -> tuple[str, str, dict[str, str]]:
    """(pod the Segment names, another ready broker pod, pod → URL)."""
    urls = await stack.broker_urls()
    segment = (await stack.segments(TOPIC))[SID]
    pod = segment["status"]["broker"]["pod"]
    other = sorted(p for p in urls if p != pod)[0]
    return pod, other, urls


async def moved_consistently(stack: Stack, destination: str, entries: int) -> JsonObj:
    segment = (await stack.segments(TOPIC))[SID]
    status = segment["status"]
    assert not status.get("transfer"), status.get("transfer")
    assert status["broker"]["pod"] == destination
    urls = await stack.broker_urls()
    hosts = [
        pod for pod, url in urls.items() if await stack.segment_stats(url, TOPIC, SID) is not None
    ]
    assert hosts == [destination], hosts
    stats = await stack.segment_stats(urls[destination], TOPIC, SID)
    assert stats is not None and stats["writable"] is True
    assert stats["lastPosition"] == entries - 1
    floors = {name: sub["ackFloor"] for name, sub in stats["subscriptions"].items()}
    assert 10 in floors.values(), floors
    return stats


async def test_move_request_moves_the_segment_once(stack: Stack) -> None:
    pod, other, urls = await placement(stack)
    before = await stack.segment_stats(urls[pod], TOPIC, SID)
    assert before is not None
    operator = await start(stack, "mover")
    request = {"id": "move-plain", "op": "move", "segments": [SID], "to": other}
    try:
        await stack.request(TOPIC, request)
        topic = await stack.wait_request(TOPIC, "move-plain", within=90)
        last = topic["status"]["lastRequest"]
        assert last["result"] == "Succeeded", (last, operator.log()[-3000:])
        await moved_consistently(stack, other, before["lastPosition"] + 1)
        events = await stack.events(TOPIC)
        assert any(e["reason"] == "Moved" and f"to {other}" in e["message"] for e in events)
        bad = {"id": "move-bad", "op": "move", "segments": [SID], "to": "nope"}
        await stack.request(TOPIC, bad)
        topic = await stack.wait_request(TOPIC, "move-bad", within=60)
        assert topic["status"]["lastRequest"]["result"] == "Rejected"
        assert "not a ready broker pod" in topic["status"]["lastRequest"]["message"]
        # the first id again is not executed again
        await stack.request(TOPIC, {**request, "to": pod})
        topic = await stack.wait_request(TOPIC, "move-plain", within=60)
        assert topic["status"]["lastRequest"]["message"].startswith("already handled")
        assert (await stack.segments(TOPIC))[SID]["status"]["broker"]["pod"] == other
    finally:
        await stack.stop_operators()
    assert operator.proc.returncode == 0, operator.log()[-3000:]


@pytest.mark.parametrize("point", TRANSFER_FAULT_POINTS)
async def test_move_survives_a_leader_crash_after_each_step(stack: Stack, point: str) -> None:
    pod, other, urls = await placement(stack)
    before = await stack.segment_stats(urls[pod], TOPIC, SID)
    assert before is not None
    request_id = f"move-{point}"
    await stack.request(TOPIC, {"id": request_id, "op": "move", "segments": [SID], "to": other})
    try:
        doomed = await start(stack, f"doomed-{point}", f"crash-after:{point}")
        code = await doomed.wait(90)
        assert code == -9, f"exit {code}\n{doomed.log()[-3000:]}"
        assert f"fault injection: SIGKILL after {point}" in doomed.log()

        stopped = (await stack.segments(TOPIC))[SID]["status"]
        assert stopped.get("transfer"), stopped
        writable = [p for p in (pod, other) if await accepts_writes(urls[p])]
        assert len(writable) <= 1, (point, writable)
        entries = before["lastPosition"] + 1 + len(writable)

        fresh = await start(stack, f"fresh-{point}")
        try:
            topic = await stack.wait_request(TOPIC, request_id, within=90)
        except AssertionError as exc:
            # One CI run had the request unfinished after 90 s with nothing else to read.
            topic_status = ((await stack.topic(TOPIC)) or {}).get("status")
            segment_status = (await stack.segments(TOPIC))[SID].get("status")
            raise AssertionError(
                f"{exc}\ntopic status: {topic_status}\nsegment status: {segment_status}\n"
                f"fresh leader's log:\n{fresh.log()[-4000:]}"
            ) from None
        assert topic["status"]["lastRequest"]["result"] == "Succeeded", (
            topic["status"],
            fresh.log()[-3000:],
        )
        await eventually(lambda: moved_consistently(stack, other, entries), 30, "the moved segment")
        assert await accepts_writes(urls[other])
    finally:
        # A failure must not leave this test's leader running into the next parametrization
        # (it would keep the Lease and handle the next test's request itself).
        await stack.stop_operators()
    assert fresh.proc.returncode == 0, fresh.log()[-3000:]


LOAD_TOPIC = "moving-load"
LOAD_SUB = "billing"
KEYS = [f"key-{i}" for i in range(32)]


async def _wait(probe: Callable[[], bool], within: float, what: str) -> None:
    async def check() -> bool:
        return probe()

    await eventually(check, within, what)


async def _move(stack: Stack, recorder: Recorder, sid: int, request_id: str) -> str:
    """Move ``sid`` of the load topic to another broker; the consumer's reconnect is recorded
    as an outage of the segment's broker (it may redeliver what was not acknowledged there)."""
    urls = await stack.broker_urls()
    pod = (await stack.segments(LOAD_TOPIC))[sid]["status"]["broker"]["pod"]
    other = sorted(p for p in urls if p != pod)[0]
    handle = recorder.restart(RestartKind.BROKER, pod, segments=(sid,))
    request = {"id": request_id, "op": "move", "segments": [sid], "to": other}
    await stack.request(LOAD_TOPIC, request)
    topic = await stack.wait_request(LOAD_TOPIC, request_id, within=90)
    recorder.restarted(handle)
    assert topic["status"]["lastRequest"]["result"] == "Succeeded", topic["status"]
    assert (await stack.segments(LOAD_TOPIC))[sid]["status"]["broker"]["pod"] == other
    return other


async def test_moves_under_keyed_load_lose_and_reorder_nothing(stack: Stack) -> None:
    """An active segment, then a sealed one (the parent of a split, its seal and successors
    moving with it), move while a keyed open-loop producer writes and a stream consumer
    reads: the chaos checker finds nothing lost, reordered, skipped or unexpected, and every
    duplicate explained by the move of the segment it came from."""
    operator = await start(stack, "load")
    await stack.apply_topic(topic_body(LOAD_TOPIC, segments=2))
    await stack.wait_ready(LOAD_TOPIC)
    recorder = Recorder({LOAD_SUB: True})

    async def open_stream() -> ReadingConsumer:
        consumer = StreamConsumer(operator.url, "default", LOAD_TOPIC, LOAD_SUB, "reader")
        await consumer.start()
        return consumer

    runner = ConsumerRunner("reader", LOAD_SUB, recorder, open_stream)
    try:
        async with ScalableTopicProducer(
            operator.url, "default", LOAD_TOPIC, linger_ms=2
        ) as producer:
            await runner.start()
            writer = OpenLoopWriter(producer, recorder, KEYS, rate=200.0, pad=16)
            writer.start()
            await _wait(lambda: recorder.acked >= 400, 60, "warm-up")
            await _move(stack, recorder, 0, "load-move-active")
            moved = recorder.acked
            await _wait(lambda: recorder.acked >= moved + 400, 60, "writes after the move")
            assert producer.moves >= 1, "the producer followed the moved close frame"

            await stack.request(LOAD_TOPIC, {"id": "load-split", "op": "split", "segments": [1]})
            split = await stack.wait_request(LOAD_TOPIC, "load-split", within=90)
            assert split["status"]["lastRequest"]["result"] == "Succeeded", split["status"]
            assert "successors of #1 named to 1 producer(s) ahead of the seal" in operator.log()
            assert producer.early_connects >= 2
            await _move(stack, recorder, 1, "load-move-sealed")
            sealed = (await stack.segments(LOAD_TOPIC))[1]
            assert sealed["status"]["state"] == "Sealed"
            moved = recorder.acked
            await _wait(lambda: recorder.acked >= moved + 400, 60, "writes after both moves")
            assert await writer.stop(30.0) == 0
        await _wait(lambda: recorder.unread(LOAD_SUB) == 0, 90, "the consumer caught up")
        assert runner.error is None, runner.error
    finally:
        await runner.stop()
        await stack.stop_operators()
    report = check(recorder.history())
    print(f"\nmoves under load: {report.summary()}")
    assert report.valid, report.summary()
    assert report.sends["ok"] > 1200, report.summary()
    assert report.lost == report.reordered == report.skips == report.unexpected == 0
    assert report.duplicates_unexplained == 0, report.summary()
    assert report.inconsistent_positions == 0, report.summary()


async def stopic(stack: Stack, *args: str, within: float = 180) -> tuple[int, str]:
    """The ``stopic`` CLI (``kubectl stopic``) as a user with the admin kubeconfig."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scalable_topics.cli.main",
        *args,
        "--kubeconfig",
        str(stack.cluster.kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), within)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_drain_moves_every_segment_off_the_pod_and_uncordon_lets_it_back(
    stack: Stack,
) -> None:
    """``kubectl stopic drain POD``: every segment of every topic on the pod moves away (the
    other tests' topics, an active and a sealed segment among them), the command returns once no
    Segment is on the pod or moving from it (no transfer record left), the pod gets a
    ``Drained`` event, a new topic is placed elsewhere; ``uncordon`` removes the annotation."""
    operator = await start(stack, "drainer")
    try:
        hosted = await stack.broker_segments(LOAD_TOPIC)
        urls = await stack.broker_urls()
        by_url = {url: pod for pod, url in urls.items()}
        pod = by_url[hosted[1]]  # the sealed segment moved by the load test
        code, out = await stopic(stack, "drain", pod, "--broker-namespace", "scalable-topics")
        assert code == 0, out
        assert f"{pod} is drained" in out
        for topic in (TOPIC, LOAD_TOPIC):
            segments = await stack.segments(topic)
            assert all(s["status"]["broker"]["pod"] != pod for s in segments.values())
            assert all(not s["status"].get("transfer") for s in segments.values())
            assert pod not in {by_url[u] for u in (await stack.broker_segments(topic)).values()}

        async def drained_event() -> bool:
            return any(e["reason"] == "Drained" for e in await stack.events(pod, "scalable-topics"))

        await eventually(drained_event, 30, "a Drained event on the pod")
        await stack.apply_topic(topic_body("after-drain", segments=3))
        await stack.wait_ready("after-drain")
        placed = {
            s["status"]["broker"]["pod"] for s in (await stack.segments("after-drain")).values()
        }
        assert pod not in placed, placed

        code, out = await stopic(stack, "uncordon", pod, "--broker-namespace", "scalable-topics")
        assert code == 0, out
        pods = {
            p["metadata"]["name"]: p
            for p in await stack.pods("app.kubernetes.io/name=segment-broker")
        }
        assert DRAIN_ANNOTATION not in (pods[pod]["metadata"].get("annotations") or {})
    finally:
        await stack.stop_operators()
    assert operator.proc.returncode == 0, operator.log()[-3000:]


ROLL_TOPIC = "rolling"


async def rolled_out(stack: Stack) -> bool:
    """The broker StatefulSet runs its current template on every pod, all Ready."""
    sts = await stack.api.get(STATEFULSETS, "scalable-topics", "segment-broker")
    status = sts.get("status") or {}
    return bool(
        status.get("observedGeneration") == sts["metadata"]["generation"]
        and status.get("updateRevision") == status.get("currentRevision")
        and status.get("updatedReplicas") == status.get("readyReplicas") == 3
    )


async def test_rolling_restart_of_the_brokers_under_load_hands_segments_off(stack: Stack) -> None:
    """Brokers with ``--handoff-wait-s`` (and a grace period above it): a rolling restart of
    the three brokers under keyed load. Each terminating pod is drained by the leader before it
    exits (its segments move, clients follow the close frame): the application sees no error,
    the checker finds nothing lost or reordered."""
    await stack.api.patch(
        STATEFULSETS,
        "scalable-topics",
        "segment-broker",
        [
            {
                "op": "replace",
                "path": "/spec/template/spec/terminationGracePeriodSeconds",
                "value": 40,
            },
            {
                "op": "add",
                "path": "/spec/template/spec/containers/0/env/-",
                "value": {"name": "SEGMENT_BROKER_HANDOFF_WAIT_S", "value": "30"},
            },
        ],
        patch_type="json",
    )
    await eventually(lambda: rolled_out(stack), 180, "brokers with the hand-off")
    operator = await start(stack, "roller")
    await stack.apply_topic(topic_body(ROLL_TOPIC, segments=3))
    await stack.wait_ready(ROLL_TOPIC)
    recorder = Recorder({LOAD_SUB: True})

    async def open_stream() -> ReadingConsumer:
        consumer = StreamConsumer(operator.url, "default", ROLL_TOPIC, LOAD_SUB, "reader")
        await consumer.start()
        return consumer

    runner = ConsumerRunner("reader", LOAD_SUB, recorder, open_stream)
    try:
        async with ScalableTopicProducer(
            operator.url, "default", ROLL_TOPIC, linger_ms=2
        ) as producer:
            await runner.start()
            writer = OpenLoopWriter(producer, recorder, KEYS, rate=200.0, pad=16)
            writer.start()
            await _wait(lambda: recorder.acked >= 400, 60, "warm-up")
            handle = recorder.restart(RestartKind.BROKER, "segment-broker")
            rolled_at = recorder.clock()
            await stack.api.patch(
                STATEFULSETS,
                "scalable-topics",
                "segment-broker",
                {"spec": {"template": {"metadata": {"annotations": {"test/roll": "1"}}}}},
            )
            await eventually(lambda: rolled_out(stack), 300, "the rolling restart")
            recorder.restarted(handle)
            done_at = recorder.clock()
            acked = recorder.acked
            await _wait(lambda: recorder.acked >= acked + 400, 60, "writes after the restart")
            assert await writer.stop(30.0) == 0
            moves = producer.moves
        await _wait(lambda: recorder.unread(LOAD_SUB) == 0, 90, "the consumer caught up")
        assert runner.error is None, runner.error
    finally:
        await runner.stop()
        await stack.stop_operators()
    history = recorder.history()
    report = check(history)
    waits = sorted(
        s.completed - s.invoked
        for s in history.sends
        if s.completed is not None and rolled_at <= s.invoked <= done_at
    )
    p99 = waits[int(len(waits) * 0.99) - 1] if waits else float("nan")
    events = [e for e in await stack.events(ROLL_TOPIC) if e["reason"] == "Moved"]
    print(
        f"\nrolling restart: {report.summary()}\n{len(events)} moves, producer followed "
        f"{moves} moved close frames, publish latency during the restart: p99 {p99 * 1000:.0f} "
        f"ms, max {waits[-1] * 1000 if waits else float('nan'):.0f} ms over {len(waits)} sends"
    )
    assert events, "the terminating brokers' segments were moved"
    assert report.sends["fail"] == report.sends["info"] == 0, report.summary()
    assert report.valid, report.summary()
    assert report.lost == report.reordered == report.skips == report.unexpected == 0
    assert report.duplicates_unexplained == 0, report.summary()


async def test_load_shedding_moves_a_hot_segment_off_a_hot_broker(stack: Stack) -> None:
    """Both segments of a loaded topic on one broker: the leader sees the broker's msgRateIn
    (reported by the brokers into Segment.status.load) above the mean by the margin, posts a
    LoadShed event saying why, counts it, and moves one segment to the least loaded broker
    while the producer keeps writing without an error. (The other tests' topics may still
    report load from their runs and be shed first: every shed is counted. Events of earlier
    tests' operators in this module are left out of the count.)"""
    earlier, _ = await stack.api.list(EVENTS, "default", field_selector="reason=LoadShed")
    before = {e["metadata"]["name"] for e in earlier}
    operator = await stack.start_operator(
        "shedder",
        lease_duration=2.0,
        renew_deadline=1.5,
        retry_period=0.5,
        extra=(
            "--resync-interval",
            "2",
            "--shed-margin",
            "0.5",
            "--shed-min-rate",
            "100",
            "--shed-cooldown",
            "5",
        ),
    )
    recorder = Recorder({LOAD_SUB: True})
    try:
        await stack.apply_topic(topic_body("hot", segments=2))
        await stack.wait_ready("hot")
        segments = await stack.segments("hot")
        hot = segments[0]["status"]["broker"]["pod"]
        if segments[1]["status"]["broker"]["pod"] != hot:
            request = {"id": "gather", "op": "move", "segments": [1], "to": hot}
            await stack.request("hot", request)
            done = await stack.wait_request("hot", "gather", within=90)
            assert done["status"]["lastRequest"]["result"] == "Succeeded", done["status"]
        async with ScalableTopicProducer(operator.url, "default", "hot", linger_ms=2) as producer:
            writer = OpenLoopWriter(producer, recorder, KEYS, rate=600.0, pad=16)
            writer.start()

            async def shed() -> list[JsonObj]:
                return [
                    e
                    for e in await stack.events("hot")
                    if e["reason"] == "LoadShed" and f"{hot} takes" in e["message"]
                ]

            await eventually(shed, 120, "a LoadShed event naming the hot broker")

            async def spread() -> bool:
                placed = await stack.segments("hot")
                return {s["status"]["broker"]["pod"] for s in placed.values()} != {hot} and not any(
                    s["status"].get("transfer") for s in placed.values()
                )

            await eventually(spread, 90, "one segment moved off the hot broker")
            assert await writer.stop(30.0) == 0
        async with stack.http.get(operator.url + "/metrics") as resp:
            text = await resp.text()
        (counted,) = (
            float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("scalable_topic_load_sheds_total ")
        )
        listed, _ = await stack.api.list(EVENTS, "default", field_selector="reason=LoadShed")
        events = [e for e in listed if e["metadata"]["name"] not in before]
        assert counted == len(events) >= 1, (counted, [e["message"] for e in events])
    finally:
        await stack.stop_operators()
    report = check(recorder.history())
    assert report.sends["fail"] == report.sends["info"] == 0, report.summary()
