"""Lease-based leader election: an asyncio port of client-go's ``tools/leaderelection``.

Semantics kept from client-go:

- A candidate takes the Lease when it is free or when the holder's record has not changed for
  ``lease_duration`` as observed on *our* monotonic clock (``observed_at``), never by trusting
  the timestamps in the record, so clock skew between replicas does not matter.
- A takeover increments ``leaseTransitions`` and sets ``acquireTime``; a renewal keeps both.
- Every write is a replace carrying the ``resourceVersion`` we read: a concurrent writer gets
  409 and loses that round.
- The leader gives up (stops mutating) when it could not renew within ``renew_deadline``, which
  is shorter than ``lease_duration``, so it stops before anybody else may take over.
- On shutdown the leader releases the Lease (empty holder, 1 s duration) so a successor need not
  wait for the expiry.

There is no fencing (client-go has none either): the protocol steps guarded by the Lease are
written so that each is idempotent and every metadata write is a compare-and-swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from kubernetes_asyncio.client import CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

LEADER_URL_ANNOTATION = "scalabletopics.io/leader-url"


@dataclass(frozen=True)
class ElectionTimings:
    """client-go's defaults for core clients; ``lease > renew > 1.2 * retry`` is enforced."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    jitter: float = 1.2

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if not self.renew_deadline > self.jitter * self.retry_period:
            raise ValueError("renew_deadline must be greater than jitter * retry_period")
        if self.retry_period <= 0 or self.jitter < 1:
            raise ValueError("retry_period must be positive and jitter at least 1")


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a ``coordination.k8s.io/v1`` Lease that election uses."""

    holder: str = ""
    lease_duration_seconds: int = 15
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    holder_url: str = ""
    resource_version: str | None = field(default=None, compare=False)

    def same_observation(self, other: LeaseRecord | None) -> bool:
        return other is not None and self == other


class LeaseConflict(Exception):
    """Somebody else wrote the Lease between our read and our write (HTTP 409)."""


class LeaseStore(Protocol):
    """Where the Lease lives. The Kubernetes implementation is :class:`KubernetesLeaseStore`."""

    async def get(self) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord) -> LeaseRecord: ...

    async def replace(self, record: LeaseRecord) -> LeaseRecord:
        """Write ``record`` if the stored resourceVersion still equals ``record``'s."""
        ...


Callback = Callable[[], Awaitable[None]]


