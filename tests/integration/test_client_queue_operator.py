"""Per-key order of three queue workers against the whole stack: the real operator process
(its reconciler creating the brokers' Queue subscriptions, its topic cache giving the segments'
bucket counts, its consumer hub assigning buckets and persisting them in the topic's status)
and real broker pods, on the embedded control plane (``operator_harness``). The topic splits
and merges through the request annotation while a worker is killed and restarted; the chaos
checker judges the union of the deliveries as one ordered subscription."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from scalable_topics.client import DagWatcher, ScalableTopicProducer
from tests.chaos.checker import RestartKind, check
from tests.chaos.scenario import service_url
from tests.chaos.workload import OpenLoopWriter, Recorder

from .operator_harness import eventually, operator_stack, topic_body
from .test_client_queue_order import SUB, Interval, Worker, check_exclusive, progressed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "queued"
KEYS = [f"job-{i}" for i in range(16)]


async def test_queue_workers_keep_key_order_through_the_operator(tmp_path: Path) -> None:
    async with operator_stack(tmp_path, operator_replicas=1, brokers=2) as stack:
        body = topic_body(
            TOPIC,
            segments=1,
            entryBuckets=4,
            consumerGracePeriod="3s",
            subscriptions=[{"name": SUB, "type": "Queue"}],
            autoScale={"enabled": False},
        )
        await stack.apply_topic(body)
        await stack.wait_ready(TOPIC, 90)
        url = await service_url(stack)
        watcher = DagWatcher(url, "default", TOPIC)

        async def placed() -> bool:
            dag = watcher.dag
            return bool(dag.segments) and all(s.broker_url and s.buckets for s in dag.segments)

        await watcher.start(within=30)
        await eventually(placed, 60, "the DAG with brokers and bucket counts")
        await watcher.close()

        recorder = Recorder({SUB: True})
        intervals: dict[str, list[Interval]] = defaultdict(list)
        workers = {
            n: Worker(n, url, "default", TOPIC, recorder, intervals) for n in ("w0", "w1", "w2")
        }

        async def status_holders() -> dict[str, list[int]] | None:
            topic = await stack.topic(TOPIC)
            for entry in ((topic or {}).get("status") or {}).get("subscriptions") or []:
                if entry.get("name") == SUB and entry.get("type") == "Queue":
                    consumers = entry.get("consumers") or []
                    return {c["name"]: c.get("segments") or [] for c in consumers}
            return None

        try:
            async with ScalableTopicProducer(url, "default", TOPIC, linger_ms=2) as producer:
                writer = OpenLoopWriter(producer, recorder, KEYS, rate=300.0, pad=16)
                writer.start()
                await eventually(_at_least(recorder, 300), 30, "a backlog")
                for worker in workers.values():
                    await worker.start()
                await eventually(_shared(workers, [1, 1, 2]), 30, "four buckets over three")
                await progressed(workers, 100)

                await stack.request(TOPIC, {"id": "split-1", "op": "split", "segments": [0]})
                await stack.wait_request(TOPIC, "split-1")
                await eventually(_read_from(recorder, {1, 2}), 30, "reads of the children")
                await progressed(workers, 100)

                handle = recorder.restart(RestartKind.CONSUMER, "w1", SUB)
                await workers["w1"].kill()
                await workers["w1"].start()
                recorder.restarted(handle)
                await progressed(workers, 100)

                await stack.request(TOPIC, {"id": "merge-1", "op": "merge", "segments": [1, 2]})
                await stack.wait_request(TOPIC, "merge-1")
                await eventually(_read_from(recorder, {3}), 30, "reads of the merge child")
                await progressed(workers, 100)
                assert await writer.stop(30.0) == 0

            async def drained() -> bool:
                return recorder.unread(SUB) == 0

            await eventually(drained, 30, "every acknowledged message read")
            holders = await eventually(status_holders, 30, "the Queue status")
            assert set(holders) == set(workers)
        finally:
            for worker in workers.values():
                await worker.stop()

    report = check(recorder.history())
    print(f"\n{report.summary()}\nreads { {n: w.reads for n, w in workers.items()} }")
    assert report.valid, report.summary()
    assert report.sends["ok"] > 1000, report.summary()
    check_exclusive(intervals)
    assert all(w.reads for w in workers.values())


def _at_least(recorder: Recorder, acked: int) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return recorder.acked >= acked

    return probe


def _read_from(recorder: Recorder, segments: set[int]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return any(d.segment in segments for d in recorder.deliveries)

    return probe


def _shared(workers: dict[str, Worker], sizes: list[int]) -> Callable[[], Awaitable[bool]]:
    """The workers' bucket counts (as their last assignments say) are ``sizes``, sorted."""

    async def probe() -> bool:
        shares = [w.consumer.buckets if w.consumer else {} for w in workers.values()]
        return sorted(sum(len(b) for b in share.values()) for share in shares) == sizes

    return probe
