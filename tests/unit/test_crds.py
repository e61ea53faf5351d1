"""core.crds and cli.crdgen: the generated CRDs are current, structural, and agree with the models.

Besides the structural check, a small validator here applies a CRD schema the way the API server
does (defaults, types, bounds, patterns, list-map keys, CEL rules via cel-python), so the tests
can state for each kind of mistake whether admission or the operator catches it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel

from scalable_topics.cli import crdgen
from scalable_topics.core import crds
from scalable_topics.core import resources as r
from scalable_topics.core.assignment import SubscriptionCoordinator
from scalable_topics.core.layout import HashRange, SegmentLayout
from scalable_topics.core.operation import Phase, plan_merge, plan_split
from scalable_topics.localcluster import schema as localschema

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
EXAMPLE = ROOT / "manifests" / "examples" / "orders.yaml"

TOPIC_CRD = crds.topic_crd()
SEGMENT_CRD = crds.segment_crd()


def schema_of(crd: Mapping[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def node_at(schema: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``spec.subscriptions[]`` → the items schema of spec.subscriptions."""
    node: Any = schema
    for part in path.split("."):
        items = part.endswith("[]")
        node = node["properties"][part.removesuffix("[]")]
        if items:
            node = node["items"]
    return dict(node)


# -- a miniature of the API server's CRD validation --------------------------------------------

_CEL = celpy.Environment()


