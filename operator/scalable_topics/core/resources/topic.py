"""The ``ScalableTopic`` resource: spec (subscriptions, retention, entry buckets, the auto-scale
override), status (conditions, layout, assignments, operation, recommendation), the root CEL
rules and parsing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..assignment import AssignmentStrategy
from ..hashing import RING_MAX
from ..layout import SegmentLayout, SegmentState
from ..operation import OperationKind, Phase
from ..policy import (
    DEFAULT_POLICY,
    AutoScalePolicy,
    ClusterDefaults,
    PolicyError,
    Resolution,
    level_text,
    resolve_policy,
)
from ..retention import RetentionRule
from ..subscriptions import SubscriptionType
from .autoscale import AutoScaleOverride, AutoScaleStatus
from .common import (
    SUBSCRIPTION_NAME_PATTERN,
    Duration,
    Int,
    Quantity,
    Range,
    ResourceValidationError,
    Timestamp,
    _Spec,
    _Status,
    _validate,
)
from .conditions import Condition
from .names import MAX_BUCKETS, MAX_INITIAL_SEGMENTS, MAX_SUBSCRIPTIONS, topic_name_problem
from .requests import REQUEST_HISTORY, LastRequest


class OperationSource(enum.StrEnum):
    MANUAL = "manual"
    AUTO = "auto"
    RECOMMENDATION = "recommendation"
    REBUILT = "rebuilt"
    """Found interrupted in the Segment records when a lost ``status.layout`` was rebuilt."""


class SubscriptionSpec(_Spec):
    """A subscription the operator creates on every segment (cursor at the segment's start)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.type == oldSelf.type",
                    "message": "a subscription's type is immutable; add a subscription with "
                    "another name instead",
                }
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=SUBSCRIPTION_NAME_PATTERN,
        description="Subscription name, unique in the topic.",
    )
    type: SubscriptionType = Field(description="Stream (ordered, exclusive) or Queue (shared).")
    assignment: AssignmentStrategy = Field(
        AssignmentStrategy.STICKY,
        description="How a Stream subscription's active segments are assigned to its consumers: "
        "sticky (balanced, fewest moves) or round-robin (PIP-468). Ignored for Queue.",
    )


class Retention(_Spec):
    """When sealed segments that every subscription has consumed are pruned from the DAG and
    deleted (``core.retention``). Without retention, or with neither field set, sealed segments
    are kept. With both fields set, either limit prunes."""

    time: Duration | None = Field(
        None,
        description="Prune a drained sealed segment this long after it was sealed (0: as soon "
        "as every subscription has drained it).",
    )
    size: Quantity | None = Field(
        None,
        description="Prune the oldest drained sealed segments while their total stored size "
        "exceeds this (bytes, or e.g. 10Gi).",
    )

    def rule(self) -> RetentionRule:
        return RetentionRule(time=self.time, size=int(self.size) if self.size is not None else None)


