"""What the reconciler and the auto-scaler share about the topics a replica leads: one lock per
topic (whoever mutates it holds it) and each topic's resolved auto-scale policy (written by
the reconcile pass that resolves it, read by the auto-scaler)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from ..core.policy import Resolution

Key = tuple[str, str]


class TopicLocks:
    """One ``asyncio.Lock`` per topic, held by a reconcile pass or an auto-scale operation."""

    def __init__(self) -> None:
        self._locks: dict[Key, asyncio.Lock] = {}

    def __call__(self, key: Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())


class ResolvedPolicies:
    """Each led topic's effective auto-scale policy with every knob's source; a topic whose
    policy levels do not combine (or that is gone) has none, and is not auto-scaled."""

    def __init__(self) -> None:
        self._resolutions: dict[Key, Resolution] = {}

    def put(self, key: Key, resolution: Resolution | None) -> None:
        if resolution is None:
            self._resolutions.pop(key, None)
        else:
            self._resolutions[key] = resolution

    def get(self, key: Key) -> Resolution | None:
        return self._resolutions.get(key)

    def drop(self, key: Key) -> None:
        self._resolutions.pop(key, None)

    def items(self) -> Iterator[tuple[Key, Resolution]]:
        """A snapshot: safe to iterate while a pass changes the policies."""
        return iter(list(self._resolutions.items()))
