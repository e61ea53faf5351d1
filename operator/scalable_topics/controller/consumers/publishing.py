"""Sending to consumers what the coordinators decided (:class:`AssignmentPublisher`):
assignment messages carrying the segments' broker URLs from the replica's topic cache, and
redirects to the topic's leader."""

from __future__ import annotations

from collections.abc import Mapping

from ...core.assignment import ConsumerAssignment
from ...core.sessions import CloseCode, RedirectMessage, assignment_message, consumers_path
from ..interfaces import DagSource, Routing
from .connection import _RETRY_AFTER, ConsumerConnection, leader_elsewhere
from .state import _Subscription, _Topic


class AssignmentPublisher:
    """Assignment and redirect messages of the hub's consumer sockets. ``dags`` (broker URLs,
    bucket counts) and ``routing`` (redirect targets) may come later through :meth:`bind`."""

    def __init__(self, dags: DagSource | None = None, routing: Routing | None = None) -> None:
        self.dags = dags
        self._routing = routing
        self._own_url = ""

    def bind(self, *, dags: DagSource, routing: Routing, own_url: str = "") -> None:
        if self.dags is None:
            self.dags = dags
        if self._routing is None:
            self._routing = routing
        self._own_url = own_url.rstrip("/")

    def bucket_counts(self, state: _Topic) -> dict[int, int]:
        """Bucket count of every segment the topic's DAG knows it of."""
        dag = self.dags.dag(state.namespace, state.name) if self.dags else None
        if dag is None:
            return {}
        return {s.segment_id: s.buckets for s in dag.segments if s.buckets is not None}

    def brokers(self, state: _Topic) -> Mapping[int, str]:
        dag = self.dags.dag(state.namespace, state.name) if self.dags else None
        return dag.brokers() if dag is not None else {}

    def push(
        self,
        state: _Topic,
        sub: _Subscription,
        session: ConsumerConnection,
        assignment: ConsumerAssignment,
        brokers: Mapping[int, str] | None = None,
    ) -> None:
        urls = self.brokers(state) if brokers is None else brokers
        message = assignment_message(state.namespace, state.name, sub.name, assignment, urls)
        session.sent_brokers = {s.segment_id: s.broker_url for s in message.segments}
        session.send(message)

    def redirect(self, session: ConsumerConnection, reason: str) -> None:
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
