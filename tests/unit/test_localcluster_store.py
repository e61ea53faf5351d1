"""The object store and API semantics, in-process (no HTTP)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from scalable_topics.localcluster.errors import ApiError
from scalable_topics.localcluster.gc import GarbageCollector
from scalable_topics.localcluster.objects import Api
from scalable_topics.localcluster.registry import Registry
from scalable_topics.localcluster.store import Store, TooOld

CRD = Path(__file__).resolve().parent.parent / "fixtures" / "localcluster" / "widgets-crd.yaml"


def _api(path: Path | None, history: int = 100) -> Api:
    api = Api(Store(path, history_size=history), Registry())
    ns = api.registry.by_key("/namespaces")
    assert ns is not None
    api.create(ns, "", {"metadata": {"name": "default"}})
    return api


async def test_history_resume_and_too_old() -> None:
    api = _api(None, history=3)
    rt = api.registry.by_key("/configmaps")
    assert rt is not None
    start = api.store.rv
    for i in range(2):
        api.create(rt, "default", {"metadata": {"name": f"c{i}"}})
    sub, backlog = api.store.subscribe(rt.key, "default", start)
    assert [e.obj["metadata"]["name"] for e in backlog] == ["c0", "c1"]
    api.patch(rt, "default", "c0", "application/merge-patch+json", {"data": {"a": "b"}})
    live = sub.queue.get_nowait()
    assert live is not None and live.type == "MODIFIED"
    sub.close()
    for i in range(2, 6):
        api.create(rt, "default", {"metadata": {"name": f"c{i}"}})
    with pytest.raises(TooOld):
        api.store.subscribe(rt.key, None, start)


def test_resource_versions_conflicts_and_noop_updates(tmp_path: Path) -> None:
    api = _api(tmp_path / "db.sqlite3")
    rt = api.registry.by_key("apps/deployments")
    assert rt is not None
    dep = api.create(rt, "default", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    assert dep["metadata"]["generation"] == 1
    same = api.update(rt, "default", "l", copy.deepcopy(dep))
    assert same["metadata"]["resourceVersion"] == dep["metadata"]["resourceVersion"], (
        "no-op writes do not bump"
    )
    changed = copy.deepcopy(dep)
    changed["spec"]["holderIdentity"] = "b"
    newer = api.update(rt, "default", "l", changed)
    assert int(newer["metadata"]["resourceVersion"]) > int(dep["metadata"]["resourceVersion"])
    assert newer["metadata"]["generation"] == 2
    with pytest.raises(ApiError) as conflict:
        api.update(rt, "default", "l", changed)
    assert conflict.value.code == 409 and conflict.value.reason == "Conflict"
    with pytest.raises(ApiError) as patch_conflict:
        api.patch(
            rt,
            "default",
            "l",
            "application/merge-patch+json",
            {
                "metadata": {"resourceVersion": dep["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": "c"},
            },
        )
    assert patch_conflict.value.code == 409
    api.store.close()
    reopened = Api(Store(tmp_path / "db.sqlite3"), Registry())
    again = reopened.get(rt, "default", "l")
    assert again == newer
    assert reopened.store.rv == int(newer["metadata"]["resourceVersion"])
    cm_rt = reopened.registry.by_key("/configmaps")
    assert cm_rt is not None
    cm = reopened.create(cm_rt, "default", {"metadata": {"name": "c"}})
    assert "generation" not in cm["metadata"], "ConfigMaps have no generation"
    assert (
        int(cm["metadata"]["resourceVersion"])
        == reopened.store.rv
        > int(newer["metadata"]["resourceVersion"])
    )


def test_finalizers_block_deletion_until_removed() -> None:
    api = _api(None)
    rt = api.registry.by_key("/configmaps")
    assert rt is not None
    api.create(rt, "default", {"metadata": {"name": "f", "finalizers": ["x/y"]}})
    pending = api.delete(rt, "default", "f")
    assert pending["metadata"]["deletionTimestamp"]
    with pytest.raises(ApiError) as no_new:
        api.patch(
            rt,
            "default",
            "f",
            "application/merge-patch+json",
            {"metadata": {"finalizers": ["x/y", "z"]}},
        )
    assert no_new.value.code == 422
    api.patch(
        rt, "default", "f", "application/merge-patch+json", {"metadata": {"finalizers": None}}
    )
    with pytest.raises(ApiError) as missing:
        api.get(rt, "default", "f")
    assert missing.value.code == 404


def test_generate_name_and_namespace_checks() -> None:
    api = _api(None)
    rt = api.registry.by_key("/configmaps")
    assert rt is not None
    made = api.create(rt, "default", {"metadata": {"generateName": "gen-"}})
    assert made["metadata"]["name"].startswith("gen-") and len(made["metadata"]["name"]) == 9
    with pytest.raises(ApiError) as no_ns:
        api.create(rt, "elsewhere", {"metadata": {"name": "x"}})
    assert no_ns.value.code == 404
    with pytest.raises(ApiError) as mismatch:
        api.create(rt, "default", {"metadata": {"name": "x", "namespace": "other"}})
    assert mismatch.value.code == 400


def test_pods_on_a_node_are_deleted_gracefully() -> None:
    api = _api(None)
    rt = api.registry.by_key("/pods")
    assert rt is not None
    spec = {"nodeName": "local", "containers": [{"name": "c", "image": "x"}]}
    api.create(rt, "default", {"metadata": {"name": "bound"}, "spec": spec})
    api.create(
        rt, "default", {"metadata": {"name": "unbound"}, "spec": {"containers": spec["containers"]}}
    )
    terminating = api.delete(rt, "default", "bound")
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    api.patch(
        rt,
        "default",
        "bound",
        "application/merge-patch+json",
        {"status": {"phase": "Running"}},
        subresource="status",
    )
    assert api.get(rt, "default", "bound")["metadata"]["deletionTimestamp"], (
        "status writes do not finish it"
    )
    api.delete(rt, "default", "bound", {"gracePeriodSeconds": 0})
    api.delete(rt, "default", "unbound")
    assert api.list(rt, "default")[0] == []


async def test_deleting_a_crd_deletes_its_resources_first() -> None:
    api = _api(None)
    gc = GarbageCollector(api)
    gc.start()
    try:
        crd_rt = api.registry.by_key("apiextensions.k8s.io/customresourcedefinitions")
        assert crd_rt is not None
        api.create(crd_rt, "", yaml.safe_load(CRD.read_text()))
        widgets = api.registry.lookup("test.stopic.io", "v1", "widgets")
        assert widgets is not None
        held = {
            "metadata": {"name": "held", "finalizers": ["test/hold"]},
            "spec": {"initialSegments": 1},
        }
        api.create(widgets, "default", held)
        api.create(
            widgets, "default", {"metadata": {"name": "free"}, "spec": {"initialSegments": 1}}
        )
        api.delete(crd_rt, "", "widgets.test.stopic.io")
        await gc.idle()
        remaining = api.list(widgets, "default")[0]
        assert [w["metadata"]["name"] for w in remaining] == ["held"]
        assert remaining[0]["metadata"]["deletionTimestamp"]
        assert api.get(crd_rt, "", "widgets.test.stopic.io")["metadata"]["deletionTimestamp"]
        api.patch(
            widgets,
            "default",
            "held",
            "application/merge-patch+json",
            {"metadata": {"finalizers": None}},
        )
        await gc.idle()
        with pytest.raises(ApiError):
            api.get(crd_rt, "", "widgets.test.stopic.io")
        assert api.registry.lookup("test.stopic.io", "v1", "widgets") is None
    finally:
        await gc.stop()
