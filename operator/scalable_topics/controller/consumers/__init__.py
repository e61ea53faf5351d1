"""The consumer hub: the leader's live side of subscriptions (DESIGN §3, §6, PIP-486).

Per topic and subscription the hub holds one coordinator (the pure state machine of
:mod:`scalable_topics.core.assignment`: a ``SubscriptionCoordinator`` handing whole segments to
the stream/checkpoint consumers of a Stream subscription, a ``QueueCoordinator`` handing entry
buckets to the queue consumers of a Queue subscription), the consumer WebSockets of that
subscription, one asyncio timer for the coordinator's next grace deadline, and at most one
in-flight persist.

Every event - a consumer registering, dropping, unregistering or reporting a drained segment, a
grace period running out, a layout change, a drain observed by the controller - goes through the
coordinator, and its result is carried out the same way (:meth:`CoordinatorDriver.apply`): push
effects become assignment messages on the consumers' sockets, a persist effect becomes a call of
``persist`` (coalesced: the latest status wins), a change of the registered consumers calls
``on_consumers_changed`` (the consumer-count autoscale rule), and the timer is re-armed.

Everything runs on the event loop without awaiting between reading and updating state, so no
lock is needed; the only awaits are socket writes (one writer task per socket, so a slow consumer
delays nobody else) and ``persist``.
"""

from __future__ import annotations

from .connection import ConsumerConnection, SessionRejected, close_reason, leader_elsewhere
from .hub import ConsumerHub

__all__ = [
    "ConsumerConnection",
    "ConsumerHub",
    "SessionRejected",
    "close_reason",
    "leader_elsewhere",
]
