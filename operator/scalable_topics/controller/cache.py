"""What a replica knows: the latest ScalableTopics, Segments and broker pods, fed by kopf's
watches. Every replica keeps one, leader or not, so any replica can serve DAG watch sessions.

DAG watchers get the *latest* DAG: a slow watcher skips intermediate versions and never holds
up the others or the watch stream.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from ..core.jsontypes import JsonObj
from ..core.layout import SegmentLayout
from ..core.resources import LABEL_TOPIC
from ..core.sessions import DagMessage, dag_message
from ..core.transfer import DRAIN_ANNOTATION, SegmentRate, recorded_broker
from .brokers import BrokerPod

Key = tuple[str, str]


_PARSED_KEPT = 100_000
_parsed: dict[str, tuple[str, SegmentLayout | None]] = {}
"""uid → (resourceVersion, its layout): a topic's layout is parsed once per version, not at
every pass and evaluation over it (a tenth of the operator's CPU at rest with 10,000 topics)."""


def layout_of(topic: Mapping[str, Any]) -> SegmentLayout | None:
    raw = (topic.get("status") or {}).get("layout")
    if not raw:
        return None
    meta = topic.get("metadata") or {}
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if uid and version:
        held = _parsed.get(uid)
        if held is not None and held[0] == version:
            return held[1]
    try:
        layout: SegmentLayout | None = SegmentLayout.from_metadata(raw)
    except ValueError:
        layout = None
    if uid and version:
        if len(_parsed) >= _PARSED_KEPT:
            _parsed.clear()
        _parsed[uid] = (version, layout)
    return layout


def pod_broker(pod: Mapping[str, Any], port: int = 8080, scheme: str = "http") -> BrokerPod | None:
    """A broker pod's URL and readiness from its (dict) body.

    ``https`` (brokers serving TLS) names a StatefulSet pod by its stable DNS name
    ``<hostname>.<subdomain>.<namespace>.svc``, which a certificate can list ahead of time
    (a wildcard for the headless Service), unlike a pod IP; a pod without ``spec.subdomain``
    keeps its IP (docs/security.md)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    ip = status.get("podIP")
    if not ip:
        return None
    host = str(ip)
    if scheme == "https" and spec.get("hostname") and spec.get("subdomain"):
        host = f"{spec['hostname']}.{spec['subdomain']}.{meta.get('namespace')}.svc"
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return BrokerPod(
        name=str(meta.get("name")),
        url=f"{scheme}://{host}:{port}",
        ready=ready,
        # A terminating pod is drained like an annotated one: it may hand its segments off
        # before it stops (the broker's --handoff-wait-s), so it stays a move's source.
        cordoned=bool(
            (meta.get("annotations") or {}).get(DRAIN_ANNOTATION) or meta.get("deletionTimestamp")
        ),
        namespace=str(meta.get("namespace") or ""),
        uid=str(meta.get("uid") or ""),
    )


def _older(meta: Mapping[str, Any], held: Mapping[str, Any]) -> bool:
    """Whether ``meta`` is an earlier version of the same object as ``held``. The resource
    versions of one resource compare as positive integers (apimachinery's
    ``resourceversion.CompareResourceVersion``); one that is not well formed is taken as newer."""
    if meta.get("uid") != held.get("uid"):
        return False
    try:
        return int(meta.get("resourceVersion", "")) < int(held.get("resourceVersion", ""))
    except ValueError:
        return False


DELETED_KEPT = 4096
"""Deleted Segments' uids the cache remembers, so that a stale copy does not come back."""


class TopicCache:
    def __init__(
        self,
        *,
        controller_url: Callable[[str, str], str],
        broker_port: int = 8080,
        broker_scheme: str = "http",
        on_broker_change: Callable[[], None] | None = None,
    ) -> None:
        self._controller_url = controller_url
        self.broker_port = broker_port
        self.broker_scheme = broker_scheme
        self.topics: dict[Key, JsonObj] = {}
        self.segments: dict[Key, dict[int, JsonObj]] = defaultdict(dict)
        self.segments_complete = False
        """Every Segment the API server held when this replica started came through the
        watch before it led a shard (``controller.initialsync``), and the watch has kept them
        since: a topic with none here has none at all, unless a Segment was created after that
        by another writer, which only the topic's previous leader can have been, at least a
        Lease duration ago. Even then a new topic's Segments come out the same: the first
        layout is fixed by the spec, a create of an existing Segment returns it, and the
        placement on record wins (``OperationExecutor.ensure_segment``)."""
        self.brokers: dict[str, BrokerPod] = {}
        self._changed: dict[Key, asyncio.Event] = defaultdict(asyncio.Event)
        self._fingerprints: dict[Key, Any] = {}
        self.on_broker_change = on_broker_change
        """Called when a broker pod appears, goes, moves or changes readiness."""
        self._placed: dict[tuple[str, str, int], str] = {}
        """(namespace, topic, segment id) → broker pod of every segment that is not Sealed."""
        self._load: Counter[str] = Counter()
        self._rated: dict[tuple[str, str, int], SegmentRate] = {}
        """Every Active segment with a broker and a produce rate above zero: the only ones load
        shedding weighs (a zero rate adds nothing to a broker's load and cannot be moved for
        it), so an idle cluster of 20,000 segments costs its once-a-second decision nothing."""
        self._transferring: set[tuple[str, str, int]] = set()
        """Segments whose status has a transfer (a move runs: no load shedding meanwhile)."""
        self._deleted: dict[str, None] = {}
        """Uids of the last ``DELETED_KEPT`` Segments the watch saw deleted (oldest first)."""

    # -- feeding -------------------------------------------------------------------------------

    def put_topic(self, body: JsonObj) -> None:
        """Keep ``body`` unless the cache holds a later version of the topic: the answer of the
        operator's own write can come before the watch event of an earlier one, and a
        reconcile pass starts from this copy (``TopicReconciler``)."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        held = self.topics.get(key)
        if held is not None and _older(meta, held["metadata"]):
            return
        self.topics[key] = body
        self._maybe_notify(key)

    def drop_topic(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self.topics.pop(key, None)
        for sid in self.segments.pop(key, {}):
            self._place((namespace, name, sid), None)
            self._index_rate((namespace, name, sid), {}, None)
        self._fingerprints.pop(key, None)
        self._notify(key)

    def put_segment(self, body: JsonObj) -> None:
        meta = body["metadata"]
        topic = (meta.get("labels") or {}).get(LABEL_TOPIC) or body.get("spec", {}).get("topic")
        if not topic:
            return
        if meta.get("uid") and str(meta["uid"]) in self._deleted:
            # A listing or a write answered before the deletion, read after its watch event:
            # keeping it would hide the loss from every later pass (nothing recovers it).
            return
        key = (meta["namespace"], str(topic))
        sid = int(body["spec"]["segmentId"])
        self.segments[key][sid] = body
        pod = recorded_broker(body)
        sealed = (body.get("status") or {}).get("state") == "Sealed"
        self._place((key[0], key[1], sid), None if sealed else pod)
        self._index_rate((key[0], key[1], sid), body.get("status") or {}, pod)
        self._maybe_notify(key)

    def _index_rate(self, segment: tuple[str, str, int], status: JsonObj, pod: str | None) -> None:
        """Index a Segment's ``status`` on broker ``pod`` (``{}`` and ``None``: it is gone)."""
        if status.get("transfer"):
            self._transferring.add(segment)
        else:
            self._transferring.discard(segment)
        try:
            rate = float((status.get("load") or {}).get("msgRateIn") or 0.0)
        except (TypeError, ValueError):
            rate = 0.0
        if status.get("state") == "Active" and pod and rate > 0:
            self._rated[segment] = SegmentRate(segment, pod, rate)
        else:
            self._rated.pop(segment, None)

    def active_rates(self) -> list[SegmentRate] | None:
        """The produce rate and broker of every Active segment with a rate above zero, for load
        shedding; ``None`` while a segment has a transfer (one move at a time). Kept as Segments
        come and go: the decision does not rescan every Segment."""
        if self._transferring:
            return None
        return list(self._rated.values())

    def _place(self, segment: tuple[str, str, int], pod: str | None) -> None:
        before = self._placed.pop(segment, None)
        if before is not None:
            self._load[before] -= 1
            if self._load[before] <= 0:
                del self._load[before]
        if pod is not None:
            self._placed[segment] = pod
            self._load[pod] += 1

    def drop_segment(self, body: JsonObj) -> None:
        meta = body["metadata"]
        topic = (meta.get("labels") or {}).get(LABEL_TOPIC) or body.get("spec", {}).get("topic")
        if not topic:
            return
        if meta.get("uid"):
            self._deleted[str(meta["uid"])] = None
            if len(self._deleted) > DELETED_KEPT:
                del self._deleted[next(iter(self._deleted))]
        key = (meta["namespace"], str(topic))
        sid = int(body["spec"]["segmentId"])
        cached_uid = (self.segments.get(key, {}).get(sid) or {}).get("metadata", {}).get("uid")
        if meta.get("uid") and cached_uid and cached_uid != meta["uid"]:
            return  # already written again (a new uid) before this event came
        self.segments.get(key, {}).pop(sid, None)
        self._place((key[0], key[1], sid), None)
        self._index_rate((key[0], key[1], sid), {}, None)
        self._maybe_notify(key)

    def put_pod(self, body: JsonObj) -> None:
        broker = pod_broker(body, self.broker_port, self.broker_scheme)
        name = str(body["metadata"]["name"])
        before = self.brokers.get(name)
        if broker is None:
            self.brokers.pop(name, None)
        else:
            self.brokers[name] = broker
        if before != broker and self.on_broker_change is not None:
            self.on_broker_change()

    def drop_pod(self, body: JsonObj) -> None:
        if self.brokers.pop(str(body["metadata"]["name"]), None) and self.on_broker_change:
            self.on_broker_change()

    # -- queries -------------------------------------------------------------------------------

    def segment_brokers(self, namespace: str, topic: str) -> dict[int, str]:
        return {
            sid: str(((seg.get("status") or {}).get("broker") or {}).get("url") or "")
            for sid, seg in self.segments.get((namespace, topic), {}).items()
        }

    def broker_url_of(self, segment: Mapping[str, Any]) -> str:
        """Where a Segment lives: ``status.broker.url``, else the URL of the pod it was placed
        on at creation (a crash may come before the status is written); "" when unknown."""
        url = ((segment.get("status") or {}).get("broker") or {}).get("url")
        if url:
            return str(url)
        pod = self.brokers.get(recorded_broker(segment) or "")
        return pod.url if pod is not None else ""

    def segment_buckets(self, namespace: str, topic: str) -> dict[int, int]:
        return {
            sid: int(seg["spec"].get("buckets") or 1)
            for sid, seg in self.segments.get((namespace, topic), {}).items()
        }

    def broker_load(self) -> dict[str, int]:
        """Segments not Sealed per broker pod, for least-loaded placement (kept up to date as
        Segments come and go: placing thousands of segments must not rescan all of them)."""
        return dict(self._load)

    def dag(self, namespace: str, name: str) -> DagMessage | None:
        topic = self.topics.get((namespace, name))
        if topic is None:
            return None
        layout = layout_of(topic)
        if layout is None:
            return None
        return dag_message(
            namespace,
            name,
            layout,
            brokers=self.segment_brokers(namespace, name),
            buckets=self.segment_buckets(namespace, name),
            controller_url=self._controller_url(namespace, name),
        )

    async def watch(self, namespace: str, name: str) -> AsyncIterator[DagMessage]:
        key = (namespace, name)
        last: Any = None
        while True:
            event = self._changed[key]
            message = self.dag(namespace, name)
            if message is None:
                if key not in self.topics:
                    return
            elif self._fingerprint(key) != last:
                last = self._fingerprint(key)
                yield message
            await event.wait()

    # -- change notification -------------------------------------------------------------------

    def _fingerprint(self, key: Key) -> Any:
        topic = self.topics.get(key)
        layout = (topic or {}).get("status", {}).get("layout") or {}
        return (
            layout.get("epoch"),
            tuple(sorted(self.segment_brokers(*key).items())),
            tuple(sorted(self.segment_buckets(*key).items())),
            self._controller_url(*key),
        )

    def _maybe_notify(self, key: Key) -> None:
        fingerprint = self._fingerprint(key)
        if self._fingerprints.get(key) != fingerprint:
            self._fingerprints[key] = fingerprint
            self._notify(key)

    def _notify(self, key: Key) -> None:
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()

    def notify_controller_changed(self) -> None:
        """Leadership moved: every watcher gets the new controller URL."""
        for key in list(self.topics):
            self._maybe_notify(key)
