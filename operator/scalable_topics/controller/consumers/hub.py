"""The consumer hub proper (:class:`ConsumerHub`): the reconciler's side (restore, layout
changes, drains, counts), the session layer's side (register, reports, leave) and the
internals that carry out the coordinators' results."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from aiohttp import web

from ...core.assignment import (
    AssignmentStrategy,
    ConsumerAssignment,
    Coordinator,
    CoordinatorResult,
    QueueCoordinator,
    SubscriptionCoordinator,
)
from ...core.layout import SegmentLayout
from ...core.resources import SUBSCRIPTION_NAME_PATTERN
from ...core.sessions import (
    CloseCode,
    ConsumerType,
    ErrorCode,
    ErrorMessage,
    RedirectMessage,
    RegisterMessage,
    assignment_message,
    consumers_path,
)
from .. import metrics
from ..interfaces import DagSource, Routing
from .connection import (
    _CLOSE_FLUSH_TIMEOUT,
    _PERSIST_BACKOFF,
    _RETRY_AFTER,
    ConsumerConnection,
    ConsumersChangedFn,
    PersistFn,
    SessionRejected,
    leader_elsewhere,
    log,
)
from .state import _differs, _fields, _Subscription, _Topic


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
        self._persist_fn = persist
        self._on_consumers_changed = on_consumers_changed
        self._clock = clock
        self._dags = dags
        self._routing = routing
        self._own_url = ""
        self._topics: dict[tuple[str, str], _Topic] = {}
        self._closed = False
        metrics.KEY_SHARED.sources.add(self)

    def bind(self, *, dags: DagSource, routing: Routing, own_url: str = "") -> None:
        """Give the hub the replica's topic cache (broker URLs for assignments, broker moves)
        and its shard routing (redirect targets), unless given at construction, and this
        replica's URL (never a redirect target). ``make_app`` calls this."""
        if self._dags is None:
            self._dags = dags
        if self._routing is None:
            self._routing = routing
        self._own_url = own_url.rstrip("/")

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
        key = (namespace, topic)
        state = self._topics.get(key)
        if state is None:
            state = _Topic(namespace, topic, layout, grace_period)
            self._topics[key] = state
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
                self._drop_subscription(
                    state, state.subscriptions.pop(name), "removed from the spec"
                )
                changed = True
        for name in sorted(queue_names | set(strategies)):
            strategy = strategies.get(name)
            current = state.subscriptions.get(name)
            if current is None:
                added = self._add_subscription(state, name, entries.get(name), strategy, now)
                changed = changed or bool(added.coordinator.sessions())
            elif grace_period != current.coordinator.grace_period or (
                strategy is not None
                and isinstance(current.coordinator, SubscriptionCoordinator)
                and AssignmentStrategy(strategy) is not current.coordinator.strategy
            ):
                self._rebuild(state, current, strategy, now)
        if changed:
            self._notify(state)

    def layout_changed(self, namespace: str, topic: str, layout: SegmentLayout) -> None:
        """A split, merge, rebucket or prune committed ``layout``."""
        state = self._topics.get((namespace, topic))
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
        counts = self._bucket_counts(state)
        for sub in list(state.subscriptions.values()):
            self._event(state, sub, lambda c: c.layout_changed(layout, now, buckets=counts))

    def segment_drained(
        self, namespace: str, topic: str, subscription: str, segment_id: int
    ) -> None:
        """The controller observed that ``subscription`` has no backlog on sealed
        ``segment_id`` (e.g. from the broker's stats)."""
        state = self._topics.get((namespace, topic))
        sub = state.subscriptions.get(subscription) if state else None
        if state is None or sub is None:
            return
        now = self._clock()
        result = self._event(state, sub, lambda c: c.drained(None, segment_id, now))
        if result.rejected:
            log.info(
                "consumer hub: %s %s: drain of %d not applied: %s",
                state,
                sub.name,
                segment_id,
                result.rejected,
                extra=_fields("drain.rejected", state, sub, segment=segment_id),
            )

    def stream_consumer_counts(self, namespace: str, topic: str) -> dict[str, int]:
        """Subscription → its registered ordered consumers (connected or in their grace
        period): the stream and checkpoint consumers of a Stream subscription, the ordered
        workers of a Queue subscription (unordered ones never register). The auto-scaler's
        consumer-count rule treats both alike (issue 14: ordered queue workers outnumbering
        buckets trigger the same rule)."""
        state = self._topics.get((namespace, topic))
        if state is None:
            return {}
        return {name: len(sub.coordinator.sessions()) for name, sub in state.subscriptions.items()}

    def forget_topic(self, namespace: str, topic: str) -> None:
        """Stop serving the topic (deleted, or its shard lost): close its consumer sockets with a
        redirect to the new leader when known (else a retry hint) and drop its state. Pending
        persists are cancelled: this replica may no longer write the topic."""
        state = self._topics.pop((namespace, topic), None)
        if state is None:
            return
        deleted = self._dags is not None and self._dags.dag(namespace, topic) is None
        log.info(
            "consumer hub: no longer serving %s (%s)",
            state,
            "deleted" if deleted else "moved",
            extra=_fields("topic.forgotten", state, deleted=deleted),
        )
        for sub in state.subscriptions.values():
            self._stop_subscription(sub)
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
                    self._redirect(session, "the topic's controller leadership moved")
            sub.sessions.clear()
        if state.watch_task is not None:
            state.watch_task.cancel()

    async def close(self) -> None:
        """Close every consumer socket (``GOING_AWAY`` with a retry hint), let in-flight
        persists finish for a few seconds, and drop all state."""
        if self._closed:
            return
        self._closed = True
        sessions: list[ConsumerConnection] = []
        persists: list[asyncio.Task[None]] = []
        watches: list[asyncio.Task[None]] = []
        for state in self._topics.values():
            if state.watch_task is not None:
                watches.append(state.watch_task)
                state.watch_task.cancel()
            for sub in state.subscriptions.values():
                if sub.timer is not None:
                    sub.timer.cancel()
                if sub.persist_task is not None and not sub.persist_task.done():
                    persists.append(sub.persist_task)
                for session in sub.sessions.values():
                    session.finish(
                        RedirectMessage(
                            retry_after=_RETRY_AFTER, reason="controller shutting down"
                        ),
                        CloseCode.GOING_AWAY,
                        "controller shutting down",
                    )
                    sessions.append(session)
        self._topics.clear()
        pending = [s.writer for s in sessions] + persists
        if pending:
            _, late = await asyncio.wait(pending, timeout=_CLOSE_FLUSH_TIMEOUT)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await asyncio.gather(*watches, return_exceptions=True)

    # -- queries ------------------------------------------------------------------------------

    def serves(self, namespace: str, topic: str) -> bool:
        return (namespace, topic) in self._topics

    def coordinator(self, namespace: str, topic: str, subscription: str) -> Coordinator[Any] | None:
        state = self._topics.get((namespace, topic))
        sub = state.subscriptions.get(subscription) if state else None
        return sub.coordinator if sub else None

    def positions(self, namespace: str, topic: str, subscription: str) -> dict[str, dict[int, int]]:
        """Consumer → segment → the last position it reported (in memory only: positions are
        informational and change too often to be written to the resource)."""
        state = self._topics.get((namespace, topic))
        sub = state.subscriptions.get(subscription) if state else None
        if sub is None:
            return {}
        return {name: dict(p) for name, p in sub.positions.items()}

    def key_shared_samples(self) -> list[metrics.KeySharedSample]:
        """PIP-486 metrics of every consumable segment of every Stream subscription served."""
        samples = []
        for state in self._topics.values():
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
        return sum(
            len(sub.sessions) for t in self._topics.values() for sub in t.subscriptions.values()
        )

    # -- the session layer's side -------------------------------------------------------------

    def open_session(
        self, namespace: str, topic: str, message: RegisterMessage, ws: web.WebSocketResponse
    ) -> ConsumerConnection:
        """Register a consumer on a new socket; raises :class:`SessionRejected`.

        A consumer name that already has a socket: the newer session wins, the older one is
        closed with ``SUPERSEDED``.
        """
        state = self._topics.get((namespace, topic))
        if state is None or self._closed:
            raise SessionRejected(
                CloseCode.UNAVAILABLE,
                RedirectMessage(
                    retry_after=_RETRY_AFTER,
                    reason=f"the controller is not serving consumers of {namespace}/{topic} yet",
                ),
            )
        sub = self._subscription_for(state, message)
        session = ConsumerConnection(
            ws,
            namespace=namespace,
            topic=topic,
            subscription=sub.name,
            consumer=message.consumer,
            consumer_type=message.consumer_type,
        )
        old = sub.sessions.get(message.consumer)
        sub.sessions[message.consumer] = session
        if old is not None:
            log.info(
                "consumer hub: %r replaced by a newer session %d",
                old,
                session.id,
                extra=_fields("consumer.superseded", state, sub, old.consumer, session=old.id),
            )
            old.finish(
                ErrorMessage(
                    code=ErrorCode.SUPERSEDED,
                    message=f"consumer {message.consumer!r} registered again on another session",
                ),
                CloseCode.SUPERSEDED,
                "replaced by a newer session",
            )
        now = self._clock()
        self._sync_buckets(state, sub, self._bucket_counts(state))
        log.info(
            "consumer hub: %s %s: consumer %s registered (%s, session %d)",
            state,
            sub.name,
            message.consumer,
            message.consumer_type.value,
            session.id,
            extra=_fields("consumer.registered", state, sub, message.consumer, session=session.id),
        )
        self._event(state, sub, lambda c: c.register(message.consumer, now))
        self._ensure_watch(state)
        return session

    def report_drained(
        self, session: ConsumerConnection, segment_id: int, buckets: Collection[int] | None = None
    ) -> None:
        found = self._current(session)
        if found is None:
            return
        state, sub = found
        now = self._clock()
        coordinator = sub.coordinator
        if buckets is not None and isinstance(coordinator, SubscriptionCoordinator):
            result = self._event(
                state,
                sub,
                lambda _: coordinator.drained(session.consumer, segment_id, now, buckets),
            )
        else:
            result = self._event(state, sub, lambda c: c.drained(session.consumer, segment_id, now))
        if result.rejected:
            session.send(
                ErrorMessage(code=ErrorCode.REJECTED, message=result.rejected, fatal=False)
            )

    def report_released(
        self, session: ConsumerConnection, segment_id: int, buckets: Collection[int]
    ) -> None:
        """The consumer let go of withheld buckets: hand them to their new owner."""
        found = self._current(session)
        if found is None:
            return
        state, sub = found
        coordinator = sub.coordinator
        if not isinstance(coordinator, SubscriptionCoordinator):
            session.send(
                ErrorMessage(
                    code=ErrorCode.REJECTED,
                    message="released is for stream and checkpoint consumers",
                    fatal=False,
                )
            )
            return
        now = self._clock()
        log.info(
            "consumer hub: %s %s: consumer %s released segment %d buckets %s",
            state,
            sub.name,
            session.consumer,
            segment_id,
            sorted(buckets),
            extra=_fields("buckets.released", state, sub, session.consumer, segment=segment_id),
        )
        self._event(
            state, sub, lambda _: coordinator.released(session.consumer, segment_id, buckets, now)
        )

    def record_position(self, session: ConsumerConnection, segment_id: int, position: int) -> None:
        found = self._current(session)
        if found is not None:
            found[1].positions.setdefault(session.consumer, {})[segment_id] = position

    def unregister(self, session: ConsumerConnection) -> None:
        """The consumer leaves for good: redistribute its units now and close its socket."""
        self._leave(session, "unregistered", lambda c, now: c.unregister(session.consumer, now))
        session.finish(None, CloseCode.NORMAL, "unregistered")

    def session_closed(self, session: ConsumerConnection) -> None:
        """The socket is gone: the consumer's grace period starts (if it still was current)."""
        self._leave(session, "disconnected", lambda c, now: c.disconnect(session.consumer, now))
        session.finish(None, CloseCode.GOING_AWAY, "session closed")

    # -- internals ----------------------------------------------------------------------------

    def _current(self, session: ConsumerConnection) -> tuple[_Topic, _Subscription] | None:
        state = self._topics.get((session.namespace, session.topic))
        sub = state.subscriptions.get(session.subscription) if state else None
        if state is None or sub is None or sub.sessions.get(session.consumer) is not session:
            return None
        return state, sub

    def _leave(
        self,
        session: ConsumerConnection,
        what: str,
        event: Callable[[Coordinator[Any], float], CoordinatorResult],
    ) -> None:
        """The consumer of ``session`` unregistered or disconnected (if the session still was
        current)."""
        found = self._current(session)
        if found is None:
            return
        state, sub = found
        del sub.sessions[session.consumer]
        log.info(
            "consumer hub: %s %s: consumer %s %s (grace %.1fs)",
            state,
            sub.name,
            session.consumer,
            what,
            sub.coordinator.grace_period if what == "disconnected" else 0.0,
            extra=_fields(f"consumer.{what}", state, sub, session.consumer),
        )
        now = self._clock()
        self._event(state, sub, lambda c: event(c, now))

    def _subscription_for(self, state: _Topic, message: RegisterMessage) -> _Subscription:
        """The subscription a registration is for, if its consumer type fits it; a Queue
        subscription not known yet is added when the caller did not name the Queue
        subscriptions (see :meth:`restore`)."""
        name = message.subscription
        queue = message.consumer_type is ConsumerType.QUEUE
        sub = state.subscriptions.get(name)
        if (
            sub is None
            and queue
            and not state.queues_known
            and re.fullmatch(SUBSCRIPTION_NAME_PATTERN, name) is not None
        ):
            sub = self._add_subscription(state, name, None, None, self._clock())
        if sub is not None and sub.queue == queue:
            return sub
        if sub is not None:
            kind, use = (
                ("Queue", "a queue consumer")
                if sub.queue
                else ("Stream", "a stream or checkpoint consumer")
            )
            text = f"subscription {name!r} of topic {state} is a {kind} subscription: use {use}"
        else:
            kind = "Queue" if queue else "Stream"
            known = ", ".join(n for n, s in sorted(state.subscriptions.items()) if s.queue == queue)
            text = (
                f"subscription {name!r} is not a {kind} subscription of topic {state} "
                f"({kind} subscriptions: {known or 'none'})"
            )
        raise SessionRejected(
            CloseCode.INVALID_SUBSCRIPTION,
            ErrorMessage(code=ErrorCode.INVALID_SUBSCRIPTION, message=text),
        )

    def _add_subscription(
        self,
        state: _Topic,
        name: str,
        entry: Mapping[str, Any] | None,
        strategy: str | None,
        now: float,
    ) -> _Subscription:
        """Serve subscription ``name`` (a Stream one with ``strategy``, else a Queue one),
        restored from its status ``entry`` when it has a usable one; the status is written when
        it differs."""
        coordinator: Coordinator[Any] | None = None
        if entry is not None:
            try:
                coordinator = self._coordinator_from(state, entry, strategy, now)
            except ValueError as exc:
                log.warning(
                    "consumer hub: %s %s: persisted registrations unusable (%s); starting afresh",
                    state,
                    name,
                    exc,
                    extra=_fields("subscription.status_unusable", state, subscription=name),
                )
        sub = _Subscription(name, coordinator or self._new_coordinator(state, strategy))
        state.subscriptions[name] = sub
        status = sub.coordinator.to_status()
        if entry is None or _differs(entry, status):
            self._persist(state, sub, status)
        self._arm(state, sub)
        return sub

    def _new_coordinator(self, state: _Topic, strategy: str | None) -> Coordinator[Any]:
        """A new subscription's coordinator. A Stream subscription exists on no sealed segment
        (the operator creates cursors on active segments only), so they count as drained; a
        Queue one drains nothing up front (see :meth:`restore`)."""
        if strategy is None:
            return QueueCoordinator(
                state.layout, buckets=self._bucket_counts(state), grace_period=state.grace_period
            )
        sealed = [i for i, s in state.layout.segments.items() if not s.active]
        return SubscriptionCoordinator(
            state.layout,
            strategy=strategy,
            grace_period=state.grace_period,
            drained=sealed,
            buckets=self._bucket_counts(state),
        )

    def _coordinator_from(
        self, state: _Topic, status: Mapping[str, Any], strategy: str | None, now: float
    ) -> Coordinator[Any]:
        """A Stream (``strategy``) or Queue (``None``) subscription's coordinator restored from
        ``status`` under the topic's layout, grace period and bucket counts."""
        if strategy is None:
            return QueueCoordinator.from_status(
                status,
                state.layout,
                now,
                buckets=self._bucket_counts(state),
                grace_period=state.grace_period,
            )
        return SubscriptionCoordinator.from_status(
            status,
            state.layout,
            now,
            grace_period=state.grace_period,
            strategy=strategy,
            buckets=self._bucket_counts(state),
        )

    def _rebuild(self, state: _Topic, sub: _Subscription, strategy: str | None, now: float) -> None:
        log.info(
            "consumer hub: %s %s: strategy %s, grace %.1fs",
            state,
            sub.name,
            strategy or "queue",
            state.grace_period,
            extra=_fields("subscription.reconfigured", state, sub, strategy=strategy or "queue"),
        )
        before = set(sub.coordinator.sessions())
        sub.coordinator = self._coordinator_from(state, sub.coordinator.to_status(), strategy, now)
        for name in sorted(sub.sessions):
            self._apply(state, sub, sub.coordinator.register(name, now), before)
        self._arm(state, sub)

    def _bucket_counts(self, state: _Topic) -> dict[int, int]:
        """Bucket count of every segment the topic's DAG knows it of."""
        dag = self._dags.dag(state.namespace, state.name) if self._dags else None
        if dag is None:
            return {}
        return {s.segment_id: s.buckets for s in dag.segments if s.buckets is not None}

    def _sync_buckets(self, state: _Topic, sub: _Subscription, counts: Mapping[int, int]) -> None:
        """Give a subscription the bucket counts it does not know yet."""
        coordinator = sub.coordinator
        known = coordinator.buckets
        new = {s: n for s, n in counts.items() if known.get(s) != n}
        if new:
            now = self._clock()
            self._event(state, sub, lambda _: coordinator.buckets_changed(new, now))

    def _event(
        self,
        state: _Topic,
        sub: _Subscription,
        event: Callable[[Coordinator[Any]], CoordinatorResult],
    ) -> CoordinatorResult:
        before = set(sub.coordinator.sessions())
        result = event(sub.coordinator)
        self._apply(state, sub, result, before)
        return result

    def _apply(
        self, state: _Topic, sub: _Subscription, result: CoordinatorResult, before: set[str]
    ) -> None:
        for effect in result.push:
            session = sub.sessions.get(effect.consumer)
            if session is not None:
                self._push(state, sub, session, effect.assignment)
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
            self._persist(state, sub, result.persist.status)
        after = set(sub.coordinator.sessions())
        for gone in set(sub.positions) - after:
            del sub.positions[gone]
        self._arm(state, sub)
        if after != before:
            self._notify(state)

    def _brokers(self, state: _Topic) -> Mapping[int, str]:
        dag = self._dags.dag(state.namespace, state.name) if self._dags else None
        return dag.brokers() if dag is not None else {}

    def _push(
        self,
        state: _Topic,
        sub: _Subscription,
        session: ConsumerConnection,
        assignment: ConsumerAssignment,
        brokers: Mapping[int, str] | None = None,
    ) -> None:
        urls = self._brokers(state) if brokers is None else brokers
        message = assignment_message(state.namespace, state.name, sub.name, assignment, urls)
        session.sent_brokers = {s.segment_id: s.broker_url for s in message.segments}
        session.send(message)

    def _notify(self, state: _Topic) -> None:
        try:
            self._on_consumers_changed(state.namespace, state.name)
        except Exception:
            log.exception("consumer hub: %s: on_consumers_changed failed", state)

    def _arm(self, state: _Topic, sub: _Subscription) -> None:
        if sub.timer is not None:
            sub.timer.cancel()
            sub.timer = None
        deadline = sub.coordinator.next_deadline()
        if deadline is None or self._closed:
            return
        delay = max(0.0, deadline - self._clock())
        sub.timer = asyncio.get_running_loop().call_later(delay, self._expire, state, sub)

    def _expire(self, state: _Topic, sub: _Subscription) -> None:
        sub.timer = None
        if state.subscriptions.get(sub.name) is not sub or self._topics.get(state.key) is not state:
            return
        now = self._clock()
        self._event(state, sub, lambda c: c.tick(now))

    def _persist(self, state: _Topic, sub: _Subscription, status: dict[str, Any]) -> None:
        sub.persist_pending = status
        if sub.persist_task is None or sub.persist_task.done():
            sub.persist_task = asyncio.create_task(
                self._persist_loop(state, sub), name=f"persist-{state}-{sub.name}"
            )

    async def _persist_loop(self, state: _Topic, sub: _Subscription) -> None:
        backoff, max_backoff = _PERSIST_BACKOFF
        while sub.persist_pending is not None:
            status, sub.persist_pending = sub.persist_pending, None
            try:
                await self._persist_fn(state.namespace, state.name, sub.name, status)
                backoff = _PERSIST_BACKOFF[0]
            except Exception:
                log.exception(
                    "consumer hub: %s %s: persisting registrations failed; retrying in %.1fs",
                    state,
                    sub.name,
                    backoff,
                )
                if sub.persist_pending is None:
                    sub.persist_pending = status
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max_backoff)

    def _stop_subscription(self, sub: _Subscription) -> None:
        if sub.timer is not None:
            sub.timer.cancel()
            sub.timer = None
        if sub.persist_task is not None:
            sub.persist_task.cancel()
        sub.persist_pending = None

    def _drop_subscription(self, state: _Topic, sub: _Subscription, why: str) -> None:
        log.info(
            "consumer hub: %s: subscription %s %s",
            state,
            sub.name,
            why,
            extra=_fields("subscription.dropped", state, sub),
        )
        self._stop_subscription(sub)
        for session in sub.sessions.values():
            session.finish(
                ErrorMessage(
                    code=ErrorCode.INVALID_SUBSCRIPTION,
                    message=f"subscription {sub.name!r} was {why}",
                ),
                CloseCode.INVALID_SUBSCRIPTION,
                f"subscription {why}",
            )
        sub.sessions.clear()

    def _redirect(self, session: ConsumerConnection, reason: str) -> None:
        url = None
        if self._routing is not None:
            leader = leader_elsewhere(
                self._routing, self._own_url, session.namespace, session.topic
            )
            if leader:
                url = leader + consumers_path(session.namespace, session.topic)
        session.finish(
            RedirectMessage(url=url, retry_after=_RETRY_AFTER, reason=reason),
            CloseCode.MOVED if url else CloseCode.UNAVAILABLE,
            reason,
        )

    def _ensure_watch(self, state: _Topic) -> None:
        if self._dags is None or (state.watch_task is not None and not state.watch_task.done()):
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
        dags = self._dags
        if dags is None:
            return
        try:
            async for dag in dags.watch(state.namespace, state.name):
                if self._topics.get(state.key) is not state:
                    return
                counts = {s.segment_id: s.buckets for s in dag.segments if s.buckets is not None}
                brokers = dag.brokers()
                for sub in list(state.subscriptions.values()):
                    self._sync_buckets(state, sub, counts)
                    for session in sub.sessions.values():
                        if any(brokers.get(i) != url for i, url in session.sent_brokers.items()):
                            assignment = sub.coordinator.assignment(session.consumer)
                            self._push(state, sub, session, assignment, brokers)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("consumer hub: %s: DAG watch failed", state)
