"""Auto split/merge policy (DESIGN §3, PIP-483): knobs, defaults, validation and resolution.

Durations are seconds (float) in the core. In resources they may also be written the way
Kubernetes users write them (``"90s"``, ``"5m"``, ``"1h30m"``); byte rates accept binary or
decimal suffixes (``"50Mi"``, ``"50MB"``; ``MB`` is read as 2**20 bytes like Pulsar's
``broker.conf``).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

MIB = 1024 * 1024

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|[kmgt]B?|B)?\s*$")
_QUANTITY_UNITS = {"": 1, "B": 1, "K": 1024, "M": MIB, "G": 1024 * MIB, "T": 1024 * 1024 * MIB}


def parse_duration(value: Any) -> Any:
    """``"1h30m"``/``"90s"``/``"250ms"`` → seconds; numbers pass through (as seconds)."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("empty duration")
        try:
            return float(text)
        except ValueError:
            pass
        pos, total = 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text):
            raise ValueError(f"invalid duration {value!r}: use e.g. '90s', '5m', '1h30m'")
        return total
    return value


def parse_quantity(value: Any) -> Any:
    """``"50Mi"``/``"50MB"``/``"5M"`` → bytes; numbers pass through."""
    if isinstance(value, str):
        match = _QUANTITY.match(value)
        if not match:
            raise ValueError(f"invalid byte rate {value!r}: use e.g. 52428800, '50Mi' or '50MB'")
        unit = (match.group(2) or "").upper().rstrip("B").rstrip("I")
        return float(match.group(1)) * _QUANTITY_UNITS[unit]
    return value


def format_duration(seconds: float) -> str:
    """The inverse of :func:`parse_duration` for whole seconds, for readable status/events."""
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
        f"{secs}s" if secs else "",
    ]
    return "".join(parts) or "0s"


Duration = Annotated[float, BeforeValidator(parse_duration)]
ByteRate = Annotated[float, BeforeValidator(parse_quantity)]


class PolicyMode(enum.StrEnum):
    """``auto`` executes decisions; ``recommend`` only records them (status and events)."""

    AUTO = "auto"
    RECOMMEND = "recommend"


_RATE_METRICS = ("msg_rate_in", "bytes_rate_in", "msg_rate_out", "bytes_rate_out")


