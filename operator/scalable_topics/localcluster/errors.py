"""Kubernetes API errors and the ``Status`` bodies the real apiserver returns for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


@dataclass
class Cause:
    """One ``details.causes[]`` entry (``reason`` is a ``metav1.CauseType``)."""

    reason: str
    message: str
    field: str = ""

    def to_api(self) -> JSON:
        out: JSON = {"reason": self.reason, "message": self.message}
        if self.field:
            out["field"] = self.field
        return out


@dataclass
class ApiError(Exception):
    """An error the HTTP layer renders as a ``kind: Status`` failure body."""

    code: int
    reason: str
    message: str
    name: str = ""
    group: str = ""
    kind: str = ""
    causes: list[Cause] = field(default_factory=list)
    retry_after: int | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        details: JSON = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [c.to_api() for c in self.causes]
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        if details:
            body["details"] = details
        return body


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(plural, group)} "{name}" not found',
        name=name,
        group=group,
        kind=plural,
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(plural, group)} "{name}" already exists',
        name=name,
        group=group,
        kind=plural,
    )


def conflict(plural: str, group: str, name: str, detail: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {detail}',
        name=name,
        group=group,
        kind=plural,
    )


def stale(plural: str, group: str, name: str) -> ApiError:
    return conflict(
        plural,
        group,
        name,
        "the object has been modified; please apply your changes to the latest version "
        "and try again",
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str = "the server does not allow this method") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type}) - accepted media "
        "types include: application/json-patch+json, application/merge-patch+json",
    )


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def forbidden(message: str, *, plural: str = "", group: str = "", name: str = "") -> ApiError:
    return ApiError(403, "Forbidden", message, name=name, group=group, kind=plural)


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    """422 ``Invalid`` with the apiserver's aggregated message format."""
    parts = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {joined}',
        name=name,
        group=group,
        kind=kind,
        causes=causes,
    )
