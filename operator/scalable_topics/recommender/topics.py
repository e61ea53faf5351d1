"""What the recommender needs from a ScalableTopic object, read without trusting it.

Pure functions over the object as the API server returns it (a ``dict``): the current layout
(``status.layout``), the effective auto-scale policy (``core.policy.resolve_policy``, the same
resolution as the controller's: ``spec.autoScale``, the namespace's annotation, the cluster
ConfigMap, the built-in defaults), the stream subscriptions' consumer counts
(``status.subscriptions``), and entry-bucket counts from the topic's Segment objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.policy import (
    DEFAULT_POLICY,
    AutoScalePolicy,
    ClusterDefaults,
    resolve_policy,
)
from scalable_topics.core.resources import (
    LABEL_TOPIC,
    SubscriptionType,
    parse_topic_spec,
)


@dataclass(frozen=True)
class TopicState:
    """A topic as the recommender sees it; ``problem`` says why it cannot be planned."""

    namespace: str
    name: str
    generation: int | None
    layout: SegmentLayout | None
    policy: AutoScalePolicy
    stream_consumers: Mapping[str, int] = field(default_factory=dict)
    problem: str | None = None
    notes: tuple[str, ...] = ()
    """Levels of the policy that were ignored (an invalid namespace annotation), and why."""


def stream_consumers(obj: Mapping[str, Any]) -> dict[str, int]:
    """Registered consumers per Stream subscription (the type from status, else from spec)."""
    spec_types = {
        str(s.get("name")): str(s.get("type"))
        for s in (obj.get("spec") or {}).get("subscriptions") or []
        if isinstance(s, Mapping)
    }
    counts: dict[str, int] = {}
    for sub in (obj.get("status") or {}).get("subscriptions") or []:
        if not isinstance(sub, Mapping) or not sub.get("name"):
            continue
        name = str(sub["name"])
        kind = sub.get("type") or spec_types.get(name)
        if kind != SubscriptionType.STREAM.value:
            continue
        consumers = sub.get("consumers") or []
        counts[name] = len(consumers) if isinstance(consumers, list | Mapping) else 0
    return counts


def topic_state(
    obj: Mapping[str, Any],
    defaults: AutoScalePolicy = DEFAULT_POLICY,
    *,
    namespace_policy: str | None = None,
    cluster: ClusterDefaults | None = None,
) -> TopicState:
    """``namespace_policy`` is the text of the namespace's annotation, ``cluster`` the cluster
    ConfigMap's level."""
    metadata = obj.get("metadata") or {}
    namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
    generation = metadata.get("generation")
    problem = None
    notes: tuple[str, ...] = ()
    try:
        spec = parse_topic_spec(obj.get("spec") or {})
        knobs = spec.auto_scale.knobs() if spec.auto_scale is not None else None
        resolution = resolve_policy(knobs, namespace_policy, cluster, defaults)
        policy, notes = resolution.policy, resolution.problems
    except ValueError as exc:
        policy, problem = defaults, f"invalid spec: {exc}"
    layout = None
    raw_layout = (obj.get("status") or {}).get("layout")
    if problem is None:
        if not raw_layout:
            problem = "no status.layout yet"
        else:
            try:
                layout = SegmentLayout.from_metadata(raw_layout)
            except ValueError as exc:
                problem = f"invalid status.layout: {exc}"
    return TopicState(
        namespace=namespace,
        name=name,
        generation=int(generation) if isinstance(generation, int) else None,
        layout=layout,
        policy=policy,
        stream_consumers=stream_consumers(obj),
        problem=problem,
        notes=notes,
    )


def segment_buckets(segments: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[int, int]]:
    """Bucket counts by topic from Segment objects (``spec.topic``/label, ``spec.segmentId``,
    ``spec.buckets``)."""
    result: dict[tuple[str, str], dict[int, int]] = {}
    for seg in segments:
        metadata = seg.get("metadata") or {}
        spec = seg.get("spec") or {}
        topic = spec.get("topic") or (metadata.get("labels") or {}).get(LABEL_TOPIC)
        segment_id, buckets = spec.get("segmentId"), spec.get("buckets", 1)
        if not topic or not isinstance(segment_id, int) or not isinstance(buckets, int):
            continue
        key = (str(metadata.get("namespace", "")), str(topic))
        result.setdefault(key, {})[segment_id] = buckets
    return result
