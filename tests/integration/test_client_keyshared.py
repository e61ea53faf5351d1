"""Key-shared ordered consumption for stream consumers (PIP-486, issue 14), on real broker
processes and the operator's real session server (``client_harness``).

A 2-segment topic (2 entry buckets each) under keyed open-loop load; stream consumers scale
1 -> 6 -> 2 through a split, one of them dying mid-message and closing without unregistering
(its buckets held for the grace period, then handed on). With more consumers than segments the
controller spreads the segments' buckets so that every consumer up to ``sum(N)`` reads; a
moving bucket is withheld until its previous owner released it. The chaos checker
(``tests/chaos/checker.py``) judges the union of the deliveries as one ordered subscription:
nothing acknowledged lost, no key seen out of order, duplicates only where a consumer died.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path

import pytest

from scalable_topics.client import CheckpointConsumer, ScalableTopicProducer, StreamConsumer
from scalable_topics.client.model import Message
from scalable_topics.core.assignment import SubscriptionCoordinator
from scalable_topics.core.buckets import bucket_of
from scalable_topics.core.hashing import bucket_hash
from segment_broker.testing import BrokerProcess
from tests.chaos.checker import RestartKind, check
from tests.chaos.workload import OpenLoopWriter, Recorder

from .client_harness import KeyedLoad, OperatorReplica, TopicEnv, check_order, start_operator
from .conftest import eventually
from .test_client_queue_order import Interval, Worker, check_exclusive, progressed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NS = "keyshared"
SUB = "work"  # the name the queue test's Worker records under
GRACE = 2.0
REPO = str(Path(__file__).resolve().parents[2])
KEYS = [f"order-{i}" for i in range(16)]


class StreamWorker(Worker):
    """The queue test's worker (record, work a moment, acknowledge), as a stream consumer."""

    async def start(self) -> None:
        self.session += 1
        consumer = StreamConsumer(
            self.service_url, self.namespace, self.topic, SUB, self.name, permits=64
        )
        self.consumer = consumer  # type: ignore[assignment]
        await consumer.start()
        self.task = asyncio.create_task(self._run(consumer, self.session))  # type: ignore[arg-type]


def idle(worker: Worker) -> bool:
    """Not in the middle of a message (every one it took is acknowledged)."""
    return not any(
        i.end is None
        for items in worker.intervals.values()
        for i in items
        if i.worker == worker.name and i.session == worker.session
    )


def _coordinator(env: TopicEnv) -> SubscriptionCoordinator:
    coordinator = env.operator.hub.coordinator(NS, env.topic, SUB)
    assert isinstance(coordinator, SubscriptionCoordinator)
    return coordinator


def _readers(coordinator: SubscriptionCoordinator) -> set[str]:
    return {n for n in coordinator.unit_owners().values()} - set(coordinator.withheld().values())


