"""Label and field selectors, parsed once per request and matched per object."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import bad_request

JSON = dict[str, Any]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_OP_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str]

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value in self.values
        if self.op == "!=":
            return not present or value not in self.values
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( … )``."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (s.strip() for s in parts) if p]


def parse_label_selector(text: str | None) -> list[Requirement]:
    if not text:
        return []
    reqs: list[Requirement] = []
    for part in _split_top_level(text):
        m = _SET_RE.match(part)
        if m and not m.group(1):
            values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
            reqs.append(Requirement(m.group(2), m.group(3), values))
            continue
        m = _OP_RE.match(part)
        if m:
            op = "!=" if m.group(2) == "!=" else "="
            reqs.append(Requirement(m.group(1), op, frozenset([m.group(3)])))
            continue
        m = _EXISTS_RE.match(part)
        if m:
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists", frozenset()))
            continue
        raise bad_request(f"unable to parse requirement: {part!r}")
    return reqs


def label_selector_from_api(selector: JSON | None) -> list[Requirement]:
    """A ``metav1.LabelSelector`` (matchLabels / matchExpressions) as requirements."""
    if not selector:
        return []
    reqs = [
        Requirement(k, "=", frozenset([str(v)]))
        for k, v in (selector.get("matchLabels") or {}).items()
    ]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        reqs.append(
            Requirement(
                expr["key"],
                ops.get(expr.get("operator", ""), "in"),
                frozenset(expr.get("values") or []),
            )
        )
    return reqs


def format_selector(reqs: list[Requirement]) -> str:
    out: list[str] = []
    for r in reqs:
        if r.op in ("=", "!="):
            out.append(f"{r.key}{r.op}{next(iter(r.values))}")
        elif r.op in ("in", "notin"):
            out.append(f"{r.key} {r.op} ({','.join(sorted(r.values))})")
        elif r.op == "exists":
            out.append(r.key)
        else:
            out.append(f"!{r.key}")
    return ",".join(out)


def labels_match(reqs: list[Requirement], obj: JSON) -> bool:
    if not reqs:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(r.matches(labels) for r in reqs)


@dataclass(frozen=True)
class FieldRequirement:
    path: tuple[str, ...]
    negate: bool
    value: str

    def matches(self, obj: JSON) -> bool:
        cur: Any = obj
        for part in self.path:
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is None:
            actual = ""
        elif isinstance(cur, bool):
            actual = "true" if cur else "false"
        else:
            actual = str(cur)
        return (actual == self.value) != self.negate


_FIELD_ALIASES = {"source": ("source", "component")}


def parse_field_selector(text: str | None) -> list[FieldRequirement]:
    """``a.b=c,d!=e``; any dotted path into the object is accepted (a superset of the real
    apiserver, which allows only a per-kind list)."""
    if not text:
        return []
    reqs: list[FieldRequirement] = []
    for part in _split_top_level(text):
        for op in ("!=", "==", "="):
            if op in part:
                field, _, value = part.partition(op)
                field = field.strip()
                path = _FIELD_ALIASES.get(field, tuple(field.split(".")))
                reqs.append(FieldRequirement(path, op == "!=", value.strip()))
                break
        else:
            raise bad_request(f"invalid selector: {text!r}; can't understand {part!r}")
    return reqs


def fields_match(reqs: list[FieldRequirement], obj: JSON) -> bool:
    return all(r.matches(obj) for r in reqs)


def make_filter(label: str | None, field: str | None) -> Callable[[JSON], bool] | None:
    lreqs = parse_label_selector(label)
    freqs = parse_field_selector(field)
    if not lreqs and not freqs:
        return None
    return lambda obj: labels_match(lreqs, obj) and fields_match(freqs, obj)
