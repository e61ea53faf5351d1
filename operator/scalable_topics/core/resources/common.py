"""Schema-level building blocks shared by the resources: the patterns of the CRD schema, the
int-or-string duration and quantity types, RFC 3339 timestamps, the spec/status base models,
the hash-ring ``Range``, and validation that reports every bad field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

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
    model_validator,
)
from pydantic.alias_generators import to_camel

from ..hashing import RING_MAX
from ..layout import HashRange
from ..policy import format_duration, parse_duration, parse_quantity

DURATION_PATTERN = r"^(([0-9]+(\.[0-9]+)?(ms|s|m|h))+|[0-9]+(\.[0-9]+)?)$"
QUANTITY_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B?|[kmgt]B?|B)?\s*$"
SUBSCRIPTION_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


_HEX_RANGE_PATTERN = r"^[0-9a-f]{4}-[0-9a-f]{4}$"


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


_M = TypeVar("_M", bound=BaseModel)


def _validate(model: type[_M], data: Any, what: str, prefix: str) -> _M:
    if not isinstance(data, Mapping):
        raise ResourceValidationError(what, [(prefix, f"expected an object, got {data!r}")])
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ResourceValidationError(what, _problems(exc, prefix)) from None
