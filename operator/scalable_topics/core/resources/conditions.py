"""kstatus conditions (``metav1.Condition``): types, reasons, the model and the helpers that
build and replace them in a status.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from .common import CONDITION_TYPE_PATTERN, REASON_PATTERN, Timestamp, _Status, format_time

_REASON_RE = re.compile(REASON_PATTERN)


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
