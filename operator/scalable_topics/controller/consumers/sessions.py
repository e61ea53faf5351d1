"""The session layer's side of the hub (:class:`ConsumerSessions`): a consumer registering on
a socket, its drain, release and position reports, and its leaving (unregistered or
disconnected)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection
from typing import Any

from aiohttp import web

from ...core.assignment import Coordinator, CoordinatorResult, SubscriptionCoordinator
from ...core.resources import SUBSCRIPTION_NAME_PATTERN
from ...core.sessions import (
    CloseCode,
    ConsumerType,
    ErrorCode,
    ErrorMessage,
    RedirectMessage,
    RegisterMessage,
)
from .connection import _RETRY_AFTER, ConsumerConnection, SessionRejected, log
from .driver import CoordinatorDriver
from .lifecycle import SubscriptionLifecycle
from .publishing import AssignmentPublisher
from .registry import TopicRegistry
from .state import _fields, _Subscription, _Topic


class ConsumerSessions:
    """Consumer sessions on the topics of ``registry``. ``clock`` gives Unix seconds."""

    def __init__(
        self,
        registry: TopicRegistry,
        publisher: AssignmentPublisher,
        subscriptions: SubscriptionLifecycle,
        driver: CoordinatorDriver,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._publisher = publisher
        self._subscriptions = subscriptions
        self._driver = driver
        self._clock = clock

    def open(
        self, namespace: str, topic: str, message: RegisterMessage, ws: web.WebSocketResponse
    ) -> ConsumerConnection:
        """Register a consumer on a new socket; raises :class:`SessionRejected`.

        A consumer name that already has a socket: the newer session wins, the older one is
        closed with ``SUPERSEDED``.
        """
        state = self._registry.get(namespace, topic)
        if state is None or self._registry.closed:
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
        self._driver.sync_buckets(state, sub, self._publisher.bucket_counts(state))
        log.info(
            "consumer hub: %s %s: consumer %s registered (%s, session %d)",
            state,
            sub.name,
            message.consumer,
            message.consumer_type.value,
            session.id,
            extra=_fields("consumer.registered", state, sub, message.consumer, session=session.id),
        )
        self._driver.event(state, sub, lambda c: c.register(message.consumer, now))
        self._driver.ensure_watch(state)
        return session

    def report_drained(
        self, session: ConsumerConnection, segment_id: int, buckets: Collection[int] | None = None
    ) -> None:
        found = self._registry.current(session)
        if found is None:
            return
        state, sub = found
        now = self._clock()
        coordinator = sub.coordinator
        if buckets is not None and isinstance(coordinator, SubscriptionCoordinator):
            result = self._driver.event(
                state,
                sub,
                lambda _: coordinator.drained(session.consumer, segment_id, now, buckets),
            )
        else:
            result = self._driver.event(
                state, sub, lambda c: c.drained(session.consumer, segment_id, now)
            )
        if result.rejected:
            session.send(
                ErrorMessage(code=ErrorCode.REJECTED, message=result.rejected, fatal=False)
            )

    def report_released(
        self, session: ConsumerConnection, segment_id: int, buckets: Collection[int]
    ) -> None:
        """The consumer let go of withheld buckets: hand them to their new owner."""
        found = self._registry.current(session)
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
        self._driver.event(
            state, sub, lambda _: coordinator.released(session.consumer, segment_id, buckets, now)
        )

    def record_position(self, session: ConsumerConnection, segment_id: int, position: int) -> None:
        found = self._registry.current(session)
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

    def _leave(
        self,
        session: ConsumerConnection,
        what: str,
        event: Callable[[Coordinator[Any], float], CoordinatorResult],
    ) -> None:
        """The consumer of ``session`` unregistered or disconnected (if the session still was
        current)."""
        found = self._registry.current(session)
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
        self._driver.event(state, sub, lambda c: event(c, now))

    def _subscription_for(self, state: _Topic, message: RegisterMessage) -> _Subscription:
        """The subscription a registration is for, if its consumer type fits it; a Queue
        subscription not known yet is added when the caller did not name the Queue
        subscriptions (see :meth:`ConsumerHub.restore`)."""
        name = message.subscription
        queue = message.consumer_type is ConsumerType.QUEUE
        sub = state.subscriptions.get(name)
        if (
            sub is None
            and queue
            and not state.queues_known
            and re.fullmatch(SUBSCRIPTION_NAME_PATTERN, name) is not None
        ):
            sub = self._subscriptions.add(state, name, None, None, self._clock())
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
