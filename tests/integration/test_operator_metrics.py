"""Values of the operator's and brokers' metrics on real processes (docs/operations.md,
"Metrics"), for the series the dashboard and the alerts read:

* the leader gauges: ``scalable_topic_controller_leader`` and ``_failovers_total`` on the
  replica that leads and the one that does not, and after the lead moves;
* an operation that cannot finish (the brokers SIGSTOPped) has its
  ``scalable_topic_operation_started_timestamp_seconds`` series, valued at its
  ``status.operation.startedAt``, until it finishes; then ``scalable_topic_operations_total``
  counts it once with its outcome;
* the brokers' ``segment_broker_segment_sealed``, ``_log_bytes`` (the log files on disk) and
  ``_consumed_messages_total`` (what the consumer received);
* a replica that loses the shard's Lease (SIGSTOPped past the lease, then resumed) drops the
  topic's series, which the new leader has.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from scalable_topics.client import ScalableTopicProducer, StreamConsumer
from scalable_topics.core.resources import parse_time
from tests.chaos.nemesis import _pid

from .operator_harness import OperatorProcess, Stack, eventually, operator_stack, topic_body

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(300),
]

BROKERS = "app.kubernetes.io/name=segment-broker"
TOPIC = "measured"
SUB = "billing"
MESSAGES = 60
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(tmp_path_factory.mktemp("metrics"), operator_replicas=0) as s:
        yield s


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def replicas(stack: Stack) -> tuple[OperatorProcess, OperatorProcess]:
    """(leader, follower), with Lease timings long enough that the lead stays put on a busy
    machine until the last test moves it."""
    first = await stack.start_operator(
        "m-a", lease_duration=8.0, renew_deadline=6.0, retry_period=1.0
    )

    async def a_leads() -> bool:
        return await stack.leader() == "m-a"

    await eventually(a_leads, 60, "m-a leading")
    second = await stack.start_operator(
        "m-b", lease_duration=8.0, renew_deadline=6.0, retry_period=1.0
    )
    await stack.apply_topic(topic_body(TOPIC, segments=2, autoScale={"enabled": False}))
    await stack.wait_ready(TOPIC, 90)
    for op in (first, second):

        async def serving(op: OperatorProcess = op) -> bool:
            async with stack.http.get(op.url + "/readyz") as response:
                return response.status == 200

        await eventually(serving, 60, f"{op.identity} ready")
    return (first, second) if await stack.leader() == "m-a" else (second, first)


async def samples(url: str) -> Samples:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as response:
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def topic_series(found: Samples, topic: str) -> dict[str, float]:
    return {
        name: v
        for (name, labels), v in found.items()
        if ("topic", topic) in labels and name.startswith("scalable_topic_")
    }


async def test_leader_gauges_on_the_leader_and_the_follower(
    stack: Stack, replicas: tuple[OperatorProcess, OperatorProcess]
) -> None:
    """1 on the leader, 0 or absent on the follower; every leadership gained is counted once:
    the replicas' failovers add up to the Lease's first acquisition plus its transitions (on a
    busy machine the lead may have moved while the fixture set up)."""
    leader, follower = replicas
    assert await stack.leader() == leader.identity
    on_leader = await samples(leader.url)
    on_follower = await samples(follower.url)
    lease = await stack.lease()
    assert await stack.leader() == leader.identity, "the lead moved while reading"
    assert value(on_leader, "scalable_topic_controller_leader", shard="0") == 1.0
    assert value(on_follower, "scalable_topic_controller_leader", shard="0") in (None, 0.0)
    gained = [
        value(found, "scalable_topic_controller_failovers_total", shard="0") or 0.0
        for found in (on_leader, on_follower)
    ]
    assert gained[0] >= 1.0
    assert sum(gained) == 1 + int((lease or {})["spec"].get("leaseTransitions") or 0), (
        gained,
        lease,
    )
    assert topic_series(on_follower, TOPIC) == {}


async def test_a_stuck_operation_then_counted_and_the_brokers_segment_metrics(
    stack: Stack, replicas: tuple[OperatorProcess, OperatorProcess]
) -> None:
    leader, follower = replicas
    url = follower.url  # any replica serves the clients' DAG watch, as a Service would route
    async with ScalableTopicProducer(url, "default", TOPIC) as producer:
        for i in range(MESSAGES):
            await producer.send(b"m%d" % i, key=f"k{i % 8}")

    pids = [_pid(pod) for pod in await stack.pods(BROKERS)]
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        await stack.request(TOPIC, {"id": "stuck", "op": "split", "segments": [0]})

        async def in_progress() -> tuple[float, dict[str, str]] | None:
            topic = await stack.topic(TOPIC)
            op = ((topic or {}).get("status") or {}).get("operation")
            if not op:
                return None
            labels = {
                "namespace": "default",
                "topic": TOPIC,
                "kind": "split",
                "phase": str(op["phase"]),
            }
            found = value(
                await samples(leader.url),
                "scalable_topic_operation_started_timestamp_seconds",
                **labels,
            )
            if found is None:
                return None
            assert found == parse_time(op["startedAt"]), (found, op)
            return found, labels

        await eventually(in_progress, 60, "the split's in-progress series on the leader")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    topic = await stack.wait_request(TOPIC, "stuck", 120)
    result = topic["status"]["lastRequest"]["result"]
    outcome = {"Succeeded": "committed", "Failed": "rolled-back"}[result]
    if outcome == "rolled-back":  # the brokers' calls timed out: the split runs once more
        await stack.request(TOPIC, {"id": "again", "op": "split", "segments": [0]})
        topic = await stack.wait_request(TOPIC, "again", 120)
        assert topic["status"]["lastRequest"]["result"] == "Succeeded"
    after = await samples(leader.url)
    assert not [k for k in after if k[0] == "scalable_topic_operation_started_timestamp_seconds"], (
        "a finished operation keeps its series"
    )
    ops = dict(namespace="default", topic=TOPIC, kind="split", source="manual")
    counted = value(after, "scalable_topic_operations_total", **ops, outcome=outcome)
    assert counted == 1.0, after
    assert value(after, "scalable_topic_operations_total", **ops, outcome="committed") == 1.0
    assert value(after, "scalable_topic_operation_duration_seconds_count", kind="split") == 1.0

    consumer = StreamConsumer(url, "default", TOPIC, SUB, "reader")
    await consumer.start()
    try:
        for _ in range(MESSAGES):
            msg = await asyncio.wait_for(consumer.receive(), 30)
            await consumer.ack(msg)
    finally:
        await consumer.close()

    hosted = await stack.broker_segments(TOPIC)
    assert set(hosted) == {0, 1, 2, 3}, hosted
    consumed = 0.0
    log_bytes = 0.0
    for sid, broker_url in hosted.items():
        found = await samples(broker_url)
        seg = {"namespace": "default", "topic": TOPIC, "segment": str(sid)}
        assert value(found, "segment_broker_segment_sealed", **seg) == (1.0 if sid == 0 else 0.0)
        consumed += value(found, "segment_broker_consumed_messages_total", **seg) or 0.0
        log_bytes += value(found, "segment_broker_log_bytes", **seg) or 0.0
    # every message was produced before the split, into #0 and #1, and delivered once
    assert consumed == MESSAGES
    on_disk = sum(
        f.stat().st_size
        for f in stack.data_dir.rglob("log-*.log")
        if f"/default/{TOPIC}/" in f.as_posix()
    )
    assert log_bytes == on_disk > 0


async def test_losing_the_lease_drops_the_topic_series(
    stack: Stack, replicas: tuple[OperatorProcess, OperatorProcess]
) -> None:
    old, new = replicas
    assert await stack.leader() == old.identity
    before = topic_series(await samples(old.url), TOPIC)
    assert before["scalable_topic_active_segments"] == 3.0, before
    assert before["scalable_topic_layout_epoch"] == 1.0, before
    assert "scalable_topic_auto_splits_total" in before, before

    failovers = "scalable_topic_controller_failovers_total"
    gained_before = value(await samples(new.url), failovers, shard="0") or 0.0
    os.kill(old.proc.pid, signal.SIGSTOP)
    try:

        async def moved() -> bool:
            return await stack.leader() == new.identity

        await eventually(moved, 60, "the Lease taken over by m-b")
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)

    async def dropped() -> Samples | None:
        found = await samples(old.url)
        return found if not topic_series(found, TOPIC) else None

    gone = await eventually(dropped, 60, "m-a's series of the topic removed")
    assert value(gone, "scalable_topic_controller_leader", shard="0") == 0.0

    async def taken_over() -> dict[str, float] | None:
        series = topic_series(await samples(new.url), TOPIC)
        return series if "scalable_topic_active_segments" in series else None

    now = await eventually(taken_over, 60, "m-b's series of the topic")
    assert now["scalable_topic_active_segments"] == 3.0
    assert now["scalable_topic_layout_epoch"] == 1.0
    on_new = await samples(new.url)
    assert value(on_new, "scalable_topic_controller_leader", shard="0") == 1.0
    assert value(on_new, failovers, shard="0") == gained_before + 1
