"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge patch follows ``k8s.io/apimachinery/pkg/util/strategicpatch`` for what kubectl
sends: maps merge recursively, ``null`` deletes, lists with a patch merge key merge element by
element (``$patch: delete`` / ``replace`` inside elements), primitive lists with the ``merge``
strategy take the union, ``$deleteFromPrimitiveList/<field>`` removes values,
``$setElementOrder/<field>`` and ``$retainKeys`` are honoured; every other list is replaced.
The merge keys come from :data:`MERGE_KEYS`, a table by field path (wildcarding kinds), which
covers the built-ins this server stores.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError, bad_request

JSON = dict[str, Any]

# field name (as it appears in a path, list elements not counted) -> merge key.
# Applies when the parent path ends with the given suffix.
_POD_SPEC_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "tolerations": "",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
}
_CONTAINER_KEYS: dict[str, str] = {
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "resizePolicy": "resourceName",
}
_MERGE_PRIMITIVE = object()

MERGE_KEYS: dict[tuple[str, ...], dict[str, Any]] = {
    ("metadata",): {"finalizers": _MERGE_PRIMITIVE, "ownerReferences": "uid"},
    ("spec",): {
        **_POD_SPEC_KEYS,
        "ports": "port",
        "volumeClaimTemplates": "",
    },
    ("spec", "template", "spec"): _POD_SPEC_KEYS,
    ("spec", "jobTemplate", "spec", "template", "spec"): _POD_SPEC_KEYS,
    ("spec", "containers", "*"): _CONTAINER_KEYS,
    ("spec", "initContainers", "*"): _CONTAINER_KEYS,
    ("spec", "template", "spec", "containers", "*"): _CONTAINER_KEYS,
    ("spec", "template", "spec", "initContainers", "*"): _CONTAINER_KEYS,
    ("spec", "jobTemplate", "spec", "template", "spec", "containers", "*"): _CONTAINER_KEYS,
    ("status",): {"conditions": "type", "containerStatuses": "name", "podIPs": "ip"},
    ("subsets", "*"): {"addresses": "ip", "ports": "port"},
}


def _lookup_key(path: tuple[str, ...], field: str) -> Any:
    table = MERGE_KEYS.get(path)
    if table is None:
        return None
    key = table.get(field)
    return key if key != "" else None


# -- JSON merge patch ---------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


# -- JSON patch ---------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str], op: str) -> tuple[Any, str]:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict):
            if part not in cur:
                raise _patch_error(op, f"missing path segment {part!r}")
            cur = cur[part]
        elif isinstance(cur, list):
            cur = cur[_index(cur, part, op)]
        else:
            raise _patch_error(op, f"cannot traverse into {part!r}")
    return cur, parts[-1]


def _index(lst: list[Any], part: str, op: str, *, allow_end: bool = False) -> int:
    if part == "-" and allow_end:
        return len(lst)
    try:
        i = int(part)
    except ValueError:
        raise _patch_error(op, f"invalid array index {part!r}") from None
    if i < 0 or i > len(lst) or (i == len(lst) and not allow_end):
        raise _patch_error(op, f"array index {i} out of bounds")
    return i


def _patch_error(op: str, detail: str) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request: "
        f"json patch {op} operation does not apply: {detail}",
    )


def _get(doc: Any, path: str, op: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _resolve(doc, parts, op)
    if isinstance(parent, dict):
        if last not in parent:
            raise _patch_error(op, f"doc is missing key: {path}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, op)]
    raise _patch_error(op, f"cannot read {path}")


def _remove(doc: Any, path: str, op: str) -> Any:
    parts = _pointer(path)
    parent, last = _resolve(doc, parts, op)
    if isinstance(parent, dict):
        if last not in parent:
            raise _patch_error(op, f"doc is missing key: {path}")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, op))
    raise _patch_error(op, f"cannot remove {path}")


