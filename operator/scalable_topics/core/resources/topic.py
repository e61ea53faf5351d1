"""The custom resources (DESIGN §4) as pydantic models: ``ScalableTopic``, ``Segment`` and the
manual-operation request annotation.

The models are the single source of truth for the CRDs in ``crds/`` (see :mod:`.crds`): field
names, aliases, constraints, defaults, descriptions and the CEL rules attached through
``json_schema_extra``. Python attributes are snake_case; the resources are camelCase.

What the admission schema can check is declared here and mirrored by pydantic validation, so
:func:`parse_topic_spec` and friends reject exactly what the API server would reject (plus the
checks no schema can express, such as a byte rate written as a string being above another).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from annotated_types import Ge
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    Strict,
    ValidationError,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from ..assignment import AssignmentStrategy
from ..hashing import RING_MAX
from ..layout import HashRange, SegmentLayout, SegmentState
from ..operation import OperationKind, Phase
from ..policy import (
    DEFAULT_POLICY,
    NAMESPACE_POLICY_ANNOTATION,
    AutoScalePolicy,
    ClusterDefaults,
    PolicyError,
    Resolution,
    format_duration,
    level_text,
    parse_duration,
    parse_quantity,
    resolve_policy,
)
from ..retention import RetentionRule
from ..transfer import TransferPhase

__all__ = [
    "ANNOTATION_AUTOSCALE_POLICY",
    "ANNOTATION_REQUEST",
    "API_VERSION",
    "CATEGORY",
    "CONDITION_TYPE_PATTERN",
    "DNS_SUBDOMAIN_PATTERN",
    "DURATION_PATTERN",
    "GROUP",
    "LABEL_MANAGED_BY",
    "LABEL_SEGMENT_ID",
    "LABEL_TOPIC",
    "MANAGED_BY",
    "MAX_BUCKETS",
    "MAX_INITIAL_SEGMENTS",
    "MAX_PARENTS",
    "MAX_SUBSCRIPTIONS",
    "MAX_TOPIC_NAME",
    "QUANTITY_PATTERN",
    "REASON_PATTERN",
    "REQUEST_HISTORY",
    "SEGMENT_KIND",
    "SEGMENT_PLURAL",
    "SEGMENT_SHORT_NAMES",
    "SEGMENT_SINGULAR",
    "SUBSCRIPTION_NAME_PATTERN",
    "TOPIC_KIND",
    "TOPIC_PLURAL",
    "TOPIC_RULES",
    "TOPIC_SHORT_NAMES",
    "TOPIC_SINGULAR",
    "VERSION",
    "AssignmentStrategy",
    "AutoScaleOverride",
    "BrokerRef",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "ConsumerStatus",
    "ControllerRef",
    "LastRequest",
    "ManualRequest",
    "ManualRequestOp",
    "OperationChild",
    "OperationKind",
    "OperationSource",
    "OperationStatus",
    "Range",
    "Reason",
    "Recommendation",
    "RecommendedAction",
    "RequestResult",
    "ResourceValidationError",
    "Retention",
    "ScalableTopic",
    "ScalableTopicSpec",
    "ScalableTopicStatus",
    "Segment",
    "SegmentLoad",
    "SegmentPhase",
    "SegmentSpec",
    "SegmentStatus",
    "SubscriptionSpec",
    "SubscriptionStatus",
    "SubscriptionType",
    "condition",
    "format_time",
    "get_condition",
    "handled_request",
    "layout_status",
    "parse_manual_request",
    "parse_segment",
    "parse_segment_spec",
    "parse_time",
    "parse_topic",
    "parse_topic_spec",
    "remember_request",
    "segment_labels",
    "segment_manifest",
    "segment_name",
    "set_condition",
    "topic_name_problem",
    "topic_owner_reference",
]

# -- identity ----------------------------------------------------------------------------------

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

DURATION_PATTERN = r"^(([0-9]+(\.[0-9]+)?(ms|s|m|h))+|[0-9]+(\.[0-9]+)?)$"
QUANTITY_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|[kmgt]B?|B)?\s*$"
SUBSCRIPTION_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_REASON_RE = re.compile(REASON_PATTERN)
_HEX_RANGE_PATTERN = r"^[0-9a-f]{4}-[0-9a-f]{4}$"


# -- schema-level building blocks --------------------------------------------------------------


def _int_or_string(pattern: str, minimum: float | None = None, *, exclusive: bool = False) -> Any:
    """The CRD form of a value written either as a number or as a unit string (``"5m"``)."""
    schema: dict[str, Any] = {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
        "pattern": pattern,
    }
    if minimum is not None:
        schema["minimum"] = minimum
        if exclusive:
            schema["exclusiveMinimum"] = minimum
    return WithJsonSchema(schema)


Int = Annotated[int, Strict()]


def _dump_duration(seconds: float) -> str:
    return format_duration(seconds)


def _dump_quantity(value: float) -> int | str:
    if float(value).is_integer():
        return int(value)
    return f"{value:f}".rstrip("0").rstrip(".")


def _schema_input(kind: str, unit: str, pattern: str, examples: str) -> BeforeValidator:
    """What the int-or-string schema admits, checked before the unit parser: a whole number
    (``1.5`` is rejected at admission) or a string matching the schema's pattern (the parser
    alone is more lenient, e.g. about surrounding spaces)."""
    compiled = re.compile(pattern)

    def check(value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"must be a whole number of {unit} or a string such as {examples}")
        if isinstance(value, str) and not compiled.match(value):
            raise ValueError(f"invalid {kind} {value!r}: use e.g. {examples}")
        return value

    return BeforeValidator(check)


_DURATION_INPUT = _schema_input("duration", "seconds", DURATION_PATTERN, "'90s', '5m', '1h30m'")
_QUANTITY_INPUT = _schema_input("quantity", "bytes", QUANTITY_PATTERN, "52428800, '50Mi', '1.5Gi'")

# In JSON output, a float such as 30.0 would be rejected by the int-or-string schema.
_DURATION_JSON = PlainSerializer(_dump_duration, when_used="json")
_QUANTITY_JSON = PlainSerializer(_dump_quantity, when_used="json")

Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    _DURATION_INPUT,  # listed after the parser so that it runs before it
    Ge(0),
    _DURATION_JSON,
    _int_or_string(DURATION_PATTERN, 0),
]
Quantity = Annotated[
    float,
    BeforeValidator(parse_quantity),
    _QUANTITY_INPUT,
    Ge(0),
    _QUANTITY_JSON,
    _int_or_string(QUANTITY_PATTERN, 0),
]


def _check_time(value: str) -> str:
    parse_time(value)
    return value


Timestamp = Annotated[
    str,
    BeforeValidator(lambda v: format_time(v) if isinstance(v, datetime) else v),
    AfterValidator(_check_time),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


def format_time(when: float | datetime) -> str:
    """RFC 3339 in UTC with second precision, the way ``metav1.Time`` is serialised."""
    if isinstance(when, datetime):
        moment = when if when.tzinfo else when.replace(tzinfo=UTC)
    else:
        moment = datetime.fromtimestamp(when, UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """RFC 3339 → Unix seconds (the core's instants). ``ValueError`` when malformed."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except (ValueError, AttributeError):
        raise ValueError(f"invalid RFC 3339 time {text!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"RFC 3339 time {text!r} has no time zone")
    return moment.timestamp()


class _Spec(BaseModel):
    """Spec objects: unknown fields are errors, as they are for ``kubectl apply`` (strict)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class _Status(BaseModel):
    """Status objects are written by several components; a reader ignores what it does not know."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class ResourceValidationError(ValueError):
    """A resource (or annotation) that does not validate; the message names every bad field."""

    def __init__(self, what: str, problems: Sequence[tuple[str, str]]) -> None:
        self.what = what
        self.problems = list(problems)
        details = "; ".join(f"{path}: {message}" if path else message for path, message in problems)
        super().__init__(f"invalid {what}: {details}")


def _problems(error: ValidationError, prefix: str) -> list[tuple[str, str]]:
    problems = []
    for item in error.errors():
        parts = [prefix] if prefix else []
        for loc in item["loc"]:
            if isinstance(loc, int):
                parts[-1:] = [f"{parts[-1]}[{loc}]"] if parts else [f"[{loc}]"]
            else:
                parts.append(str(loc))
        message = str(item["msg"])
        message = message.removeprefix("Value error, ")
        problems.append((".".join(parts), message))
    return problems


# -- enums -------------------------------------------------------------------------------------


class SubscriptionType(enum.StrEnum):
    """``Stream``: ordered, each active segment read by one consumer (sticky or round-robin).
    ``Queue``: shared, messages dispatched to any consumer with per-key order kept by entry
    buckets (PIP-486)."""

    STREAM = "Stream"
    QUEUE = "Queue"


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(enum.StrEnum):
    """kstatus-compatible condition types (``Ready`` is the summary)."""

    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"


class Reason:
    """CamelCase condition reasons the operator writes (docs/resources.md lists them)."""

    # Ready
    RECONCILED = "Reconciled"
    INITIALIZING = "Initializing"
    INVALID_SPEC = "InvalidSpec"
    INVALID_AUTO_SCALE_POLICY = "InvalidAutoScalePolicy"
    NOT_SUPPORTED = "NotSupported"
    BROKERS_UNAVAILABLE = "BrokersUnavailable"
    LAYOUT_INVALID = "LayoutInvalid"
    SEGMENT_CORRUPTED = "SegmentCorrupted"
    LAYOUT_LOST = "LayoutLost"
    # Reconciling
    CREATING = "Creating"
    SPLITTING = "Splitting"
    MERGING = "Merging"
    REBUCKETING = "Rebucketing"
    PRUNING = "Pruning"
    IDLE = "Idle"
    # Stalled
    OPERATION_FAILED = "OperationFailed"
    NAME_TOO_LONG = "NameTooLong"


class SegmentPhase(enum.StrEnum):
    """A Segment resource's lifecycle: created (no broker yet), taking writes, sealed."""

    PENDING = "Pending"
    ACTIVE = "Active"
    SEALED = "Sealed"

    @classmethod
    def from_layout(cls, state: SegmentState) -> SegmentPhase:
        return cls.ACTIVE if state is SegmentState.ACTIVE else cls.SEALED


class OperationSource(enum.StrEnum):
    MANUAL = "manual"
    AUTO = "auto"
    RECOMMENDATION = "recommendation"
    REBUILT = "rebuilt"
    """Found interrupted in the Segment records when a lost ``status.layout`` was rebuilt."""


class ManualRequestOp(enum.StrEnum):
    SPLIT = "split"
    MERGE = "merge"
    MOVE = "move"


class RequestResult(enum.StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    REJECTED = "Rejected"


# -- conditions --------------------------------------------------------------------------------


class Condition(_Status):
    """A ``metav1.Condition``."""

    type: str = Field(
        description="Condition type: Ready, Reconciling or Stalled on a topic (kstatus).",
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        description="CamelCase reason for the last transition.",
        min_length=1,
        max_length=1024,
        pattern=REASON_PATTERN,
    )
    message: str = Field(description="Human-readable detail.", max_length=32768)
    last_transition_time: Timestamp = Field(
        description="When the status last changed (not the reason or message)."
    )
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation this condition was computed from."
    )


def condition(
    type: str,
    status: bool | str,
    reason: str,
    message: str = "",
    generation: int | None = None,
    now: float | datetime | None = None,
) -> dict[str, Any]:
    """A condition dict ready for a status patch; ``status`` may be a bool."""
    if isinstance(status, bool):
        status_text = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    else:
        try:
            status_text = ConditionStatus(status)
        except ValueError:
            raise ValueError(
                f"condition {type}: status must be True, False or Unknown, got {status!r}"
            ) from None
    if not _REASON_RE.match(reason):
        raise ValueError(f"condition {type}: reason must be CamelCase, got {reason!r}")
    result: dict[str, Any] = {
        "type": type,
        "status": status_text.value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": format_time(datetime.now(UTC) if now is None else now),
    }
    if generation is not None:
        result["observedGeneration"] = generation
    return result


def get_condition(
    conditions: Iterable[Mapping[str, Any]] | None, type: str
) -> dict[str, Any] | None:
    for item in conditions or ():
        if item.get("type") == type:
            return dict(item)
    return None


def set_condition(
    conditions: Iterable[Mapping[str, Any]] | None, new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """A new list with ``new`` replacing the condition of the same type (appended if absent).

    ``lastTransitionTime`` is kept from the old condition when the status did not change, so
    re-asserting a condition does not look like a transition (and does not churn the status).
    """
    result: list[dict[str, Any]] = []
    replaced = False
    for item in conditions or ():
        if item.get("type") == new["type"]:
            merged = dict(new)
            if item.get("status") == new.get("status") and item.get("lastTransitionTime"):
                merged["lastTransitionTime"] = item["lastTransitionTime"]
            result.append(merged)
            replaced = True
        else:
            result.append(dict(item))
    if not replaced:
        result.append(dict(new))
    return result


# -- ScalableTopic spec ------------------------------------------------------------------------

_KNOB_DOCS: dict[str, str] = {
    "enabled": "Run automatic split/merge for this topic at all.",
    "mode": "auto executes decisions; recommend only records them in status and events.",
    "max_segments": "Never split beyond this many active segments.",
    "min_segments": "Never merge below this many active segments.",
    "max_dag_depth": "Never merge a segment that already descends from this many merges.",
    "split_cooldown": "Minimum time between two splits of the topic.",
    "merge_cooldown": "Minimum time between two merges of the topic.",
    "merge_window": "How long both neighbours must have been cold before they merge.",
    "evaluation_interval": "How often the operator evaluates the policy.",
    "split_msg_rate_in_threshold": "Split a segment whose inbound rate exceeds this (msg/s).",
    "split_bytes_rate_in_threshold": "Split a segment whose inbound byte rate exceeds this (B/s).",
    "split_msg_rate_out_threshold": "Split a segment whose outbound rate exceeds this (msg/s).",
    "split_bytes_rate_out_threshold": "Split a segment whose outbound byte rate exceeds this "
    "(B/s).",
    "merge_msg_rate_in_threshold": "Neighbours may merge while both stay below this inbound "
    "rate (msg/s).",
    "merge_bytes_rate_in_threshold": "Neighbours may merge while both stay below this inbound "
    "byte rate (B/s).",
    "merge_msg_rate_out_threshold": "Neighbours may merge while both stay below this outbound "
    "rate (msg/s).",
    "merge_bytes_rate_out_threshold": "Neighbours may merge while both stay below this outbound "
    "byte rate (B/s).",
}


def _validator_funcs(info: FieldInfo) -> set[Any]:
    return {m.func for m in info.metadata if isinstance(m, BeforeValidator)}


def _lower_bound(info: FieldInfo) -> tuple[float | None, bool]:
    for item in info.metadata:
        if getattr(item, "gt", None) is not None:
            return float(item.gt), True
        if getattr(item, "ge", None) is not None:
            return float(item.ge), False
    return None, False


def _format_bytes(value: float) -> str:
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}"


def _show(name: str, value: Any) -> str:
    """A knob value the way a user writes it (``5m``, ``50Mi``, ``10000``, ``true``)."""
    funcs = _validator_funcs(AutoScalePolicy.model_fields[name])
    if parse_duration in funcs:
        return format_duration(value)
    if parse_quantity in funcs:
        return _format_bytes(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _knob_field(name: str, info: FieldInfo) -> tuple[Any, Any]:
    """A policy knob as an optional override field: same type, constraints and alias."""
    funcs = _validator_funcs(info)
    default = getattr(DEFAULT_POLICY, name)
    metadata: list[Any] = list(info.metadata)
    if parse_duration in funcs or parse_quantity in funcs:
        minimum, exclusive = _lower_bound(info)
        if parse_duration in funcs:
            metadata.append(_DURATION_INPUT)
            metadata.append(_DURATION_JSON)
            metadata.append(_int_or_string(DURATION_PATTERN, minimum, exclusive=exclusive))
        else:
            metadata.append(_QUANTITY_INPUT)
            metadata.append(_QUANTITY_JSON)
            metadata.append(_int_or_string(QUANTITY_PATTERN, minimum, exclusive=exclusive))
    shown = _show(name, default)
    annotation: Any = Annotated[info.annotation, *metadata] if metadata else info.annotation
    description = f"{_KNOB_DOCS.get(name, name)} Operator default: {shown}."
    return (annotation | None, Field(None, alias=info.alias, description=description))


def _threshold_pairs() -> list[tuple[str, str]]:
    """(split, merge) knob names of the same metric, e.g. split/mergeMsgRateInThreshold."""
    pairs = []
    for name in AutoScalePolicy.model_fields:
        if name.startswith("split_") and name.endswith("_threshold"):
            partner = "merge_" + name.removeprefix("split_")
            if partner in AutoScalePolicy.model_fields:
                pairs.append((name, partner))
    return pairs


def _autoscale_rules() -> list[dict[str, str]]:
    rules = [
        {
            "rule": "!has(self.minSegments) || !has(self.maxSegments) "
            "|| self.maxSegments >= self.minSegments",
            "message": "maxSegments must be >= minSegments",
        }
    ]
    for split, merge in _threshold_pairs():
        if parse_quantity in _validator_funcs(AutoScalePolicy.model_fields[split]):
            continue  # "50Mi" vs 1000: CEL cannot compare; the operator checks (InvalidSpec).
        split_alias, merge_alias = to_camel(split), to_camel(merge)
        rules.append(
            {
                "rule": f"!has(self.{split_alias}) || !has(self.{merge_alias}) "
                f"|| self.{split_alias} > self.{merge_alias}",
                "message": f"{split_alias} must be above {merge_alias}",
            }
        )
    return rules


def _add_autoscale_rules(schema: dict[str, Any]) -> None:
    schema["x-kubernetes-validations"] = _autoscale_rules()


class _AutoScaleBase(_Spec):
    model_config = ConfigDict(json_schema_extra=_add_autoscale_rules)

    def knobs(self) -> dict[str, Any]:
        """The knobs this override sets (snake_case), as :func:`policy.resolve` takes them."""
        return {
            name: getattr(self, name)
            for name in self.model_fields_set
            if getattr(self, name) is not None
        }

    @model_validator(mode="after")
    def _check_pairs(self) -> _AutoScaleBase:
        values = self.knobs()
        if (
            "max_segments" in values
            and "min_segments" in values
            and values["max_segments"] < values["min_segments"]
        ):
            raise ValueError(
                f"maxSegments ({values['max_segments']}) must be >= minSegments "
                f"({values['min_segments']})"
            )
        for split, merge in _threshold_pairs():
            if split in values and merge in values and not values[split] > values[merge]:
                raise ValueError(
                    f"{to_camel(split)} ({_show(split, values[split])}) must be above "
                    f"{to_camel(merge)} ({_show(merge, values[merge])})"
                )
        return self


AutoScaleOverride: type[_AutoScaleBase] = create_model(  # type: ignore[call-overload]
    "AutoScaleOverride",
    __base__=_AutoScaleBase,
    __doc__=(
        "Auto split/merge policy (PIP-483) for this topic. Every knob is optional: an unset knob "
        "comes from the namespace's policy, then from the operator's defaults. Durations are "
        "seconds or strings like 90s, 5m, 1h30m; byte rates are bytes/s or strings like 50Mi."
    ),
    **{name: _knob_field(name, info) for name, info in AutoScalePolicy.model_fields.items()},
)


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


# -- ScalableTopic status ----------------------------------------------------------------------


class Range(_Spec):
    """An inclusive range of the 16-bit hash ring."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.start <= self.end", "message": "range.start must be <= range.end"}
            ]
        }
    )

    start: Int = Field(ge=0, le=RING_MAX, description="First hash of the range (inclusive).")
    end: Int = Field(ge=0, le=RING_MAX, description="Last hash of the range (inclusive).")
    hex: str | None = Field(
        None,
        max_length=9,
        pattern=_HEX_RANGE_PATTERN,
        description="The range as ssss-eeee (hex); filled in from start and end.",
    )

    @model_validator(mode="after")
    def _check(self) -> Range:
        hash_range = HashRange(self.start, self.end)
        if self.hex is None:
            self.hex = hash_range.hex()
        elif self.hex != hash_range.hex():
            raise ValueError(f"hex {self.hex!r} does not match start/end ({hash_range.hex()})")
        return self

    @classmethod
    def of(cls, hash_range: HashRange) -> Range:
        return cls(start=hash_range.start, end=hash_range.end)

    def to_hash_range(self) -> HashRange:
        return HashRange(self.start, self.end)


class ControllerRef(_Status):
    """The operator instance leading this topic's shard."""

    pod: str | None = Field(None, description="Leader pod name.")
    url: str | None = Field(None, description="Session/watch URL of the leader.")
    shard: int | None = Field(None, ge=0, description="Lease shard of the topic.")
    since: Timestamp | None = Field(None, description="When this leader took the topic over.")


class ConsumerStatus(_Status):
    """A registered consumer and the segments assigned to it."""

    name: str = Field(description="Consumer name (its identity across reconnects).")
    segments: list[int] = Field(default_factory=list, description="Assigned segment ids.")
    connected: bool | None = Field(None, description="Whether a session is open now.")


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


REQUEST_HISTORY = 16
"""How many handled manual request ids ``status.recentRequests`` keeps (an id older than that
would be executed again)."""


class LastRequest(_Status):
    """Outcome of a manual request (annotation scalabletopics.io/request)."""

    id: str = Field(description="The request's id.")
    op: ManualRequestOp = Field(description="split, merge or move.")
    result: RequestResult = Field(description="Succeeded, Failed or Rejected.")
    message: str = Field("", description="What happened.")
    completed_at: Timestamp | None = Field(None, description="When the request finished.")


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


class AutoScaleDecision(_Status):
    """The auto-scaler's last decision: executed (mode auto) or only recorded (recommend)."""

    action: OperationKind = Field(description="split, merge or rebucket.")
    segments: list[int] = Field(default_factory=list, description="Segment ids concerned.")
    source: str = Field(description="auto (the evaluator) or recommendation (the recommender).")
    executed: bool = Field(description="Whether the operation was started (false: recommend).")
    operation: str | None = Field(None, description="Id of the operation started, if any.")
    reason: str = Field("", description="Why: the rule and the figures behind it.")
    decided_at: Timestamp | None = Field(None, description="When it was decided.")


class AutoScaleEvaluation(_Status):
    """The outcome of the auto-scaler's evaluations; ``since`` moves only when it changes."""

    result: str = Field(
        description="Acted, Recommended, Suppressed (an action was wanted but held back), Idle "
        "(nothing called for) or Off (the master switch or the policy stops decisions)."
    )
    reasons: list[str] = Field(
        default_factory=list,
        description="Suppression reasons (the scalable_topic_autoscale_suppressed_total labels).",
    )
    message: str = Field("", description="What was held back and by what.")
    since: Timestamp | None = Field(None, description="First evaluation with this outcome.")


class AutoScaleStatus(_Status):
    """The effective auto-scale policy, where each knob came from, and what the auto-scaler
    last decided or why it did nothing (``core.policy.resolve_policy``)."""

    mode: str | None = Field(None, description="Effective mode: off, recommend or auto.")
    policy: dict[str, str] = Field(
        default_factory=dict, description="Every knob's effective value, as users write it."
    )
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="Where each knob comes from: topic, namespace, cluster or default.",
    )
    problem: str | None = Field(
        None, description="A policy level that is ignored or invalid, and why."
    )
    last_decision: AutoScaleDecision | None = Field(None, description="The last decision.")
    last_evaluation: AutoScaleEvaluation | None = Field(
        None, description="The latest evaluations' outcome."
    )


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


# -- Segment -----------------------------------------------------------------------------------


class SegmentSpec(_Spec):
    """A segment of a topic: fixed for its whole life (immutable)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "Segment spec is immutable"}
            ]
        }
    )

    topic: str = Field(
        min_length=1,
        max_length=MAX_TOPIC_NAME,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the owning ScalableTopic (same namespace).",
    )
    segment_id: Int = Field(ge=0, description="Segment id in the topic's DAG.")
    range: Range = Field(description="Hash range served by the segment.")
    parents: list[Int] = Field(
        default_factory=list, max_length=MAX_PARENTS, description="Parent segment ids."
    )
    buckets: Int = Field(1, ge=1, le=MAX_BUCKETS, description="Entry-bucket count (PIP-486).")


class BrokerRef(_Status):
    pod: str | None = Field(None, description="Broker pod hosting the segment.")
    url: str | None = Field(None, description="Broker URL for produce/consume.")


class SegmentLoad(_Status):
    """Rates written by the owning broker when one moved by more than 25 %."""

    msg_rate_in: float = Field(0.0, ge=0, description="Messages/s in.")
    bytes_rate_in: float = Field(0.0, ge=0, description="Bytes/s in.")
    msg_rate_out: float = Field(0.0, ge=0, description="Messages/s out.")
    bytes_rate_out: float = Field(0.0, ge=0, description="Bytes/s out.")
    updated_at: Timestamp | None = Field(None, description="When the sample was taken.")


class SegmentCorruption(_Status):
    """Written by the owning broker when it quarantined the segment: its log is damaged, it
    takes no writes, and consumers get nothing from ``position`` on (docs/operations.md)."""

    position: int = Field(ge=0, description="First position not served: the damaged record's.")
    file: str = Field(description="Log file holding the damaged record.")
    offset: int = Field(ge=0, description="Byte offset of the damaged record in that file.")
    reason: str = Field(description="What is damaged, e.g. checksum mismatch.")
    source: str = Field(description="Who found it: recovery (at start) or read.")
    detected_at: Timestamp | None = Field(None, description="When the broker found it.")


class TransferEndpoint(_Status):
    pod: str = Field(description="Broker pod.")
    url: str = Field(description="Broker URL.")


class SegmentTransfer(_Status):
    """An ownership transfer in flight (DESIGN §9, ``core.transfer.Transfer``): a new leader
    completes it (from ``Owned`` only forward) or rolls it back."""

    id: str = Field(description="Transfer id (also in events).")
    segment_id: int = Field(ge=0, description="The segment moving.")
    source: TransferEndpoint = Field(description="The broker it leaves.")
    destination: TransferEndpoint = Field(description="The broker it goes to.")
    phase: TransferPhase = Field(description="Releasing, Assigned, Owned or RollingBack.")
    trigger: str = Field("manual", description="manual, drain, shed or shutdown.")
    reason: str | None = Field(None, description="Why.")
    request_id: str | None = Field(None, description="Id of the manual request, if any.")
    started_at: Timestamp | None = Field(None, description="When the transfer was recorded.")


class SegmentStatus(_Status):
    state: SegmentPhase = Field(SegmentPhase.PENDING, description="Pending, Active or Sealed.")
    broker: BrokerRef | None = Field(None, description="Where the segment lives.")
    load: SegmentLoad | None = Field(None, description="Latest load sample.")
    corruption: SegmentCorruption | None = Field(
        None,
        description="Set by the broker while the segment is quarantined for a damaged log; "
        "removed when an operator truncated it.",
    )
    backlog: dict[str, int] = Field(
        default_factory=dict,
        description="Entries not acknowledged, per subscription (written by the owning broker "
        "when a count moved by more than 25 % or a subscription came or went).",
    )
    sealed_at: Timestamp | None = Field(None, description="When the segment was sealed.")
    created_at_epoch: int | None = Field(
        None,
        ge=0,
        description="Layout epoch that created the segment (recorded from status.layout; a lost "
        "layout is rebuilt from the Segments).",
    )
    sealed_at_epoch: int | None = Field(
        None, ge=0, description="Layout epoch that sealed the segment (recorded as above)."
    )
    recorded_at_epoch: int | None = Field(
        None,
        ge=0,
        description="Layout epoch when a rebuild of a lost layout, or a recovery of this "
        "Segment from its broker, last wrote it: a later rebuild goes above it too.",
    )
    subscriptions: list[str] = Field(
        default_factory=list,
        description="Subscriptions the operator has provisioned on the segment's broker.",
    )
    transfer: SegmentTransfer | None = Field(
        None, description="Ownership transfer in flight (cleared when it ends)."
    )


class Segment(_Status):
    model_config = ConfigDict(extra="forbid")

    api_version: Literal["scalabletopics.io/v1alpha1"] = Field(
        "scalabletopics.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["Segment"] = "Segment"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SegmentSpec
    status: SegmentStatus | None = None


# -- manual requests ---------------------------------------------------------------------------


def _id_text(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class ManualRequest(_Spec):
    """``scalabletopics.io/request: '{"id": "r1", "op": "split", "segments": [3], "at": 4096}'``.

    A split names exactly one segment and may give a split point ``at`` (``start <= at < end``
    is checked against the layout by the operator); a merge names two or more distinct segments;
    a move names one segment and the broker pod it goes ``to``.
    """

    id: Annotated[str, BeforeValidator(_id_text)] = Field(min_length=1, max_length=128)
    op: ManualRequestOp
    segments: list[Int] = Field(min_length=1)
    at: Int | None = Field(None, ge=0, lt=RING_MAX)
    to: str | None = Field(None, min_length=1, max_length=253)

    @field_validator("segments")
    @classmethod
    def _non_negative(cls, value: list[int]) -> list[int]:
        for item in value:
            if item < 0:
                raise ValueError(f"segment ids are >= 0, got {item}")
        return value

    @model_validator(mode="after")
    def _check_op(self) -> ManualRequest:
        if (self.op is ManualRequestOp.MOVE) != (self.to is not None):
            raise ValueError("a move names the broker pod it goes 'to'; only a move does")
        if self.op is ManualRequestOp.MOVE:
            if len(self.segments) != 1:
                raise ValueError(f"a move names exactly one segment, got {self.segments}")
            if self.at is not None:
                raise ValueError("'at' is only valid for a split")
        elif self.op is ManualRequestOp.SPLIT:
            if len(self.segments) != 1:
                raise ValueError(f"a split names exactly one segment, got {self.segments}")
        else:
            if len(self.segments) < 2:
                raise ValueError(f"a merge names two or more segments, got {self.segments}")
            if len(set(self.segments)) != len(self.segments):
                raise ValueError(f"a merge names each segment once, got {self.segments}")
            if self.at is not None:
                raise ValueError("'at' is only valid for a split")
        return self

    def to_annotation(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True, mode="json"), separators=(",", ":"))


# -- parsing and helpers -----------------------------------------------------------------------


_M = TypeVar("_M", bound=BaseModel)


def _validate(model: type[_M], data: Any, what: str, prefix: str) -> _M:
    if not isinstance(data, Mapping):
        raise ResourceValidationError(what, [(prefix, f"expected an object, got {data!r}")])
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ResourceValidationError(what, _problems(exc, prefix)) from None


def parse_topic_spec(spec: Mapping[str, Any] | None) -> ScalableTopicSpec:
    """Validate a ScalableTopic ``spec``; ``ResourceValidationError`` names each bad field
    (e.g. ``spec.autoScale.maxSegments``)."""
    return _validate(ScalableTopicSpec, spec or {}, "ScalableTopic spec", "spec")


def parse_topic(obj: Mapping[str, Any]) -> ScalableTopic:
    return _validate(ScalableTopic, obj, "ScalableTopic", "")


def parse_segment_spec(spec: Mapping[str, Any]) -> SegmentSpec:
    return _validate(SegmentSpec, spec, "Segment spec", "spec")


def parse_segment(obj: Mapping[str, Any]) -> Segment:
    return _validate(Segment, obj, "Segment", "")


def parse_manual_request(text: str | None) -> ManualRequest:
    """Parse the ``scalabletopics.io/request`` annotation (JSON)."""
    what = f"{ANNOTATION_REQUEST} annotation"
    if text is None or not text.strip():
        raise ResourceValidationError(what, [("", "empty")])
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResourceValidationError(what, [("", f"not JSON: {exc}")]) from None
    return _validate(ManualRequest, data, what, "")


def handled_request(status: Mapping[str, Any], request_id: str) -> dict[str, Any] | None:
    """The recorded outcome of manual request ``request_id`` if the topic already handled it
    (``status.lastRequest`` or one of ``status.recentRequests``), else ``None``."""
    last = status.get("lastRequest")
    if isinstance(last, Mapping) and last.get("id") == request_id:
        return dict(last)
    for entry in status.get("recentRequests") or []:
        if isinstance(entry, Mapping) and entry.get("id") == request_id:
            return dict(entry)
    return None


def remember_request(status: dict[str, Any], limit: int = REQUEST_HISTORY) -> None:
    """Fold ``status.lastRequest`` into ``status.recentRequests`` (in place): appended when its
    id is not there yet, oldest entries dropped beyond ``limit``. Whoever records an outcome in
    ``lastRequest`` only (the split/merge protocol's commit) is caught up by the next call, which
    the leader makes before it starts any other request."""
    last = status.get("lastRequest")
    if not isinstance(last, Mapping) or not last.get("id"):
        return
    history = [
        dict(e)
        for e in status.get("recentRequests") or []
        if isinstance(e, Mapping) and e.get("id")
    ]
    if any(e["id"] == last["id"] for e in history):
        return
    entry = {k: last[k] for k in ("id", "op", "result", "message", "completedAt") if k in last}
    if isinstance(entry.get("message"), str):
        entry["message"] = entry["message"][:256]
    history.append(entry)
    status["recentRequests"] = history[-limit:]


def layout_status(layout: SegmentLayout) -> dict[str, Any]:
    """``status.layout``: the layout's PIP-468 metadata without ``sealedAtEpoch`` on active
    segments (it is 0 there, which ``kubectl describe`` showed as "Sealed At Epoch: 0").
    :meth:`SegmentLayout.from_metadata` reads a missing ``sealedAtEpoch`` as active."""
    data = layout.to_metadata()
    for segment in data["segments"].values():
        if segment["state"] == SegmentState.ACTIVE.value:
            del segment["sealedAtEpoch"]
    return data


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


def segment_manifest(
    *,
    topic: str,
    namespace: str,
    topic_uid: str,
    segment_id: int,
    hash_range: HashRange,
    parents: Sequence[int] = (),
    buckets: int = 1,
) -> dict[str, Any]:
    """The Segment object the leader creates: named, labelled and owned by its topic (so it is
    garbage-collected with it), with a validated spec."""
    spec = SegmentSpec(
        topic=topic,
        segment_id=segment_id,
        range=Range.of(hash_range),
        parents=list(parents),
        buckets=buckets,
    )
    return {
        "apiVersion": API_VERSION,
        "kind": SEGMENT_KIND,
        "metadata": {
            "name": segment_name(topic, segment_id),
            "namespace": namespace,
            "labels": segment_labels(topic, segment_id),
            "ownerReferences": [topic_owner_reference(topic, topic_uid)],
        },
        "spec": spec.model_dump(by_alias=True, mode="json"),
    }
