"""Serving, reconfiguring and dropping a subscription (:class:`SubscriptionLifecycle`): its
coordinator built new or restored from the persisted status, rebuilt when the strategy or grace
period changes, and its consumers closed when it leaves the spec."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.assignment import Coordinator, QueueCoordinator, SubscriptionCoordinator
from ...core.sessions import CloseCode, ErrorCode, ErrorMessage
from .connection import log
from .driver import CoordinatorDriver
from .persistence import StatusPersister
from .publishing import AssignmentPublisher
from .state import _differs, _fields, _Subscription, _Topic


class SubscriptionLifecycle:
    """Adds, rebuilds and drops the subscriptions of a served topic."""

    def __init__(
        self,
        publisher: AssignmentPublisher,
        persister: StatusPersister,
        driver: CoordinatorDriver,
    ) -> None:
        self._publisher = publisher
        self._persister = persister
        self._driver = driver

    def add(
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
            self._persister.write(state, sub, status)
        self._driver.arm(state, sub)
        return sub

    def new_status(self, state: _Topic, strategy: str | None) -> dict[str, Any]:
        """The status a new subscription's coordinator persists (what :meth:`add` writes for a
        subscription without an entry)."""
        return self._new_coordinator(state, strategy).to_status()

    def _new_coordinator(self, state: _Topic, strategy: str | None) -> Coordinator[Any]:
        """A new subscription's coordinator. A Stream subscription exists on no sealed segment
        (the operator creates cursors on active segments only), so they count as drained; a
        Queue one drains nothing up front (see :meth:`ConsumerHub.restore`)."""
        if strategy is None:
            return QueueCoordinator(
                state.layout,
                buckets=self._publisher.bucket_counts(state),
                grace_period=state.grace_period,
            )
        sealed = [i for i, s in state.layout.segments.items() if not s.active]
        return SubscriptionCoordinator(
            state.layout,
            strategy=strategy,
            grace_period=state.grace_period,
            drained=sealed,
            buckets=self._publisher.bucket_counts(state),
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
                buckets=self._publisher.bucket_counts(state),
                grace_period=state.grace_period,
            )
        return SubscriptionCoordinator.from_status(
            status,
            state.layout,
            now,
            grace_period=state.grace_period,
            strategy=strategy,
            buckets=self._publisher.bucket_counts(state),
        )

    def rebuild(self, state: _Topic, sub: _Subscription, strategy: str | None, now: float) -> None:
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
            self._driver.apply(state, sub, sub.coordinator.register(name, now), before)
        self._driver.arm(state, sub)

    def drop(self, state: _Topic, sub: _Subscription, why: str) -> None:
        log.info(
            "consumer hub: %s: subscription %s %s",
            state,
            sub.name,
            why,
            extra=_fields("subscription.dropped", state, sub),
        )
        self._driver.stop(sub)
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