async def test_stream_consumers_share_buckets_beyond_the_segment_count_in_order(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = TopicEnv(operator, [b.url for b in brokers], NS, "scaling", subscriptions={SUB: "Stream"})
    env.grace_period = GRACE
    await env.create(2)  # two segments of two entry buckets each: sum(N) = 4
    recorder = Recorder({SUB: True})
    intervals: dict[str, list[Interval]] = defaultdict(list)
    names = [f"s{i}" for i in range(6)]
    workers = {
        n: StreamWorker(n, env.service_url, NS, env.topic, recorder, intervals) for n in names
    }
    releases = 0
    max_readers = 0

    def readers() -> set[str]:
        nonlocal max_readers
        found = _readers(_coordinator(env))
        max_readers = max(max_readers, len(found))
        return found

    try:
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer:
            writer = OpenLoopWriter(producer, recorder, KEYS, rate=400.0, pad=16)
            writer.start()
            await eventually(lambda: recorder.acked >= 400, within=20)
            # 1 consumer: both segments, whole.
            await workers["s0"].start()
            await progressed(workers, 200, "s0")
            coordinator = _coordinator(env)
            assert all(s.buckets is None for s in coordinator.assignment("s0").segments), (
                "one consumer reads whole segments"
            )

            # 1 -> 6: every consumer up to sum(N) = 4 gets buckets; 2 wait.
            for name in names[1:]:
                await workers[name].start()
            await eventually(lambda: len(readers()) == 4, within=20)
            busy = sorted(readers())
            await progressed(workers, 50, *busy)
            shared = [s for s in (0, 1) if len(_coordinator(env).sharers(s)) == 2]
            assert shared == [0, 1], "both segments' buckets are spread"

            # A split while six are registered: the sealed parent drains (wide), children go on.
            children = await env.split(0)
            await eventually(lambda: any(d.segment in children for d in recorder.deliveries))
            await eventually(lambda: 0 in _coordinator(env).drained_segments, within=30)

            # One dies mid-message without unregistering: held for the grace period, then its
            # buckets go to a waiting consumer.
            victim = next(n for n in sorted(readers()) if n != "s0")
            handle = recorder.restart(RestartKind.CONSUMER, victim, SUB)
            await workers[victim].kill()
            recorder.restarted(handle)
            await eventually(lambda: victim not in _coordinator(env).sessions(), within=20)
            await eventually(lambda: len(readers()) == 4, within=20)

            # 6 -> 2: the others leave cleanly (unregister); two keep everything.
            keep = ["s0", next(n for n in names if n not in ("s0", victim))]
            for name in names:
                if name not in keep and workers[name].consumer is not None:
                    worker = workers[name]
                    # an application leaving cleanly finishes (acknowledges) its message first
                    await eventually(partial(idle, worker), within=10)
                    consumer, task = worker.consumer, worker.task
                    worker.consumer = worker.task = None
                    assert consumer is not None and task is not None
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    releases += consumer.releases
                    await consumer.close()
            await eventually(lambda: readers() == set(keep), within=20)
            await progressed(workers, 100, *keep)

            unanswered = await writer.stop(30.0)
            assert unanswered == 0
        await eventually(lambda: recorder.unread(SUB) == 0, within=40)
        coordinator = _coordinator(env)
        owners = coordinator.unit_owners()
        assert set(owners.values()) == set(keep) and coordinator.withheld() == {}
    finally:
        for worker in workers.values():
            if worker.consumer is not None:
                releases += worker.consumer.releases
            await worker.stop()
        await env.close()

    report = check(recorder.history())
    print(
        f"\n{report.summary()}\nreads { ({n: w.reads for n, w in workers.items()}) }, "
        f"segments { ({n: sorted(w.segments) for n, w in workers.items()}) }, "
        f"most readers at once {max_readers}, hand-overs {releases}, "
        f"reassignments {coordinator.reassignments}"
    )
    assert report.valid, report.summary()
    assert report.lost == report.reordered == report.skips == 0, report.summary()
    # Enough traffic for the order check to mean something; how much flows depends on how
    # long the scenario's steps take (2,893 in a loaded CI run), so not a throughput bound.
    assert report.sends["ok"] > 1000, report.summary()
    check_exclusive(intervals)
    assert max_readers == 4
    assert sum(1 for w in workers.values() if w.reads) >= 4, "4 consumers read at once"
    assert releases > 0, "no bucket was ever handed over"
    assert {0} <= coordinator.drained_segments


async def test_checkpoint_consumers_share_a_segment_by_bucket_and_drain_it_together(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """Two checkpoint consumers on a one-segment topic of two buckets read one bucket each
    (per-(segment, bucket) checkpoints); after a split each learns from the broker that its
    bucket is done (``END_OF_BUCKETS``), reports it, and the children open once both did."""
    env = TopicEnv(
        operator,
        [b.url for b in brokers],
        NS,
        "checkpoints",
        subscriptions={SUB: "Stream"},
        bucket_budget=2,
    )
    await env.create(1)
    keys = [f"k{i}" for i in range(12)]
    consumers = [CheckpointConsumer(env.service_url, NS, env.topic, SUB, f"c{i}") for i in (0, 1)]
    got: dict[str, list[tuple[str, int, int]]] = defaultdict(list)

    async def drain(consumer: CheckpointConsumer, until: int) -> None:
        while len(got[consumer.name]) < until:
            message = await consumer.receive()
            assert message.key is not None
            got[consumer.name].append((message.key, int(message.value), message.segment_id))

    try:
        for consumer in consumers:
            await consumer.start()
        await eventually(
            lambda: all(
                [s.buckets for s in _coordinator(env).assignment(c.name).segments]
                in ([(0,)], [(1,)])
                for c in consumers
            ),
            within=10,
        )
        async with ScalableTopicProducer(env.service_url, NS, env.topic) as producer:
            for n in range(10):
                for key in keys:
                    await producer.send(b"%d" % n, key=key)
            await producer.flush()
            bucket_of_key = {k: bucket_of(bucket_hash(k), 2) for k in keys}
            expected = {b: sum(10 for k in keys if bucket_of_key[k] == b) for b in (0, 1)}
            owner = {
                b: next(c for c in consumers if _coordinator(env).unit_owners()[(0, b)] == c.name)
                for b in (0, 1)
            }
            async with asyncio.timeout(20):
                await asyncio.gather(*(drain(owner[b], expected[b]) for b in (0, 1)))
            for b in (0, 1):
                name = owner[b].name
                assert {bucket_of_key[k] for k, _, _ in got[name]} == {b}
                for key in {k for k, _, _ in got[name]}:
                    values = [v for k, v, _ in got[name] if k == key]
                    assert values == list(range(10)), f"{key}: {values}"
                checkpoint = owner[b].checkpoint()
                assert set(checkpoint.bucket_positions) == {(0, b)}
            # one message per entry (each send awaited its ack), every entry within a bucket
            batches = producer.bucket_batches()
            assert batches == {(0, b): (expected[b], expected[b]) for b in (0, 1)}
            children = await env.split(0)
            await eventually(lambda: 0 in _coordinator(env).drained_segments, within=20)
            for n in range(10, 12):
                for key in keys:
                    await producer.send(b"%d" % n, key=key)
            await producer.flush()
            total = sum(len(v) for v in got.values())
            async with asyncio.timeout(20):
                while total < 12 * len(keys):
                    done, _ = await asyncio.wait(
                        [asyncio.ensure_future(c.receive()) for c in consumers],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    for task in done:
                        message = task.result()
                        assert message.key is not None and message.segment_id in children
                        total += 1
    finally:
        for consumer in consumers:
            await consumer.close()
        await env.close()


async def test_a_sigkilled_stream_consumer_loses_its_buckets_after_the_grace_period(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """Four stream consumers share a 2-segment topic's four buckets, one of them a separate
    process that is SIGKILLed mid-stream: its buckets are held for the grace period, then go to
    the waiting fifth consumer; nothing acknowledged is lost, no key is reordered, duplicates
    only from the killed process's unacknowledged messages."""
    env = TopicEnv(operator, [b.url for b in brokers], NS, "killed", subscriptions={SUB: "Stream"})
    env.grace_period = GRACE
    await env.create(2)
    recorder = Recorder({SUB: True})
    intervals: dict[str, list[Interval]] = defaultdict(list)
    names = ["s0", "s1", "s2", "s4"]
    workers = {
        n: StreamWorker(n, env.service_url, NS, env.topic, recorder, intervals) for n in names
    }
    proc: asyncio.subprocess.Process | None = None
    reads = 0

    async def follow(process: asyncio.subprocess.Process) -> None:
        nonlocal reads
        assert process.stdout is not None
        async for raw in process.stdout:
            line = json.loads(raw)
            if "started" in line:
                continue
            message = Message(
                key=line["key"],
                value=line["value"].encode("latin-1"),
                segment_id=line["segment"],
                position=line["position"],
                batch_index=line["batchIndex"],
                batch_size=line["batchSize"],
            )
            recorder.delivered(SUB, "proc", 1, message)
            reads += 1

    try:
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer:
            writer = OpenLoopWriter(producer, recorder, KEYS, rate=400.0, pad=16)
            writer.start()
            for name in names[:3]:
                await workers[name].start()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.integration.keyshared_consumer_proc",
                env.service_url,
                NS,
                env.topic,
                SUB,
                "proc",
                stdout=asyncio.subprocess.PIPE,
                cwd=REPO,
            )
            following = asyncio.create_task(follow(proc))
            await eventually(lambda: "proc" in _readers(_coordinator(env)), within=20)
            await eventually(lambda: reads >= 100, within=20)
            await progressed(workers, 50, *names[:3])

            handle = recorder.restart(RestartKind.CONSUMER, "proc", SUB)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            await following  # every line it printed is recorded
            recorder.restarted(handle)
            held = [u for u, n in _coordinator(env).unit_owners().items() if n == "proc"]
            assert held, "its buckets are held for the grace period"
            await workers["s4"].start()
            await eventually(lambda: "proc" not in _coordinator(env).sessions(), within=20)
            await eventually(lambda: _readers(_coordinator(env)) == set(names), within=20)
            await progressed(workers, 50)
            unanswered = await writer.stop(30.0)
            assert unanswered == 0
        await eventually(lambda: recorder.unread(SUB) == 0, within=40)
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        for worker in workers.values():
            await worker.stop()
        await env.close()

    report = check(recorder.history())
    print(f"\n{report.summary()}\nproc read {reads}")
    assert report.valid, report.summary()
    assert report.lost == report.reordered == report.skips == 0, report.summary()
    check_exclusive(intervals)


async def test_a_child_bucket_starts_while_another_parent_bucket_still_has_backlog(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """Per-bucket ordering across a split (protocol v3 ``BUCKETS_DONE``): a one-segment topic
    of 4 buckets shared by two stream consumers (buckets 0-1 and 2-3) splits into two children
    of 2 buckets; child bucket 0 holds the keys of parent buckets 0 and 1 only. The consumer of
    parent buckets 2-3 holds its messages unacknowledged, yet once the other acknowledged
    parent buckets 0-1 the children's bucket 0 is read - while the parent still has backlog -
    and every key still comes in order."""
    env = TopicEnv(
        operator, [b.url for b in brokers], NS, "perbucket", subscriptions={SUB: "Stream"}
    )
    await env.create(1)  # bucket budget 4: one segment of 4 buckets
    keys = [f"k{i}" for i in range(24)]
    bucket_of_key = {k: bucket_of(bucket_hash(k), 4) for k in keys}
    assert set(bucket_of_key.values()) == {0, 1, 2, 3}
    consumers = {
        n: StreamConsumer(env.service_url, NS, env.topic, SUB, n, permits=16) for n in "ab"
    }
    received: list[tuple[str, int]] = []
    by_consumer: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    held: list[Message] = []
    release = asyncio.Event()
    child_while_held: list[tuple[int, str]] = []
    slow_name: list[str] = []

    async def run(consumer: StreamConsumer) -> None:
        while True:
            message = await consumer.receive()
            assert message.key is not None
            key, n = KeyedLoad.parse(message.value)
            received.append((key, n))
            by_consumer[consumer.name].append((message.segment_id, key, n))
            if message.segment_id == 0 and consumer.name in slow_name and not release.is_set():
                held.append(message)
                continue
            if message.segment_id != 0 and held and not release.is_set():
                child_while_held.append((message.segment_id, key))
            consumer.ack_nowait(message)

    tasks: list[asyncio.Task[None]] = []
    load = KeyedLoad(keys)
    try:
        for consumer in consumers.values():
            await consumer.start()
        await eventually(
            lambda: len(_coordinator(env).sharers(0)) == 2 and not _coordinator(env).withheld(),
            within=10,
        )
        owners = _coordinator(env).unit_owners()
        fast = owners[(0, 0)]
        assert owners[(0, 1)] == fast and owners[(0, 2)] == owners[(0, 3)] != fast, owners
        slow_name.append(owners[(0, 2)])
        tasks = [asyncio.create_task(run(c)) for c in consumers.values()]
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer:
            await load.run(producer, 30)  # parent backlog: 30 per key
            children = await env.split(0)
            await load.run(producer, 10, first=30)
            assert not load.errors
            # the slow consumer holds the parent's buckets 2-3 (its permits are used up, the
            # rest is backlog); the fast one finished buckets 0-1 and the broker said so
            await eventually(lambda: bool(child_while_held), within=30)
            assert 0 not in _coordinator(env).drained_segments
            stats = await env.stats(0)
            assert stats["subscriptions"][SUB]["backlog"] > 0
            assert {bucket_of(bucket_hash(k), 2) for _, k in child_while_held} == {0}
            assert {bucket_of_key[k] for _, k in child_while_held} <= {0, 1}
            for segment_id in children:
                primary = _coordinator(env).owner_of(segment_id)
                assert primary is not None
                [entry] = [
                    s
                    for s in _coordinator(env).assignment(primary).segments
                    if s.segment_id == segment_id
                ]
                assert not entry.consumable and entry.ready_buckets == (0,)
            release.set()
            for message in held:
                consumers[slow_name[0]].ack_nowait(message)
            await eventually(lambda: set(load.acked) <= set(received), within=40)
            await eventually(lambda: 0 in _coordinator(env).drained_segments, within=20)
        check_order(received, load.acked)  # per key: the parent's 0..29, then 30..39
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for consumer in consumers.values():
            await consumer.close()
        await env.close()


async def test_a_new_leader_keeps_the_bucket_owners_of_the_old_one(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """Leader failover with key-shared helpers: three stream consumers share a one-segment
    topic's four buckets; leadership moves to a standby restoring from the persisted status
    (with the helpers' shares). The consumers follow and the standby's bucket owners are the
    old leader's: nothing moved, nothing withheld, and every key still comes in order."""
    env = TopicEnv(
        operator, [b.url for b in brokers], NS, "failover", subscriptions={SUB: "Stream"}
    )
    await env.create(1)
    standby = await start_operator(leader=operator.url)
    env.operators.append(standby)
    env.publish()  # the standby's DAG knows the segment and its bucket count
    keys = [f"k{i}" for i in range(12)]
    consumers = [StreamConsumer(env.service_url, NS, env.topic, SUB, n) for n in "abc"]
    received: list[tuple[str, int]] = []
    load = KeyedLoad(keys)

    async def run(consumer: StreamConsumer) -> None:
        while True:
            message = await consumer.receive()
            received.append(KeyedLoad.parse(message.value))
            consumer.ack_nowait(message)

    tasks: list[asyncio.Task[None]] = []
    try:
        for consumer in consumers:
            await consumer.start()
        await eventually(
            lambda: len(_readers(_coordinator(env))) == 3 and not _coordinator(env).withheld(),
            within=10,
        )
        owners = _coordinator(env).unit_owners()
        assert len(set(owners.values())) == 3
        persisted = operator.persisted[(NS, env.topic, SUB)]
        assert any(entry.get("shares") for entry in persisted["consumers"])
        tasks = [asyncio.create_task(run(c)) for c in consumers]
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer:
            await load.run(producer, 10)
            await eventually(lambda: set(load.acked) <= set(received), within=20)

            operator.routing.leader = standby.url
            standby.routing.leader = standby.url
            standby.hub.restore(
                NS,
                env.topic,
                env.layout,
                [{"name": SUB, "type": "Stream", **json.loads(json.dumps(persisted))}],
                grace_period=30.0,
                strategies={SUB: "sticky"},
            )
            operator.hub.forget_topic(NS, env.topic)

            def followed() -> bool:
                coordinator = standby.hub.coordinator(NS, env.topic, SUB)
                return coordinator is not None and coordinator.connected() == ["a", "b", "c"]

            await eventually(followed, within=15)
            new = standby.hub.coordinator(NS, env.topic, SUB)
            assert isinstance(new, SubscriptionCoordinator)
            assert new.unit_owners() == owners
            assert new.withheld() == {} and new.reassignments == 0
            await load.run(producer, 10, first=10)
            await eventually(lambda: set(load.acked) <= set(received), within=20)
        assert new.unit_owners() == owners and new.reassignments == 0
        check_order(received, load.acked)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for consumer in consumers:
            await consumer.close()
        await standby.stop()
        await env.close()


@pytest.mark.parametrize("sharers", [1, 2], ids=["whole-segment", "buckets"])
async def test_a_consumer_leaving_in_the_middle_of_an_entry_hands_on_only_the_rest(
    operator: OperatorReplica, brokers: list[BrokerProcess], sharers: int
) -> None:
    """A stream consumer that acknowledges the first message of a three-message entry and
    closes (a clean leave: scaling down) acknowledges that message by batch index (protocol
    v4); the entry's next reader gets the other two and the next entry, never the first
    again. The key-shared chaos run once caught that duplicate: the entry went back whole."""
    env = TopicEnv(
        operator,
        [b.url for b in brokers],
        NS,
        f"mid-entry-{sharers}",
        subscriptions={SUB: "Stream"},
        bucket_budget=sharers,
    )
    await env.create(1)
    leaver = StreamConsumer(env.service_url, NS, env.topic, SUB, "leaver", permits=8)
    heir = StreamConsumer(env.service_url, NS, env.topic, SUB, "heir", permits=8)
    try:
        await leaver.start()
        bucket = 0
        if sharers == 2:
            await heir.start()
            await eventually(lambda: len(set(_coordinator(env).unit_owners().values())) == 2)
            owners = _coordinator(env).unit_owners()
            bucket = next(b for (_, b), name in owners.items() if name == "leaver")
        keys = [
            k for k in (f"k{i}" for i in range(200)) if bucket_of(bucket_hash(k), sharers) == bucket
        ]
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=50) as producer:
            await (await producer.send_many([b"a0", b"a1", b"a2"], keys[:3]))
            first = await asyncio.wait_for(leaver.receive(), 20)
            assert (first.value, first.batch_index, first.batch_size) == (b"a0", 0, 3)
            await leaver.ack(first)
            await leaver.close()
            if sharers == 1:
                await heir.start()
            await (await producer.send_many([b"b0"], keys[3:4]))
            rest = [await asyncio.wait_for(heir.receive(), 20) for _ in range(3)]
        assert [(m.value, m.batch_index) for m in rest] == [(b"a1", 1), (b"a2", 2), (b"b0", 0)]
        assert rest[0].position == first.position and rest[0].redelivery_count == 1
        for message in rest:
            await heir.ack(message)
        await eventually(lambda: env.all_acknowledged(0, SUB))
    finally:
        await leaver.close()
        await heir.close()
        await env.close()
