"""The official ``kubernetes`` Python client against the embedded API server.

The client is synchronous, so every call runs in a worker thread (``asyncio.to_thread``)
while the server keeps serving on the test's event loop.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from scalable_topics.localcluster.cluster import LocalCluster

from .conftest import eventually

pytestmark = pytest.mark.integration

NS = "default"
WIDGETS_CRD = (
    Path(__file__).resolve().parent.parent / "fixtures" / "localcluster" / "widgets-crd.yaml"
)


def _api(cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


def _lease(name: str, holder: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


async def test_stale_replace_conflicts_and_one_concurrent_writer_wins(
    local_cluster: LocalCluster,
) -> None:
    api = client.CoordinationV1Api(_api(local_cluster))
    created = await asyncio.to_thread(api.create_namespaced_lease, NS, _lease("shard-0"))
    rv0 = created.metadata.resource_version

    created.spec.holder_identity = "b"
    updated = await asyncio.to_thread(api.replace_namespaced_lease, "shard-0", NS, created)
    assert int(updated.metadata.resource_version) > int(rv0)

    stale = await asyncio.to_thread(api.read_namespaced_lease, "shard-0", NS)
    stale.metadata.resource_version = rv0
    with pytest.raises(ApiException) as info:
        await asyncio.to_thread(api.replace_namespaced_lease, "shard-0", NS, stale)
    assert info.value.status == 409
    assert '"reason":"Conflict"' in info.value.body

    current = await asyncio.to_thread(api.read_namespaced_lease, "shard-0", NS)
    barrier = threading.Barrier(2)

    def contend(holder: str) -> str:
        body = client.ApiClient().sanitize_for_serialization(current)
        body["spec"]["holderIdentity"] = holder
        own = client.CoordinationV1Api(_api(local_cluster))
        barrier.wait()
        try:
            own.replace_namespaced_lease("shard-0", NS, body)
            return "won"
        except ApiException as exc:
            return f"lost:{exc.status}"

    results = await asyncio.gather(asyncio.to_thread(contend, "x"), asyncio.to_thread(contend, "y"))
    assert sorted(results) == ["lost:409", "won"]
    final = await asyncio.to_thread(api.read_namespaced_lease, "shard-0", NS)
    assert final.spec.holder_identity in ("x", "y")


async def test_watch_resumes_in_order_and_lists_carry_resource_version(
    local_cluster: LocalCluster,
) -> None:
    core = client.CoreV1Api(_api(local_cluster))
    listed = await asyncio.to_thread(core.list_namespaced_config_map, NS)
    since = listed.metadata.resource_version
    assert since

    expected: list[tuple[str, str, str]] = []
    for i in range(5):
        cm = await asyncio.to_thread(
            core.create_namespaced_config_map,
            NS,
            {"metadata": {"name": f"cm-{i}", "labels": {"idx": str(i)}}, "data": {"v": "0"}},
        )
        expected.append(("ADDED", f"cm-{i}", cm.metadata.resource_version))
    for i in (3, 1):
        cm = await asyncio.to_thread(
            core.patch_namespaced_config_map, f"cm-{i}", NS, {"data": {"v": "1"}}
        )
        expected.append(("MODIFIED", f"cm-{i}", cm.metadata.resource_version))
    await asyncio.to_thread(core.delete_namespaced_config_map, "cm-0", NS)
    expected.append(("DELETED", "cm-0", ""))

    def collect() -> list[tuple[str, str, str]]:
        seen: list[tuple[str, str, str]] = []
        w = watch.Watch()
        for event in w.stream(
            core.list_namespaced_config_map, NS, resource_version=since, timeout_seconds=10
        ):
            obj = event["object"]
            seen.append((event["type"], obj.metadata.name, obj.metadata.resource_version))
            if len(seen) == len(expected):
                w.stop()
        return seen

    seen = await asyncio.to_thread(collect)
    assert [(t, n) for t, n, _ in seen] == [(t, n) for t, n, _ in expected]
    assert [rv for _, _, rv in seen[:-1]] == [rv for _, _, rv in expected[:-1]]
    rvs = [int(rv) for _, _, rv in seen]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)

    by_label = await asyncio.to_thread(
        core.list_namespaced_config_map, NS, label_selector="idx in (1,3)"
    )
    assert sorted(c.metadata.name for c in by_label.items) == ["cm-1", "cm-3"]
    by_field = await asyncio.to_thread(
        core.list_namespaced_config_map, NS, field_selector="metadata.name!=cm-2"
    )
    assert "cm-2" not in {c.metadata.name for c in by_field.items}
    everywhere = await asyncio.to_thread(
        core.list_config_map_for_all_namespaces, label_selector="!idx"
    )
    assert everywhere.items == []


async def test_watch_from_a_too_old_resource_version_gets_410(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "c", kubelet=False, history_size=4) as cluster:
        core = client.CoreV1Api(_api(cluster))
        first = await asyncio.to_thread(
            core.create_namespaced_config_map, NS, {"metadata": {"name": "a"}, "data": {"n": "0"}}
        )
        for n in range(1, 8):
            await asyncio.to_thread(
                core.patch_namespaced_config_map, "a", NS, {"data": {"n": str(n)}}
            )

        def old_watch() -> None:
            for _ in watch.Watch().stream(
                core.list_namespaced_config_map,
                NS,
                resource_version=first.metadata.resource_version,
                timeout_seconds=5,
            ):
                pass

        with pytest.raises(ApiException) as info:
            await asyncio.to_thread(old_watch)
        assert info.value.status == 410


async def test_restart_keeps_objects_uids_and_resource_versions(tmp_path: Path) -> None:
    data = tmp_path / "c"
    async with LocalCluster(data, kubelet=False) as cluster:
        api = client.CoordinationV1Api(_api(cluster))
        lease = await asyncio.to_thread(api.create_namespaced_lease, NS, _lease("keep"))
        token = cluster.token
    async with LocalCluster(data, kubelet=False) as cluster:
        assert cluster.token == token
        api = client.CoordinationV1Api(_api(cluster))
        again = await asyncio.to_thread(api.read_namespaced_lease, "keep", NS)
        assert again.metadata.uid == lease.metadata.uid
        assert again.metadata.resource_version == lease.metadata.resource_version
        assert again.metadata.creation_timestamp == lease.metadata.creation_timestamp
        other = await asyncio.to_thread(api.create_namespaced_lease, NS, _lease("new"))
        assert int(other.metadata.resource_version) > int(lease.metadata.resource_version)
        namespaces = await asyncio.to_thread(client.CoreV1Api(_api(cluster)).list_namespace)
        assert {"default", "kube-system"} <= {n.metadata.name for n in namespaces.items}


async def test_owner_references_are_garbage_collected(local_cluster: LocalCluster) -> None:
    core = client.CoreV1Api(_api(local_cluster))

    async def make(name: str, owners: list[tuple[str, str, bool]] = ()) -> Any:  # type: ignore[assignment]
        refs = [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": n, "uid": u, "blockOwnerDeletion": b}
            for n, u, b in owners
        ]
        body = {"metadata": {"name": name, "ownerReferences": refs} if refs else {"name": name}}
        return await asyncio.to_thread(core.create_namespaced_config_map, NS, body)

    async def exists(name: str) -> bool:
        try:
            await asyncio.to_thread(core.read_namespaced_config_map, name, NS)
            return True
        except ApiException as exc:
            assert exc.status == 404
            return False

    # Background: the dependent goes after its owner; a second owner keeps it alive.
    owner = await make("owner")
    other = await make("other")
    await make("child", [("owner", owner.metadata.uid, False)])
    shared = await make(
        "shared", [("owner", owner.metadata.uid, False), ("other", other.metadata.uid, False)]
    )
    await asyncio.to_thread(core.delete_namespaced_config_map, "owner", NS)
    await eventually(lambda: _not(exists("child")))
    assert local_cluster.gc is not None
    await local_cluster.gc.idle()
    kept = await asyncio.to_thread(core.read_namespaced_config_map, "shared", NS)
    assert [r.uid for r in kept.metadata.owner_references] == [other.metadata.uid]
    assert kept.metadata.uid == shared.metadata.uid

    # Orphan: the dependent stays and loses its reference.
    owner2 = await make("owner2")
    await make("orphan", [("owner2", owner2.metadata.uid, False)])
    await asyncio.to_thread(
        core.delete_namespaced_config_map, "owner2", NS, propagation_policy="Orphan"
    )
    await eventually(lambda: _not(exists("owner2")))
    orphan = await asyncio.to_thread(core.read_namespaced_config_map, "orphan", NS)
    assert not orphan.metadata.owner_references

    # Foreground: the owner waits for a blocking dependent that has a finalizer of its own.
    owner3 = await make("owner3")
    await make("blocker", [("owner3", owner3.metadata.uid, True)])
    await asyncio.to_thread(
        core.patch_namespaced_config_map, "blocker", NS, {"metadata": {"finalizers": ["test/hold"]}}
    )
    await asyncio.to_thread(
        core.delete_namespaced_config_map, "owner3", NS, propagation_policy="Foreground"
    )
    await local_cluster.gc.idle()
    waiting = await asyncio.to_thread(core.read_namespaced_config_map, "owner3", NS)
    assert waiting.metadata.deletion_timestamp is not None
    assert "foregroundDeletion" in waiting.metadata.finalizers
    blocker = await asyncio.to_thread(core.read_namespaced_config_map, "blocker", NS)
    assert blocker.metadata.deletion_timestamp is not None
    await asyncio.to_thread(
        core.patch_namespaced_config_map, "blocker", NS, {"metadata": {"finalizers": None}}
    )
    await eventually(lambda: _not(exists("owner3")))
    assert not await exists("blocker")


async def _not(value: Any) -> bool:
    return not await value


async def test_errors_are_kubernetes_status_objects(local_cluster: LocalCluster) -> None:
    core = client.CoreV1Api(_api(local_cluster))
    with pytest.raises(ApiException) as missing:
        await asyncio.to_thread(core.read_namespaced_config_map, "nope", NS)
    assert missing.value.status == 404
    assert '"message":"configmaps \\"nope\\" not found"' in missing.value.body
    await asyncio.to_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "dup"}})
    with pytest.raises(ApiException) as dup:
        await asyncio.to_thread(
            core.create_namespaced_config_map, NS, {"metadata": {"name": "dup"}}
        )
    assert dup.value.status == 409 and '"reason":"AlreadyExists"' in dup.value.body
    with pytest.raises(ApiException) as bad_name:
        await asyncio.to_thread(
            core.create_namespaced_config_map, NS, {"metadata": {"name": "Bad_Name"}}
        )
    assert bad_name.value.status == 422 and '"field":"metadata.name"' in bad_name.value.body
    with pytest.raises(ApiException) as no_ns:
        await asyncio.to_thread(
            core.create_namespaced_config_map, "missing", {"metadata": {"name": "x"}}
        )
    assert no_ns.value.status == 404 and 'namespaces \\"missing\\" not found' in no_ns.value.body


async def test_events_k8s_io_and_core_events_share_storage(local_cluster: LocalCluster) -> None:
    events_v1 = client.EventsV1Api(_api(local_cluster))
    core = client.CoreV1Api(_api(local_cluster))
    body = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "lease.1"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "scalabletopics.io/operator",
        "reportingInstance": "operator-0",
        "action": "Split",
        "reason": "SegmentSplit",
        "note": "segment 0 split into 1 and 2",
        "type": "Normal",
        "regarding": {"apiVersion": "v1", "kind": "ConfigMap", "name": "topic", "namespace": NS},
    }
    await asyncio.to_thread(events_v1.create_namespaced_event, NS, body)
    found = await asyncio.to_thread(
        core.list_namespaced_event,
        NS,
        field_selector="involvedObject.kind=ConfigMap,involvedObject.name=topic",
    )
    assert [(e.reason, e.message, e.reporting_component) for e in found.items] == [
        ("SegmentSplit", "segment 0 split into 1 and 2", "scalabletopics.io/operator")
    ]
    again = await asyncio.to_thread(events_v1.read_namespaced_event, "lease.1", NS)
    assert again.note == "segment 0 split into 1 and 2" and again.regarding.name == "topic"


async def test_field_validation_strict_rejects_unknown_fields(local_cluster: LocalCluster) -> None:
    await local_cluster.apply_file(WIDGETS_CRD)
    custom = client.CustomObjectsApi(_api(local_cluster))
    body = {
        "apiVersion": "test.stopic.io/v1",
        "kind": "Widget",
        "metadata": {"name": "strict"},
        "spec": {"initialSegments": 1, "surprise": True},
    }
    with pytest.raises(ApiException) as strict:
        await asyncio.to_thread(
            custom.create_namespaced_custom_object,
            "test.stopic.io",
            "v1",
            NS,
            "widgets",
            body,
            field_validation="Strict",
        )
    assert strict.value.status == 400
    assert 'strict decoding error: unknown field \\"spec.surprise\\"' in strict.value.body
    created = await asyncio.to_thread(
        custom.create_namespaced_custom_object, "test.stopic.io", "v1", NS, "widgets", body
    )
    assert "surprise" not in created["spec"]
