"""Merge patch, JSON patch and strategic merge patch as the local apiserver applies them."""

from __future__ import annotations

from typing import Any

import pytest

from scalable_topics.localcluster.errors import ApiError
from scalable_topics.localcluster.patches import json_patch, merge_patch, strategic_merge_patch


def test_merge_patch_rfc7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "l": [3], "n": {"x": None, "y": 1}}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "l": [3], "n": {"y": 1}}
    assert target["c"] == {"d": "e", "f": "g"}, "the target is not mutated"


def test_json_patch_operations_and_test_failure() -> None:
    doc: dict[str, Any] = {"spec": {"tags": ["a"], "n": 1}, "metadata": {"labels": {"a/b": "x"}}}
    out = json_patch(
        doc,
        [
            {"op": "test", "path": "/spec/n", "value": 1},
            {"op": "add", "path": "/spec/tags/-", "value": "b"},
            {"op": "add", "path": "/spec/tags/0", "value": "first"},
            {"op": "replace", "path": "/spec/n", "value": 2},
            {"op": "remove", "path": "/metadata/labels/a~1b"},
            {"op": "copy", "from": "/spec/n", "path": "/spec/m"},
            {"op": "move", "from": "/spec/m", "path": "/spec/k"},
        ],
    )
    assert out == {
        "spec": {"tags": ["first", "a", "b"], "n": 2, "k": 2},
        "metadata": {"labels": {}},
    }
    assert doc["spec"]["n"] == 1
    with pytest.raises(ApiError) as failed:
        json_patch(doc, [{"op": "test", "path": "/spec/n", "value": 5}])
    assert failed.value.code == 422
    with pytest.raises(ApiError):
        json_patch(doc, [{"op": "remove", "path": "/spec/missing"}])
    with pytest.raises(ApiError):
        json_patch(doc, [{"op": "replace", "path": "/spec/tags/7", "value": 1}])


def test_strategic_merge_patch_merges_lists_by_key() -> None:
    deployment = {
        "metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "v1",
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        },
                        {"name": "side", "image": "s1"},
                    ],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                }
            }
        },
    }
    patch = {
        "metadata": {"finalizers": ["b"], "labels": {"x": None}},
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "side"}, {"name": "main"}],
                    "containers": [
                        {"name": "main", "env": [{"name": "B", "value": "3"}]},
                        {"name": "side", "$patch": "delete"},
                    ],
                    "volumes": [{"name": "cache", "emptyDir": {}}],
                }
            }
        },
    }
    out = strategic_merge_patch(deployment, patch)
    assert out["metadata"] == {"finalizers": ["a", "b"], "labels": {}}
    pod_spec = out["spec"]["template"]["spec"]
    assert pod_spec["containers"] == [
        {
            "name": "main",
            "image": "v1",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}],
        }
    ]
    assert [v["name"] for v in pod_spec["volumes"]] == ["data", "cache"]


def test_strategic_merge_patch_directives() -> None:
    obj = {
        "metadata": {"finalizers": ["a", "b", "c"]},
        "spec": {"args": ["x", "y"], "strategy": {"type": "Recreate", "rollingUpdate": None}},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }
    out = strategic_merge_patch(
        obj,
        {
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]},
            "spec": {"args": ["z"], "strategy": {"$retainKeys": ["type"], "type": "RollingUpdate"}},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "Synced", "status": "True"},
                ]
            },
        },
    )
    assert out["metadata"]["finalizers"] == ["a", "c"]
    assert out["spec"]["args"] == ["z"], "lists without a merge key are replaced"
    assert out["spec"]["strategy"] == {"type": "RollingUpdate"}
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "Synced", "status": "True"},
    ]
    replaced = strategic_merge_patch(obj, {"spec": {"$patch": "replace", "only": 1}})
    assert replaced["spec"] == {"only": 1}
