"""A real in-memory ``DagSource`` (the operator's topic cache contract) for tests that serve
the session server without a Kubernetes API: the unit tests of the sessions and the client
integration harness."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from scalable_topics.core.buckets import initial_layout_buckets, layout_buckets
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import DagMessage, dag_message


class _Watch:
    def __init__(self, latest: DagMessage) -> None:
        self.latest = latest
        self.ended = False
        self.wake = asyncio.Event()
        self.wake.set()


class MemoryDagSource:
    """The topic cache's contract fed from layouts: ``watch`` yields the current DAG first, then
    the latest one after every change (a slow watcher skips versions), and ends on deletion."""

    def __init__(self, controller_url: str = "") -> None:
        self.controller_url = controller_url
        self._dags: dict[tuple[str, str], DagMessage] = {}
        self._buckets: dict[tuple[str, str], dict[int, int]] = {}
        self._watches: dict[tuple[str, str], set[_Watch]] = {}

    def publish(self, message: DagMessage) -> DagMessage:
        """Make ``message`` the topic's current DAG and wake its watchers."""
        key = (message.namespace, message.topic)
        self._dags[key] = message
        for watch in self._watches.get(key, ()):
            watch.latest = message
            watch.wake.set()
        return message

    def publish_layout(
        self,
        namespace: str,
        name: str,
        layout: SegmentLayout,
        brokers: Mapping[int, str] | None = None,
        *,
        bucket_budget: int = 4,
    ) -> DagMessage:
        key = (namespace, name)
        known = self._buckets.get(key)
        if known is None or layout.epoch == 0:
            known = initial_layout_buckets(layout, bucket_budget)
        buckets = layout_buckets(layout, known)
        self._buckets[key] = buckets
        if brokers is None:
            brokers = {i: f"http://broker-{i % 3}.test:8080" for i in layout.segments}
        message = dag_message(
            namespace,
            name,
            layout,
            brokers=brokers,
            buckets=buckets,
            controller_url=self.controller_url,
        )
        return self.publish(message)

    def delete(self, namespace: str, name: str) -> None:
        self._dags.pop((namespace, name), None)
        for watch in self._watches.get((namespace, name), ()):
            watch.ended = True
            watch.wake.set()

    def watchers(self, namespace: str, name: str) -> int:
        return len(self._watches.get((namespace, name), ()))

    def dag(self, namespace: str, name: str) -> DagMessage | None:
        return self._dags.get((namespace, name))

    async def watch(self, namespace: str, name: str) -> AsyncIterator[DagMessage]:
        current = self._dags.get((namespace, name))
        if current is None:
            return
        watch = _Watch(current)
        watches = self._watches.setdefault((namespace, name), set())
        watches.add(watch)
        try:
            while True:
                await watch.wake.wait()
                watch.wake.clear()
                if watch.ended:
                    return
                yield watch.latest
        finally:
            watches.discard(watch)
