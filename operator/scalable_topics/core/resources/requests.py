"""Manual operation requests: the ``scalabletopics.io/request`` annotation, its parsing, and the
outcomes the topic keeps in ``status.lastRequest`` and ``status.recentRequests``.
"""

from __future__ import annotations

import enum
import json
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator

from ..hashing import RING_MAX
from .common import Int, ResourceValidationError, Timestamp, _Spec, _Status, _validate
from .names import ANNOTATION_REQUEST


class ManualRequestOp(enum.StrEnum):
    SPLIT = "split"
    MERGE = "merge"
    MOVE = "move"


class RequestResult(enum.StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    REJECTED = "Rejected"


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
