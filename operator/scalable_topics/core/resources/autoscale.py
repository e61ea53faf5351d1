"""Auto split/merge (PIP-483) in the resources: ``spec.autoScale``, a model derived from
:class:`core.policy.AutoScalePolicy` (every knob optional, with the CRD's CEL rules), and
``status.autoScale`` (effective policy, sources, last decision and evaluation).
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, create_model, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from ..operation import OperationKind
from ..policy import (
    DEFAULT_POLICY,
    AutoScalePolicy,
    format_duration,
    parse_duration,
    parse_quantity,
)
from .common import (
    _DURATION_INPUT,
    _DURATION_JSON,
    _QUANTITY_INPUT,
    _QUANTITY_JSON,
    DURATION_PATTERN,
    QUANTITY_PATTERN,
    Timestamp,
    _int_or_string,
    _Spec,
    _Status,
)

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
    "rebucket_down_window": "How long a segment holding more entry buckets than its budget "
    "share and than the ordered consumers need must stay cold before its bucket count is "
    "lowered (rebucket rollover).",
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