def to_cel(value: Any, schema: Mapping[str, Any]) -> Any:
    """JSON → CEL values typed by the schema (a ``number`` field holding 1000 is a double)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", {})
        return {
            k: to_cel(v, props.get(k, extra if isinstance(extra, dict) else {}))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [to_cel(v, schema.get("items", {})) for v in value]
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def cel(rule: str, schema: Mapping[str, Any], self: Any, old: Any = None) -> bool:
    program = _CEL.program(_CEL.compile(rule))
    activation = {"self": json_to_cel(to_cel(self, schema))}
    if old is not None:
        activation["oldSelf"] = json_to_cel(to_cel(old, schema))
    result = program.evaluate(activation)
    assert isinstance(result, celpy.celtypes.BoolType), f"{rule!r} gave {result!r}"
    return bool(result)


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        out = dict(value)
        for name, sub in schema.get("properties", {}).items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(out[name], sub)
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


def schema_errors(
    value: Any, schema: Mapping[str, Any], path: str = "", old: Any = None
) -> list[str]:
    """What the API server would reject in an already-defaulted ``value``."""
    errors: list[str] = []
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [f"{path}: must be an integer or a string"]
    elif kind is not None:
        checks = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
        }
        if not checks[kind](value):
            return [f"{path}: must be of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: must be one of {schema['enum']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") and value == low):
                errors.append(f"{path}: below minimum {low}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: above maximum {schema['maximum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: does not match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if schema.get("format") == "date-time":
            try:
                r.parse_time(value)
            except ValueError:
                errors.append(f"{path}: not a date-time")
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}.{name}: required")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name, sub in value.items():
            sub_schema = props.get(name, extra if isinstance(extra, dict) else None)
            if sub_schema is not None:
                old_sub = old.get(name) if isinstance(old, dict) else None
                errors.extend(schema_errors(sub, sub_schema, f"{path}.{name}", old_sub))
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{path}: more than {schema['maxItems']} items")
        keys = schema.get("x-kubernetes-list-map-keys")
        seen: set[tuple[Any, ...]] = set()
        old_by_key: dict[tuple[Any, ...], Any] = {}
        if keys and isinstance(old, list):
            old_by_key = {tuple(o.get(k) for k in keys): o for o in old if isinstance(o, dict)}
        for index, item in enumerate(value):
            old_item = None
            if keys and isinstance(item, dict):
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    errors.append(f"{path}[{index}]: duplicate value {key}")
                seen.add(key)
                old_item = old_by_key.get(key)
            errors.extend(schema_errors(item, schema["items"], f"{path}[{index}]", old_item))
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            if old is None:
                continue  # transition rules run on updates of an existing value only
            if not cel(rule["rule"], schema, value, old):
                errors.append(f"{path}: {rule['message']}")
        elif not cel(rule["rule"], schema, value):
            errors.append(f"{path}: {rule['message']}")
    return errors


def admit(
    crd: Mapping[str, Any], obj: Mapping[str, Any], old: Mapping[str, Any] | None = None
) -> list[str]:
    schema = schema_of(crd)
    return schema_errors(
        apply_defaults(dict(obj), schema),
        schema,
        "",
        apply_defaults(dict(old), schema) if old else None,
    )


def topic(spec: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": r.API_VERSION,
        "kind": r.TOPIC_KIND,
        "metadata": {"name": "t"},
    }
    if spec is not None:
        body["spec"] = spec
    body.update(extra)
    return body


# -- crds/ is current --------------------------------------------------------------------------


def test_crds_directory_is_not_stale() -> None:
    generated = crds.crd_files()
    on_disk = {p.name for p in CRD_DIR.glob("*.yaml")}
    assert on_disk == set(generated), "crds/ has extra or missing files: run `make crds`"
    for name, text in generated.items():
        assert (CRD_DIR / name).read_text(encoding="utf-8") == text, (
            f"crds/{name} is stale: run `make crds`"
        )
    assert crdgen.stale_files(CRD_DIR) == []


def test_generation_is_deterministic_and_yaml_round_trips() -> None:
    first, second = crds.crd_files(), crds.crd_files()
    assert first == second
    for text in first.values():
        assert text.startswith(crds.HEADER)
        assert "do not edit" in text.splitlines()[0]
    docs = [yaml.safe_load(text) for text in first.values()]
    assert docs == crds.crd_manifests()


def test_crdgen_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "crds"
    assert crdgen.main([str(out), "--check"]) == 1
    assert crdgen.main([str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(crds.crd_files())
    assert crdgen.main([str(out), "--check"]) == 0
    victim = out / "scalabletopics.io_segments.yaml"
    victim.write_text(victim.read_text().replace("shortNames", "shortnames"))
    assert crdgen.main([str(out), "--check"]) == 1
    assert "stale: " in capsys.readouterr().err
    assert crdgen.write(out) == ["scalabletopics.io_segments.yaml"]
    assert crdgen.stale_files(out) == []


# -- identity, printer columns -----------------------------------------------------------------


def test_names_scope_and_subresources() -> None:
    names = TOPIC_CRD["spec"]["names"]
    assert TOPIC_CRD["metadata"]["name"] == "scalabletopics.scalabletopics.io"
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "ScalableTopic",
        "scalabletopics",
        ["stopic", "st"],
        ["scalabletopics"],
    )
    seg = SEGMENT_CRD["spec"]["names"]
    assert (seg["kind"], seg["plural"], seg["shortNames"], seg["categories"]) == (
        "Segment",
        "segments",
        ["seg"],
        ["scalabletopics"],
    )
    for crd in (TOPIC_CRD, SEGMENT_CRD):
        assert crd["spec"]["group"] == "scalabletopics.io"
        assert crd["spec"]["scope"] == "Namespaced"
        (version,) = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}


def _column_node(schema: Mapping[str, Any], json_path: str) -> dict[str, Any] | None:
    """Resolve a printer column's JSONPath in the schema (``None`` for metadata fields)."""
    if json_path.startswith(".metadata."):
        return None
    path = re.sub(r"\[\?\(@\.type==\"\w+\"\)\]", "[]", json_path).lstrip(".")
    return node_at(schema, path)


@pytest.mark.parametrize(
    ("crd", "expected"),
    [
        (
            TOPIC_CRD,
            [
                ("Active", 0),
                ("Epoch", 0),
                ("Ready", 0),
                ("Age", 0),
                ("Reason", 1),
                ("Controller", 1),
                ("Initial", 1),
            ],
        ),
        (
            SEGMENT_CRD,
            [
                ("Topic", 0),
                ("ID", 0),
                ("Range", 0),
                ("State", 0),
                ("Broker", 0),
                ("Rate-In", 0),
                ("Age", 0),
                ("Parents", 1),
                ("Buckets", 1),
            ],
        ),
    ],
)
def test_printer_columns_point_at_fields_of_their_type(
    crd: dict[str, Any], expected: list[tuple[str, int]]
) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c.get("priority", 0)) for c in columns] == expected
    schema = schema_of(crd)
    for column in columns:
        node = _column_node(schema, column["jsonPath"])
        if node is None:
            assert column["type"] == "date"
            continue
        if column["type"] == "string" and node.get("type") == "array":
            continue  # kubectl prints lists (Parents) as text
        if column["name"] == "Rate-In":
            # A rate is a float; the column truncates it (71.71031059119261 prints as 71).
            assert (node.get("type"), column["type"]) == ("number", "integer"), column
            continue
        assert node.get("type") == column["type"], column


