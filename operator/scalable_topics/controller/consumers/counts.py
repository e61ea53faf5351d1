"""What the hub reports about its consumers (:class:`ConsumerCounts`): the registered consumers
per subscription for the auto-scaler's consumer-count rule, the change notification that drives
it, and the PIP-486 key-shared metrics."""

from __future__ import annotations

from ...core.assignment import SubscriptionCoordinator
from .. import metrics
from .connection import ConsumersChangedFn, log
from .registry import TopicRegistry
from .state import _Topic


class ConsumerCounts:
    """Counts and metrics over the topics of ``registry``; ``on_consumers_changed(namespace,
    topic)`` is called when the registered consumers of a topic changed (event-driven
    autoscale)."""

    def __init__(self, registry: TopicRegistry, on_consumers_changed: ConsumersChangedFn) -> None:
        self._registry = registry
        self._on_consumers_changed = on_consumers_changed

    def notify(self, state: _Topic) -> None:
        try:
            self._on_consumers_changed(state.namespace, state.name)
        except Exception:
            log.exception("consumer hub: %s: on_consumers_changed failed", state)

    def stream_consumer_counts(self, namespace: str, topic: str) -> dict[str, int]:
        """Subscription → its registered ordered consumers (connected or in their grace
        period): the stream and checkpoint consumers of a Stream subscription, the ordered
        workers of a Queue subscription (unordered ones never register). The auto-scaler's
        consumer-count rule treats both alike (issue 14: ordered queue workers outnumbering
        buckets trigger the same rule)."""
        state = self._registry.get(namespace, topic)
        if state is None:
            return {}
        return {name: len(sub.coordinator.sessions()) for name, sub in state.subscriptions.items()}

    def key_shared_samples(self) -> list[metrics.KeySharedSample]:
        """PIP-486 metrics of every consumable segment of every Stream subscription served."""
        samples = []
        for state in self._registry:
            for sub in state.subscriptions.values():
                c = sub.coordinator
                if not isinstance(c, SubscriptionCoordinator):
                    continue
                withheld: dict[int, int] = {}
                for segment_id, _ in c.withheld():
                    withheld[segment_id] = withheld.get(segment_id, 0) + 1
                wide = set(c.drain_wide())
                for segment_id in sorted({s for s, _ in c.unit_owners()}):
                    samples.append(
                        metrics.KeySharedSample(
                            state.namespace,
                            state.name,
                            sub.name,
                            segment_id,
                            c.bucket_count(segment_id),
                            len(c.sharers(segment_id)),
                            withheld.get(segment_id, 0),
                            segment_id in wide,
                            c.reassignments_by_segment.get(segment_id, 0),
                        )
                    )
        return samples

    def session_count(self) -> int:
        return sum(len(sub.sessions) for t in self._registry for sub in t.subscriptions.values())
