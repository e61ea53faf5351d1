"""Writing subscription status (:class:`StatusPersister`): one coalescing writer task per
subscription, so the latest status wins and a failed write is retried with backoff."""

from __future__ import annotations

import asyncio
from typing import Any

from .connection import _PERSIST_BACKOFF, PersistFn, log
from .state import _Subscription, _Topic


class StatusPersister:
    """``persist(namespace, topic, subscription, status)`` writes a subscription's
    :meth:`~Coordinator.to_status` into ``status.subscriptions`` (the reconciler's CAS write)."""

    def __init__(self, persist: PersistFn) -> None:
        self._persist_fn = persist

    def write(self, state: _Topic, sub: _Subscription, status: dict[str, Any]) -> None:
        sub.persist_pending = status
        if sub.persist_task is None or sub.persist_task.done():
            sub.persist_task = asyncio.create_task(
                self._persist_loop(state, sub), name=f"persist-{state}-{sub.name}"
            )

    def cancel(self, sub: _Subscription) -> None:
        """Drop the subscription's pending and in-flight writes."""
        if sub.persist_task is not None:
            sub.persist_task.cancel()
        sub.persist_pending = None

    @staticmethod
    def in_flight(sub: _Subscription) -> asyncio.Task[None] | None:
        if sub.persist_task is not None and not sub.persist_task.done():
            return sub.persist_task
        return None

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