class AutoScalePolicy(BaseModel):
    """PIP-483 knobs. snake_case in Python, camelCase in resources (``splitCooldown``)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid"
    )

    enabled: bool = True
    mode: PolicyMode = PolicyMode.AUTO
    max_segments: int = Field(64, ge=1)
    min_segments: int = Field(1, ge=1)
    max_dag_depth: int = Field(10, ge=0)
    split_cooldown: Duration = Field(60.0, ge=0)
    merge_cooldown: Duration = Field(300.0, ge=0)
    merge_window: Duration = Field(300.0, ge=0)
    evaluation_interval: Duration = Field(60.0, gt=0)
    split_msg_rate_in_threshold: float = Field(10_000.0, gt=0)
    split_bytes_rate_in_threshold: ByteRate = Field(50.0 * MIB, gt=0)
    split_msg_rate_out_threshold: float = Field(50_000.0, gt=0)
    split_bytes_rate_out_threshold: ByteRate = Field(250.0 * MIB, gt=0)
    merge_msg_rate_in_threshold: float = Field(1_000.0, ge=0)
    merge_bytes_rate_in_threshold: ByteRate = Field(5.0 * MIB, ge=0)
    merge_msg_rate_out_threshold: float = Field(5_000.0, ge=0)
    merge_bytes_rate_out_threshold: ByteRate = Field(25.0 * MIB, ge=0)
    rebucket_down_window: Duration = Field(3600.0, ge=0)
    """PIP-486: how long a segment with surplus entry buckets must stay cold before its bucket
    count is lowered (a rebucket rollover down; raised fast, lowered lazily)."""

    @model_validator(mode="after")
    def _check_consistency(self) -> AutoScalePolicy:
        if self.max_segments < self.min_segments:
            raise ValueError(
                f"maxSegments ({self.max_segments}) must be >= minSegments ({self.min_segments})"
            )
        for metric in _RATE_METRICS:
            split = getattr(self, f"split_{metric}_threshold")
            merge = getattr(self, f"merge_{metric}_threshold")
            if not split > merge:
                camel = to_camel(metric)
                raise ValueError(
                    f"split{camel[0].upper()}{camel[1:]}Threshold ({split:g}) must be above "
                    f"merge{camel[0].upper()}{camel[1:]}Threshold ({merge:g})"
                )
        return self

    def split_threshold(self, metric: str) -> float:
        return float(getattr(self, f"split_{metric}_threshold"))

    def merge_threshold(self, metric: str) -> float:
        return float(getattr(self, f"merge_{metric}_threshold"))


DEFAULT_POLICY = AutoScalePolicy()

PolicySource = Mapping[str, Any] | AutoScalePolicy | None
"""A level of the policy: knobs by name (camelCase or snake_case), or a policy object whose
explicitly set fields are its knobs."""


# -- one resolution for the controller, the recommender and the acceptance rule -----------------

NAMESPACE_POLICY_ANNOTATION = "scalabletopics.io/autoscale-policy"
CLUSTER_DEFAULTS_CONFIGMAP = "scalable-topics-autoscale-defaults"
"""The ConfigMap (in the operator's namespace) with the cluster-wide defaults and master switch."""

BUCKET_MAX = 1024
"""The built-in ``N_max`` (``core.buckets.N_MAX``): a segment's entry buckets are at most this."""
LOAD_REPORT_THRESHOLD = 0.25
"""The built-in relative move (PIP-483's 25 %) of a segment's rates or backlog that makes a
broker rewrite ``Segment.status.load``/``backlog``."""


class PolicyLevel(enum.StrEnum):
    """Where a knob's effective value comes from, highest precedence first."""

    TOPIC = "topic"
    NAMESPACE = "namespace"
    CLUSTER = "cluster"
    DEFAULT = "default"


class ClusterMode(enum.StrEnum):
    """The cluster master switch (ConfigMap key ``mode``): ``off`` stops every decision,
    ``recommend`` records decisions without executing them, ``auto`` leaves it to each topic's
    ``mode``."""

    OFF = "off"
    RECOMMEND = "recommend"
    AUTO = "auto"


_MODE_RANK = {ClusterMode.OFF: 0, ClusterMode.RECOMMEND: 1, ClusterMode.AUTO: 2}


class PolicyError(ValueError):
    """A level of the policy, or their combination, is invalid; the message names the knob."""


def _knob_adapter(info: Any) -> TypeAdapter[Any]:
    if info.metadata:
        return TypeAdapter(Annotated[info.annotation, *info.metadata])
    return TypeAdapter(info.annotation)


_KNOB_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    name: _knob_adapter(info) for name, info in AutoScalePolicy.model_fields.items()
}
_BY_ALIAS = {(info.alias or name): name for name, info in AutoScalePolicy.model_fields.items()}


def knob_alias(name: str) -> str:
    """``split_cooldown`` → ``splitCooldown`` (the name users write)."""
    return AutoScalePolicy.model_fields[name].alias or name


