"""The topics and subscriptions the hub serves (:class:`TopicRegistry`), shared by the hub and
its collaborators, and the read-only queries on them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...core.assignment import Coordinator
from .connection import ConsumerConnection
from .state import _Subscription, _Topic


class TopicRegistry:
    """Topic key → its :class:`_Topic` state, and whether the hub has closed (once closed it
    serves nothing again and arms no timers)."""

    def __init__(self) -> None:
        self._topics: dict[tuple[str, str], _Topic] = {}
        self.closed = False

    def get(self, namespace: str, topic: str) -> _Topic | None:
        return self._topics.get((namespace, topic))

    def add(self, state: _Topic) -> None:
        self._topics[state.key] = state

    def pop(self, namespace: str, topic: str) -> _Topic | None:
        return self._topics.pop((namespace, topic), None)

    def clear(self) -> None:
        self._topics.clear()

    def __iter__(self) -> Iterator[_Topic]:
        return iter(self._topics.values())

    def live(self, state: _Topic, sub: _Subscription | None = None) -> bool:
        """``state`` (and ``sub`` of it) is still the one served, not a forgotten or replaced
        one."""
        if sub is not None and state.subscriptions.get(sub.name) is not sub:
            return False
        return self._topics.get(state.key) is state

    def serves(self, namespace: str, topic: str) -> bool:
        return (namespace, topic) in self._topics

    def subscription(self, namespace: str, topic: str, subscription: str) -> _Subscription | None:
        state = self._topics.get((namespace, topic))
        return state.subscriptions.get(subscription) if state else None

    def coordinator(self, namespace: str, topic: str, subscription: str) -> Coordinator[Any] | None:
        sub = self.subscription(namespace, topic, subscription)
        return sub.coordinator if sub else None

    def positions(self, namespace: str, topic: str, subscription: str) -> dict[str, dict[int, int]]:
        """Consumer → segment → the last position it reported (in memory only: positions are
        informational and change too often to be written to the resource)."""
        sub = self.subscription(namespace, topic, subscription)
        if sub is None:
            return {}
        return {name: dict(p) for name, p in sub.positions.items()}

    def current(self, session: ConsumerConnection) -> tuple[_Topic, _Subscription] | None:
        """The topic and subscription of ``session`` while it is still its consumer's current
        session."""
        state = self._topics.get((session.namespace, session.topic))
        sub = state.subscriptions.get(session.subscription) if state else None
        if state is None or sub is None or sub.sessions.get(session.consumer) is not session:
            return None
        return state, sub