def test_ready_column_reads_the_ready_condition() -> None:
    columns = {
        c["name"]: c["jsonPath"]
        for c in TOPIC_CRD["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Reason"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert columns["Active"] == ".status.activeSegments"


# -- structural schema -------------------------------------------------------------------------


@pytest.mark.parametrize("crd", [TOPIC_CRD, SEGMENT_CRD], ids=["ScalableTopic", "Segment"])
def test_generated_schemas_are_structural(crd: dict[str, Any]) -> None:
    assert crds.structural_problems(schema_of(crd)) == []


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)] if isinstance(node, dict) else []
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            found.extend(_walk(sub, f"{path}.{name}"))
        if isinstance(node.get("items"), dict):
            found.extend(_walk(node["items"], f"{path}[]"))
        if isinstance(node.get("additionalProperties"), dict):
            found.extend(_walk(node["additionalProperties"], f"{path}.*"))
    return found


@pytest.mark.parametrize("crd", [TOPIC_CRD, SEGMENT_CRD], ids=["ScalableTopic", "Segment"])
def test_every_field_is_described_and_no_pydantic_leftovers(crd: dict[str, Any]) -> None:
    for path, node in _walk(schema_of(crd)):
        assert not {"title", "$ref", "$defs", "const", "additionalProperties"} & set(node) or (
            isinstance(node.get("additionalProperties"), dict)
        ), path
        if (
            path.count(".") >= 2
            and not path.endswith(("[]", ".*"))
            and not path.startswith(".metadata")
        ):
            assert node.get("description"), f"{path} has no description"


STRUCTURAL_BREAKAGES = [
    ({"type": "object", "properties": {"a": {}}}, ".a: no type"),
    (
        {"type": "object", "properties": {"a": {"$ref": "#/definitions/X"}}},
        ".a: $ref is not allowed",
    ),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "additionalProperties": {"type": "string"},
        },
        ": properties and additionalProperties are mutually exclusive",
    ),
    (
        {"type": "object", "additionalProperties": False},
        ": additionalProperties: false is not allowed",
    ),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "string", "x-kubernetes-int-or-string": True}},
        },
        ".a: x-kubernetes-int-or-string must not set a type",
    ),
    (
        {
            "type": "object",
            "properties": {
                "a": {
                    "anyOf": [{"type": "string"}, {"type": "integer"}],
                    "x-kubernetes-int-or-string": True,
                }
            },
        },
        ".a: int-or-string anyOf must be [integer, string]",
    ),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "string", "anyOf": [{"type": "string", "pattern": "x"}]}},
        },
        ".a.anyOf[0]: type is not allowed in anyOf",
    ),
    (
        {"type": "object", "anyOf": [{"properties": {"b": {"type": "string"}}}]},
        ": b is in anyOf but not in properties",
    ),
    ({"type": "object", "properties": {"a": {"type": "array"}}}, ".a: array without items schema"),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "exclusiveMinimum": 0}},
        },
        ".a: exclusiveMinimum must be a boolean in OpenAPI v3.0",
    ),
    (
        {"type": "object", "properties": {"a": {"type": "integer", "default": "1"}}},
        ".a: default '1' is not of type integer",
    ),
    (
        {"type": "object", "properties": {"a": {"type": "integer", "maximum": 3, "default": 4}}},
        ".a: default 4 is above maximum 3",
    ),
    (
        {
            "type": "object",
            "properties": {
                "a": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}
            },
        },
        ".a: uniqueItems: true is not allowed",
    ),
    (
        {
            "type": "object",
            "properties": {
                "a": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"k": {"type": "string"}}},
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["k"],
                }
            },
        },
        ".a: map key 'k' must be required or defaulted",
    ),
    (
        {
            "type": "object",
            "properties": {
                "a": {"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "set"}
            },
        },
        ".a: list-type set needs scalar items",
    ),
    (
        {
            "type": "object",
            "properties": {
                "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}
            },
        },
        ".metadata: only name/generateName may be restricted, got {'labels'}",
    ),
    ({"type": "object", "properties": {"a": {"type": "uuid"}}}, ".a: unknown type 'uuid'"),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "string", "x-kubernetes-validations": [{"message": "m"}]}},
        },
        ".a: x-kubernetes-validations[0] has no rule",
    ),
]


