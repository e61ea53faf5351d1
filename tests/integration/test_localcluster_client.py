"""The official ``kubernetes`` Python client against the embedded API server.

The client is synchronous, so every call runs in a worker thread (``asyncio.to_thread``)
while the server keeps serving on the test's event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import pytest
from kubernetes import client, config, watch
from kubernetes.client import (
    EventsV1Event,
    V1ConfigMap,
    V1Lease,
    V1LeaseSpec,
    V1ObjectMeta,
    V1ObjectReference,
    V1OwnerReference,
)
from kubernetes.client.exceptions import ApiException

from scalable_topics.localcluster.cluster import LocalCluster

from .conftest import eventually

pytestmark = pytest.mark.integration

NS = "default"
WIDGETS_CRD = (
    Path(__file__).resolve().parent.parent / "fixtures" / "localcluster" / "widgets-crd.yaml"
)


def _api(cluster: LocalCluster) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.kubeconfig)
    )
    return api


def _lease(name: str, holder: str = "a") -> V1Lease:
    return V1Lease(
        api_version="coordination.k8s.io/v1",
        kind="Lease",
        metadata=V1ObjectMeta(name=name),
        spec=V1LeaseSpec(holder_identity=holder, lease_duration_seconds=15),
    )


def _config_map(name: str, data: dict[str, str] | None = None) -> V1ConfigMap:
    return V1ConfigMap(metadata=V1ObjectMeta(name=name), data=data)


class _Object(Protocol):
    @property
    def metadata(self) -> V1ObjectMeta | None: ...


def _meta(obj: _Object) -> V1ObjectMeta:
    """The metadata of an object the server returned, which always carries some."""
    assert obj.metadata is not None, f"{type(obj).__name__} came back without metadata"
    return obj.metadata


def _name(obj: _Object) -> str:
    name = _meta(obj).name
    assert name, f"{type(obj).__name__} came back without metadata.name"
    return name


def _uid(obj: _Object) -> str:
    uid = _meta(obj).uid
    assert uid, f"{_name(obj)} came back without metadata.uid"
    return uid


def _rv(obj: _Object) -> str:
    rv = _meta(obj).resource_version
    assert rv, f"{_name(obj)} came back without metadata.resourceVersion"
    return rv


def _body(exc: ApiException) -> str:
    """The error response's body: every failure checked here is an HTTP error with a Status."""
    assert exc.body is not None, f"ApiException {exc.status} without a response body"
    return exc.body


async def test_stale_replace_conflicts_and_one_concurrent_writer_wins(
    local_cluster: LocalCluster,
) -> None:
    api = client.CoordinationV1Api(_api(local_cluster))
    created = await asyncio.to_thread(api.create_namespaced_lease, NS, _lease("shard-0"))
    rv0 = _rv(created)

    assert created.spec is not None
    created.spec.holder_identity = "b"
    updated = await asyncio.to_thread(api.replace_namespaced_lease, "shard-0", NS, created)
    assert int(_rv(updated)) > int(rv0)

    stale = await asyncio.to_thread(api.read_namespaced_lease, "shard-0", NS)
    _meta(stale).resource_version = rv0
    with pytest.raises(ApiException) as info:
        await asyncio.to_thread(api.replace_namespaced_lease, "shard-0", NS, stale)
    assert info.value.status == 409
    assert '"reason":"Conflict"' in _body(info.value)

    current = await asyncio.to_thread(api.read_namespaced_lease, "shard-0", NS)
    barrier = threading.Barrier(2)

    def contend(holder: str) -> str:
        body = current.model_copy(deep=True)
        assert body.spec is not None
        body.spec.holder_identity = holder
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
    assert final.spec is not None
    assert final.spec.holder_identity in ("x", "y")


