"""The consumer hub proper (:class:`ConsumerHub`): the reconciler's side (restore, layout
changes, drains, forgetting topics, shutdown) and the facade the session layer and the
auto-scaler call. Its collaborators, built at construction and sharing one
:class:`TopicRegistry` (the served topics and subscriptions), do the rest:
:class:`SubscriptionLifecycle` adds, rebuilds and drops subscriptions, :class:`ConsumerSessions`
handles registrations and consumer reports, :class:`CoordinatorDriver` carries out coordinator
results, :class:`AssignmentPublisher` sends assignments and redirects, :class:`StatusPersister`
writes subscription status and :class:`ConsumerCounts` counts consumers for the auto-scaler and
the metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from aiohttp import web

from ...core.assignment import (
    AssignmentStrategy,
    Coordinator,
    SubscriptionCoordinator,
)
from ...core.layout import SegmentLayout
from ...core.sessions import (
    CloseCode,
    ErrorCode,
    ErrorMessage,
    RedirectMessage,
    RegisterMessage,
)
from .. import metrics
from ..interfaces import DagSource, Routing
from .connection import (
    _CLOSE_FLUSH_TIMEOUT,
    _RETRY_AFTER,
    ConsumerConnection,
    ConsumersChangedFn,
    PersistFn,
    log,
)
from .counts import ConsumerCounts
from .driver import CoordinatorDriver
from .lifecycle import SubscriptionLifecycle
from .persistence import StatusPersister
from .publishing import AssignmentPublisher
from .registry import TopicRegistry
from .sessions import ConsumerSessions
from .state import _fields, _Topic, subscription_entry


class ConsumerHub:
    """Consumer controller sessions of the topics this replica leads.

    ``persist(namespace, topic, subscription, status)`` writes a subscription's
    :meth:`~Coordinator.to_status` into ``status.subscriptions`` (the reconciler's CAS write; a
    Queue subscription's status carries ``"type": "Queue"``); ``on_consumers_changed(namespace,
    topic)`` is called when the registered consumers of a topic changed (event-driven
    autoscale). ``clock`` gives Unix seconds.

    The sync methods must be called on the event loop that serves the sessions.
    """

    def __init__(
        self,
        *,
        persist: PersistFn,
        on_consumers_changed: ConsumersChangedFn,
        clock: Callable[[], float] = time.time,
        dags: DagSource | None = None,
        routing: Routing | None = None,
    ) -> None:
        self._clock = clock
        self._registry = TopicRegistry()
        self._publisher = AssignmentPublisher(dags, routing)
        self._persister = StatusPersister(persist)
        self._counts = ConsumerCounts(self._registry, on_consumers_changed)
        self._driver = CoordinatorDriver(
            self._registry, self._publisher, self._persister, self._counts, clock
        )
        self._subscriptions = SubscriptionLifecycle(self._publisher, self._persister, self._driver)
        self._sessions = ConsumerSessions(
            self._registry, self._publisher, self._subscriptions, self._driver, clock
        )
        metrics.KEY_SHARED.sources.add(self)

    def bind(self, *, dags: DagSource, routing: Routing, own_url: str = "") -> None:
        """Give the hub the replica's topic cache (broker URLs for assignments, broker moves)
        and its shard routing (redirect targets), unless given at construction, and this
        replica's URL (never a redirect target). ``make_app`` calls this."""
        self._publisher.bind(dags=dags, routing=routing, own_url=own_url)

    # -- the reconciler's side ----------------------------------------------------------------

    def restore(
        self,
        namespace: str,
        topic: str,
        layout: SegmentLayout,
        subscriptions_status: list[dict[str, Any]],
        *,
        grace_period: float,
        strategies: Mapping[str, str],
        queues: Collection[str] | None = None,
    ) -> None:
        """Take the topic's subscriptions over: ``strategies`` maps each Stream subscription of
        the spec to its assignment strategy, ``queues`` names its Queue subscriptions.

        For a topic the hub does not serve yet (a new leader), every subscription is restored
        from its entry in ``subscriptions_status`` with a fresh grace period for every consumer.
        A Stream subscription without an entry is new: its subscription exists on no sealed
        segment (the operator creates cursors on active segments only), so the sealed segments
        count as drained for it. A Queue subscription without an entry drains nothing up front:
        its consumers attach to the sealed segments too, and one that the subscription never had
        (or has drained) ends at once, so no backlog can be skipped. The status is written back
        when restoring changed it.

        ``queues=None`` (the caller does not say which subscriptions are Queue ones): a Queue
        subscription is served once something names it - a status entry of type ``Queue``, or a
        queue consumer registering for a name that is not a Stream subscription - and is not
        dropped here.

        Calling it again for a served topic applies spec changes: new subscriptions are added,
        removed ones are dropped (their consumers are closed with ``INVALID_SUBSCRIPTION``), a
        changed strategy or grace period rebuilds the coordinator from its own state with the
        connected consumers re-registered, and a newer layout is applied. Live state is kept
        otherwise (it is newer than anything persisted).
        """
        now = self._clock()
        state = self._registry.get(namespace, topic)
        if state is None:
            state = _Topic(namespace, topic, layout, grace_period)
            self._registry.add(state)
            log.info(
                "consumer hub: serving topic %s/%s (epoch %d, subscriptions %s)",
                namespace,
                topic,
                layout.epoch,
                sorted(strategies),
                extra=_fields("topic.served", state, epoch=layout.epoch),
            )
        elif layout.epoch > state.layout.epoch:
            self.layout_changed(namespace, topic, layout)
        state.grace_period = grace_period
        state.queues_known = queues is not None
        entries = {
            str(e["name"]): e
            for e in subscriptions_status
            if isinstance(e, Mapping) and isinstance(e.get("name"), str)
        }
        if queues is None:
            queue_names = {n for n, sub in state.subscriptions.items() if sub.queue} | {
                n for n, e in entries.items() if e.get("type") == "Queue"
            }
        else:
            queue_names = set(queues)
        queue_names -= set(strategies)
        changed = False
        for name, sub in sorted(state.subscriptions.items()):
            if name not in (queue_names if sub.queue else strategies):
                self._subscriptions.drop(
                    state, state.subscriptions.pop(name), "removed from the spec"
                )
                changed = True
        for name in sorted(queue_names | set(strategies)):
            strategy = strategies.get(name)
            current = state.subscriptions.get(name)
            if current is None:
                added = self._subscriptions.add(state, name, entries.get(name), strategy, now)
                changed = changed or bool(added.coordinator.sessions())
            elif grace_period != current.coordinator.grace_period or (
                strategy is not None
                and isinstance(current.coordinator, SubscriptionCoordinator)
                and AssignmentStrategy(strategy) is not current.coordinator.strategy
            ):
                self._subscriptions.rebuild(state, current, strategy, now)
        if changed:
            self._counts.notify(state)

    def initial_entries(
        self,
        namespace: str,
        topic: str,
        layout: SegmentLayout,
        subscriptions_status: list[dict[str, Any]],
        *,
        grace_period: float,
        strategies: Mapping[str, str],
        queues: Collection[str],
    ) -> list[dict[str, Any]]:
        """The ``status.subscriptions`` entries :meth:`restore` (same arguments) would write
        for a topic this hub does not serve yet: one per subscription of the spec without an
        entry, as a new coordinator persists it. A new topic's Ready status carries them, so
        the restore that follows finds them and writes nothing (one topic status write less
        per new topic). Nothing for a served topic: there the hub's live state is newer."""
        if self._registry.get(namespace, topic) is not None:
            return []
        have = {e.get("name") for e in subscriptions_status if isinstance(e, Mapping)}
        state = _Topic(namespace, topic, layout, grace_period)
        names = set(queues) | set(strategies)
        return [
            subscription_entry(name, self._subscriptions.new_status(state, strategies.get(name)))
            for name in sorted(names - have)
        ]

    def layout_changed(self, namespace: str, topic: str, layout: SegmentLayout) -> None:
        """A split, merge, rebucket or prune committed ``layout``."""
        state = self._registry.get(namespace, topic)
        if state is None:
            return
        if layout.epoch < state.layout.epoch:
            log.debug(
                "consumer hub: %s: ignoring layout epoch %d (at %d)",
                state,
                layout.epoch,
                state.layout.epoch,
            )
            return
        state.layout = layout
        now = self._clock()
        counts = self._publisher.bucket_counts(state)
        for sub in list(state.subscriptions.values()):
            self._driver.event(state, sub, lambda c: c.layout_changed(layout, now, buckets=counts))

    def segment_drained(
        self, namespace: str, topic: str, subscription: str, segment_id: int
    ) -> None:
        """The controller observed that ``subscription`` has no backlog on sealed
        ``segment_id`` (e.g. from the broker's stats)."""
        state = self._registry.get(namespace, topic)
        sub = state.subscriptions.get(subscription) if state else None
        if state is None or sub is None:
            return
        now = self._clock()
        result = self._driver.event(state, sub, lambda c: c.drained(None, segment_id, now))
        if result.rejected:
            log.info(
                "consumer hub: %s %s: drain of %d not applied: %s",
                state,
                sub.name,
                segment_id,
                result.rejected,
                extra=_fields("drain.rejected", state, sub, segment=segment_id),
            )

    def forget_topic(self, namespace: str, topic: str) -> None:
        """Stop serving the topic (deleted, or its shard lost): close its consumer sockets with a
        redirect to the new leader when known (else a retry hint) and drop its state. Pending
        persists are cancelled: this replica may no longer write the topic."""
        state = self._registry.pop(namespace, topic)
        if state is None:
            return
        deleted = (
            self._publisher.dags is not None and self._publisher.dags.dag(namespace, topic) is None
        )
        log.info(
            "consumer hub: no longer serving %s (%s)",
            state,
            "deleted" if deleted else "moved",
            extra=_fields("topic.forgotten", state, deleted=deleted),
        )
        for sub in state.subscriptions.values():
            self._driver.stop(sub)
            for session in sub.sessions.values():
                if deleted:
                    session.finish(
                        ErrorMessage(
                            code=ErrorCode.UNKNOWN_TOPIC,
                            message=f"topic {state} was deleted",
                        ),
                        CloseCode.UNKNOWN_TOPIC,
                        "topic deleted",
                    )
                else:
                    self._publisher.redirect(session, "the topic's controller leadership moved")
            sub.sessions.clear()
        if state.watch_task is not None:
            state.watch_task.cancel()

    async def close(self) -> None:
        """Close every consumer socket (``GOING_AWAY`` with a retry hint), let in-flight
        persists finish for a few seconds, and drop all state."""
        if self._registry.closed:
            return
        self._registry.closed = True
        sessions: list[ConsumerConnection] = []
        persists: list[asyncio.Task[None]] = []
        watches: list[asyncio.Task[None]] = []
        for state in self._registry:
            if state.watch_task is not None:
                watches.append(state.watch_task)
                state.watch_task.cancel()
            for sub in state.subscriptions.values():
                if sub.timer is not None:
                    sub.timer.cancel()
                if (persist := self._persister.in_flight(sub)) is not None:
                    persists.append(persist)
                for session in sub.sessions.values():
                    session.finish(
                        RedirectMessage(
                            retry_after=_RETRY_AFTER, reason="controller shutting down"
                        ),
                        CloseCode.GOING_AWAY,
                        "controller shutting down",
                    )
                    sessions.append(session)
        self._registry.clear()
        pending = [s.writer for s in sessions] + persists
        if pending:
            _, late = await asyncio.wait(pending, timeout=_CLOSE_FLUSH_TIMEOUT)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await asyncio.gather(*watches, return_exceptions=True)

    # -- queries ------------------------------------------------------------------------------

    def serves(self, namespace: str, topic: str) -> bool:
        return self._registry.serves(namespace, topic)

    def coordinator(self, namespace: str, topic: str, subscription: str) -> Coordinator[Any] | None:
        return self._registry.coordinator(namespace, topic, subscription)

    def positions(self, namespace: str, topic: str, subscription: str) -> dict[str, dict[int, int]]:
        """See :meth:`TopicRegistry.positions`."""
        return self._registry.positions(namespace, topic, subscription)

    def stream_consumer_counts(self, namespace: str, topic: str) -> dict[str, int]:
        """See :meth:`ConsumerCounts.stream_consumer_counts` (the auto-scaler's input)."""
        return self._counts.stream_consumer_counts(namespace, topic)

    def key_shared_samples(self) -> list[metrics.KeySharedSample]:
        """PIP-486 metrics of every consumable segment of every Stream subscription served."""
        return self._counts.key_shared_samples()

    def session_count(self) -> int:
        return self._counts.session_count()

    # -- the session layer's side (see :class:`ConsumerSessions`) -----------------------------

    def open_session(
        self, namespace: str, topic: str, message: RegisterMessage, ws: web.WebSocketResponse
    ) -> ConsumerConnection:
        """Register a consumer on a new socket; raises :class:`SessionRejected`."""
        return self._sessions.open(namespace, topic, message, ws)

    def report_drained(
        self, session: ConsumerConnection, segment_id: int, buckets: Collection[int] | None = None
    ) -> None:
        self._sessions.report_drained(session, segment_id, buckets)

    def report_released(
        self, session: ConsumerConnection, segment_id: int, buckets: Collection[int]
    ) -> None:
        self._sessions.report_released(session, segment_id, buckets)

    def record_position(self, session: ConsumerConnection, segment_id: int, position: int) -> None:
        self._sessions.record_position(session, segment_id, position)

    def unregister(self, session: ConsumerConnection) -> None:
        self._sessions.unregister(session)

    def session_closed(self, session: ConsumerConnection) -> None:
        self._sessions.session_closed(session)
