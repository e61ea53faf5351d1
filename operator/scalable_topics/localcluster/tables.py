"""Server-side ``meta.k8s.io/v1`` Table rendering (what ``kubectl get`` prints).

Custom resources use their ``additionalPrinterColumns``; the JSONPath subset evaluated is the
one those columns use in practice: dotted fields (with ``\\.`` escapes and ``['a.b']``
brackets), ``[n]`` indexes, ``[*]`` and ``[?(@.field=="value")]`` filters.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from typing import Any

from .registry import ResourceType
from .selectors import format_selector, label_selector_from_api

JSON = dict[str, Any]

NAME_COLUMN: JSON = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}
AGE_COLUMN: JSON = {
    "name": "Age",
    "type": "date",
    "description": "CreationTimestamp is a timestamp representing the server time when this "
    "object was created.",
    "priority": 0,
    "jsonPath": ".metadata.creationTimestamp",
}


# -- JSONPath subset ----------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\.\.?(?P<field>(?:\\.|[^.\[\\])+)     # .field (backslash escapes)
      |\[\s*'(?P<quoted>[^']*)'\s*\]          # ['field']
      |\[\s*"(?P<dquoted>[^"]*)"\s*\]         # ["field"]
      |\[\s*(?P<index>-?\d+)\s*\]             # [0]
      |\[\s*\*\s*\]                           # [*]
      |\[\s*\?\(\s*@\.(?P<fpath>[^=!<> ]+)\s*(?P<fop>==|!=)\s*
         (?P<fval>"[^"]*"|'[^']*'|[^)\s]+)\s*\)\s*\]     # [?(@.type=="Ready")]
    """,
    re.VERBOSE,
)


def _tokens(path: str) -> list[tuple[str, Any]]:
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    if path.startswith("$"):
        path = path[1:]
    out: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            raise ValueError(f"unsupported JSONPath {path!r} at {pos}")
        if m.group("field") is not None:
            out.append(("field", re.sub(r"\\(.)", r"\1", m.group("field"))))
        elif m.group("quoted") is not None:
            out.append(("field", m.group("quoted")))
        elif m.group("dquoted") is not None:
            out.append(("field", m.group("dquoted")))
        elif m.group("index") is not None:
            out.append(("index", int(m.group("index"))))
        elif m.group("fpath") is not None:
            raw = m.group("fval")
            if raw[0] in "'\"":
                value: Any = raw[1:-1]
            else:
                try:
                    value = json.loads(raw)
                except ValueError:
                    value = raw
            out.append(("filter", (m.group("fpath").split("."), m.group("fop"), value)))
        else:
            out.append(("all", None))
        pos = m.end()
    return out


def jsonpath(obj: Any, path: str) -> list[Any]:
    """All values ``path`` selects in ``obj`` (empty when nothing matches)."""
    current = [obj]
    for kind, arg in _tokens(path):
        nxt: list[Any] = []
        for value in current:
            if kind == "field":
                if isinstance(value, dict) and arg in value:
                    nxt.append(value[arg])
            elif kind == "index":
                if isinstance(value, list) and -len(value) <= arg < len(value):
                    nxt.append(value[arg])
            elif kind == "all":
                if isinstance(value, list):
                    nxt.extend(value)
                elif isinstance(value, dict):
                    nxt.extend(value.values())
            else:
                fpath, op, want = arg
                if isinstance(value, list):
                    for item in value:
                        got: Any = item
                        for p in fpath:
                            got = got.get(p) if isinstance(got, dict) else None
                        if (got == want) == (op == "=="):
                            nxt.append(item)
        current = nxt
    return current


# -- cell formatting ----------------------------------------------------------------------


def _units(whole: int, unit: str, rest: int, rest_unit: str) -> str:
    """``1h30m``, or ``1h`` when the smaller unit is zero."""
    return f"{whole}{unit}{rest}{rest_unit}" if rest else f"{whole}{unit}"