async def test_watch_resumes_in_order_and_lists_carry_resource_version(
    local_cluster: LocalCluster,
) -> None:
    core = client.CoreV1Api(_api(local_cluster))
    listed = await asyncio.to_thread(core.list_namespaced_config_map, NS)
    assert listed.metadata is not None
    since = listed.metadata.resource_version
    assert since

    expected: list[tuple[str, str, str]] = []
    for i in range(5):
        cm = await asyncio.to_thread(
            core.create_namespaced_config_map,
            NS,
            V1ConfigMap(
                metadata=V1ObjectMeta(name=f"cm-{i}", labels={"idx": str(i)}), data={"v": "0"}
            ),
        )
        expected.append(("ADDED", f"cm-{i}", _rv(cm)))
    for i in (3, 1):
        cm = await asyncio.to_thread(
            core.patch_namespaced_config_map, f"cm-{i}", NS, {"data": {"v": "1"}}
        )
        expected.append(("MODIFIED", f"cm-{i}", _rv(cm)))
    await asyncio.to_thread(core.delete_namespaced_config_map, "cm-0", NS)
    expected.append(("DELETED", "cm-0", ""))

    def collect() -> list[tuple[str, str, str]]:
        seen: list[tuple[str, str, str]] = []
        w = watch.Watch()  # type: ignore[no-untyped-call]
        for event in w.stream(  # type: ignore[no-untyped-call]
            core.list_namespaced_config_map, NS, resource_version=since, timeout_seconds=10
        ):
            obj: V1ConfigMap = event["object"]
            seen.append((event["type"], _name(obj), _rv(obj)))
            if len(seen) == len(expected):
                w.stop()  # type: ignore[no-untyped-call]
        return seen

    seen = await asyncio.to_thread(collect)
    assert [(t, n) for t, n, _ in seen] == [(t, n) for t, n, _ in expected]
    assert [rv for _, _, rv in seen[:-1]] == [rv for _, _, rv in expected[:-1]]
    rvs = [int(rv) for _, _, rv in seen]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)

    by_label = await asyncio.to_thread(
        core.list_namespaced_config_map, NS, label_selector="idx in (1,3)"
    )
    assert sorted(_name(c) for c in by_label.items) == ["cm-1", "cm-3"]
    by_field = await asyncio.to_thread(
        core.list_namespaced_config_map, NS, field_selector="metadata.name!=cm-2"
    )
    assert "cm-2" not in {_name(c) for c in by_field.items}
    everywhere = await asyncio.to_thread(
        core.list_config_map_for_all_namespaces, label_selector="!idx"
    )
    assert everywhere.items == []