def _add(doc: Any, path: str, value: Any, op: str, *, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _resolve(doc, parts, op)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise _patch_error(op, f"doc is missing key: {path}")
        parent[last] = value
    elif isinstance(parent, list):
        if replace:
            parent[_index(parent, last, op)] = value
        else:
            parent.insert(_index(parent, last, op, allow_end=True), value)
    else:
        raise _patch_error(op, f"cannot add at {path}")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for raw in ops:
        if not isinstance(raw, dict) or "op" not in raw:
            raise bad_request("json patch operation must be an object with 'op'")
        op = raw["op"]
        path = raw.get("path", "")
        if op == "add":
            doc = _add(doc, path, copy.deepcopy(raw.get("value")), op, replace=False)
        elif op == "replace":
            doc = _add(doc, path, copy.deepcopy(raw.get("value")), op, replace=True)
        elif op == "remove":
            _remove(doc, path, op)
        elif op == "move":
            value = _remove(doc, raw["from"], op)
            doc = _add(doc, path, value, op, replace=False)
        elif op == "copy":
            value = copy.deepcopy(_get(doc, raw["from"], op))
            doc = _add(doc, path, value, op, replace=False)
        elif op == "test":
            if _get(doc, path, op) != raw.get("value"):
                raise _patch_error(op, f"testing value {path} failed")
        else:
            raise bad_request(f"unexpected json patch operation {op!r}")
    return doc


# -- strategic merge patch ----------------------------------------------------------------


def strategic_merge_patch(target: JSON, patch: JSON) -> JSON:
    result: JSON = _smp_map(target, patch, ())
    return result


def _smp_map(original: Any, patch: JSON, path: tuple[str, ...]) -> Any:
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: JSON = dict(original) if isinstance(original, dict) else {}
    retain = patch.get("$retainKeys")
    orders: dict[str, list[Any]] = {}
    deletes: dict[str, list[Any]] = {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/"):
            orders[k.partition("/")[2]] = v
        elif k.startswith("$deleteFromPrimitiveList/"):
            deletes[k.partition("/")[2]] = v
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            result.pop(k, None)
            continue
        child_path = (*path, k)
        if isinstance(v, dict):
            merged = _smp_map(result.get(k), v, child_path)
            if merged is None:
                result.pop(k, None)
            else:
                result[k] = merged
        elif isinstance(v, list):
            result[k] = _smp_list(result.get(k), v, path, k)
        else:
            result[k] = v
    for k, values in deletes.items():
        if isinstance(result.get(k), list):
            result[k] = [x for x in result[k] if x not in values]
    for k, order in orders.items():
        if isinstance(result.get(k), list):
            result[k] = _reorder(result[k], order, _lookup_key(path, k))
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _smp_list(original: Any, patch: list[Any], parent: tuple[str, ...], field: str) -> list[Any]:
    key = _lookup_key(parent, field)
    if key is None:
        return copy.deepcopy(patch)
    orig = list(original) if isinstance(original, list) else []
    if key is _MERGE_PRIMITIVE:
        out = list(orig)
        for item in patch:
            if item not in out:
                out.append(item)
        return out
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    elem_path = (*parent, field, "*")
    out = list(orig)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            out.append(copy.deepcopy(item))
            continue
        idx = next(
            (i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(_smp_map({}, item, elem_path))
        else:
            out[idx] = _smp_map(out[idx], item, elem_path)
    return out


def _reorder(items: list[Any], order: list[Any], key: Any) -> list[Any]:
    def ident(x: Any) -> Any:
        if isinstance(x, dict) and isinstance(key, str):
            return x.get(key)
        return x

    wanted = [ident(o) for o in order]
    positioned = {w: i for i, w in enumerate(wanted)}
    in_order = sorted(
        (x for x in items if ident(x) in positioned), key=lambda x: positioned[ident(x)]
    )
    rest = [x for x in items if ident(x) not in positioned]
    return in_order + rest
