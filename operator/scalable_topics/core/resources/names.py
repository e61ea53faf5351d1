"""The resources' identity: API group and version, kinds, plural and short names, the labels,
annotations and owner references the operator writes, and the limits on names and counts.
"""

from __future__ import annotations

from typing import Any

from ..policy import NAMESPACE_POLICY_ANNOTATION

GROUP = "scalabletopics.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "scalabletopics"

TOPIC_KIND = "ScalableTopic"
TOPIC_PLURAL = "scalabletopics"
TOPIC_SINGULAR = "scalabletopic"
TOPIC_SHORT_NAMES = ("stopic", "st")

SEGMENT_KIND = "Segment"
SEGMENT_PLURAL = "segments"
SEGMENT_SINGULAR = "segment"
SEGMENT_SHORT_NAMES = ("seg",)

LABEL_TOPIC = f"{GROUP}/topic"
LABEL_SEGMENT_ID = f"{GROUP}/segment-id"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "scalable-topics-operator"
ANNOTATION_REQUEST = f"{GROUP}/request"
ANNOTATION_AUTOSCALE_POLICY = NAMESPACE_POLICY_ANNOTATION
"""On a Namespace: a JSON object of camelCase auto-scale knobs for the topics in it."""

MAX_INITIAL_SEGMENTS = 1024
MAX_BUCKETS = 1024
MAX_SUBSCRIPTIONS = 64
MAX_PARENTS = 64
MAX_TOPIC_NAME = 63
"""A topic's name is the value of the ``scalabletopics.io/topic`` label on its Segments, and a
label value has at most 63 characters. The Segment names (``<topic>-<id>``) are DNS subdomains
of up to 253 characters, which leaves room for any id."""


def topic_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a topic's name (``None`` when it can): the CRD's limit, which the
    operator also applies to topics stored before the limit was enforced."""
    if len(name) <= MAX_TOPIC_NAME:
        return None
    return (
        f"the name is {len(name)} characters, longer than {MAX_TOPIC_NAME} characters: it is "
        f"the value of the {LABEL_TOPIC} label on the topic's Segments, and a Kubernetes label "
        "value has at most 63 characters. No segment can be created for this topic; re-create "
        "it under a shorter name"
    )


def segment_name(topic: str, segment_id: int) -> str:
    """``<topic>-<id>``: the Segment resource's name."""
    if not isinstance(segment_id, int) or isinstance(segment_id, bool) or segment_id < 0:
        raise ValueError(f"segment id must be a non-negative integer, got {segment_id!r}")
    if not topic:
        raise ValueError("topic name is empty")
    return f"{topic}-{segment_id}"


def segment_labels(topic: str, segment_id: int) -> dict[str, str]:
    return {
        LABEL_TOPIC: topic,
        LABEL_SEGMENT_ID: str(segment_id),
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def topic_owner_reference(topic: str, uid: str) -> dict[str, Any]:
    """The owner reference a topic's Segments carry: the topic is their controller, and the
    garbage collector deletes them with it."""
    return {
        "apiVersion": API_VERSION,
        "kind": TOPIC_KIND,
        "name": topic,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