async def test_watch_from_a_too_old_resource_version_gets_410(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "c", kubelet=False, history_size=4) as cluster:
        core = client.CoreV1Api(_api(cluster))
        first = await asyncio.to_thread(
            core.create_namespaced_config_map, NS, _config_map("a", {"n": "0"})
        )
        for n in range(1, 8):
            await asyncio.to_thread(
                core.patch_namespaced_config_map, "a", NS, {"data": {"n": str(n)}}
            )

        def old_watch() -> None:
            for _ in watch.Watch().stream(  # type: ignore[no-untyped-call]
                core.list_namespaced_config_map,
                NS,
                resource_version=_rv(first),
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
        assert _uid(again) == _uid(lease)
        assert _rv(again) == _rv(lease)
        assert _meta(again).creation_timestamp == _meta(lease).creation_timestamp
        other = await asyncio.to_thread(api.create_namespaced_lease, NS, _lease("new"))
        assert int(_rv(other)) > int(_rv(lease))
        namespaces = await asyncio.to_thread(client.CoreV1Api(_api(cluster)).list_namespace)
        assert {"default", "kube-system"} <= {_name(n) for n in namespaces.items}


async def test_owner_references_are_garbage_collected(local_cluster: LocalCluster) -> None:
    core = client.CoreV1Api(_api(local_cluster))

    async def make(name: str, owners: Sequence[tuple[str, str, bool]] = ()) -> V1ConfigMap:
        refs = [
            V1OwnerReference(
                api_version="v1", kind="ConfigMap", name=n, uid=u, block_owner_deletion=b
            )
            for n, u, b in owners
        ]
        body = V1ConfigMap(metadata=V1ObjectMeta(name=name, owner_references=refs or None))
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
    await make("child", [("owner", _uid(owner), False)])
    shared = await make("shared", [("owner", _uid(owner), False), ("other", _uid(other), False)])
    await asyncio.to_thread(core.delete_namespaced_config_map, "owner", NS)
    await eventually(lambda: _not(exists("child")))
    assert local_cluster.gc is not None
    await local_cluster.gc.idle()
    kept = await asyncio.to_thread(core.read_namespaced_config_map, "shared", NS)
    kept_refs = _meta(kept).owner_references
    assert kept_refs is not None, "the surviving owner's reference is kept"
    assert [r.uid for r in kept_refs] == [_uid(other)]
    assert _uid(kept) == _uid(shared)

    # Orphan: the dependent stays and loses its reference.
    owner2 = await make("owner2")
    await make("orphan", [("owner2", _uid(owner2), False)])
    await asyncio.to_thread(
        core.delete_namespaced_config_map, "owner2", NS, propagation_policy="Orphan"
    )
    await eventually(lambda: _not(exists("owner2")))
    orphan = await asyncio.to_thread(core.read_namespaced_config_map, "orphan", NS)
    assert not _meta(orphan).owner_references

    # Foreground: the owner waits for a blocking dependent that has a finalizer of its own.
    owner3 = await make("owner3")
    await make("blocker", [("owner3", _uid(owner3), True)])
    await asyncio.to_thread(
        core.patch_namespaced_config_map, "blocker", NS, {"metadata": {"finalizers": ["test/hold"]}}
    )
    await asyncio.to_thread(
        core.delete_namespaced_config_map, "owner3", NS, propagation_policy="Foreground"
    )
    await local_cluster.gc.idle()
    waiting = await asyncio.to_thread(core.read_namespaced_config_map, "owner3", NS)
    assert _meta(waiting).deletion_timestamp is not None
    waiting_finalizers = _meta(waiting).finalizers
    assert waiting_finalizers is not None and "foregroundDeletion" in waiting_finalizers
    blocker = await asyncio.to_thread(core.read_namespaced_config_map, "blocker", NS)
    assert _meta(blocker).deletion_timestamp is not None
    await asyncio.to_thread(
        core.patch_namespaced_config_map, "blocker", NS, {"metadata": {"finalizers": None}}
    )
    await eventually(lambda: _not(exists("owner3")))
    assert not await exists("blocker")


async def _not(value: Awaitable[bool]) -> bool:
    return not await value


async def test_errors_are_kubernetes_status_objects(local_cluster: LocalCluster) -> None:
    core = client.CoreV1Api(_api(local_cluster))
    with pytest.raises(ApiException) as missing:
        await asyncio.to_thread(core.read_namespaced_config_map, "nope", NS)
    assert missing.value.status == 404
    assert '"message":"configmaps \\"nope\\" not found"' in _body(missing.value)
    await asyncio.to_thread(core.create_namespaced_config_map, NS, _config_map("dup"))
    with pytest.raises(ApiException) as dup:
        await asyncio.to_thread(core.create_namespaced_config_map, NS, _config_map("dup"))
    assert dup.value.status == 409 and '"reason":"AlreadyExists"' in _body(dup.value)
    with pytest.raises(ApiException) as bad_name:
        await asyncio.to_thread(core.create_namespaced_config_map, NS, _config_map("Bad_Name"))
    assert bad_name.value.status == 422 and '"field":"metadata.name"' in _body(bad_name.value)
    with pytest.raises(ApiException) as no_ns:
        await asyncio.to_thread(core.create_namespaced_config_map, "missing", _config_map("x"))
    assert no_ns.value.status == 404 and 'namespaces \\"missing\\" not found' in _body(no_ns.value)


async def test_events_k8s_io_and_core_events_share_storage(local_cluster: LocalCluster) -> None:
    events_v1 = client.EventsV1Api(_api(local_cluster))
    core = client.CoreV1Api(_api(local_cluster))
    body = EventsV1Event(
        api_version="events.k8s.io/v1",
        kind="Event",
        metadata=V1ObjectMeta(name="lease.1"),
        event_time=datetime(2026, 1, 1, tzinfo=UTC),
        reporting_controller="scalabletopics.io/operator",
        reporting_instance="operator-0",
        action="Split",
        reason="SegmentSplit",
        note="segment 0 split into 1 and 2",
        type="Normal",
        regarding=V1ObjectReference(api_version="v1", kind="ConfigMap", name="topic", namespace=NS),
    )
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
    assert again.regarding is not None
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
    assert 'strict decoding error: unknown field \\"spec.surprise\\"' in _body(strict.value)
    created = await asyncio.to_thread(
        custom.create_namespaced_custom_object, "test.stopic.io", "v1", NS, "widgets", body
    )
    assert isinstance(created, dict), "custom objects come back as decoded JSON"
    assert "surprise" not in created["spec"]
