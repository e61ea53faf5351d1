"""Auto split/merge policy (DESIGN §3, PIP-483): knobs, defaults, validation and resolution.

Durations are seconds (float) in the core. In resources they may also be written the way
Kubernetes users write them (``"90s"``, ``"5m"``, ``"1h30m"``); byte rates accept binary or
decimal suffixes (``"50Mi"``, ``"50MB"``; ``MB`` is read as 2**20 bytes like Pulsar's
``broker.conf``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
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


def _explicit_fields(source: PolicySource) -> dict[str, Any]:
    """The knobs a level actually sets, keyed by snake_case field name."""
    if source is None:
        return {}
    if isinstance(source, AutoScalePolicy):
        return {name: getattr(source, name) for name in source.model_fields_set}
    by_alias = {(field.alias or name): name for name, field in AutoScalePolicy.model_fields.items()}
    fields: dict[str, Any] = {}
    for key, value in source.items():
        name = by_alias.get(key, key)
        if name not in AutoScalePolicy.model_fields:
            raise ValueError(f"unknown auto-scale policy knob {key!r}")
        if value is not None:
            fields[name] = value
    return fields


def knob_source(name: str, topic: PolicySource, namespace: PolicySource) -> str:
    """Which level :func:`resolve` takes knob ``name`` (snake_case) from: ``"topic"``,
    ``"namespace"`` or ``"default"``."""
    if name in _explicit_fields(topic):
        return "topic"
    if name in _explicit_fields(namespace):
        return "namespace"
    return "default"


def resolve(
    topic: PolicySource, namespace: PolicySource, defaults: AutoScalePolicy = DEFAULT_POLICY
) -> AutoScalePolicy:
    """Field by field: the topic's value, else the namespace's, else the operator default.

    Raises ``ValueError`` (a pydantic ``ValidationError``) naming the knob when the combination
    is invalid, e.g. a topic ``minSegments`` above the namespace's ``maxSegments``.
    """
    merged = {name: getattr(defaults, name) for name in AutoScalePolicy.model_fields}
    merged.update(_explicit_fields(namespace))
    merged.update(_explicit_fields(topic))
    return AutoScalePolicy.model_validate(merged)