class ScalableTopicSpec(_Spec):
    """Desired state of a scalable topic."""

    initial_segments: Int = Field(
        1,
        ge=1,
        le=MAX_INITIAL_SEGMENTS,
        description="Number of equal segments the topic starts with. Immutable: later changes "
        "happen by split and merge.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "initialSegments is immutable"}
            ]
        },
    )
    auto_scale: AutoScaleOverride | None = Field(
        None, description="Per-topic overrides of the auto split/merge policy."
    )
    subscriptions: list[SubscriptionSpec] = Field(
        default_factory=list,
        max_length=MAX_SUBSCRIPTIONS,
        description="Subscriptions, keyed by name.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    entry_buckets: Int = Field(
        4,
        ge=1,
        le=MAX_BUCKETS,
        description="Entry-bucket budget T (PIP-486): a new segment gets max(1, T / active "
        "segments) buckets. Changing it rolls segments over to the new count.",
    )
    consumer_grace_period: Duration = Field(
        60.0,
        description="How long a disconnected consumer's segments are held for it before they are "
        "redistributed.",
        json_schema_extra={"default": "60s"},
    )
    retention: Retention | None = Field(None, description="Pruning of sealed, drained segments.")

    @field_validator("subscriptions")
    @classmethod
    def _unique_names(cls, value: list[SubscriptionSpec]) -> list[SubscriptionSpec]:
        seen: set[str] = set()
        for item in value:
            if item.name in seen:
                raise ValueError(f"duplicate subscription name {item.name!r}")
            seen.add(item.name)
        return value

    def resolution(
        self,
        namespace: str | Mapping[str, Any] | None = None,
        cluster: ClusterDefaults | None = None,
        defaults: AutoScalePolicy = DEFAULT_POLICY,
    ) -> Resolution:
        """The effective policy and each knob's source (:func:`core.policy.resolve_policy`):
        this topic's knobs, then the namespace annotation's, then ``cluster``'s, then
        ``defaults``.

        ``ResourceValidationError`` when the combination is invalid even though each level is
        valid alone (a topic ``minSegments: 100`` under the default ``maxSegments: 64``).
        """
        topic = self.auto_scale.knobs() if self.auto_scale is not None else None
        try:
            return resolve_policy(topic, namespace, cluster, defaults)
        except PolicyError as exc:
            raise ResourceValidationError("effective auto-scale policy", [("", str(exc))]) from None

    def policy(
        self,
        namespace: str | Mapping[str, Any] | None = None,
        cluster: ClusterDefaults | None = None,
        defaults: AutoScalePolicy = DEFAULT_POLICY,
    ) -> AutoScalePolicy:
        """The effective policy (:meth:`resolution` without the sources)."""
        return self.resolution(namespace, cluster, defaults).policy

    def subscription(self, name: str) -> SubscriptionSpec | None:
        return next((s for s in self.subscriptions if s.name == name), None)

    def initial_segments_problem(self, resolution: Resolution) -> str | None:
        """Why the topic cannot be laid out: ``initialSegments`` outside ``[minSegments,
        maxSegments]`` of the effective policy (``None`` when it fits), naming the level the
        bound comes from.

        Admission rejects what the spec alone decides (:data:`TOPIC_RULES`); this is the rest,
        a bound from the namespace or the operator's defaults. It matters only before the topic
        is laid out: afterwards ``initialSegments`` is history, and lowering ``maxSegments``
        below it is a legitimate change of policy."""
        policy = resolution.policy
        outside = _initial_segments_outside(
            self.initial_segments, policy.min_segments, policy.max_segments
        )
        if outside is None:
            return None
        knob, bound, relation = outside
        source = level_text(resolution.sources[_SNAKE[knob]])
        return (
            f"spec.initialSegments ({self.initial_segments}) is {relation} {knob} ({bound}) of "
            f"the effective auto-scale policy (from {source}): no segment is created until "
            f"{knob} allows {self.initial_segments}; initialSegments is immutable, so otherwise "
            "re-create the topic"
        )


_SNAKE = {"minSegments": "min_segments", "maxSegments": "max_segments"}


def _initial_segments_outside(
    initial: int, min_segments: int | None, max_segments: int | None
) -> tuple[str, int, str] | None:
    """(knob, bound, ``above``/``below``) when ``initial`` is outside the bounds given."""
    if max_segments is not None and initial > max_segments:
        return "maxSegments", max_segments, "above"
    if min_segments is not None and initial < min_segments:
        return "minSegments", min_segments, "below"
    return None


class ControllerRef(_Status):
    """The operator instance leading this topic's shard."""

    pod: str | None = Field(None, description="Leader pod name.")
    url: str | None = Field(None, description="Session/watch URL of the leader.")
    shard: int | None = Field(None, ge=0, description="Lease shard of the topic.")
    since: Timestamp | None = Field(None, description="When this leader took the topic over.")


class ShareStatus(_Status):
    """Entry buckets of one segment a consumer reads for the segment's primary consumer."""

    segment_id: int = Field(ge=0, description="Segment id.")
    buckets: list[int] = Field(description="Bucket indexes of the segment.")


class ConsumerStatus(_Status):
    """A registered consumer and the segments assigned to it."""

    name: str = Field(description="Consumer name (its identity across reconnects).")
    segments: list[int] = Field(default_factory=list, description="Assigned segment ids.")
    connected: bool | None = Field(None, description="Whether a session is open now.")
    shares: list[ShareStatus] = Field(
        default_factory=list,
        description="Stream subscriptions: entry buckets this consumer reads of segments "
        "assigned to another consumer (PIP-486 key-shared helpers), restored by a new leader.",
    )


