"""Per-key order on a Queue subscription shared by several queue consumers (PIP-486 entry
buckets), on real broker processes and the operator's real session server (``client_harness``).

The controller hands every worker disjoint ``(segment, bucket)`` units; a broker dispatches a
bucket's entries only to the worker naming it; a bucket moves only after its previous owner's
application settled what it took. The scenario runs three workers over a keyed open-loop stream
while a worker joins, the topic splits and merges, a worker is restarted within its grace
period and another is gone beyond it, and the chaos checker (``tests/chaos/checker.py``)
judges the union of the deliveries as one ordered subscription: nothing acknowledged lost, no
key seen out of order, every duplicate explained by a worker restart. Each key's processing
intervals are also checked: never two workers on one key at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest

from scalable_topics.client import ConsumerClosedError, QueueConsumer, ScalableTopicProducer
from scalable_topics.core.assignment import QueueCoordinator
from scalable_topics.core.buckets import bucket_of
from scalable_topics.core.hashing import bucket_hash
from segment_broker.testing import BrokerProcess
from tests.chaos.checker import RestartKind, check
from tests.chaos.workload import OpenLoopWriter, Recorder, decode_value

from .client_harness import OperatorReplica, TopicEnv
from .conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NS = "queues"
SUB = "work"
GRACE = 2.0
KEYS = [f"order-{i}" for i in range(16)]


@dataclass
class Interval:
    worker: str
    session: int
    value: int
    start: float
    end: float | None = None


@dataclass
class Worker:
    """One named queue consumer of ``SUB``, reading in a loop: record, process a moment,
    acknowledge. :meth:`kill` makes it die holding a message, :meth:`stop` close mid-way."""

    name: str
    service_url: str
    namespace: str
    topic: str
    recorder: Recorder
    intervals: dict[str, list[Interval]]
    session: int = 0
    consumer: QueueConsumer | None = None
    task: asyncio.Task[None] | None = None
    releases: int = 0
    error: BaseException | None = None
    reads: int = 0
    segments: set[int] = field(default_factory=set)
    dying: bool = False

    async def start(self) -> None:
        self.session += 1
        self.consumer = QueueConsumer(
            self.service_url, self.namespace, self.topic, SUB, self.name, permits=64
        )
        await self.consumer.start()
        self.task = asyncio.create_task(self._run(self.consumer, self.session))

    async def _run(self, consumer: QueueConsumer, session: int) -> None:
        clock = self.recorder.clock
        try:
            while True:
                message = await consumer.receive()
                key = message.key or ""
                interval = Interval(self.name, session, decode_value(message.value), clock())
                self.intervals[key].append(interval)
                self.recorder.delivered(SUB, self.name, session, message)
                self.reads += 1
                self.segments.add(message.segment_id)
                try:
                    if self.dying:
                        return  # dies holding this message: it is never acknowledged
                    await asyncio.sleep(0.001)  # the work: entries of a key stay in flight
                    consumer.ack_nowait(message)
                finally:
                    interval.end = clock()
        except ConsumerClosedError:
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.error = exc

    async def kill(self) -> None:
        """Die in the middle of a message (taken, never acknowledged)."""
        self.dying = True
        task = self.task
        await eventually(lambda: task is None or task.done(), within=10)
        self.dying = False
        await self.stop()

    async def stop(self) -> None:
        """Stop at once, mid-message if need be (no unregister: the grace period runs)."""
        consumer, task = self.consumer, self.task
        self.consumer = self.task = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if consumer is not None:
            self.releases += consumer.releases
            await consumer.close(unregister=False)


def _coordinator(env: TopicEnv) -> QueueCoordinator:
    coordinator = env.operator.hub.coordinator(NS, env.topic, SUB)
    assert isinstance(coordinator, QueueCoordinator)
    return coordinator


async def progressed(
    workers: Mapping[str, Worker], reads: int, *names: str, within: float = 30.0
) -> None:
    """Until each named worker (default: all) read ``reads`` more messages; none failed."""
    targets = {n: workers[n].reads + reads for n in names or workers}
    await eventually(lambda: all(workers[n].reads >= t for n, t in targets.items()), within=within)
    for worker in workers.values():
        assert worker.error is None, f"{worker.name} failed: {worker.error!r}"


def check_exclusive(intervals: dict[str, list[Interval]]) -> None:
    """Per key, no message started on one worker while another worker was still on the key."""
    for key, items in intervals.items():
        busy: dict[str, float] = {}
        for item in sorted(items, key=lambda i: i.start):
            end = item.end if item.end is not None else float("inf")
            for worker, until in busy.items():
                assert worker == item.worker or item.start >= until, (
                    f"key {key}: {item.worker} began {item.value} at {item.start:.4f} while "
                    f"{worker} was busy with it until {until:.4f}"
                )
            busy[item.worker] = max(busy.get(item.worker, 0.0), end)


async def test_three_workers_keep_every_key_in_order_across_splits_merges_and_restarts(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = TopicEnv(operator, [b.url for b in brokers], NS, "keyed", subscriptions={SUB: "Queue"})
    await env.create(2)  # two segments of two entry buckets each
    operator.hub.restore(
        NS, env.topic, env.layout, [], grace_period=GRACE, strategies={}, queues=[SUB]
    )
    recorder = Recorder({SUB: True})
    intervals: dict[str, list[Interval]] = defaultdict(list)
    workers = {
        n: Worker(n, env.service_url, NS, env.topic, recorder, intervals)
        for n in ("w0", "w1", "w2")
    }
    writer: OpenLoopWriter | None = None

    async def owned(predicate: Callable[[QueueCoordinator], bool]) -> None:
        await eventually(lambda: predicate(_coordinator(env)), within=15)

    try:
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer:
            writer = OpenLoopWriter(producer, recorder, KEYS, rate=500.0, pad=16)
            writer.start()
            # A backlog first: many entries of every key are in flight at once.
            await eventually(lambda: recorder.acked >= 800, within=20)
            for name in ("w0", "w1"):
                await workers[name].start()
            await progressed(workers, 300, "w0", "w1")

            # A third worker joins: a bucket is handed over while the others are busy.
            await workers["w2"].start()
            await owned(lambda c: all(c.owned(n) for n in workers))
            await progressed(workers, 100)

            split_children = await env.split(0)
            await eventually(lambda: any(d.segment in split_children for d in recorder.deliveries))
            await progressed(workers, 100)

            # Restart within the grace period: w1 gets its buckets back.
            before = _coordinator(env).owned("w1")
            handle = recorder.restart(RestartKind.CONSUMER, "w1", SUB)
            await workers["w1"].kill()
            await workers["w1"].start()
            recorder.restarted(handle)
            assert _coordinator(env).owned("w1") == before
            await progressed(workers, 100)

            active = [s.segment_id for s in env.layout.active()]
            merged = await env.merge(*active[-2:])
            await eventually(lambda: any(d.segment in merged for d in recorder.deliveries))
            await progressed(workers, 100)

            # w2 goes away for longer than its grace period: the others take its buckets over;
            # then it comes back as a newcomer and gets a share again.
            handle = recorder.restart(RestartKind.CONSUMER, "w2", SUB)
            await workers["w2"].kill()
            await owned(lambda c: "w2" not in c.sessions())
            await progressed(workers, 100, "w0", "w1")
            await workers["w2"].start()
            recorder.restarted(handle)
            await owned(lambda c: all(c.owned(n) for n in workers))
            await progressed(workers, 100)

            unanswered = await writer.stop(30.0)
            assert unanswered == 0
        await eventually(lambda: recorder.unread(SUB) == 0, within=30)
        coordinator = _coordinator(env)
        units = [u for n in workers for u in coordinator.owned(n)]
        assert len(units) == len(set(units)), "a bucket has two owners"
        assert set(units) == {
            (s, b) for s in coordinator.tracked() for b in range(coordinator.buckets[s])
        }
    finally:
        for worker in workers.values():
            await worker.stop()
        await env.close()

    report = check(recorder.history())
    print(
        f"\n{report.summary()}\nreads { ({n: w.reads for n, w in workers.items()}) }, "
        f"segments { ({n: sorted(w.segments) for n, w in workers.items()}) }, "
        f"hand-overs {sum(w.releases for w in workers.values())}"
    )
    assert report.valid, report.summary()
    assert report.lost == report.reordered == report.skips == 0, report.summary()
    assert report.sends["ok"] > 3000, report.summary()
    assert report.duplicates_after_restart >= 2, "each killed worker's message came again"
    check_exclusive(intervals)
    assert sum(w.releases for w in workers.values()) > 0, "no bucket was ever handed over"
    assert all(len(w.segments) >= 2 for w in workers.values()), {
        n: w.segments for n, w in workers.items()
    }
    assert {0, 1} <= coordinator.drained_segments


async def test_a_bucket_moves_only_after_its_owner_acknowledged_what_it_took(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """w0 owns both buckets of a one-segment topic and holds a message of key ``k`` unacked;
    w1 joins and is assigned ``k``'s bucket, but gets none of ``k`` until w0 acknowledges;
    then the next message of ``k`` goes to w1 (and the held one is never redelivered)."""
    env = TopicEnv(
        operator,
        [b.url for b in brokers],
        NS,
        "handoff",
        subscriptions={SUB: "Queue"},
        bucket_budget=2,
    )
    await env.create(1)
    operator.hub.restore(
        NS, env.topic, env.layout, [], grace_period=GRACE, strategies={}, queues=[SUB]
    )
    key = next(k for k in (f"k{i}" for i in range(100)) if bucket_of(bucket_hash(k), 2) == 1)
    w0 = QueueConsumer(env.service_url, NS, env.topic, SUB, "w0")
    w1 = QueueConsumer(env.service_url, NS, env.topic, SUB, "w1")
    try:
        await w0.start()
        assert w0.buckets == {0: (0, 1)}
        async with ScalableTopicProducer(env.service_url, NS, env.topic) as producer:
            await producer.send(b"first", key=key)
            async with asyncio.timeout(10):
                held = await w0.receive()
            assert held.value == b"first"
            await w1.start()
            assert w1.buckets == {0: (1,)}
            await w0.wait_assignment(lambda _: w0.buckets == {0: (0,)}, within=5)
            await producer.send(b"second", key=key)

            async def attached() -> dict[str, list[int]]:
                stats = await env.stats(0)
                consumers = stats["subscriptions"][SUB]["consumers"]
                return {c["name"]: c.get("buckets", []) for c in consumers}

            # w0 still holds bucket 1 (its application has not acknowledged); w1 waits.
            for _ in range(5):
                owners = await attached()
                assert 1 in owners.get("w0", []) and "w1" not in owners, owners
            acked_at = time.monotonic()
            await w0.ack(held)
            async with asyncio.timeout(10):
                second = await w1.receive()
            assert second.value == b"second" and second.redelivery_count <= 1
            assert time.monotonic() > acked_at
            await w1.ack(second)

            async def handed_over() -> bool:
                owners = await attached()
                return owners.get("w0") == [0] and owners.get("w1") == [1]

            await eventually(handed_over, within=10)
            assert w0.releases == 1
            stats = await env.stats(0)
            assert stats["subscriptions"][SUB]["backlog"] == 0
    finally:
        await w1.close()
        await w0.close()
        await env.close()


async def test_unordered_workers_share_entries_round_robin(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """``ordered=False``: no controller session, the broker round-robins entries (of any
    bucket) over the workers; every message is delivered once."""
    env = TopicEnv(
        operator, [b.url for b in brokers], NS, "unordered", subscriptions={SUB: "Queue"}
    )
    await env.create(1)
    workers = [
        QueueConsumer(env.service_url, NS, env.topic, SUB, f"u{i}", ordered=False) for i in range(2)
    ]
    got: dict[str, list[bytes]] = defaultdict(list)

    async def drain(consumer: QueueConsumer) -> None:
        async for message in consumer:
            got[consumer.name].append(message.value)
            await consumer.ack(message)

    try:
        for worker in workers:
            await worker.start()
        tasks = [asyncio.create_task(drain(w)) for w in workers]
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=0) as producer:
            for i in range(200):
                await producer.send(b"%d" % i, key="one-key")
        await eventually(lambda: sum(len(v) for v in got.values()) >= 200, within=15)
        assert sorted(int(v) for vs in got.values() for v in vs) == list(range(200))
        assert all(got[w.name] for w in workers), "both workers got entries of the one key"
        coordinator = operator.hub.coordinator(NS, env.topic, SUB)
        assert coordinator is None or not coordinator.sessions(), "no controller session"
        for task in tasks:
            task.cancel()
    finally:
        for worker in workers:
            await worker.close()
        await env.close()


async def test_a_worker_leaving_in_the_middle_of_an_entry_hands_on_only_what_it_did_not_ack(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """Queue acknowledgements are per message, an entry's on the broker once all are: a worker
    that acknowledged the first and third messages of a four-message entry and closes
    acknowledges those by batch index (protocol v4); the other worker (round-robin, both
    attached) gets the second and fourth only."""
    env = TopicEnv(
        operator, [b.url for b in brokers], NS, "mid-entry", subscriptions={SUB: "Queue"}
    )
    await env.create(1)
    first = QueueConsumer(env.service_url, NS, env.topic, SUB, "first", ordered=False, permits=1)
    second = QueueConsumer(env.service_url, NS, env.topic, SUB, "second", ordered=False, permits=1)
    try:
        await first.start()
        await eventually(lambda: first.reading == [0])
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=50) as producer:
            await (await producer.send_many([b"a0", b"a1", b"a2", b"a3"], ["k"] * 4))
        taken = [await asyncio.wait_for(first.receive(), 20) for _ in range(3)]
        assert [(m.value, m.batch_size) for m in taken] == [(b"a0", 4), (b"a1", 4), (b"a2", 4)]
        await first.ack(taken[0])
        await first.ack(taken[2])
        await second.start()
        await eventually(lambda: second.reading == [0])
        await first.close()
        rest = [await asyncio.wait_for(second.receive(), 20) for _ in range(2)]
        assert [(m.value, m.batch_index, m.redelivery_count) for m in rest] == [
            (b"a1", 1, 1),
            (b"a3", 3, 1),
        ]
        for message in rest:
            await second.ack(message)
        await eventually(lambda: env.all_acknowledged(0, SUB))
    finally:
        await first.close()
        await second.close()
        await env.close()
