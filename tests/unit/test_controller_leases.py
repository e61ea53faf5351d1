"""Leader election against an in-memory Lease store with the API server's CAS semantics."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from scalable_topics.controller.leases import (
    ElectionTimings,
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
)

FAST = ElectionTimings(lease_duration=1.0, renew_deadline=0.6, retry_period=0.15)


class MemoryLeaseStore:
    """One Lease with resourceVersion compare-and-swap, like the API server's."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self._versions = itertools.count(1)
        self.writes = 0
        self.fail_writes = False

    async def get(self) -> LeaseRecord | None:
        return self.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    async def replace(self, record: LeaseRecord) -> LeaseRecord:
        if self.fail_writes:
            raise ConnectionError("API server unreachable")
        if self.record is None or record.resource_version != self.record.resource_version:
            raise LeaseConflict("stale resourceVersion")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.writes += 1
        self.record = replace(record, resource_version=str(next(self._versions)))
        return self.record


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def test_timings_are_validated_like_client_go() -> None:
    with pytest.raises(ValueError, match="lease_duration"):
        ElectionTimings(lease_duration=10, renew_deadline=10, retry_period=2)
    with pytest.raises(ValueError, match="renew_deadline"):
        ElectionTimings(lease_duration=15, renew_deadline=2, retry_period=2)


async def test_first_candidate_creates_the_lease_and_a_concurrent_one_waits() -> None:
    store = MemoryLeaseStore()
    a = LeaderElector(store, "a", url="http://a:8080", timings=FAST)
    b = LeaderElector(store, "b", url="http://b:8080", timings=FAST)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert store.record is not None
    assert store.record.holder == "a"
    assert store.record.transitions == 0
    assert store.record.holder_url == "http://a:8080"
    acquired = store.record.acquire_time
    assert await a.try_acquire_or_renew()
    assert store.record.acquire_time == acquired, "a renewal keeps acquireTime"


async def test_expiry_is_judged_on_the_local_clock_not_the_record() -> None:
    store = MemoryLeaseStore()
    now = [100.0]
    a = LeaderElector(store, "a", timings=FAST, clock=lambda: now[0])
    b = LeaderElector(store, "b", timings=FAST, clock=lambda: now[0])
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b first observes the record now
    now[0] += 0.99
    assert not await b.try_acquire_or_renew()
    now[0] += 0.02
    assert await b.try_acquire_or_renew()
    assert store.record is not None
    assert store.record.holder == "b"
    assert store.record.transitions == 1
    assert not await a.try_acquire_or_renew(), "the old holder sees the new holder's record"


async def test_stale_write_loses_with_409() -> None:
    store = MemoryLeaseStore()
    a = LeaderElector(store, "a", timings=FAST)
    assert await a.try_acquire_or_renew()
    assert store.record is not None
    stale = store.record
    await store.replace(replace(stale, renew_time=None))
    with pytest.raises(LeaseConflict):
        await store.replace(stale)


async def test_failover_release_and_transitions() -> None:
    store = MemoryLeaseStore()
    events: list[str] = []

    def elector(name: str) -> LeaderElector:
        async def started() -> None:
            events.append(f"{name}+")

        async def stopped() -> None:
            events.append(f"{name}-")

        return LeaderElector(
            store, name, timings=FAST, on_started_leading=started, on_stopped_leading=stopped
        )

    a, b = elector("a"), elector("b")
    task_a = asyncio.create_task(a.run())
    await a.wait_leading()
    task_b = asyncio.create_task(b.run())
    await asyncio.sleep(0.3)
    assert a.is_leader and not b.is_leader

    a.stop()
    await task_a
    assert store.record is not None
    assert store.record.holder == "", "a released the lease on shutdown"
    await asyncio.wait_for(b.wait_leading(), timeout=2.0)
    assert store.record.holder == "b"
    assert store.record.transitions == 1
    b.stop()
    await task_b
    assert events == ["a+", "a-", "b+", "b-"]


async def test_leader_that_cannot_renew_steps_down_before_the_lease_expires() -> None:
    store = MemoryLeaseStore()
    now = asyncio.get_running_loop().time
    a = LeaderElector(store, "a", timings=FAST)
    task = asyncio.create_task(a.run())
    await a.wait_leading()
    assert store.record is not None
    last_renew_at = now()
    renewed_version = store.record.resource_version
    store.fail_writes = True
    await wait_for(
        lambda: store.record is not None and store.record.resource_version == renewed_version
    )
    await wait_for(lambda: not a.is_leader, within=2.0)
    stepped_down_after = now() - last_renew_at
    assert stepped_down_after < FAST.lease_duration, (
        f"stepped down {stepped_down_after:.2f}s after the last renewal; "
        f"others may take over after {FAST.lease_duration}s"
    )
    a.stop()
    await task


async def test_a_failed_start_steps_down_and_campaigns_again() -> None:
    """An exception in the started callback (a transient API error while listing) releases the
    lease and ends that term only: the elector campaigns again and leads."""
    store = MemoryLeaseStore()
    events: list[str] = []

    async def started() -> None:
        events.append("+")
        if events.count("+") == 1:
            raise RuntimeError("storage is (re)initializing")

    async def stopped() -> None:
        events.append("-")

    a = LeaderElector(
        store, "a", timings=FAST, on_started_leading=started, on_stopped_leading=stopped
    )
    task = asyncio.create_task(a.run())
    await wait_for(lambda: events == ["+", "-", "+"])
    assert not task.done()
    assert a.is_leader and store.record is not None and store.record.holder == "a"
    assert a.transitions_seen == 2
    a.stop()
    await task
    assert events == ["+", "-", "+", "-"]
