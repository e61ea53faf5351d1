"""Structural schema pruning, defaulting, validation and CEL rules for custom resources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from scalable_topics.localcluster.schema import apply_defaults, prune, validate

CRD = Path(__file__).resolve().parent.parent / "fixtures" / "localcluster" / "widgets-crd.yaml"
SCHEMA: dict[str, Any] = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"][
    "openAPIV3Schema"
]


def _obj(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "test.stopic.io/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": "default"},
        "spec": {"initialSegments": 2, **spec},
    }


def _fields(obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, str]:
    causes, _ = validate(obj, SCHEMA, old)
    return {c.field: c.message for c in causes}


def test_prune_keeps_declared_and_preserved_fields() -> None:
    obj = _obj(config={"free": {"form": 1}}, bogus=1)
    obj["extra"] = "dropped"
    pruned = prune(obj, SCHEMA, root=True)
    assert "extra" not in pruned and "bogus" not in pruned["spec"]
    assert pruned["spec"]["config"] == {"free": {"form": 1}}
    assert pruned["metadata"] == obj["metadata"] and pruned["kind"] == "Widget"


def test_defaults_fill_missing_and_null_fields() -> None:
    out = apply_defaults(_obj(mode=None), SCHEMA)
    assert out["spec"]["mode"] == "Stream"
    assert out["spec"]["replicas"] == 1
    kept = apply_defaults(_obj(mode="Queue", replicas=4), SCHEMA)
    assert kept["spec"]["mode"] == "Queue" and kept["spec"]["replicas"] == 4


def test_value_validations_name_the_field() -> None:
    assert _fields(_obj()) == {}
    errors = _fields(
        _obj(
            initialSegments=0,
            mode="Bogus",
            owner="Not_Valid",
            tags=["a", "b", "c", "d"],
            retention=1.5,
            maxSegments="many",
        )
    )
    assert errors["spec.initialSegments"] == (
        "Invalid value: 0: spec.initialSegments in body should be greater than or equal to 1"
    )
    assert errors["spec.mode"] == 'Unsupported value: "Bogus": supported values: "Stream", "Queue"'
    assert "should match '^[a-z][a-z0-9-]*$'" in errors["spec.owner"]
    assert errors["spec.tags"] == "Too many: 4: must have at most 3 items"
    assert "int-or-string" in errors["spec.retention"]
    assert errors["spec.maxSegments"] == (
        'Invalid value: "string": spec.maxSegments in body must be of type integer: "string"'
    )
    missing = _fields(
        {"apiVersion": "test.stopic.io/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    )
    assert missing == {"spec.initialSegments": "Required value"}
    assert _fields(_obj(initialSegments=2000))["spec.initialSegments"].endswith(
        "should be less than or equal to 1024"
    )
    assert "Too long" in _fields(_obj(owner="a" * 21))["spec.owner"]
    assert "at least 1 chars long" in _fields(_obj(tags=[""]))["spec.tags[0]"]
    assert _fields(_obj(note=None)) == {}, "nullable accepts null"


def test_list_map_keys_must_be_unique() -> None:
    obj = _obj()
    obj["status"] = {
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}]
    }
    assert _fields(obj) == {"status.conditions[1]": 'Duplicate value: {"type": "Ready"}'}


def test_cel_rules_and_transition_rules() -> None:
    bad = _fields(_obj(initialSegments=8, maxSegments=4))
    assert bad == {
        "spec.maxSegments": 'Invalid value: "object": maxSegments must be at least initialSegments'
    }
    old = _obj(initialSegments=4)
    changed = _fields(_obj(initialSegments=5), old)
    assert changed == {
        "spec.initialSegments": 'Invalid value: "integer": initialSegments is immutable'
    }
    assert _fields(_obj(initialSegments=4, maxSegments=9), old) == {}
    assert _fields(_obj(initialSegments=5)) == {}, "transition rules only run on update"


def test_cel_unsupported_rule_is_skipped_with_a_warning() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [
                    {"rule": "quantity(self.size).isGreaterThan(quantity('1Gi'))"},
                    {"rule": "self.name.lowerAscii() == self.name", "message": "lower case only"},
                ],
                "properties": {"size": {"type": "string"}, "name": {"type": "string"}},
            }
        },
    }
    obj = {"metadata": {"name": "x"}, "spec": {"size": "2Gi", "name": "Upper"}}
    causes, warnings = validate(obj, schema)
    assert [(c.field, c.message) for c in causes] == [
        ("spec", 'Invalid value: "object": lower case only')
    ]
    assert len(warnings) == 1 and "quantity" in warnings[0]


def test_unchanged_values_are_not_revalidated_on_update() -> None:
    stored = _obj(initialSegments=8, maxSegments=4)  # written before the rule existed
    with_status = _obj(initialSegments=8, maxSegments=4)
    with_status["status"] = {"replicas": 1}
    assert _fields(with_status, stored) == {}, "ratcheting: the unchanged spec is not re-checked"
    edited = _obj(initialSegments=8, maxSegments=4, owner="someone")
    assert set(_fields(edited, stored)) == {"spec.maxSegments"}, "a changed spec is checked in full"


def test_metadata_name_restrictions_apply_on_create_and_ratchet_on_update() -> None:
    schema = {
        "type": "object",
        "properties": {
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "generateName": {"type": "string", "pattern": "^[a-z]+-$"},
                },
            },
            "spec": {"type": "object"},
        },
    }

    def fields(obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, str]:
        causes, _ = validate(obj, schema, old)
        return {c.field: c.message for c in causes}

    assert fields({"metadata": {"name": "x" * 8}, "spec": {}}) == {}
    too_long = {"metadata": {"name": "x" * 9, "generateName": "Bad"}, "spec": {}}
    assert fields(too_long) == {
        "metadata.name": "Too long: may not be more than 8 bytes",
        "metadata.generateName": (
            "Invalid value: \"Bad\": metadata.generateName in body should match '^[a-z]+-$'"
        ),
    }
    stored = {"metadata": {"name": "x" * 9}, "spec": {}}  # stored before the restriction
    with_status = {"metadata": {"name": "x" * 9}, "spec": {}, "status": {"ready": False}}
    assert fields(with_status, stored) == {}, "ratcheting: the unchanged name is not re-checked"


def test_prune_reports_the_dropped_paths() -> None:
    dropped: list[str] = []
    obj = _obj(bogus=1, tags=["a"])
    obj["status"] = {"conditions": [{"type": "Ready", "status": "True", "extra": 1}]}
    prune(obj, SCHEMA, root=True, dropped=dropped)
    assert dropped == ["spec.bogus", "status.conditions[0].extra"]