def _error_text(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def validate_knob(key: str, value: Any) -> tuple[str, Any]:
    """One knob (camelCase or snake_case ``key``) checked alone: ``(snake_name, value)``.

    Raises :class:`PolicyError` naming the knob for an unknown knob or an invalid value."""
    name = _BY_ALIAS.get(key, key)
    if name not in AutoScalePolicy.model_fields:
        raise PolicyError(f"unknown auto-scale policy knob {key!r}")
    try:
        return name, _KNOB_ADAPTERS[name].validate_python(value)
    except ValidationError as exc:
        raise PolicyError(f"{knob_alias(name)}: {_error_text(exc)}") from None


def _level_knobs(level: Mapping[str, Any] | AutoScalePolicy | None) -> dict[str, Any]:
    if level is None:
        return {}
    if isinstance(level, AutoScalePolicy):
        return {name: getattr(level, name) for name in level.model_fields_set}
    if not isinstance(level, Mapping):
        raise PolicyError(f"a JSON object of knobs is expected, got {type(level).__name__}")
    knobs: dict[str, Any] = {}
    for key, value in level.items():
        if value is None:
            continue
        name, checked = validate_knob(str(key), value)
        knobs[name] = checked
    return knobs


def parse_namespace_policy(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The knobs of a namespace's ``scalabletopics.io/autoscale-policy`` annotation (its JSON
    text, or the object already decoded), each checked alone. :class:`PolicyError` when it is
    not a JSON object of known, valid knobs."""
    if raw is None:
        return {}
    value: Any = raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"not JSON: {exc}") from None
    return _level_knobs(value)


@dataclass(frozen=True)
class ClusterDefaults:
    """The cluster-wide level (ConfigMap ``scalable-topics-autoscale-defaults``): the master
    switch, knob defaults (snake_case, each valid alone and together with the built-in
    defaults) and the settings that were hard-coded before."""

    mode: ClusterMode = ClusterMode.AUTO
    knobs: Mapping[str, Any] = field(default_factory=dict)
    bucket_max: int = BUCKET_MAX
    load_report_threshold: float = LOAD_REPORT_THRESHOLD


@dataclass(frozen=True)
class SettingProblem:
    """An invalid ConfigMap key and why; the previous value of ``key`` stays in force."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


CLUSTER_SETTINGS = ("mode", "maxBuckets", "loadReportThreshold")
"""ConfigMap keys besides the knobs' camelCase names (the knob ``mode`` is the master switch)."""


def parse_cluster_defaults(
    data: Mapping[str, str] | None,
    previous: ClusterDefaults | None = None,
    defaults: AutoScalePolicy = DEFAULT_POLICY,
) -> tuple[ClusterDefaults, tuple[SettingProblem, ...]]:
    """The ConfigMap's ``data`` as :class:`ClusterDefaults`. A key that does not parse keeps
    its value in ``previous`` (the settings in force before this version of the ConfigMap)
    and is reported; a missing ConfigMap (``None``) is the built-in defaults."""
    before = previous or ClusterDefaults()
    if data is None:
        return ClusterDefaults(), ()
    problems: list[SettingProblem] = []
    mode, bucket_max, threshold = ClusterMode.AUTO, BUCKET_MAX, LOAD_REPORT_THRESHOLD
    knobs: dict[str, Any] = {}
    for key, text in sorted(data.items()):
        value = text.strip() if isinstance(text, str) else text
        if key == "mode":
            try:
                mode = ClusterMode(value)
            except ValueError:
                mode = before.mode
                problems.append(
                    SettingProblem(key, f"{value!r} is not one of off, recommend, auto")
                )
        elif key == "maxBuckets":
            try:
                bucket_max = int(value)
                if not 1 <= bucket_max <= BUCKET_MAX:
                    raise ValueError
            except (TypeError, ValueError):
                bucket_max = before.bucket_max
                problems.append(
                    SettingProblem(key, f"{value!r} is not an integer from 1 to {BUCKET_MAX}")
                )
        elif key == "loadReportThreshold":
            try:
                threshold = float(value)
                if not 0 <= threshold <= 1:
                    raise ValueError
            except (TypeError, ValueError):
                threshold = before.load_report_threshold
                problems.append(
                    SettingProblem(key, f"{value!r} is not a fraction from 0 to 1 (0.25: 25 %)")
                )
        else:
            try:
                name, checked = validate_knob(key, value)
                knobs[name] = checked
            except PolicyError as exc:
                name = _BY_ALIAS.get(key, key)
                if name in before.knobs:
                    knobs[name] = before.knobs[name]
                problems.append(SettingProblem(key, str(exc)))
    try:
        AutoScalePolicy.model_validate({**_all_knobs(defaults), **knobs})
    except ValidationError as exc:
        keys = ", ".join(knob_alias(name) for name in sorted(knobs)) or "knobs"
        problems.append(
            SettingProblem(keys, f"{_error_text(exc)} (the previous knob defaults are kept)")
        )
        knobs = dict(before.knobs)
    cluster = ClusterDefaults(
        mode=mode, knobs=knobs, bucket_max=bucket_max, load_report_threshold=threshold
    )
    return cluster, tuple(problems)


def _all_knobs(policy: AutoScalePolicy) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in AutoScalePolicy.model_fields}


_LEVEL_TEXT = {
    PolicyLevel.TOPIC: "spec.autoScale",
    PolicyLevel.NAMESPACE: f"the namespace's {NAMESPACE_POLICY_ANNOTATION} annotation",
    PolicyLevel.CLUSTER: f"the ConfigMap {CLUSTER_DEFAULTS_CONFIGMAP}",
    PolicyLevel.DEFAULT: "the operator's default",
}


