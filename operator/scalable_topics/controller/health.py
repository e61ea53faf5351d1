"""Liveness tied to progress: the rule behind ``/healthz`` (docs/operations.md, "Probes").

The rule is pure: it gets the monotonic time and what the Lease electors and the work queue last
did, and names the checks that fail. Its two checks:

- ``lease/shard-N``: as client-go's ``leaderelection.HealthzAdaptor``, a replica that *leads* a
  shard is unhealthy once its last successful renewal is older than the lease duration plus a
  tolerance (client-go's ``Check(maxTolerableExpiredLease)``; kube-controller-manager uses 20 s).
  The elector steps down after ``renew_deadline`` without a renewal, so this fails only when the
  renew loop itself is wedged while the replica still believes it leads, which is the case where
  a restart helps. A replica that does not lead is healthy as long as its election loop runs.
- ``workqueue``: as Strimzi's ``isAlive``, unhealthy when keys wait in the queue and no worker
  took or finished one for longer than ``stall`` (larger than the longest legitimate reconcile).
  An idle queue is healthy however long it has been idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_LEASE_TOLERANCE = 20.0
DEFAULT_STALL = 300.0


@dataclass(frozen=True)
class LeaseProgress:
    """What one shard's elector did: ``renewed_at`` is the monotonic time of its last successful
    acquire or renewal (``None`` before the first)."""

    shard: int
    leading: bool
    loop_running: bool
    renewed_at: float | None


@dataclass(frozen=True)
class QueueProgress:
    """``waiting`` keys are queued and not being processed; ``last_progress`` is the monotonic
    time a worker last took or finished a key (or the queue started)."""

    waiting: int
    last_progress: float


@dataclass(frozen=True)
class Failure:
    check: str
    reason: str
    since: float | None
    """Monotonic time of the last progress the check saw (``None``: never any)."""


def lease_check(shard: int) -> str:
    return f"lease/shard-{shard}"


QUEUE_CHECK = "workqueue"


@dataclass(frozen=True)
class LivenessRule:
    lease_duration: float
    lease_tolerance: float = DEFAULT_LEASE_TOLERANCE
    stall: float = DEFAULT_STALL

    def __post_init__(self) -> None:
        if self.lease_duration <= 0 or self.lease_tolerance < 0 or self.stall <= 0:
            raise ValueError(
                "lease_duration and stall must be positive and lease_tolerance not negative"
            )

    @property
    def lease_bound(self) -> float:
        return self.lease_duration + self.lease_tolerance

    def failures(
        self, now: float, leases: Sequence[LeaseProgress], queue: QueueProgress
    ) -> list[Failure]:
        failed: list[Failure] = []
        for lease in leases:
            check = lease_check(lease.shard)
            if not lease.loop_running:
                failed.append(Failure(check, "election loop not running", lease.renewed_at))
            elif lease.leading and (
                lease.renewed_at is None or now - lease.renewed_at > self.lease_bound
            ):
                failed.append(
                    Failure(
                        check,
                        f"leading but lease not renewed for more than {self.lease_bound:g}s",
                        lease.renewed_at,
                    )
                )
        if queue.waiting > 0 and now - queue.last_progress > self.stall:
            failed.append(
                Failure(
                    QUEUE_CHECK,
                    f"{queue.waiting} key(s) waiting and no reconcile started or finished "
                    f"for more than {self.stall:g}s",
                    queue.last_progress,
                )
            )
        return failed

    def checks(self, leases: Sequence[LeaseProgress]) -> list[str]:
        """Every check name the rule evaluates for these electors (the metric's label values)."""
        return [lease_check(lease.shard) for lease in leases] + [QUEUE_CHECK]
