"""Liveness tied to progress (controller.health): the rule with an injected clock, the progress
the real elector, shard leadership and work queue report to it, and ``/healthz`` + the metric."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio.client import CoordinationV1Api
from prometheus_client import REGISTRY

from scalable_topics.controller.app import Controller, ControllerSettings
from scalable_topics.controller.consumers import ConsumerHub
from scalable_topics.controller.health import (
    QUEUE_CHECK,
    LeaseProgress,
    LivenessRule,
    QueueProgress,
    lease_check,
)
from scalable_topics.controller.leadership import ShardLeadership
from scalable_topics.controller.leases import LeaderElector
from scalable_topics.controller.sessions import make_app
from scalable_topics.controller.workqueue import WorkQueue
from tests.memory_dags import MemoryDagSource
from tests.unit.test_controller_leases import FAST, MemoryLeaseStore, wait_for
from tests.unit.test_controller_sessions import StaticRouting

RULE = LivenessRule(lease_duration=15.0, lease_tolerance=20.0, stall=300.0)
IDLE = QueueProgress(waiting=0, last_progress=0.0)


def leader(
    renewed_at: float | None, *, leading: bool = True, running: bool = True
) -> LeaseProgress:
    return LeaseProgress(shard=0, leading=leading, loop_running=running, renewed_at=renewed_at)


def test_rule_validates_its_bounds() -> None:
    with pytest.raises(ValueError):
        LivenessRule(lease_duration=15.0, stall=0.0)
    with pytest.raises(ValueError):
        LivenessRule(lease_duration=15.0, lease_tolerance=-1.0)


def test_leader_is_healthy_until_lease_duration_plus_tolerance_without_renewal() -> None:
    assert RULE.failures(1000.0 + 35.0, [leader(1000.0)], IDLE) == []
    failed = RULE.failures(1000.0 + 35.1, [leader(1000.0)], IDLE)
    assert [(f.check, f.since) for f in failed] == [("lease/shard-0", 1000.0)]
    assert "35s" in failed[0].reason


def test_a_replica_that_does_not_lead_is_healthy_while_its_election_loop_runs() -> None:
    assert RULE.failures(10_000.0, [leader(1.0, leading=False)], IDLE) == []
    assert RULE.failures(10_000.0, [leader(None, leading=False)], IDLE) == []
    failed = RULE.failures(10_000.0, [leader(None, leading=False, running=False)], IDLE)
    assert [(f.check, f.reason) for f in failed] == [("lease/shard-0", "election loop not running")]


def test_each_shard_is_judged_on_its_own() -> None:
    leases = [
        LeaseProgress(shard=0, leading=True, loop_running=True, renewed_at=99.0),
        LeaseProgress(shard=1, leading=True, loop_running=True, renewed_at=10.0),
    ]
    assert [f.check for f in RULE.failures(100.0, leases, IDLE)] == [lease_check(1)]
    assert RULE.checks(leases) == ["lease/shard-0", "lease/shard-1", "workqueue"]


def test_an_idle_queue_is_healthy_however_long_it_was_idle() -> None:
    assert RULE.failures(1e9, [], QueueProgress(waiting=0, last_progress=0.0)) == []


def test_waiting_keys_without_progress_for_longer_than_the_stall_bound_fail() -> None:
    waiting = QueueProgress(waiting=3, last_progress=500.0)
    assert RULE.failures(800.0, [], waiting) == []
    failed = RULE.failures(800.5, [], waiting)
    assert [(f.check, f.since) for f in failed] == [(QUEUE_CHECK, 500.0)]
    assert failed[0].reason.startswith("3 key(s) waiting")


async def test_elector_records_renewals_and_a_wedged_renew_loop_turns_unhealthy() -> None:
    """The on-started callback hangs (as ``_gained`` does on a hung API call): the elector still
    believes it leads but renews no more, which is what the lease check must catch."""
    store = MemoryLeaseStore()
    hang = asyncio.Event()

    async def gained() -> None:
        await hang.wait()

    wedged = LeaderElector(store, "a", timings=FAST, on_started_leading=gained)
    assert wedged.renewed_at is None
    task = asyncio.create_task(wedged.run())
    await wedged.wait_leading()
    renewed_at = wedged.renewed_at
    assert renewed_at is not None
    rule = LivenessRule(lease_duration=FAST.lease_duration, lease_tolerance=0.2, stall=60.0)

    def failures() -> list[str]:
        progress = LeaseProgress(0, wedged.is_leader, not task.done(), wedged.renewed_at)
        return [f.check for f in rule.failures(time.monotonic(), [progress], IDLE)]

    try:
        assert failures() == []
        await wait_for(lambda: failures() == ["lease/shard-0"], within=3.0)
        assert wedged.is_leader and wedged.renewed_at == renewed_at
        hang.set()
        await wait_for(lambda: wedged.renewed_at != renewed_at, within=3.0)
        assert failures() == []
    finally:
        hang.set()
        wedged.stop()
        await task


async def test_a_leader_that_cannot_write_steps_down_and_stays_healthy() -> None:
    store = MemoryLeaseStore()
    elector = LeaderElector(store, "a", timings=FAST)
    task = asyncio.create_task(elector.run())
    await elector.wait_leading()
    store.fail_writes = True
    await wait_for(lambda: not elector.is_leader, within=3.0)
    rule = LivenessRule(lease_duration=FAST.lease_duration, lease_tolerance=0.0, stall=60.0)
    progress = LeaseProgress(0, elector.is_leader, not task.done(), elector.renewed_at)
    assert rule.failures(time.monotonic() + 100.0, [progress], IDLE) == []
    elector.stop()
    await task


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def running(queue: WorkQueue[str]) -> AsyncIterator[WorkQueue[str]]:
    """Starts the queue and stops it (cancelling a blocked worker) even when the test fails."""
    queue.start()
    try:
        yield queue
    finally:
        await queue.stop()


async def test_work_queue_reports_waiting_keys_and_progress() -> None:
    clock = FakeClock()
    release = asyncio.Event()
    done: list[str] = []

    async def process(key: str) -> None:
        if key == "slow":
            await release.wait()
        done.append(key)

    async with running(WorkQueue(process, workers=1, clock=clock)) as queue:
        assert (queue.waiting, queue.last_progress) == (0, 1000.0)
        clock.now = 1010.0
        queue.add("slow")
        await wait_for(lambda: queue.waiting == 0 and len(queue) == 1)
        assert queue.last_progress == 1010.0
        queue.add("next")
        assert queue.waiting == 1
        clock.now = 1010.0 + RULE.stall + 1
        failed = RULE.failures(clock.now, [], QueueProgress(queue.waiting, queue.last_progress))
        assert [(f.check, f.since) for f in failed] == [(QUEUE_CHECK, 1010.0)]
        release.set()
        await asyncio.wait_for(queue.wait_idle(), 5.0)
        assert done == ["slow", "next"] and queue.waiting == 0
        assert queue.last_progress == clock.now


async def test_a_finished_reconcile_counts_as_progress() -> None:
    clock = FakeClock()
    release = asyncio.Event()

    async def process(key: str) -> None:
        await release.wait()

    async with running(WorkQueue(process, workers=1, clock=clock)) as queue:
        queue.add("long")
        await wait_for(lambda: queue.waiting == 0 and len(queue) == 1)
        assert queue.last_progress == 1000.0
        clock.now = 1050.0
        release.set()
        await asyncio.wait_for(queue.wait_idle(), 5.0)
        assert queue.last_progress == 1050.0


def _leadership(store: MemoryLeaseStore) -> ShardLeadership:
    leadership = ShardLeadership(
        cast(CoordinationV1Api, None), namespace="ns", identity="a", url="http://a", timings=FAST
    )
    leadership.electors[0].store = store
    return leadership


async def test_shard_leadership_reports_each_elector() -> None:
    leadership = _leadership(MemoryLeaseStore())
    assert leadership.progress() == [LeaseProgress(0, False, True, None)]
    leadership.start()
    await leadership.electors[0].wait_leading()
    (progress,) = leadership.progress()
    assert progress.leading and progress.loop_running
    assert progress.renewed_at == leadership.electors[0].renewed_at
    leadership._tasks[0].cancel()
    await asyncio.gather(leadership._tasks[0], return_exceptions=True)
    assert not leadership.progress()[0].loop_running
    assert [f.check for f in RULE.failures(0.0, leadership.progress(), IDLE)] == ["lease/shard-0"]
    await leadership.stop()


def _sample(check: str) -> float | None:
    return REGISTRY.get_sample_value("scalable_topic_operator_healthy", {"check": check})


async def test_healthz_answers_500_naming_the_failed_check_and_sets_the_metric() -> None:
    release = asyncio.Event()

    async def process(key: tuple[str, str]) -> None:
        await release.wait()

    stall = 0.5
    controller = Controller(ControllerSettings(timings=FAST, liveness_stall=stall))
    controller.liveness_rule = LivenessRule(FAST.lease_duration, 5.0, stall)
    controller.leadership = _leadership(MemoryLeaseStore())
    controller.queue = WorkQueue(process, workers=1)
    controller.queue.start()
    controller.leadership.start()
    await controller.leadership.electors[0].wait_leading()

    own = "http://this-replica:8080"
    hub = ConsumerHub(persist=_no_persist, on_consumers_changed=lambda ns, t: None)
    app = make_app(
        MemoryDagSource(controller_url=own),
        StaticRouting(own, own, True),
        hub,
        health=controller._healthy,
        ready=controller._ready,
        liveness=controller._liveness,
    )
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        response = await client.get("/healthz")
        assert response.status == 200 and await response.text() == "ok\n"
        assert _sample("lease/shard-0") == 1.0 and _sample("workqueue") == 1.0

        controller.queue.add(("ns", "wedged"))
        await wait_for(lambda: len(controller.queue) == 1 and controller.queue.waiting == 0)
        controller.queue.add(("ns", "waiting"))
        # The stall counts from the queue's last progress (the worker taking "wedged"), which
        # may be a moment before this line under load.
        took_at = time.time()
        progress = controller.queue.last_progress
        while (await client.get("/healthz")).status == 200:
            assert time.monotonic() - progress < stall + 5.0, "/healthz never failed"
            await asyncio.sleep(0.05)
        assert time.monotonic() - progress >= stall
        response = await client.get("/healthz")
        assert response.status == 500
        body: dict[str, Any] = await response.json()
        assert body["healthy"] is False
        (failed,) = body["failed"]
        assert failed["check"] == "workqueue"
        assert failed["reason"].startswith("1 key(s) waiting")
        since = datetime.fromisoformat(failed["since"])
        assert abs(since.timestamp() - took_at) < 0.5 and since.tzinfo == UTC
        assert _sample("workqueue") == 0.0 and _sample("lease/shard-0") == 1.0

        release.set()
        await asyncio.wait_for(controller.queue.wait_idle(), 5.0)
        assert (await client.get("/healthz")).status == 200
        assert _sample("workqueue") == 1.0
        controller.stop()
        assert (await client.get("/healthz")).status == 503
        assert (await client.get("/readyz")).status == 503
    finally:
        await client.close()
        await controller.leadership.stop()
        await controller.queue.stop()


async def _no_persist(ns: str, topic: str, sub: str, status: dict[str, Any]) -> None:
    return None
