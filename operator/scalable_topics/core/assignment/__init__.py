"""Consumer assignment for stream, checkpoint and queue subscriptions (DESIGN §3, PIP-468,
PIP-486).

One coordinator per subscription is a pure state machine: events go in (``register``,
``disconnect``, ``unregister``, ``tick``, ``layout_changed``, ``drained``), each with the current
time, and every event returns a :class:`CoordinatorResult` describing the assignment changes and
the effects the caller must carry out (write ``status.subscriptions``, push assignments to
connected consumers). Nothing here reads a clock or does I/O.

Two kinds share everything but the unit they hand out:

* :class:`SubscriptionCoordinator` (Stream subscriptions, stream and checkpoint consumers) hands
  out whole **segments**: one consumer per segment; with more consumers than consumable
  segments it spreads their entry buckets over the idle ones (PIP-486 key-shared, see the
  class).
* :class:`QueueCoordinator` (Queue subscriptions, queue consumers) hands out **units** - one
  entry bucket of one segment, ``(segment, bucket)`` - so several workers share a segment while
  every key (whose entries all fall in one bucket of its segment) has exactly one worker. The
  brokers dispatch a bucket's entries only to the consumer naming it (PIP-486), in position
  order, so a key is processed in order by one worker at a time.

Vocabulary used throughout:

* A segment is **tracked** by the subscription while it still has to be consumed: every active
  segment, and every sealed segment not yet reported drained. Segments pruned from the DAG are
  treated as drained.
* A tracked segment is **consumable** when none of its ancestors is still tracked, i.e. every
  parent (and, transitively, every grandparent) is drained or pruned. Initial segments are
  consumable at once; split, merge and rebucket children are gated alike. A segment drains as a
  whole (the broker ends it once every entry is acknowledged), so a queue subscription's units
  are gated by their segment.
* Gating is done by *flagging*, not by withholding: a child that is not consumable yet is still
  assigned (normally near its parent's consumers) with ``consumable=False`` and ``blocked_by``
  set to its undrained ancestors. The client must not read it before either the coordinator
  pushes it as consumable, or the client itself has drained (and reported) every segment in
  ``blocked_by`` - which it can only have done when it holds a share of all of them. Holding
  the lineage lets a consumer go from a parent to its children without waiting for a round trip.
* Stream only: a sealed, undrained segment is **pinned** to its consumer until that consumer
  reports it drained (or leaves for good): moving it would hand the same backlog to two readers
  in turn. Queue units of sealed segments do move (PIP-486: a sealed backlog fans out over the
  workers); the client hands a bucket over only after the application settled what it took of
  it, and the broker refuses a bucket to a second consumer while the first still holds it.

Sessions: a disconnected consumer keeps its registration and its units for the grace period.
Under ``sticky`` (and for queues) its assignment is frozen meanwhile - nothing is taken from it
and nothing new is given to it unless no consumer is connected - so a consumer returning within
the grace period finds exactly what it left with (less what was drained or pruned meanwhile).
One exception (stream, key-shared): when a helper gives up buckets of a segment whose primary
is in its grace period and no connected consumer is idle to take them, they go back to that
primary (its own segment; nobody reads them until it returns or its grace period ends).
Under ``round-robin`` a consumer in its grace period keeps its slot in the name order, as in
PIP-468.

Persistence (``to_status``) records which segments each consumer holds a share of. A queue
subscription restored from it (a new leader) gives each segment's holders contiguous slices of
its buckets in name order (:func:`bucket_slices`); the live assignment may differ (units move
one by one), so a failover can move a few buckets - safely, through the same hand-off.
"""

from __future__ import annotations

from .base import Coordinator
from .model import (
    DEFAULT_GRACE_PERIOD,
    AssignedSegment,
    AssignmentChange,
    AssignmentStrategy,
    ConsumerAssignment,
    ConsumerSession,
    CoordinatorResult,
    PersistEffect,
    PushEffect,
    Unit,
    bucket_slices,
    parent_buckets,
    round_robin,
)
from .queue import QueueCoordinator
from .stream import SubscriptionCoordinator

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "AssignedSegment",
    "AssignmentChange",
    "AssignmentStrategy",
    "ConsumerAssignment",
    "ConsumerSession",
    "Coordinator",
    "CoordinatorResult",
    "PersistEffect",
    "PushEffect",
    "QueueCoordinator",
    "SubscriptionCoordinator",
    "Unit",
    "bucket_slices",
    "parent_buckets",
    "round_robin",
]
