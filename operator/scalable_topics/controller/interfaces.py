"""What the consumer hub and the session endpoints need of the rest of the replica, as
protocols: the topic cache's DAGs and the shard leadership. Both ``consumers`` and ``sessions``
use them, and neither imports the other for them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from ..core.sessions import DagMessage


class DagSource(Protocol):
    """The replica's view of topics' DAGs (implemented by the operator's topic cache)."""

    def dag(self, namespace: str, name: str) -> DagMessage | None:
        """The current DAG; ``None`` if the topic is unknown."""
        ...

    def watch(self, namespace: str, name: str) -> AsyncIterator[DagMessage]:
        """Yield on every change, latest wins: a slow watcher skips intermediate versions and
        never blocks other watchers or the cache. It should yield the current DAG first (the
        session drops a message equal to the one it sent last), so that nothing changed between
        :meth:`dag` and the start of the watch is lost, and it ends when the topic is deleted.
        """
        ...


class Routing(Protocol):
    """Who leads a topic's shard (implemented by ``ShardLeadership``)."""

    def leads(self, namespace: str, name: str) -> bool: ...

    def leader_url(self, namespace: str, name: str) -> str:
        """Base URL of the leader ("" when unknown)."""
        ...
