"""Compare-and-swap status updates: read, change, write with the read ``resourceVersion``; on a
409 read again and re-apply the same change. A change that alters nothing writes nothing.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from ..core.jsontypes import JsonObj
from ..core.resources import ScalableTopicStatus
from ..core.topicstatus import apply_change
from . import metrics
from .cache import TopicCache
from .kube import Conflict, KubeApi, NotFound

log = logging.getLogger(__name__)

StatusChange = Callable[[dict[str, Any], JsonObj], None]
"""Mutates the status dict in place; gets the whole (fresh) object to look at."""

TypedChange = Callable[[ScalableTopicStatus, JsonObj], ScalableTopicStatus]
"""Returns the new typed status (a ``core.topicstatus`` function); gets the whole (fresh)
object to look at."""

_VOLATILE = ("lastTransitionTime",)


def _comparable(status: Any) -> Any:
    """Status without the timestamps of conditions (a re-asserted condition is no change)."""
    if isinstance(status, dict):
        return {k: _comparable(v) for k, v in status.items() if k not in _VOLATILE}
    if isinstance(status, list):
        return [_comparable(v) for v in status]
    return status


def typed(change: TypedChange) -> StatusChange:
    """``change`` as an in-place change of the status dict: read typed, changed, written back
    with :func:`~scalable_topics.core.topicstatus.write_status` (what it does not change is kept
    exactly as it was)."""

    def apply(status: dict[str, Any], obj: JsonObj) -> None:
        new = apply_change(status, lambda typed_status: change(typed_status, obj))
        status.clear()
        status.update(new)

    return apply


class TopicGone(Exception):
    """The topic was deleted while we were working on it."""


async def update_topic_status(
    kube: KubeApi,
    namespace: str,
    name: str,
    change: StatusChange,
    *,
    topic: JsonObj | None = None,
    attempts: int = 8,
) -> JsonObj:
    """Apply ``change`` to the topic's status with CAS; returns the object as last written/read.

    ``topic`` is an already-fresh copy to try first (saves a read when the caller has one).
    """
    current = topic
    for _ in range(attempts):
        if current is None:
            current = await kube.get_topic(namespace, name)
            if current is None:
                raise TopicGone(f"{namespace}/{name}")
        before = current.get("status") or {}
        after = copy.deepcopy(before)
        change(after, current)
        if _comparable(after) == _comparable(before):
            return current
        body = dict(current)
        body["status"] = after
        try:
            written = await kube.replace_topic_status(body)
        except Conflict:
            metrics.STATUS_WRITES.labels("ScalableTopic", "conflict").inc()
            current = None
            continue
        except NotFound:
            raise TopicGone(f"{namespace}/{name}") from None
        metrics.STATUS_WRITES.labels("ScalableTopic", "written").inc()
        return written
    raise Conflict(f"{namespace}/{name}: status kept changing under us ({attempts} attempts)")


async def change_topic_status(
    kube: KubeApi,
    namespace: str,
    name: str,
    change: TypedChange,
    *,
    topic: JsonObj | None = None,
) -> JsonObj:
    """:func:`update_topic_status` with a typed change (``core.topicstatus``)."""
    return await update_topic_status(kube, namespace, name, typed(change), topic=topic)


async def reread_segment(kube: KubeApi, cache: TopicCache, segment: JsonObj) -> JsonObj | None:
    """A Segment whose compare-and-swap lost (a broker's load report is a status write every
    few seconds), as the API server has it now, also into the cache; ``None``: gone."""
    meta = segment["metadata"]
    fresh = await kube.get_segment(meta["namespace"], meta["name"])
    if fresh is not None:
        cache.put_segment(fresh)
    return fresh
