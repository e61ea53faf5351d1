"""Queue consumers on the operator's session server (controller.consumers + core.assignment's
QueueCoordinator): entry buckets per worker, bucket counts from the DAG, the kinds of
subscription and consumer checked, Queue status persisted and restored."""

from __future__ import annotations

from scalable_topics.core.assignment import QueueCoordinator, Unit
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import AssignmentMessage, CloseCode, ErrorCode
from tests.unit.test_controller_sessions import (
    NS,
    SUB,
    TOPIC,
    Replica,
    assignment_where,
    closed_with,
    replicas,
    start_replica,
    wait_for,
)

__all__ = ["replicas"]  # the fixture, shared with the stream sessions' tests

QUEUE = "jobs"


def units(message: AssignmentMessage) -> set[Unit]:
    return {(s.segment_id, b) for s in message.segments for b in s.buckets or ()}


def queue_coordinator(replica: Replica) -> QueueCoordinator:
    coordinator = replica.hub.coordinator(NS, TOPIC, QUEUE)
    assert isinstance(coordinator, QueueCoordinator)
    return coordinator


async def serving_queue(*, grace_period: float = 30.0) -> Replica:
    replica = await start_replica(segments=2, grace_period=grace_period)
    layout = SegmentLayout.initial(2)
    replica.hub.restore(
        NS,
        TOPIC,
        layout,
        [],
        grace_period=grace_period,
        strategies={SUB: "sticky"},
        queues=[QUEUE],
    )
    return replica


async def test_queue_workers_get_disjoint_buckets_of_every_segment(
    replicas: list[Replica],
) -> None:
    replica = await serving_queue()
    replicas.append(replica)
    w1 = await replica.connect("w1", subscription=QUEUE, consumer_type="queue")
    first = await assignment_where(w1)
    assert units(first) == {(0, 0), (0, 1), (1, 0), (1, 1)}  # two segments of two buckets
    assert all(s.consumable and s.broker_url for s in first.segments)
    w2 = await replica.connect("w2", subscription=QUEUE, consumer_type="queue")
    second = await assignment_where(w2)
    shrunk = await assignment_where(w1, lambda m: len(units(m)) == 2)
    assert units(second) | units(shrunk) == units(first)
    assert not units(second) & units(shrunk)
    # ordered queue workers count for the auto-scaler's consumer-count rule (issue 14)
    assert replica.hub.stream_consumer_counts(NS, TOPIC) == {SUB: 0, QUEUE: 2}
    await wait_for(lambda: any(p[2] == QUEUE and p[3]["consumers"] for p in replica.persisted))
    status = next(p[3] for p in reversed(replica.persisted) if p[2] == QUEUE)
    assert status["type"] == "Queue"
    assert [c["name"] for c in status["consumers"]] == ["w1", "w2"]
    for ws in (w1, w2):
        await ws.close()


async def test_children_get_their_bucket_counts_from_the_dag(replicas: list[Replica]) -> None:
    replica = await serving_queue()
    replicas.append(replica)
    w1 = await replica.connect("w1", subscription=QUEUE, consumer_type="queue")
    await assignment_where(w1)
    split = SegmentLayout.initial(2).split(0)
    replica.hub.layout_changed(NS, TOPIC, split)  # committed before the cache has children
    gated = await assignment_where(w1, lambda m: m.layout_epoch == 1)
    assert {s.segment_id for s in gated.segments} == {0, 1}
    assert queue_coordinator(replica).unassigned() == (2, 3)
    replica.dags.publish_layout(NS, TOPIC, split)  # the children's Segments: one bucket each
    complete = await assignment_where(w1, lambda m: {2, 3} <= {s.segment_id for s in m.segments})
    by_id = {s.segment_id: s for s in complete.segments}
    assert by_id[2].buckets == (0,) and not by_id[2].consumable and by_id[2].blocked_by == (0,)
    await w1.send_json({"v": 1, "type": "drained", "segment": 0})
    ungated = await assignment_where(w1, lambda m: 0 not in {s.segment_id for s in m.segments})
    assert all(s.consumable for s in ungated.segments)
    await w1.close()


async def test_consumer_and_subscription_kinds_must_match(replicas: list[Replica]) -> None:
    replica = await serving_queue()
    replicas.append(replica)
    for subscription, kind, text in [
        (SUB, "queue", "is a Stream subscription"),
        (QUEUE, "stream", "is a Queue subscription"),
        ("elsewhere", "queue", "not a Queue subscription"),
    ]:
        ws = await replica.connect("x", subscription=subscription, consumer_type=kind)
        last, code = await closed_with(ws)
        assert code == CloseCode.INVALID_SUBSCRIPTION, subscription
        assert last.code is ErrorCode.INVALID_SUBSCRIPTION and text in last.message


async def test_unnamed_queue_subscriptions_are_served_as_they_come_and_restored(
    replicas: list[Replica],
) -> None:
    """A caller that does not name the Queue subscriptions (``queues=None``): the first queue
    consumer of a name that is not a Stream subscription opens it; its status (type Queue)
    restores it on the next leader."""
    replica = await start_replica(segments=2)
    replicas.append(replica)
    w1 = await replica.connect("w1", subscription=QUEUE, consumer_type="queue")
    assert len(units(await assignment_where(w1))) == 4
    bad = await replica.connect("w2", subscription="not/a/name", consumer_type="queue")
    _, code = await closed_with(bad)
    assert code == CloseCode.INVALID_SUBSCRIPTION
    await wait_for(lambda: any(p[2] == QUEUE and p[3]["consumers"] for p in replica.persisted))
    status = next(p[3] for p in reversed(replica.persisted) if p[2] == QUEUE)
    await w1.close()

    successor = await start_replica(segments=2, restore=False)
    replicas.append(successor)
    entry = {"name": QUEUE, **status}
    successor.hub.restore(
        NS, TOPIC, SegmentLayout.initial(2), [entry], grace_period=30.0, strategies={SUB: "sticky"}
    )
    restored = queue_coordinator(successor)
    assert not restored.sessions()["w1"].connected
    assert len(restored.owned("w1")) == 4
    back = await successor.connect("w1", subscription=QUEUE, consumer_type="queue")
    assert len(units(await assignment_where(back))) == 4
    # naming the Queue subscriptions makes the list authoritative: others are dropped
    successor.hub.restore(
        NS,
        TOPIC,
        SegmentLayout.initial(2),
        [entry],
        grace_period=30.0,
        strategies={SUB: "sticky"},
        queues=[],
    )
    _, code = await closed_with(back)
    assert code == CloseCode.INVALID_SUBSCRIPTION
    assert successor.hub.coordinator(NS, TOPIC, QUEUE) is None
