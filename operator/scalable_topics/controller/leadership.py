"""Shard leadership: one Lease per shard, one elector per shard in every replica (DESIGN §4)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kubernetes_asyncio.client import CoordinationV1Api

from ..core.hashing import shard_of
from . import metrics
from .health import LeaseProgress
from .leases import ElectionTimings, KubernetesLeaseStore, LeaderElector, shard_lease_name

log = logging.getLogger(__name__)

ShardCallback = Callable[[int], Awaitable[None]]


class ShardLeadership:
    """Campaigns for every shard's Lease and answers "may I mutate this topic?"."""

    def __init__(
        self,
        api: CoordinationV1Api,
        *,
        namespace: str,
        identity: str,
        url: str,
        shards: int = 1,
        timings: ElectionTimings | None = None,
        on_gained: ShardCallback | None = None,
        on_lost: ShardCallback | None = None,
    ) -> None:
        if shards < 1:
            raise ValueError("shards must be at least 1")
        self.shards = shards
        self.identity = identity
        self.url = url
        self._on_gained = on_gained
        self._on_lost = on_lost
        self.electors = [
            LeaderElector(
                KubernetesLeaseStore(api, namespace, shard_lease_name(shard)),
                identity,
                url=url,
                timings=timings,
                on_started_leading=self._callback(self._gained, shard),
                on_stopped_leading=self._callback(self._lost, shard),
            )
            for shard in range(shards)
        ]
        self._tasks: list[asyncio.Task[None]] = []

    @staticmethod
    def _callback(fn: ShardCallback, shard: int) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            await fn(shard)

        return call

    async def _gained(self, shard: int) -> None:
        metrics.FAILOVERS.labels(str(shard)).inc()
        metrics.LEADER.labels(str(shard)).set(1)
        log.info("leading shard %d as %s", shard, self.identity)
        if self._on_gained:
            await self._on_gained(shard)

    async def _lost(self, shard: int) -> None:
        metrics.LEADER.labels(str(shard)).set(0)
        log.warning("no longer leading shard %d", shard)
        if self._on_lost:
            await self._on_lost(shard)

    def shard_of(self, namespace: str, name: str) -> int:
        return shard_of(namespace, name, self.shards)

    def leads(self, namespace: str, name: str) -> bool:
        return self.electors[self.shard_of(namespace, name)].is_leader

    def leader_url(self, namespace: str, name: str) -> str:
        """The URL of whoever leads the topic's shard as last observed ("" when unknown)."""
        elector = self.electors[self.shard_of(namespace, name)]
        return self.url if elector.is_leader else elector.observed_holder_url

    def progress(self) -> list[LeaseProgress]:
        """Each shard's elector as the liveness rule sees it. A loop counts as running until a
        started one ends: before ``start()`` (the replica is still starting) nothing is wrong."""
        return [
            LeaseProgress(
                shard=shard,
                leading=elector.is_leader,
                loop_running=not self._tasks or not self._tasks[shard].done(),
                renewed_at=elector.renewed_at,
            )
            for shard, elector in enumerate(self.electors)
        ]

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(e.run(), name=f"lease-shard-{i}")
            for i, e in enumerate(self.electors)
        ]

    async def stop(self) -> None:
        for elector in self.electors:
            elector.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