class SubscriptionStatus(_Status):
    """A subscription's registrations, as persisted by the assignment engine
    (``core.assignment.SubscriptionCoordinator.to_status``) plus its name and type."""

    name: str = Field(description="Subscription name.")
    type: SubscriptionType | None = Field(None, description="Stream or Queue.")
    layout_epoch: int | None = Field(None, ge=0, description="Layout epoch of the assignment.")
    consumers: list[ConsumerStatus] = Field(
        default_factory=list,
        description="Registered consumers, keyed by name.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    drained_segments: list[int] = Field(
        default_factory=list, description="Sealed segments fully consumed by this subscription."
    )


class OperationChild(_Status):
    id: int = Field(ge=0, description="Child segment id.")
    range: Range = Field(description="Child hash range.")
    buckets: int = Field(ge=1, le=MAX_BUCKETS, description="Child bucket count.")
    parents: list[int] = Field(default_factory=list, description="Child's parent segment ids.")


class OperationStatus(_Status):
    """The split/merge/rebucket in flight (DESIGN §5, step 1; ``core.operation.Operation``).
    A new leader resumes or rolls back what it finds here."""

    id: str = Field(description="Operation id (also in events).")
    kind: OperationKind = Field(description="split, merge or rebucket.")
    parents: list[int] = Field(default_factory=list, description="Parent segment ids.")
    children: list[OperationChild] = Field(
        default_factory=list, description="Planned child segments."
    )
    base_epoch: int = Field(ge=0, description="Layout epoch the plan was made on.")
    phase: Phase = Field(description="Last protocol step known complete.")
    at: int | None = Field(None, ge=0, le=RING_MAX, description="Split point (split only).")
    source: OperationSource = Field(
        OperationSource.MANUAL,
        description="manual, auto, recommendation or rebuilt (found interrupted when a lost "
        "status.layout was rebuilt).",
    )
    reason: str | None = Field(None, description="Why (the policy's reason or the request).")
    request_id: str | None = Field(None, description="Id of the manual request, if any.")
    started_at: Timestamp | None = Field(None, description="When the operation was recorded.")


class RecommendedAction(_Status):
    kind: OperationKind = Field(description="split, merge or rebucket.")
    segments: list[int] = Field(default_factory=list, description="Segment ids concerned.")
    at: int | None = Field(None, ge=0, le=RING_MAX, description="Split point (split only).")
    buckets: int | None = Field(None, ge=1, le=MAX_BUCKETS, description="New bucket count.")
    reason: str | None = Field(None, description="Short machine-readable reason.")
    detail: str | None = Field(None, description="Human-readable explanation.")
    stats: dict[str, Any] | None = Field(
        None, description="The figures behind the action (free-form, for humans and tools)."
    )


class Recommendation(_Status):
    """Written by the recommender job with a compare-and-swap; acted on only while fresh and
    computed on the current epoch."""

    computed_at: Timestamp | None = Field(None, description="When the job computed it.")
    window: Duration | None = Field(None, description="Length of the history read.")
    based_on_epoch: int | None = Field(None, ge=0, description="Layout epoch it applies to.")
    based_on_generation: int | None = Field(None, ge=0, description="Topic generation read.")
    recommended_segments: int | None = Field(None, ge=1, description="Suggested active count.")
    actions: list[RecommendedAction] = Field(default_factory=list, description="Suggested steps.")


class ScalableTopicStatus(_Status):
    """Observed state, written by the leader (and recommendation by the recommender)."""

    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation last reconciled."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready (summary), Reconciling, Stalled (kstatus).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    epoch: int | None = Field(None, ge=0, description="Layout epoch.")
    next_segment_id: int | None = Field(None, ge=0, description="Next segment id to allocate.")
    active_segments: int | None = Field(None, ge=0, description="Number of active segments.")
    layout: dict[str, Any] | None = Field(
        None,
        description="The authoritative segment DAG (PIP-468 metadata: epoch, nextSegmentId, "
        "segments, properties); changed only with a resourceVersion compare-and-swap.",
    )
    dag: str | None = Field(None, description="Readable drawing of the DAG.")
    controller: ControllerRef | None = Field(None, description="Leader of the topic.")
    subscriptions: list[SubscriptionStatus] = Field(
        default_factory=list,
        description="Consumers and assignments per subscription.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    last_split_at: Timestamp | None = Field(None, description="When the last split completed.")
    last_merge_at: Timestamp | None = Field(None, description="When the last merge completed.")
    operation: OperationStatus | None = Field(None, description="Operation in flight.")
    last_request: LastRequest | None = Field(None, description="Last manual request's outcome.")
    recent_requests: list[LastRequest] = Field(
        default_factory=list,
        max_length=REQUEST_HISTORY,
        description="The last handled manual requests, oldest first: an id listed here is never "
        "executed again.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"]},
    )
    recommendation: Recommendation | None = Field(None, description="Recommender output.")
    auto_scale: AutoScaleStatus | None = Field(
        None, description="Effective auto-scale policy with sources, last decision, suppression."
    )

    def condition(self, type: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type), None)