@pytest.mark.parametrize(("schema", "problem"), STRUCTURAL_BREAKAGES)
def test_structural_checker_finds_each_violation(schema: dict[str, Any], problem: str) -> None:
    problems = crds.structural_problems(schema)
    assert any(p.startswith(problem) for p in problems), problems


def test_converter_refuses_what_a_crd_cannot_express() -> None:
    with pytest.raises(ValueError, match="unsupported schema keyword 'oneOf'"):
        crds.to_openapi(
            {
                "type": "object",
                "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
            }
        )
    with pytest.raises(ValueError, match="cannot express a union"):
        crds.to_openapi({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})


def test_converter_inlines_refs_and_rewrites_optional_and_exclusive_bounds() -> None:
    schema = {
        "$defs": {
            "Inner": {"type": "object", "title": "Inner", "properties": {"x": {"type": "integer"}}}
        },
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "inner": {
                "anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}],
                "default": None,
                "description": "an\n  inner",
            },
            "rate": {"type": "number", "exclusiveMinimum": 0.0, "default": 5.0},
            "free": {"type": "object", "additionalProperties": True},
            "kind": {"const": "K", "type": "string"},
        },
    }
    assert crds.to_openapi(schema) == {
        "type": "object",
        "properties": {
            "inner": {
                "description": "an inner",
                "type": "object",
                "properties": {"x": {"type": "integer"}},
            },
            "rate": {"type": "number", "default": 5.0, "minimum": 0, "exclusiveMinimum": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "kind": {"type": "string", "enum": ["K"]},
        },
    }
    assert "default" not in crds.to_openapi(schema, keep_defaults=False)["properties"]["rate"]


# -- CEL -------------------------------------------------------------------------------------


def _rules(crd: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [
        (path, node, rule)
        for path, node in _walk(schema_of(crd))
        for rule in node.get("x-kubernetes-validations", [])
    ]


@pytest.mark.parametrize("crd", [TOPIC_CRD, SEGMENT_CRD], ids=["ScalableTopic", "Segment"])
def test_every_cel_rule_compiles_and_has_a_message(crd: dict[str, Any]) -> None:
    rules = _rules(crd)
    assert rules
    for path, _, rule in rules:
        _CEL.compile(rule["rule"])
        assert rule.get("message"), path


def test_cel_rules_where_they_belong() -> None:
    where = {(path, rule["rule"]) for path, _, rule in _rules(TOPIC_CRD)}
    assert (".spec.initialSegments", "self == oldSelf") in where
    assert (".spec.subscriptions[]", "self.type == oldSelf.type") in where
    assert any(
        path == ".spec.autoScale" and "self.maxSegments >= self.minSegments" in rule
        for path, rule in where
    )
    root = [rule for path, rule in where if path == ""]
    assert len(root) == 2 and all(rule.startswith("has(self.status) || ") for rule in root)
    segment_rules = {(path, rule["rule"]) for path, _, rule in _rules(SEGMENT_CRD)}
    assert segment_rules == {
        (".spec", "self == oldSelf"),
        (".spec.range", "self.start <= self.end"),
    }


# -- admission (schema + CEL) versus the models ------------------------------------------------


def test_empty_spec_is_defaulted_like_the_model() -> None:
    defaulted = apply_defaults(topic(), schema_of(TOPIC_CRD))
    assert defaulted["spec"] == {
        "initialSegments": 1,
        "entryBuckets": 4,
        "consumerGracePeriod": "60s",
    }
    assert r.parse_topic_spec(defaulted["spec"]) == r.parse_topic_spec({})
    sub = apply_defaults(
        topic({"subscriptions": [{"name": "s", "type": "Stream"}]}), schema_of(TOPIC_CRD)
    )
    assert sub["spec"]["subscriptions"][0]["assignment"] == "sticky"


EXAMPLES = sorted(EXAMPLE.parent.glob("*.yaml"))


def test_the_orders_example_exists() -> None:
    assert EXAMPLE in EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_pass_admission_with_nothing_pruned(path: Path) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert documents
    for manifest in documents:
        if manifest["kind"] == r.TOPIC_KIND:
            crd = TOPIC_CRD
            r.parse_topic(manifest)
        else:
            assert manifest["kind"] == r.SEGMENT_KIND, f"{path.name}: unexpected kind"
            crd = SEGMENT_CRD
            r.parse_segment(manifest)
        assert admit(crd, manifest) == []
        assert crds.unknown_fields(manifest, schema_of(crd)) == []


# (spec, rejected at admission, rejected by the model). Where they differ, the model is the
# stricter one and the operator reports Ready=False/InvalidSpec (docs/resources.md).
ADMISSION_CASES: list[tuple[dict[str, Any], bool, bool]] = [
    ({}, False, False),
    ({"initialSegments": 4, "entryBuckets": 16, "consumerGracePeriod": 30}, False, False),
    ({"initialSegments": 0}, True, True),
    ({"initialSegments": 1025}, True, True),
    ({"initialSegments": "2"}, True, True),
    ({"entryBuckets": 0}, True, True),
    ({"consumerGracePeriod": "1 minute"}, True, True),
    ({"consumerGracePeriod": "1h30m"}, False, False),
    ({"consumerGracePeriod": 1.5}, True, True),
    ({"consumerGracePeriod": True}, True, True),
    ({"autoScale": {"mergeWindow": 0.5}}, True, True),
    ({"autoScale": {"mergeBytesRateInThreshold": 1.5}}, True, True),
    ({"retention": {"size": "1.5Gi"}}, False, False),
    ({"retention": {"time": " 5m"}}, True, True),
    ({"autoScale": {"splitCooldown": "1.5h", "mergeCooldown": "2h30m15s"}}, False, False),
    ({"autoScale": {"maxSegments": 2, "minSegments": 3}}, True, True),
    ({"initialSegments": 3, "autoScale": {"maxSegments": 3, "minSegments": 3}}, False, False),
    ({"autoScale": {"splitMsgRateInThreshold": 100, "mergeMsgRateInThreshold": 100}}, True, True),
    (
        {"autoScale": {"splitMsgRateOutThreshold": 100.5, "mergeMsgRateOutThreshold": 100}},
        False,
        False,
    ),
    (
        {"autoScale": {"splitBytesRateInThreshold": "1Mi", "mergeBytesRateInThreshold": "2Mi"}},
        False,
        True,
    ),
    ({"autoScale": {"splitBytesRateInThreshold": "50MB"}}, False, False),
    ({"autoScale": {"splitBytesRateInThreshold": "lots"}}, True, True),
    ({"autoScale": {"splitCooldown": "-1m"}}, True, True),
    ({"autoScale": {"evaluationInterval": 0}}, True, True),
    ({"autoScale": {"mode": "recommend", "enabled": False}}, False, False),
    ({"autoScale": {"mode": "yolo"}}, True, True),
    (
        {"subscriptions": [{"name": "a", "type": "Stream"}, {"name": "a", "type": "Queue"}]},
        True,
        True,
    ),
    ({"subscriptions": [{"name": "a", "type": "Topic"}]}, True, True),
    ({"subscriptions": [{"name": "a b", "type": "Queue"}]}, True, True),
    ({"subscriptions": [{"name": f"s{i}", "type": "Queue"} for i in range(65)]}, True, True),
    ({"retention": {"time": "7d"}}, True, True),
    ({"retention": {"time": "168h", "size": "10Gi"}}, False, False),
]


@pytest.mark.parametrize(("spec", "admission_rejects", "model_rejects"), ADMISSION_CASES)
def test_admission_and_model_agree(
    spec: dict[str, Any], admission_rejects: bool, model_rejects: bool
) -> None:
    errors = admit(TOPIC_CRD, topic(spec))
    assert bool(errors) is admission_rejects, errors
    try:
        r.parse_topic_spec(spec)
        rejected = False
    except r.ResourceValidationError:
        rejected = True
    assert rejected is model_rejects


def test_topic_name_is_limited_at_admission() -> None:
    assert admit(TOPIC_CRD, {**topic(), "metadata": {"name": "x" * 63}}) == []
    assert admit(TOPIC_CRD, {**topic(), "metadata": {"name": "x" * 64}}) == [
        ".metadata.name: longer than 63"
    ]


_MAX_RULE = (
    ": spec.initialSegments must be <= spec.autoScale.maxSegments: the topic would start above "
    "its own maxSegments"
)
_MIN_RULE = (
    ": spec.initialSegments must be >= spec.autoScale.minSegments: the topic would start below "
    "its own minSegments"
)

# (whole object, admission error, rejected by parse_topic): initialSegments against the topic's
# own bounds, decided at the root while the topic has no status (the operator has not seen it).
ROOT_CASES: list[tuple[dict[str, Any], str | None, bool]] = [
    (topic({"initialSegments": 5, "autoScale": {"maxSegments": 3}}), _MAX_RULE, True),
    (topic({"initialSegments": 3, "autoScale": {"maxSegments": 3, "minSegments": 3}}), None, False),
    (topic({"initialSegments": 2, "autoScale": {"minSegments": 4}}), _MIN_RULE, True),
    # unset bounds come from the namespace or the defaults: the operator decides (InvalidSpec)
    (topic({"initialSegments": 100}), None, False),
    (topic({"initialSegments": 100, "autoScale": {"minSegments": 2}}), None, False),
    (topic({"autoScale": {"minSegments": 2}}), _MIN_RULE, True),  # initialSegments defaults to 1
    # the operator has seen it: the layout exists, initialSegments is history
    (topic({"initialSegments": 5, "autoScale": {"maxSegments": 3}}, status={}), None, False),
]


@pytest.mark.parametrize(("obj", "error", "model_rejects"), ROOT_CASES)
def test_initial_segments_within_the_topics_own_bounds(
    obj: dict[str, Any], error: str | None, model_rejects: bool
) -> None:
    assert admit(TOPIC_CRD, obj) == ([] if error is None else [error])
    try:
        r.parse_topic(obj)
        rejected = False
    except r.ResourceValidationError:
        rejected = True
    assert rejected is model_rejects


def _embedded(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """The embedded API server's validation (localcluster.schema, CEL by cel-python) of an
    object as the server sees it: defaulted, status dropped on create."""
    schema = schema_of(TOPIC_CRD)
    body = localschema.apply_defaults(copy.deepcopy(obj), schema)
    causes, warnings = localschema.validate(body, schema, old)
    assert warnings == []
    return [f"{c.field}: {c.message}" for c in causes]


def test_embedded_api_server_evaluates_the_root_rules() -> None:
    assert _embedded(topic({"initialSegments": 5, "autoScale": {"maxSegments": 3}})) == [
        '<nil>: Invalid value: "object"' + _MAX_RULE
    ]
    assert _embedded(topic({"initialSegments": 2, "autoScale": {"minSegments": 4}})) == [
        '<nil>: Invalid value: "object"' + _MIN_RULE
    ]
    assert _embedded(topic({"initialSegments": 5, "autoScale": {"minSegments": 5}})) == []
    assert _embedded({**topic(), "metadata": {"name": "x" * 64}}) == [
        "metadata.name: Too long: may not be more than 63 bytes"
    ]
    assert _embedded({**topic(), "metadata": {"name": "x" * 63}}) == []
    # Once the operator wrote a status, lowering maxSegments below initialSegments is allowed,
    # and a status write for a topic stored before the rules (or the name limit) passes.
    seen = localschema.apply_defaults(
        topic({"initialSegments": 5}, status={}), schema_of(TOPIC_CRD)
    )
    lowered = topic({"initialSegments": 5, "autoScale": {"maxSegments": 3}}, status={})
    assert _embedded(lowered, old=seen) == []
    unseen = localschema.apply_defaults(topic({"initialSegments": 5}), schema_of(TOPIC_CRD))
    assert _embedded(topic({"initialSegments": 5, "autoScale": {"maxSegments": 3}}), unseen) == [
        '<nil>: Invalid value: "object"' + _MAX_RULE
    ]
    stored = {
        **topic({"initialSegments": 5, "autoScale": {"maxSegments": 3}}),
        "metadata": {"name": "x" * 64},
    }
    status_write = {**stored, "status": {"conditions": []}}
    assert (
        _embedded(status_write, old=localschema.apply_defaults(stored, schema_of(TOPIC_CRD))) == []
    )


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ({"initialSegments": 2}, {"initialSegments": 2, "entryBuckets": 8}, None),
        (
            {"initialSegments": 2},
            {"initialSegments": 4},
            ".spec.initialSegments: initialSegments is immutable",
        ),
        # Removing the field defaults it to 1, which is a change too.
        ({"initialSegments": 2}, {}, ".spec.initialSegments: initialSegments is immutable"),
        (
            {"subscriptions": [{"name": "a", "type": "Stream"}]},
            {
                "subscriptions": [
                    {"name": "a", "type": "Stream", "assignment": "round-robin"},
                    {"name": "b", "type": "Queue"},
                ]
            },
            None,
        ),
        (
            {"subscriptions": [{"name": "a", "type": "Stream"}]},
            {"subscriptions": [{"name": "a", "type": "Queue"}]},
            ".spec.subscriptions[0]: a subscription's type is immutable; "
            "add a subscription with another name instead",
        ),
    ],
)
def test_transition_rules_on_update(
    old: dict[str, Any], new: dict[str, Any], error: str | None
) -> None:
    errors = admit(TOPIC_CRD, topic(new), old=topic(old))
    assert errors == ([] if error is None else [error])


def _segment(**spec: Any) -> dict[str, Any]:
    base = {
        "topic": "orders",
        "segmentId": 3,
        "range": {"start": 0, "end": 0x7FFF, "hex": "0000-7fff"},
        "parents": [0],
        "buckets": 2,
    }
    return {
        "apiVersion": r.API_VERSION,
        "kind": r.SEGMENT_KIND,
        "metadata": {"name": "orders-3"},
        "spec": {**base, **spec},
    }


def test_segment_admission() -> None:
    assert admit(SEGMENT_CRD, _segment()) == []
    assert admit(SEGMENT_CRD, _segment(range={"start": 9, "end": 1})) == [
        ".spec.range: range.start must be <= range.end"
    ]
    assert admit(SEGMENT_CRD, _segment(range={"start": 0, "end": 65536})) == [
        ".spec.range.end: above maximum 65535"
    ]
    assert admit(SEGMENT_CRD, _segment(buckets=2), old=_segment()) == []
    assert admit(SEGMENT_CRD, _segment(buckets=4), old=_segment()) == [
        ".spec: Segment spec is immutable"
    ]
    assert admit(SEGMENT_CRD, {**_segment(), "spec": None}) != []
    body = r.segment_manifest(
        topic="orders",
        namespace="n",
        topic_uid="u",
        segment_id=4,
        hash_range=HashRange(0, 9),
        parents=[1, 2],
        buckets=3,
    )
    assert admit(SEGMENT_CRD, body) == []


# -- what other components write into status survives the schema -------------------------------


def _status_ok(status: dict[str, Any]) -> None:
    schema = schema_of(TOPIC_CRD)["properties"]["status"]
    assert crds.unknown_fields(status, schema) == []
    assert schema_errors(status, schema, ".status") == []
    r.ScalableTopicStatus.model_validate(status)


def test_layout_and_operation_records_fit_the_status_schema() -> None:
    layout = SegmentLayout.initial(2)
    split = plan_split(
        "op-1",
        layout,
        0,
        parent_buckets=4,
        at=0x1000,
        source="auto",
        reason="msgRateIn",
        started_at="2026-11-22T04:00:00Z",
    )
    merge = plan_merge(
        "op-2",
        layout.split(0),
        [2, 3],
        parent_buckets={2: 2, 3: 2},
        request_id="r1",
        started_at="2026-11-22T04:00:00Z",
    )
    for operation in (split, merge.advanced(Phase.PARENTS_SEALED)):
        status = {
            "epoch": layout.epoch,
            "nextSegmentId": layout.next_segment_id,
            "layout": layout.to_metadata(),
            "operation": operation.to_status(),
            "lastRequest": {
                "id": "r1",
                "op": "merge",
                "result": "Succeeded",
                "completedAt": "2026-11-22T04:00:00Z",
            },
            "conditions": [r.condition("Ready", True, r.Reason.RECONCILED, now=0.0)],
        }
        _status_ok(status)
    parsed = r.OperationStatus.model_validate(split.to_status())
    assert (parsed.kind, parsed.phase, parsed.at, parsed.children[0].range.hex) == (
        "split",
        Phase.INTENT,
        0x1000,
        "0000-1000",
    )


def test_assignment_status_fits_the_status_schema() -> None:
    layout = SegmentLayout.initial(2).split(0)
    coordinator = SubscriptionCoordinator(layout)
    coordinator.register("c-1", 0.0)
    coordinator.register("c-2", 0.0)
    owner = coordinator.owner_of(0)
    coordinator.drained(owner, 0, 1.0)
    entry = {"name": "billing", "type": "Stream", **coordinator.to_status()}
    _status_ok({"subscriptions": [entry]})
    parsed = r.SubscriptionStatus.model_validate(entry)
    assert [c.name for c in parsed.consumers] == ["c-1", "c-2"]
    assert sorted(i for c in parsed.consumers for i in c.segments) == [1, 2, 3]
    assert parsed.drained_segments == [0]


def test_recommender_output_fits_the_status_schema() -> None:
    rules = pytest.importorskip("scalable_topics.recommender.rules")
    plan = rules.TopicPlan(
        recommended_segments=3,
        actions=[
            {
                "kind": "split",
                "segments": [1],
                "at": 0x9000,
                "buckets": None,
                "reason": "msgRateIn",
                "detail": "hot",
                "stats": {"keyHistogram": [1, 2], "mean": {"msgRateIn": 1.5}},
            },
            {
                "kind": "merge",
                "segments": [2, 3],
                "at": None,
                "buckets": None,
                "reason": "cold",
                "detail": "cold",
                "stats": {"segments": []},
            },
        ],
    )
    recommendation = rules.recommendation(
        plan,
        computed_at="2026-11-22T04:00:00Z",
        window=rules.Window(0.0, 3600.0),
        based_on_epoch=4,
        based_on_generation=2,
    )
    # The API server prunes nulls of non-nullable fields; a merge patch treats them as deletes.
    without_nulls = {k: v for k, v in recommendation.items() if v is not None}
    without_nulls["actions"] = [
        {k: v for k, v in a.items() if v is not None} for a in recommendation["actions"]
    ]
    _status_ok({"recommendation": without_nulls})
    parsed = r.Recommendation.model_validate(recommendation)
    assert parsed.window == 3600.0 and parsed.actions[0].at == 0x9000


def test_unknown_fields_finds_what_would_be_pruned() -> None:
    schema = schema_of(TOPIC_CRD)
    body = topic(
        {"initialSegments": 1, "partitions": 3},
        status={"layout": {"anything": {"goes": 1}}, "operation": {"id": "x", "extra": 1}},
    )
    assert crds.unknown_fields(body, schema) == [".spec.partitions", ".status.operation.extra"]


def test_status_layout_leaves_out_sealed_at_epoch_of_active_segments() -> None:
    """``kubectl describe`` printed "Sealed At Epoch: 0" for every active segment."""
    layout = SegmentLayout.initial(2).split(0).merge(3, 1)
    data = r.layout_status(layout)
    for sid, info in layout.segments.items():
        written = data["segments"][str(sid)]
        if info.active:
            assert "sealedAtEpoch" not in written, written
        else:
            assert written["sealedAtEpoch"] == info.sealed_at_epoch > 0
    assert SegmentLayout.from_metadata(data) == layout
    _status_ok({"layout": data, "epoch": layout.epoch})
