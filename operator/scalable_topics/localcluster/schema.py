"""Structural-schema handling for custom resources: pruning, defaulting, validation and CEL.

The order is the apiextensions-apiserver's: prune unknown fields, apply defaults, then validate
(OpenAPI value validations first, then ``x-kubernetes-validations`` CEL rules, with ``oldSelf``
transition rules only on update and only where the old value correlates: object properties,
map values and ``x-kubernetes-list-type: map`` items). On update, values equal to their
correlated old value are not validated again (CRD validation ratcheting, on by default since
Kubernetes 1.30): a status write does not re-run the spec's rules.

CEL is evaluated with ``cel-python`` (``celpy``). It covers the CEL standard library and macros
(``has``, ``all``, ``exists``, ``exists_one``, ``map``, ``filter``, ``size``, ``matches``,
``startsWith``…). Kubernetes' CEL extension libraries are not all there: the string helpers
registered below are, ``quantity()``, ``url()``, ``ip()``/``cidr()``, ``format`` and the
optional-types library are not. A rule that uses something ``celpy`` cannot evaluate is skipped
with a warning (never silently treated as passing *or* failing a valid object), see
``docs/localcluster.md``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import Cause

log = logging.getLogger(__name__)

JSON = dict[str, Any]

_ROOT_KEEP = ("apiVersion", "kind", "metadata")


# -- pruning ------------------------------------------------------------------------------


def prune(
    value: Any,
    schema: JSON | None,
    *,
    root: bool = False,
    dropped: list[str] | None = None,
    path: str = "",
) -> Any:
    """Drop fields the schema does not specify (unless it preserves unknown fields); the
    paths of dropped fields are appended to ``dropped``."""
    if schema is None:
        return value
    if isinstance(value, dict):
        embedded = root or schema.get("x-kubernetes-embedded-resource")
        keep = set(_ROOT_KEEP) if embedded else set()
        props: JSON = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        out: JSON = {}
        for k, v in value.items():
            sub_path = _join(path, k)
            if k in props and not (root and k == "metadata"):
                out[k] = prune(v, props[k], dropped=dropped, path=sub_path)
            elif isinstance(additional, dict):
                out[k] = prune(v, additional, dropped=dropped, path=sub_path)
            elif k in keep or preserve or additional is True:
                out[k] = v
            elif dropped is not None:
                dropped.append(sub_path)
        return out
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [
                prune(v, items, dropped=dropped, path=f"{path}[{i}]") for i, v in enumerate(value)
            ]
    return value


# -- defaulting ---------------------------------------------------------------------------


def apply_defaults(value: Any, schema: JSON | None) -> Any:
    if schema is None:
        return value
    if isinstance(value, dict):
        props: JSON = schema.get("properties") or {}
        out = dict(value)
        for k, sub in props.items():
            if "default" in sub and (k not in out or (out[k] is None and not sub.get("nullable"))):
                out[k] = copy.deepcopy(sub["default"])
            if k in out:
                out[k] = apply_defaults(out[k], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for k in list(out):
                if k not in props:
                    out[k] = apply_defaults(out[k], additional)
        return out
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [apply_defaults(v, items) for v in value]
    return value


# -- value validation ---------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '"null"'
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(_type_name(value))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(value: Any, typ: str) -> bool:
    if typ == "object":
        return isinstance(value, dict)
    if typ == "array":
        return isinstance(value, list)
    if typ == "string":
        return isinstance(value, str)
    if typ == "boolean":
        return isinstance(value, bool)
    if typ == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if typ == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


@dataclass
class _Ctx:
    causes: list[Cause]
    cel: bool
    warnings: list[str]


def _invalid(ctx: _Ctx, path: str, value: Any, detail: str) -> None:
    ctx.causes.append(Cause("FieldValueInvalid", f"Invalid value: {_fmt(value)}: {detail}", path))


def _join(path: str, key: str) -> str:
    if not path:
        return key
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}"
    return f"{path}[{key}]"


def validate(
    obj: JSON, schema: JSON, old: JSON | None = None, *, cel: bool = True
) -> tuple[list[Cause], list[str]]:
    """Validate a whole custom resource; returns (causes, warnings)."""
    ctx = _Ctx([], cel, [])
    body = {k: v for k, v in obj.items() if k != "metadata"}
    old_body = None if old is None else {k: v for k, v in old.items() if k != "metadata"}
    meta = obj.get("metadata") or {}
    _walk_metadata(meta, None if old is None else old.get("metadata") or {}, schema, ctx)
    cel_root = dict(body)
    cel_root["metadata"] = {k: meta[k] for k in _SCHEMA_METADATA if k in meta}
    _walk(body, schema, old_body, "", ctx, cel_self=cel_root, root=True)
    return ctx.causes, ctx.warnings


_SCHEMA_METADATA = ("name", "generateName")
"""The only metadata fields a CRD schema may restrict (structural schemas); the rest of
``metadata`` is ObjectMeta and validated as such."""


def _walk_metadata(meta: JSON, old_meta: JSON | None, schema: JSON, ctx: _Ctx) -> None:
    """``metadata.name`` and ``metadata.generateName`` against the schema's restrictions (e.g.
    ``maxLength`` on a name that also becomes a label value), as the apiextensions-apiserver
    validates the whole object. On update an unchanged name is not checked again (ratcheting),
    so an object stored before the restriction existed can still have its status written."""
    props = ((schema.get("properties") or {}).get("metadata") or {}).get("properties") or {}
    for key in _SCHEMA_METADATA:
        sub = props.get(key)
        if isinstance(sub, dict) and key in meta:
            old_value = None if old_meta is None else old_meta.get(key)
            _walk(meta[key], sub, old_value, f"metadata.{key}", ctx)


def _walk(
    value: Any,
    schema: JSON,
    old: Any,
    path: str,
    ctx: _Ctx,
    *,
    cel_self: Any = None,
    root: bool = False,
) -> None:
    if old is not None and not root and value == old:
        return  # validation ratcheting: an unchanged value is not validated again
    before = len(ctx.causes)
    if value is None:
        if not schema.get("nullable") and not root:
            typ = schema.get("type", "object")
            _invalid(ctx, path, None, f'{path} in body must be of type {typ}: "null"')
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            _invalid(ctx, path, value, f"{path} in body must be of type int-or-string")
            return
    elif "type" in schema and not _type_ok(value, schema["type"]):
        tn = _type_name(value)
        ctx.causes.append(
            Cause(
                "FieldValueInvalid",
                f'Invalid value: "{tn}": {path} in body must be of type {schema["type"]}: "{tn}"',
                path,
            )
        )
        return
    _scalar_checks(value, schema, path, ctx)
    for sub in schema.get("allOf") or []:
        _walk(value, sub, old, path, ctx)
    if schema.get("anyOf") and not any(_passes(value, sub) for sub in schema["anyOf"]):
        _invalid(ctx, path, value, f"{path} in body must match at least one schema (anyOf)")
    if schema.get("oneOf"):
        matched = sum(1 for sub in schema["oneOf"] if _passes(value, sub))
        if matched != 1:
            _invalid(ctx, path, value, f"{path} in body must match exactly one schema (oneOf)")
    if isinstance(schema.get("not"), dict) and _passes(value, schema["not"]):
        _invalid(ctx, path, value, f"{path} in body must not match the schema (not)")

    if isinstance(value, dict):
        props: JSON = schema.get("properties") or {}
        for req in schema.get("required") or []:
            if req not in value:
                ctx.causes.append(Cause("FieldValueRequired", "Required value", _join(path, req)))
        additional = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for k, v in value.items():
            sub = props.get(k)
            if sub is None and isinstance(additional, dict):
                sub = additional
            if sub is not None:
                _walk(v, sub, old_map.get(k), _join(path, k), ctx)
        _size_checks(value, schema, path, ctx, "Properties")
    elif isinstance(value, list):
        _array_checks(value, schema, old, path, ctx)

    if ctx.cel and len(ctx.causes) == before and schema.get("x-kubernetes-validations"):
        _run_cel(value if cel_self is None else cel_self, schema, old, path, ctx)


def _passes(value: Any, schema: JSON) -> bool:
    ctx = _Ctx([], False, [])
    _walk(value, schema, None, "x", ctx)
    return not ctx.causes


def _scalar_checks(value: Any, schema: JSON, path: str, ctx: _Ctx) -> None:
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_fmt(e) for e in schema["enum"])
        ctx.causes.append(
            Cause(
                "FieldValueNotSupported",
                f"Unsupported value: {_fmt(value)}: supported values: {supported}",
                path,
            )
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema:
            lo = schema["minimum"]
            if schema.get("exclusiveMinimum") is True and value <= lo:
                _invalid(ctx, path, value, f"{path} in body should be greater than {lo}")
            elif value < lo:
                _invalid(
                    ctx, path, value, f"{path} in body should be greater than or equal to {lo}"
                )
        if "maximum" in schema:
            hi = schema["maximum"]
            if schema.get("exclusiveMaximum") is True and value >= hi:
                _invalid(ctx, path, value, f"{path} in body should be less than {hi}")
            elif value > hi:
                _invalid(ctx, path, value, f"{path} in body should be less than or equal to {hi}")
        mult = schema.get("multipleOf")
        if mult and not math.isclose(value / mult, round(value / mult)):
            _invalid(ctx, path, value, f"{path} in body should be a multiple of {mult}")
    if isinstance(value, str):
        n = len(value)
        if "maxLength" in schema and n > schema["maxLength"]:
            ctx.causes.append(
                Cause(
                    "FieldValueTooLong",
                    f"Too long: may not be more than {schema['maxLength']} bytes",
                    path,
                )
            )
        if "minLength" in schema and n < schema["minLength"]:
            _invalid(
                ctx,
                path,
                value,
                f"{path} in body should be at least {schema['minLength']} chars long",
            )
        pattern = schema.get("pattern")
        if pattern and not _regex(pattern).search(value):
            _invalid(ctx, path, value, f"{path} in body should match '{pattern}'")


_REGEX_CACHE: dict[str, re.Pattern[str]] = {}


def _regex(pattern: str) -> re.Pattern[str]:
    compiled = _REGEX_CACHE.get(pattern)
    if compiled is None:
        compiled = _REGEX_CACHE[pattern] = re.compile(pattern)
    return compiled


def _size_checks(
    value: dict[str, Any] | list[Any], schema: JSON, path: str, ctx: _Ctx, what: str
) -> None:
    """``max<what>``/``min<what>`` of an object (``Properties``) or an array (``Items``)."""
    n = len(value)
    most, least = f"max{what}", f"min{what}"
    if most in schema and n > schema[most]:
        ctx.causes.append(
            Cause(
                "FieldValueTooMany", f"Too many: {n}: must have at most {schema[most]} items", path
            )
        )
    if least in schema and n < schema[least]:
        _invalid(
            ctx, path, value, f"{path} in body should have at least {schema[least]} {what.lower()}"
        )


def _array_checks(value: list[Any], schema: JSON, old: Any, path: str, ctx: _Ctx) -> None:
    _size_checks(value, schema, path, ctx, "Items")
    list_type = schema.get("x-kubernetes-list-type")
    map_keys: list[str] = schema.get("x-kubernetes-list-map-keys") or []
    if schema.get("uniqueItems") or list_type == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                ctx.causes.append(
                    Cause("FieldValueDuplicate", f"Duplicate value: {_fmt(item)}", f"{path}[{i}]")
                )
            seen.append(item)
    old_by_key: dict[tuple[Any, ...], Any] = {}
    if list_type == "map" and map_keys:
        seen_keys: set[str] = set()
        for i, item in enumerate(value):
            if isinstance(item, dict):
                ident = json.dumps([item.get(k) for k in map_keys])
                if ident in seen_keys:
                    dup = {k: item.get(k) for k in map_keys}
                    ctx.causes.append(
                        Cause(
                            "FieldValueDuplicate",
                            f"Duplicate value: {json.dumps(dup)}",
                            f"{path}[{i}]",
                        )
                    )
                seen_keys.add(ident)
        if isinstance(old, list):
            for item in old:
                if isinstance(item, dict):
                    old_by_key[tuple(json.dumps(item.get(k)) for k in map_keys)] = item
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            old_item = None
            if old_by_key and isinstance(item, dict):
                old_item = old_by_key.get(tuple(json.dumps(item.get(k)) for k in map_keys))
            _walk(item, items, old_item, f"{path}[{i}]", ctx)


# -- CEL ----------------------------------------------------------------------------------

_OLD_SELF = re.compile(r"\boldSelf\b")


@dataclass
class _Program:
    run: Callable[[dict[str, Any]], Any] | None
    error: str | None


_PROGRAMS: dict[str, _Program] = {}


def _cel_functions() -> dict[str, Callable[..., Any]]:
    from celpy import celtypes

    def lower_ascii(s: Any) -> Any:
        return celtypes.StringType(str(s).lower())

    def upper_ascii(s: Any) -> Any:
        return celtypes.StringType(str(s).upper())

    def trim(s: Any) -> Any:
        return celtypes.StringType(str(s).strip())

    def split(s: Any, sep: Any) -> Any:
        return celtypes.ListType([celtypes.StringType(p) for p in str(s).split(str(sep))])

    def join(lst: Any, sep: Any = "") -> Any:
        return celtypes.StringType(str(sep).join(str(x) for x in lst))

    def index_of(s: Any, sub: Any) -> Any:
        if isinstance(s, list):
            return celtypes.IntType(s.index(sub) if sub in s else -1)
        return celtypes.IntType(str(s).find(str(sub)))

    def is_sorted(lst: Any) -> Any:
        items = list(lst)
        return celtypes.BoolType(all(items[i] <= items[i + 1] for i in range(len(items) - 1)))

    def lst_sum(lst: Any) -> Any:
        items = list(lst)
        return sum(items[1:], items[0]) if items else celtypes.IntType(0)

    def lst_min(lst: Any) -> Any:
        return min(list(lst))

    def lst_max(lst: Any) -> Any:
        return max(list(lst))

    return {
        "lowerAscii": lower_ascii,
        "upperAscii": upper_ascii,
        "trim": trim,
        "split": split,
        "join": join,
        "indexOf": index_of,
        "isSorted": is_sorted,
        "sum": lst_sum,
        "min": lst_min,
        "max": lst_max,
    }


def _compile(rule: str) -> _Program:
    prog = _PROGRAMS.get(rule)
    if prog is not None:
        return prog
    try:
        import celpy

        env = celpy.Environment()
        ast = env.compile(rule)
        runner = env.program(ast, functions=_cel_functions())
        prog = _Program(runner.evaluate, None)
    except Exception as exc:  # celpy raises its own parse errors and Lark errors
        prog = _Program(None, f"{type(exc).__name__}: {exc}")
    _PROGRAMS[rule] = prog
    return prog


def check_rule(rule: str) -> str | None:
    """Why ``rule`` cannot be evaluated here (``None`` when it can be compiled)."""
    return _compile(rule).error


_UNSUPPORTED_MARKERS = (
    "undeclared reference",
    "no such overload",
    "unsupported",
    "not implemented",
)


class _Unsupported(Exception):
    pass


def _evaluate(prog: _Program, activation: dict[str, Any]) -> Any:
    from celpy.adapter import json_to_cel
    from celpy.evaluation import CELEvalError

    assert prog.run is not None
    cel_vars = {k: json_to_cel(v) for k, v in activation.items()}
    try:
        result = prog.run(cel_vars)
    except CELEvalError as exc:
        result = exc
    if isinstance(result, CELEvalError):
        text = str(result.args[0]) if result.args else str(result)
        if any(m in text for m in _UNSUPPORTED_MARKERS):
            raise _Unsupported(text)
        raise ValueError(text)
    return result


def _run_cel(value: Any, schema: JSON, old: Any, path: str, ctx: _Ctx) -> None:
    type_name = schema.get("type") or _type_name(value)
    for rule_spec in schema.get("x-kubernetes-validations") or []:
        rule = rule_spec.get("rule", "")
        transition = bool(_OLD_SELF.search(rule))
        if transition and old is None and not rule_spec.get("optionalOldSelf"):
            continue
        prog = _compile(rule)
        if prog.run is None:
            ctx.warnings.append(f"CEL rule {rule!r} at {path or '<root>'} skipped: {prog.error}")
            continue
        activation: dict[str, Any] = {"self": value}
        if transition:
            activation["oldSelf"] = old
        field = path or "<nil>"  # a root rule: the apiserver prints the nil field path so
        fp = rule_spec.get("fieldPath")
        if fp:
            field = (path + fp) if fp.startswith((".", "[")) and path else fp.lstrip(".")
        reason = rule_spec.get("reason") or "FieldValueInvalid"
        try:
            ok = _evaluate(prog, activation)
        except _Unsupported as exc:
            ctx.warnings.append(f"CEL rule {rule!r} at {path or '<root>'} skipped: {exc}")
            log.warning("CEL rule %r skipped: %s", rule, exc)
            continue
        except ValueError as exc:
            ctx.causes.append(
                Cause(reason, f'Invalid value: "{type_name}": {exc} evaluating rule: {rule}', field)
            )
            continue
        if bool(ok):
            continue
        message = rule_spec.get("message") or f"failed rule: {rule}"
        expr = rule_spec.get("messageExpression")
        if expr:
            mprog = _compile(expr)
            if mprog.run is not None:
                with contextlib.suppress(ValueError, _Unsupported):
                    message = str(_evaluate(mprog, activation))
        if reason == "FieldValueRequired":
            text = f"Required value: {message}"
        elif reason == "FieldValueForbidden":
            text = f"Forbidden: {message}"
        elif reason == "FieldValueDuplicate":
            text = f"Duplicate value: {message}"
        else:
            text = f'Invalid value: "{type_name}": {message}'
        ctx.causes.append(Cause(reason, text, field))