class ScalableTopic(_Status):
    """A whole ScalableTopic object (as read from the API server or a manifest)."""

    model_config = ConfigDict(extra="forbid")

    api_version: Literal["scalabletopics.io/v1alpha1"] = Field(
        "scalabletopics.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["ScalableTopic"] = "ScalableTopic"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ScalableTopicSpec = Field(default_factory=ScalableTopicSpec)
    status: ScalableTopicStatus | None = None

    @field_validator("metadata")
    @classmethod
    def _check_name(cls, value: dict[str, Any]) -> dict[str, Any]:
        name = value.get("name")
        problem = None if name is None else topic_name_problem(str(name))
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check_initial_segments(self) -> ScalableTopic:
        """:data:`TOPIC_RULES`: a topic the operator has not seen yet (no status) starts within
        its own ``minSegments``/``maxSegments``."""
        auto_scale = self.spec.auto_scale
        if self.status is not None or auto_scale is None:
            return self
        knobs = auto_scale.knobs()
        outside = _initial_segments_outside(
            self.spec.initial_segments, knobs.get("min_segments"), knobs.get("max_segments")
        )
        if outside is not None:
            knob, bound, relation = outside
            raise ValueError(
                f"spec.initialSegments ({self.spec.initial_segments}) is {relation} "
                f"spec.autoScale.{knob} ({bound})"
            )
        return self


def _initial_segments_rule(knob: str, op: str, relation: str) -> dict[str, str]:
    return {
        "rule": f"has(self.status) || !has(self.spec.autoScale) "
        f"|| !has(self.spec.autoScale.{knob}) "
        f"|| self.spec.initialSegments {op} self.spec.autoScale.{knob}",
        "message": f"spec.initialSegments must be {op} spec.autoScale.{knob}: the topic would "
        f"start {relation} its own {knob}",
    }


TOPIC_RULES: list[dict[str, str]] = [
    _initial_segments_rule("maxSegments", "<=", "above"),
    _initial_segments_rule("minSegments", ">=", "below"),
]
"""CEL rules at the root of the ScalableTopic schema, mirrored by :class:`ScalableTopic`.

They check ``initialSegments`` against the topic's own bounds only while the topic has no
status, i.e. on create and until the operator first saw it: afterwards the layout exists and
lowering ``maxSegments`` below ``initialSegments`` (which is immutable) is a legitimate change.
The status test also keeps the operator's status writes valid for a topic stored before the
rules existed (a status write runs the root rules too, and the root always changed). Bounds set
by the namespace or the operator's defaults are the operator's to check
(:meth:`ScalableTopicSpec.initial_segments_problem`, ``InvalidSpec``)."""


def parse_topic_spec(spec: Mapping[str, Any] | None) -> ScalableTopicSpec:
    """Validate a ScalableTopic ``spec``; ``ResourceValidationError`` names each bad field
    (e.g. ``spec.autoScale.maxSegments``)."""
    return _validate(ScalableTopicSpec, spec or {}, "ScalableTopic spec", "spec")


def parse_topic(obj: Mapping[str, Any]) -> ScalableTopic:
    return _validate(ScalableTopic, obj, "ScalableTopic", "")


def layout_status(layout: SegmentLayout) -> dict[str, Any]:
    """``status.layout``: the layout's PIP-468 metadata without ``sealedAtEpoch`` on active
    segments (it is 0 there, which ``kubectl describe`` showed as "Sealed At Epoch: 0").
    :meth:`SegmentLayout.from_metadata` reads a missing ``sealedAtEpoch`` as active."""
    data = layout.to_metadata()
    for segment in data["segments"].values():
        if segment["state"] == SegmentState.ACTIVE.value:
            del segment["sealedAtEpoch"]
    return data
