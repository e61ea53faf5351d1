"""Consumers of a scalable topic: stream, checkpoint and queue (DESIGN §1, §3, §6, PIP-486).

Every consumer registers with the topic's controller (the consumer controller session,
``docs/sessions.md``) and reads what it is assigned:

* :class:`StreamConsumer` gets whole segments of a Stream subscription, reads them in DAG order
  and acknowledges cumulatively per segment on the brokers.
* :class:`CheckpointConsumer` gets assignments the same way but leaves no acknowledgements on
  the brokers: the application stores a :class:`~scalable_topics.client.model.Checkpoint` and
  restarts from it.
* :class:`QueueConsumer` gets entry buckets of the segments of a Queue subscription: any number
  of queue consumers share the subscription, each key is processed by one of them at a time, in
  order; acknowledgements are individual. ``ordered=False`` skips the controller and lets the
  brokers spread entries round-robin (no order).

**DAG order.** A segment is read only while the controller marks it ``consumable``, or once
this consumer has itself drained and reported every segment in its ``blockedBy``: a split or
merge child therefore starts right after its parents, without a round trip to the controller,
and every message of a parent is acknowledged before any message of a child is delivered - so
per-key order survives splits and merges. A segment is drained when the broker sends
``END_OF_SEGMENT`` (sealed, and every entry acknowledged by the subscription); a checkpoint
consumer's when it has handed out everything up to the sealed segment's last position.

Iterating (``async for msg in consumer``) yields :class:`Message` objects from all the segments
being read; messages of one segment (of one bucket, for a queue consumer) come in position
order.

**Leaving.** ``close()`` is a clean leave: the readers detach from the brokers, then the consumer
unregisters, and the controller hands what it held to the others at once. Only a consumer that
vanishes (socket dropped without ``unregister``) keeps its assignment for the grace period.
"""

from __future__ import annotations

from .checkpoint import CheckpointConsumer
from .common import (
    ConsumerClosedError,
    ConsumerError,
    ConsumerOptions,
    ConsumerTopicNotFoundError,
    entry_messages,
    readable,
)
from .queue import QueueConsumer
from .stream import StreamConsumer

__all__ = [
    "CheckpointConsumer",
    "ConsumerClosedError",
    "ConsumerError",
    "ConsumerOptions",
    "ConsumerTopicNotFoundError",
    "QueueConsumer",
    "StreamConsumer",
    "entry_messages",
    "readable",
]
