"""Running events through a subscription's coordinator and carrying out its result
(:class:`CoordinatorDriver`): push effects go to the :class:`AssignmentPublisher`, persist
effects to the :class:`StatusPersister`, a change of the registered consumers to
:class:`ConsumerCounts`, and the grace timer is re-armed. It also follows each served topic's
DAG so assignments pick up broker moves and queue subscriptions learn bucket counts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...core.assignment import Coordinator, CoordinatorResult
from .connection import log
from .counts import ConsumerCounts
from .persistence import StatusPersister
from .publishing import AssignmentPublisher
from .registry import TopicRegistry
from .state import _fields, _Subscription, _Topic


class CoordinatorDriver:
    """The one place coordinator results are carried out. ``clock`` gives Unix seconds."""

    def __init__(
        self,
        registry: TopicRegistry,
        publisher: AssignmentPublisher,
        persister: StatusPersister,
        counts: ConsumerCounts,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._publisher = publisher
        self._persister = persister
        self._counts = counts
        self._clock = clock

    def event(
        self,
        state: _Topic,
        sub: _Subscription,
        event: Callable[[Coordinator[Any]], CoordinatorResult],
    ) -> CoordinatorResult:
        before = set(sub.coordinator.sessions())
        result = event(sub.coordinator)
        self.apply(state, sub, result, before)
        return result

    def apply(
        self, state: _Topic, sub: _Subscription, result: CoordinatorResult, before: set[str]
    ) -> None:
        for effect in result.push:
            session = sub.sessions.get(effect.consumer)
            if session is not None:
                self._publisher.push(state, sub, session, effect.assignment)
        if result.expired:
            log.info(
                "consumer hub: %s %s: grace period over for %s",
                state,
                sub.name,
                ", ".join(result.expired),
                extra=_fields("consumer.expired", state, sub, consumers=list(result.expired)),
            )
        if result.moved:
            log.info(
                "consumer hub: %s %s: moved segments %s",
                state,
                sub.name,
                list(result.moved),
                extra=_fields("assignment.moved", state, sub, segments=list(result.moved)),
            )
        if result.persist is not None:
            self._persister.write(state, sub, result.persist.status)
        after = set(sub.coordinator.sessions())
        for gone in set(sub.positions) - after:
            del sub.positions[gone]
        self.arm(state, sub)
        if after != before:
            self._counts.notify(state)

    def sync_buckets(self, state: _Topic, sub: _Subscription, counts: Mapping[int, int]) -> None:
        """Give a subscription the bucket counts it does not know yet."""
        coordinator = sub.coordinator
        known = coordinator.buckets
        new = {s: n for s, n in counts.items() if known.get(s) != n}
        if new:
            now = self._clock()
            self.event(state, sub, lambda _: coordinator.buckets_changed(new, now))

    def arm(self, state: _Topic, sub: _Subscription) -> None:
        if sub.timer is not None:
            sub.timer.cancel()
            sub.timer = None
        deadline = sub.coordinator.next_deadline()
        if deadline is None or self._registry.closed:
            return
        delay = max(0.0, deadline - self._clock())
        sub.timer = asyncio.get_running_loop().call_later(delay, self._expire, state, sub)

    def _expire(self, state: _Topic, sub: _Subscription) -> None:
        sub.timer = None
        if not self._registry.live(state, sub):
            return
        now = self._clock()
        self.event(state, sub, lambda c: c.tick(now))

    def stop(self, sub: _Subscription) -> None:
        """Cancel the subscription's timer and its pending status writes."""
        if sub.timer is not None:
            sub.timer.cancel()
            sub.timer = None
        self._persister.cancel(sub)

    def ensure_watch(self, state: _Topic) -> None:
        if self._publisher.dags is None or (
            state.watch_task is not None and not state.watch_task.done()
        ):
            return
        state.watch_task = asyncio.create_task(
            self._watch_dag(state), name=f"consumer-hub-watch-{state}"
        )

    async def _watch_dag(self, state: _Topic) -> None:
        """Re-send an assignment when a broker URL in it changed (a segment placed or moved),
        and give queue subscriptions the bucket counts the DAG learnt.

        A layout commit reaches the hub (``layout_changed``) and the topic cache in either
        order; assignments pushed before the cache knew the new segments' brokers (or bucket
        counts) are completed here.
        """
        dags = self._publisher.dags
        if dags is None:
            return
        try:
            async for dag in dags.watch(state.namespace, state.name):
                if not self._registry.live(state):
                    return
                counts = {s.segment_id: s.buckets for s in dag.segments if s.buckets is not None}
                brokers = dag.brokers()
                for sub in list(state.subscriptions.values()):
                    self.sync_buckets(state, sub, counts)
                    for session in sub.sessions.values():
                        if any(brokers.get(i) != url for i, url in session.sent_brokers.items()):
                            assignment = sub.coordinator.assignment(session.consumer)
                            self._publisher.push(state, sub, session, assignment, brokers)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("consumer hub: %s: DAG watch failed", state)