def level_text(level: PolicyLevel) -> str:
    """Where a level is written, for messages (``spec.autoScale``, the annotation, ...)."""
    return _LEVEL_TEXT[level]


@dataclass(frozen=True)
class Resolution:
    """The effective policy of a topic and where each knob came from.

    ``mode`` is the effective mode: the more restrictive of the master switch and the policy's
    ``mode`` (``mode_source`` says which decided). ``problems`` are levels that were ignored
    (an invalid namespace annotation), each with the reason."""

    policy: AutoScalePolicy
    sources: Mapping[str, PolicyLevel]
    mode: ClusterMode
    mode_source: PolicyLevel
    bucket_max: int = BUCKET_MAX
    problems: tuple[str, ...] = ()

    def shown(self) -> dict[str, str]:
        """Every knob as users write it (camelCase → ``5m``, ``50Mi``, ``10000``, ``true``);
        ``mode`` is the effective mode."""
        values = {knob_alias(n): format_knob(n, getattr(self.policy, n)) for n in self.sources}
        values["mode"] = self.mode.value
        return values

    def shown_sources(self) -> dict[str, str]:
        sources = {knob_alias(n): level.value for n, level in self.sources.items()}
        sources["mode"] = self.mode_source.value
        return sources


def format_knob(name: str, value: Any) -> str:
    """A knob's value the way a user writes it."""
    metadata = AutoScalePolicy.model_fields[name].metadata
    funcs = {getattr(m, "func", None) for m in metadata}
    if parse_duration in funcs:
        return format_duration(float(value))
    if parse_quantity in funcs:
        for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= size and value % size == 0:
                return f"{int(value // size)}{unit}"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def resolve_policy(
    topic: Mapping[str, Any] | AutoScalePolicy | None,
    namespace: str | Mapping[str, Any] | None = None,
    cluster: ClusterDefaults | None = None,
    defaults: AutoScalePolicy = DEFAULT_POLICY,
) -> Resolution:
    """The effective auto-scale policy: each knob from the topic's ``spec.autoScale``, else the
    namespace's annotation, else the cluster ConfigMap, else the built-in ``defaults``.

    An invalid namespace annotation (not JSON, an unknown knob, a bad value) is ignored as a
    whole, with the reason in ``problems``: the topic runs on the other levels. Raises
    :class:`PolicyError` when the topic's own knobs are invalid or the levels combine into an
    invalid policy (a topic ``minSegments`` above the namespace's ``maxSegments``); the
    message names the knobs and their levels."""
    cluster = cluster or ClusterDefaults()
    topic_knobs = _level_knobs(topic)
    problems: list[str] = []
    try:
        namespace_knobs = parse_namespace_policy(namespace)
    except PolicyError as exc:
        namespace_knobs = {}
        problems.append(
            f"{level_text(PolicyLevel.NAMESPACE)} is ignored: {exc}; the topic uses the other "
            "levels"
        )
    levels = (
        (PolicyLevel.TOPIC, topic_knobs),
        (PolicyLevel.NAMESPACE, namespace_knobs),
        (PolicyLevel.CLUSTER, cluster.knobs),
    )
    merged: dict[str, Any] = {}
    sources: dict[str, PolicyLevel] = {}
    for name in AutoScalePolicy.model_fields:
        level, value = next(
            ((lv, knobs[name]) for lv, knobs in levels if name in knobs),
            (PolicyLevel.DEFAULT, getattr(defaults, name)),
        )
        merged[name], sources[name] = value, level
    try:
        policy = AutoScalePolicy.model_validate(merged)
    except ValidationError as exc:
        text = _error_text(exc)
        named = [n for n in sources if knob_alias(n) in text]
        where = ", ".join(f"{knob_alias(n)} from {level_text(sources[n])}" for n in named)
        raise PolicyError(f"{text} ({where})" if where else text) from None
    knob_mode = ClusterMode(policy.mode.value)
    if _MODE_RANK[cluster.mode] < _MODE_RANK[knob_mode]:
        mode, mode_source = cluster.mode, PolicyLevel.CLUSTER
    else:
        mode, mode_source = knob_mode, sources["mode"]
    return Resolution(
        policy=policy,
        sources=sources,
        mode=mode,
        mode_source=mode_source,
        bucket_max=cluster.bucket_max,
        problems=tuple(problems),
    )