class LeaderElector:
    """Campaigns for one Lease forever; ``is_leader`` is true only while it may act as leader.

    ``on_started_leading`` runs when leadership is gained and ``on_stopped_leading`` when it is
    lost or released. Both are awaited inline: leadership work belongs in tasks they start and
    stop, so that losing the Lease can cancel it promptly.
    """

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        *,
        url: str = "",
        timings: ElectionTimings | None = None,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not identity:
            raise ValueError("leader election identity must not be empty")
        self.store = store
        self.identity = identity
        self.url = url
        self.timings = timings or ElectionTimings()
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock = clock
        self._wall_clock = wall_clock
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self._leading = asyncio.Event()
        self._stopped = asyncio.Event()
        self.transitions_seen = 0

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    @property
    def renewed_at(self) -> float | None:
        """Monotonic time (this elector's clock) of its last successful acquire or renewal."""
        return self._renewed_at

    @property
    def observed_holder_url(self) -> str:
        return self._observed.holder_url if self._observed else ""

    async def wait_leading(self) -> None:
        await self._leading.wait()

    def _retry_delay(self) -> float:
        return self.timings.retry_period * random.uniform(1.0, self.timings.jitter)

    async def try_acquire_or_renew(self) -> bool:
        """One round of client-go's ``tryAcquireOrRenew``."""
        now = self._wall_clock()
        duration = max(1, math.ceil(self.timings.lease_duration))
        current = await self.store.get()
        if current is None:
            record = LeaseRecord(
                holder=self.identity,
                lease_duration_seconds=duration,
                acquire_time=now,
                renew_time=now,
                transitions=0,
                holder_url=self.url,
            )
            try:
                created = await self.store.create(record)
            except LeaseConflict:
                return False
            self._observe(created)
            self._renewed_at = self._clock()
            return True

        if not current.same_observation(self._observed):
            self._observe(current)
        expired = self._observed_at + current.lease_duration_seconds <= self._clock()
        held_by_other = current.holder not in ("", self.identity)
        if held_by_other and not expired:
            return False

        if current.holder == self.identity:
            record = replace(
                current, renew_time=now, lease_duration_seconds=duration, holder_url=self.url
            )
        else:
            record = replace(
                current,
                holder=self.identity,
                lease_duration_seconds=duration,
                acquire_time=now,
                renew_time=now,
                transitions=current.transitions + 1,
                holder_url=self.url,
            )
        try:
            written = await self.store.replace(record)
        except LeaseConflict:
            return False
        self._observe(written)
        self._renewed_at = self._clock()
        return True

    def _observe(self, record: LeaseRecord) -> None:
        self._observed = record
        self._observed_at = self._clock()

    async def _acquire(self) -> None:
        while not self._stopped.is_set():
            try:
                if await self.try_acquire_or_renew():
                    return
            except LeaseConflict:
                pass
            except Exception:
                log.exception("leader election: acquiring lease failed")
            await self._sleep(self._retry_delay())

    async def _renew_until_lost(self) -> None:
        deadline = self._clock() + self.timings.renew_deadline
        while not self._stopped.is_set():
            await self._sleep(self.timings.retry_period)
            if self._stopped.is_set():
                return
            try:
                renewed = await asyncio.wait_for(
                    self.try_acquire_or_renew(), timeout=max(0.0, deadline - self._clock())
                )
            except (TimeoutError, LeaseConflict):
                renewed = False
            except Exception:
                log.exception("leader election: renewing lease failed")
                renewed = False
            now = self._clock()
            if renewed:
                deadline = now + self.timings.renew_deadline
            elif now >= deadline:
                log.warning("leader election: could not renew within the renew deadline")
                return

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), timeout=seconds)

    async def run(self) -> None:
        """Campaign, lead, and campaign again after a loss, until :meth:`stop`."""
        try:
            while not self._stopped.is_set():
                await self._acquire()
                if self._stopped.is_set():
                    break
                self.transitions_seen += 1
                self._leading.set()
                log.info("leader election: %s is now the leader", self.identity)
                start_failed = False
                try:
                    if self._on_started:
                        await self._on_started()
                    await self._renew_until_lost()
                except Exception:
                    # A start that fails (the API server still initialising a resource right
                    # after its CRD was created answers 429) ends this term, not the election.
                    log.exception(
                        "leader election: %s could not start leading; stepping down", self.identity
                    )
                    start_failed = True
                finally:
                    self._leading.clear()
                    if self._on_stopped:
                        await self._on_stopped()
                    log.info("leader election: %s stopped leading", self.identity)
                if start_failed:
                    await self._release()
                    await self._sleep(self._retry_delay())
        finally:
            await self._release()

    def stop(self) -> None:
        self._stopped.set()

    async def _release(self) -> None:
        observed = self._observed
        if observed is None or observed.holder != self.identity:
            return
        try:
            current = await self.store.get()
            if current is None or current.holder != self.identity:
                return
            now = self._wall_clock()
            await self.store.replace(
                replace(current, holder="", lease_duration_seconds=1, renew_time=now, holder_url="")
            )
            log.info("leader election: %s released the lease", self.identity)
        except Exception:
            log.exception("leader election: releasing lease failed")


class KubernetesLeaseStore:
    """A ``coordination.k8s.io/v1`` Lease through kubernetes_asyncio's CoordinationV1Api."""

    def __init__(self, api: CoordinationV1Api, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    @staticmethod
    def _record(lease: V1Lease) -> LeaseRecord:
        spec = lease.spec
        annotations = lease.metadata.annotations or {}
        return LeaseRecord(
            holder=spec.holder_identity or "",
            lease_duration_seconds=int(spec.lease_duration_seconds or 0),
            acquire_time=spec.acquire_time,
            renew_time=spec.renew_time,
            transitions=int(spec.lease_transitions or 0),
            holder_url=annotations.get(LEADER_URL_ANNOTATION, ""),
            resource_version=lease.metadata.resource_version,
        )

    def _body(self, record: LeaseRecord) -> V1Lease:
        return V1Lease(
            metadata=V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                resource_version=record.resource_version,
                annotations={LEADER_URL_ANNOTATION: record.holder_url},
            ),
            spec=V1LeaseSpec(
                holder_identity=record.holder or None,
                lease_duration_seconds=record.lease_duration_seconds,
                acquire_time=record.acquire_time,
                renew_time=record.renew_time,
                lease_transitions=record.transitions,
            ),
        )

    async def get(self) -> LeaseRecord | None:
        try:
            lease = await self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._record(lease)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        try:
            lease = await self.api.create_namespaced_lease(self.namespace, self._body(record))
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(str(exc.reason)) from None
            raise
        return self._record(lease)

    async def replace(self, record: LeaseRecord) -> LeaseRecord:
        try:
            lease = await self.api.replace_namespaced_lease(
                self.name, self.namespace, self._body(record)
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(str(exc.reason)) from None
            raise
        return self._record(lease)


def shard_lease_name(shard: int) -> str:
    return f"scalable-topics-shard-{shard}"
