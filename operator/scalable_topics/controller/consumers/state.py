"""The hub's per-topic and per-subscription state, and the helpers its log records and
persistence checks use."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...core.assignment import (
    Coordinator,
    QueueCoordinator,
)
from ...core.layout import SegmentLayout
from ...core.subscriptions import SubscriptionType
from .connection import ConsumerConnection


@dataclass(eq=False)
class _Subscription:
    name: str
    coordinator: Coordinator[Any]
    sessions: dict[str, ConsumerConnection] = field(default_factory=dict)
    positions: dict[str, dict[int, int]] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    persist_pending: dict[str, Any] | None = None
    persist_task: asyncio.Task[None] | None = None

    @property
    def queue(self) -> bool:
        return isinstance(self.coordinator, QueueCoordinator)


@dataclass(eq=False)
class _Topic:
    namespace: str
    name: str
    layout: SegmentLayout
    grace_period: float
    subscriptions: dict[str, _Subscription] = field(default_factory=dict)
    watch_task: asyncio.Task[None] | None = None
    queues_known: bool = False
    """The caller named the topic's Queue subscriptions (else they are served as they come)."""

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def _fields(
    event: str,
    state: _Topic,
    sub: _Subscription | None = None,
    consumer: str | None = None,
    **more: object,
) -> dict[str, object]:
    """``extra`` of a structured log record (``core.logfmt``): the event and what it is about,
    ``topic`` as ``namespace/name``."""
    fields: dict[str, object] = {"event": event, "topic": str(state)}
    if sub is not None:
        fields["subscription"] = sub.name
    if consumer is not None:
        fields["consumer"] = consumer
    fields.update(more)
    return fields


def _normalised(status: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a subscription status that :meth:`Coordinator.to_status` writes, in its
    canonical form, to tell whether a persisted status is current."""
    consumers = status.get("consumers") or []
    return {
        "layoutEpoch": status.get("layoutEpoch"),
        "consumers": sorted(
            (
                {"name": c.get("name"), "segments": sorted(c.get("segments") or [])}
                for c in consumers
                if isinstance(c, Mapping)
            ),
            key=lambda c: str(c["name"]),
        ),
        "drainedSegments": sorted(status.get("drainedSegments") or []),
    }


def subscription_entry(name: str, coordinator_status: Mapping[str, Any]) -> dict[str, Any]:
    """A subscription's ``status.subscriptions`` entry: its coordinator's status with its name
    and type (``Stream`` unless the status says ``Queue``, as a queue coordinator's does)."""
    return {"name": name, "type": SubscriptionType.STREAM.value, **coordinator_status}


def _differs(entry: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    try:
        return _normalised(entry) != _normalised(status)
    except TypeError:  # mixed types in a hand-edited status: not the canonical form
        return True
