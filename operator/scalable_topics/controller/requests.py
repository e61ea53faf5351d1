"""Manual requests (the ``scalabletopics.io/request`` annotation; docs/operator.md, "Manual
requests") and the planning of split/merge/rebucket operations, which the auto-scaler shares.
Every status change is a ``core.topicstatus`` function; this module decides and does the I/O.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from ..core.jsontypes import JsonObj
from ..core.layout import SegmentLayout
from ..core.operation import Operation, plan_merge, plan_rebucket, plan_split
from ..core.resources import (
    ANNOTATION_REQUEST,
    LastRequest,
    ResourceValidationError,
    ScalableTopicSpec,
    format_time,
    parse_manual_request,
    parse_topic_spec,
)
from ..core.topicstatus import (
    find_handled,
    read_status,
    reject_request,
    remember_request,
    report_handled,
)
from .cache import TopicCache
from .kube import KubeApi
from .protocol import EventSink, OperationExecutor, OperationRejected
from .segments import SegmentKeeper
from .status import change_topic_status
from .transfer import MoveRejected, TransferExecutor

log = logging.getLogger(__name__)


class Planner(Protocol):
    """:meth:`RequestHandler.plan`, as the auto-scaler calls it."""

    def __call__(
        self,
        topic: JsonObj,
        layout: SegmentLayout,
        op: str,
        segments: list[int],
        at: int | None,
        *,
        source: str,
        reason: str,
        request_id: str | None = None,
        buckets: int | None = None,
        spec: ScalableTopicSpec | None = None,
    ) -> Operation: ...


class RequestHandler:
    """The reconciler's requests collaborator (one per replica)."""

    def __init__(
        self,
        kube: KubeApi,
        cache: TopicCache,
        executor: OperationExecutor,
        transfers: TransferExecutor,
        segments: SegmentKeeper,
        *,
        events: EventSink,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.executor = executor
        self.transfers = transfers
        self.segments = segments
        self.events = events
        self.clock = clock

    async def handle(
        self, topic: JsonObj, layout: SegmentLayout, spec: ScalableTopicSpec
    ) -> JsonObj:
        """Serve the topic's request annotation, once per request id: a move through the
        transfer protocol, a split or merge through the operation protocol, anything invalid
        or impossible rejected with the reason in ``status.lastRequest``."""
        annotations = topic["metadata"].get("annotations") or {}
        raw = annotations.get(ANNOTATION_REQUEST)
        if not raw:
            return topic
        status = read_status(topic.get("status"))
        last_id = status.last_request.id if status.last_request is not None else None
        try:
            request = parse_manual_request(raw)
        except ResourceValidationError as exc:
            request_id, op = loose_request(raw)
            if last_id == request_id:
                return topic
            return await self._reject(topic, request_id, op, str(exc))
        if last_id == request.id:
            return topic
        if (topic.get("status") or {}).get("operation"):
            return topic
        handled = find_handled(status, request.id)
        if handled is not None:
            return await self._already_handled(topic, handled)
        # The outcome of this request will replace lastRequest (the protocol's commit writes
        # only that): the previous one goes into the history first.
        meta = topic["metadata"]
        topic = await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: remember_request(status),
            topic=topic,
        )
        op = request.op.value
        if op == "move":
            try:
                return await self.transfers.start(topic, request)
            except MoveRejected as exc:
                return await self._reject(topic, request.id, op, str(exc))
        try:
            operation = self.plan(
                topic,
                layout,
                op,
                request.segments,
                request.at,
                source="manual",
                reason=f"request {request.id}",
                request_id=request.id,
                spec=spec,
            )
        except ValueError as exc:
            return await self._reject(topic, request.id, op, str(exc))
        try:
            return await self.executor.start(topic, operation)
        except OperationRejected as exc:
            return await self._reject(topic, request.id, op, str(exc))

    def plan(
        self,
        topic: JsonObj,
        layout: SegmentLayout,
        op: str,
        segments: list[int],
        at: int | None,
        *,
        source: str,
        reason: str,
        request_id: str | None = None,
        buckets: int | None = None,
        spec: ScalableTopicSpec | None = None,
    ) -> Operation:
        """Plan a split/merge/rebucket on the current layout; ``ValueError`` says why it can't
        be. ``spec`` is the topic's, parsed (read from ``topic`` when not given)."""
        if spec is None:
            spec = parse_topic_spec(topic.get("spec"))
        counts = self.segments.bucket_counts(topic, layout, spec)
        op_id = f"{op}-{uuid.uuid4().hex[:8]}"
        fields: dict[str, Any] = {
            "source": source,
            "reason": reason,
            "request_id": request_id,
            "started_at": format_time(self.clock()),
        }
        if op == "split":
            if len(segments) != 1:
                raise ValueError(f"a split names exactly one segment, got {segments}")
            return plan_split(
                op_id,
                layout,
                segments[0],
                parent_buckets=counts.get(segments[0], 1),
                at=at,
                **fields,
            )
        if op == "merge":
            return plan_merge(
                op_id,
                layout,
                segments,
                parent_buckets={s: counts.get(s, 1) for s in segments},
                **fields,
            )
        if op == "rebucket":
            return plan_rebucket(op_id, layout, segments, buckets=buckets or 1, **fields)
        raise ValueError(f"unknown operation {op!r}")

    async def _reject(self, topic: JsonObj, request_id: str, op: str, message: str) -> JsonObj:
        meta = topic["metadata"]
        log.warning(
            "%s/%s: request %s (%s) rejected: %s",
            meta["namespace"],
            meta["name"],
            request_id,
            op,
            message,
        )
        now = self.clock()
        topic = await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: reject_request(status, request_id, op, message, now),
            topic=topic,
        )
        await self.events(topic, "Warning", "RequestRejected", f"request {request_id}: {message}")
        return topic

    async def _already_handled(self, topic: JsonObj, handled: LastRequest) -> JsonObj:
        """A request id found in the history was applied again: it is not executed again, and
        ``lastRequest`` reports it with its original outcome (which also keeps later passes from
        reporting it twice)."""
        meta = topic["metadata"]
        topic = await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: report_handled(status, handled),
            topic=topic,
        )
        when = handled.completed_at or "an unknown time"
        await self.events(
            topic,
            "Normal",
            "RequestAlreadyHandled",
            f"request {handled.id} was already handled ({handled.result.value} at {when}), "
            "not executed again",
        )
        return topic


def loose_request(raw: str) -> tuple[str, str]:
    """The id and op of a request annotation that failed validation, for its ``Rejected``
    outcome: what the request said where it can be read (a one-segment merge is recorded as a
    merge), ``"invalid"`` for an unreadable id and ``"split"`` for an unreadable op (the status
    schema knows only split and merge)."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return "invalid", "split"
    if not isinstance(data, dict):
        return "invalid", "split"
    op = data.get("op")
    return str(data.get("id", "invalid")), op if op in ("split", "merge") else "split"