def human_duration(seconds: float) -> str:
    """``k8s.io/apimachinery/pkg/util/duration.HumanDuration``."""
    s = int(seconds)
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return _units(minutes, "m", s % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return _units(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return _units(hours // 24, "d", hours % 24, "h")
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24
        return _units(days // 365, "y", days % 365, "d")
    return f"{hours // 24 // 365}y"


def age(timestamp: Any) -> Any:
    if not isinstance(timestamp, str):
        return "<unknown>"
    try:
        t = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        try:
            t = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError:
            return timestamp
    return human_duration((datetime.now(UTC) - t).total_seconds())


def _cell(values: list[Any], typ: str) -> Any:
    if not values:
        return None
    value = values[0] if len(values) == 1 else values
    if typ == "date":
        return age(value)
    if typ == "integer":  # a float is truncated, as the API server's table convertor does
        if isinstance(value, float) and math.isfinite(value):
            return int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if typ == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if typ == "boolean":
        return value if isinstance(value, bool) else None
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- built-in columns ---------------------------------------------------------------------


def _pod_cells(pod: JSON) -> list[Any]:
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    reason = status.get("reason") or status.get("phase") or "Pending"
    for c in statuses:
        state = c.get("state") or {}
        waiting = (state.get("waiting") or {}).get("reason")
        terminated = state.get("terminated") or {}
        if waiting:
            reason = waiting
        elif terminated:
            reason = terminated.get("reason") or (
                f"ExitCode:{terminated.get('exitCode')}"
                if terminated.get("exitCode")
                else "Completed"
            )
    if pod.get("metadata", {}).get("deletionTimestamp"):
        reason = "Terminating"
    return [f"{ready}/{len(containers)}", reason, restarts]


def _workload_ready(obj: JSON) -> list[Any]:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return [f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}"]


_BUILTIN_COLUMNS: dict[str, tuple[list[JSON], Any]] = {
    "/pods": (
        [
            {"name": "Ready", "type": "string", "priority": 0},
            {"name": "Status", "type": "string", "priority": 0},
            {"name": "Restarts", "type": "string", "priority": 0},
        ],
        _pod_cells,
    ),
    "apps/deployments": (
        [
            {"name": "Ready", "type": "string", "priority": 0},
            {"name": "Up-to-date", "type": "string", "priority": 0},
            {"name": "Available", "type": "string", "priority": 0},
        ],
        lambda o: [
            *_workload_ready(o),
            (o.get("status") or {}).get("updatedReplicas", 0),
            (o.get("status") or {}).get("availableReplicas", 0),
        ],
    ),
    "apps/statefulsets": ([{"name": "Ready", "type": "string", "priority": 0}], _workload_ready),
    "apps/replicasets": ([{"name": "Ready", "type": "string", "priority": 0}], _workload_ready),
    "/namespaces": (
        [{"name": "Status", "type": "string", "priority": 0}],
        lambda o: [(o.get("status") or {}).get("phase", "Active")],
    ),
    "/services": (
        [
            {"name": "Type", "type": "string", "priority": 0},
            {"name": "Cluster-IP", "type": "string", "priority": 0},
        ],
        lambda o: [
            (o.get("spec") or {}).get("type", "ClusterIP"),
            (o.get("spec") or {}).get("clusterIP", "<none>"),
        ],
    ),
    "/configmaps": (
        [{"name": "Data", "type": "integer", "priority": 0}],
        lambda o: [len(o.get("data") or {}) + len(o.get("binaryData") or {})],
    ),
    "/secrets": (
        [
            {"name": "Type", "type": "string", "priority": 0},
            {"name": "Data", "type": "integer", "priority": 0},
        ],
        lambda o: [o.get("type", "Opaque"), len(o.get("data") or {})],
    ),
    "coordination.k8s.io/leases": (
        [{"name": "Holder", "type": "string", "priority": 0}],
        lambda o: [(o.get("spec") or {}).get("holderIdentity", "")],
    ),
    "batch/cronjobs": (
        [
            {"name": "Schedule", "type": "string", "priority": 0},
            {"name": "Suspend", "type": "boolean", "priority": 0},
            {"name": "Active", "type": "integer", "priority": 0},
        ],
        lambda o: [
            (o.get("spec") or {}).get("schedule", ""),
            bool((o.get("spec") or {}).get("suspend", False)),
            len((o.get("status") or {}).get("active") or []),
        ],
    ),
    "batch/jobs": (
        [{"name": "Completions", "type": "string", "priority": 0}],
        lambda o: [
            f"{(o.get('status') or {}).get('succeeded', 0)}/"
            f"{(o.get('spec') or {}).get('completions', 1)}"
        ],
    ),
    "/events": (
        [
            {"name": "Type", "type": "string", "priority": 0},
            {"name": "Reason", "type": "string", "priority": 0},
            {"name": "Object", "type": "string", "priority": 0},
            {"name": "Message", "type": "string", "priority": 0},
        ],
        lambda o: [
            o.get("type", ""),
            o.get("reason", ""),
            f"{str((o.get('involvedObject') or {}).get('kind', '')).lower()}/"
            f"{(o.get('involvedObject') or {}).get('name', '')}",
            o.get("message", ""),
        ],
    ),
}


def _containers(obj: JSON) -> list[JSON]:
    template = (obj.get("spec") or {}).get("template") or {}
    return list((template.get("spec") or {}).get("containers") or [])


def _wide(name: str) -> JSON:
    return {"name": name, "type": "string", "priority": 1}


# Columns kubectl shows after AGE with ``-o wide``.
_WIDE_COLUMNS: dict[str, tuple[list[JSON], Any]] = {
    "/pods": (
        [_wide("IP"), _wide("Node"), _wide("Nominated Node"), _wide("Readiness Gates")],
        lambda o: [
            (o.get("status") or {}).get("podIP") or "<none>",
            (o.get("spec") or {}).get("nodeName") or "<none>",
            (o.get("status") or {}).get("nominatedNodeName") or "<none>",
            "<none>",
        ],
    ),
    "apps/deployments": (
        [_wide("Containers"), _wide("Images"), _wide("Selector")],
        lambda o: [
            ",".join(str(c.get("name", "")) for c in _containers(o)),
            ",".join(str(c.get("image", "")) for c in _containers(o)),
            format_selector(label_selector_from_api((o.get("spec") or {}).get("selector"))),
        ],
    ),
}

_NO_AGE_COLUMN: dict[str, tuple[list[JSON], Any]] = {
    "apiextensions.k8s.io/customresourcedefinitions": (
        [{"name": "Created At", "type": "string", "format": "date-time", "priority": 0}],
        lambda o: [o["metadata"].get("creationTimestamp")],
    ),
}


def columns_for(rt: ResourceType, version: str | None) -> list[JSON]:
    if rt.crd:
        cols = rt.printer_columns.get(version or rt.preferred_version) or []
        if not cols:
            return [NAME_COLUMN, AGE_COLUMN]
        return [NAME_COLUMN, *({**c, "priority": int(c.get("priority", 0))} for c in cols)]
    if rt.key in _NO_AGE_COLUMN:
        return [NAME_COLUMN, *_NO_AGE_COLUMN[rt.key][0]]
    extra = _BUILTIN_COLUMNS.get(rt.key)
    wide = _WIDE_COLUMNS.get(rt.key, ([], None))[0]
    if extra is None:
        return [NAME_COLUMN, AGE_COLUMN, *wide]
    return [NAME_COLUMN, *extra[0], AGE_COLUMN, *wide]


def _row(rt: ResourceType, cols: list[JSON], obj: JSON, include: str) -> JSON:
    cells: list[Any] = [obj["metadata"]["name"]]
    if rt.crd:
        for col in cols[1:]:
            try:
                cells.append(
                    _cell(jsonpath(obj, col.get("jsonPath", "")), col.get("type", "string"))
                )
            except ValueError:
                cells.append(None)
    else:
        no_age = _NO_AGE_COLUMN.get(rt.key)
        extra = no_age or _BUILTIN_COLUMNS.get(rt.key)
        if extra is not None:
            cells.extend(extra[1](obj))
        if no_age is None:
            cells.append(age(obj["metadata"].get("creationTimestamp")))
        wide = _WIDE_COLUMNS.get(rt.key)
        if wide is not None:
            cells.extend(wide[1](obj))
    row: JSON = {"cells": cells}
    if include == "Object":
        row["object"] = obj
    elif include != "None":
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
    return row


def render(
    rt: ResourceType,
    version: str | None,
    objects: list[JSON],
    resource_version: str,
    include: str = "Metadata",
    *,
    with_columns: bool = True,
) -> JSON:
    cols = columns_for(rt, version)
    table: JSON = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {
                "name": c["name"],
                "type": c.get("type", "string"),
                "format": c.get("format", ""),
                "description": c.get("description", ""),
                "priority": int(c.get("priority", 0)),
            }
            for c in cols
        ]
        if with_columns
        else [],
        "rows": [_row(rt, cols, o, include) for o in objects],
    }
    return table
