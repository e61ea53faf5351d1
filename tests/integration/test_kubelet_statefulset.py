"""StatefulSet and Deployment pods run as local processes by the embedded kubelet."""

from __future__ import annotations

import ipaddress
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from scalable_topics.localcluster.cluster import LocalCluster
from scalable_topics.localcluster.restclient import DEPLOYMENTS, PODS, STATEFULSETS, RestClient

from .kubelet_harness import (
    Harness,
    JsonObj,
    eventually,
    free_port,
    is_ready,
    running_cluster,
    sleeper_container,
    state_server_container,
)

pytestmark = pytest.mark.integration

NS = "default"


def statefulset(name: str, replicas: int, port: int) -> JsonObj:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [state_server_container(port)],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "state"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        },
    }


async def http_get(url: str) -> str:
    async with (
        aiohttp.ClientSession() as s,
        s.get(url, timeout=aiohttp.ClientTimeout(total=3)) as r,
    ):
        r.raise_for_status()
        return await r.text()


async def ready_pod(h: Harness, name: str) -> JsonObj:
    async def probe() -> JsonObj | None:
        pod = await h.pod(NS, name)
        return pod if is_ready(pod) else None

    return await eventually(probe, what=f"pod {name} Ready")


def container_pid(pod: JsonObj) -> int:
    cid = pod["status"]["containerStatuses"][0]["containerID"]
    assert cid.startswith("local://")
    return int(cid.removeprefix("local://"))


async def test_statefulset_pods_run_restart_and_scale(tmp_path: Path) -> None:
    port = free_port()
    async with running_cluster(tmp_path) as h:
        await h.client.create(STATEFULSETS, NS, statefulset("web", 2, port))
        pods = [await ready_pod(h, f"web-{i}") for i in range(2)]
        ips = [p["status"]["podIP"] for p in pods]
        assert len(set(ips)) == 2
        for i, (pod, ip) in enumerate(zip(pods, ips, strict=True)):
            assert ipaddress.ip_address(ip).is_loopback and not ip.startswith("127.0.0.")
            assert pod["status"]["podIPs"] == [{"ip": ip}]
            assert pod["status"]["hostIP"] == "127.0.0.1"
            assert pod["spec"]["nodeName"] == "local"
            assert pod["status"]["phase"] == "Running"
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
            assert await http_get(f"http://{ip}:{port}/starts") == "1"
            whoami = await http_get(f"http://{ip}:{port}/whoami")
            claim_dir = h.data_dir / "volumes" / NS / f"state-web-{i}"
            assert f'"pod": "web-{i}"' in whoami and str(claim_dir) in whoami

        async def sts_status(replicas: int, ready: int) -> bool:
            s = await h.client.get(STATEFULSETS, NS, "web")
            st = s.get("status") or {}
            return (
                st.get("replicas") == replicas
                and st.get("readyReplicas") == ready
                and st.get("observedGeneration") == s["metadata"]["generation"]
            )

        await eventually(lambda: sts_status(2, 2), what="statefulset status 2/2")

        # Chaos: SIGKILL the server of web-0; the kubelet restarts it on the same IP and volume.
        os.kill(container_pid(pods[0]), signal.SIGKILL)

        async def restarted() -> JsonObj | None:
            pod = await h.pod(NS, "web-0")
            if pod and is_ready(pod) and pod["status"]["containerStatuses"][0]["restartCount"] == 1:
                return pod
            return None

        pod0 = await eventually(restarted, what="web-0 restarted once and Ready")
        last = pod0["status"]["containerStatuses"][0]["lastState"]["terminated"]
        assert last["exitCode"] == 137
        assert pod0["status"]["podIP"] == ips[0]
        assert await http_get(f"http://{ips[0]}:{port}/starts") == "2"

        # Deleting a pod: it is re-created with the same name, address and state directory.
        uid1 = (await h.client.get(PODS, NS, "web-1"))["metadata"]["uid"]
        await h.client.delete(PODS, NS, "web-1")

        async def replaced() -> JsonObj | None:
            pod = await h.pod(NS, "web-1")
            return pod if pod and pod["metadata"]["uid"] != uid1 and is_ready(pod) else None

        pod1 = await eventually(replaced, what="web-1 re-created and Ready")
        assert pod1["status"]["podIP"] == ips[1]
        assert await http_get(f"http://{ips[1]}:{port}/starts") == "2"

        await h.client.patch(STATEFULSETS, NS, "web", {"spec": {"replicas": 3}})
        pod2 = await ready_pod(h, "web-2")
        assert pod2["status"]["podIP"] not in ips
        await eventually(lambda: sts_status(3, 3), what="statefulset status 3/3")

        await h.client.patch(STATEFULSETS, NS, "web", {"spec": {"replicas": 2}})

        async def web2_gone() -> bool:
            return await h.pod(NS, "web-2") is None

        await eventually(web2_gone, what="web-2 deleted")
        await eventually(lambda: sts_status(2, 2), what="statefulset status back to 2/2")
        assert (h.data_dir / "volumes" / NS / "state-web-2" / "starts.log").exists()
        server_log = h.data_dir / "pods" / NS / "web-0" / "server.log"
        assert "serving on" in server_log.read_text()
        old_pid = container_pid(pod0)
    # After stop() nothing the kubelet started is left.
    with pytest.raises(ProcessLookupError):
        os.kill(old_pid, 0)


def deployment(name: str, replicas: int, env_value: str) -> JsonObj:
    container = sleeper_container()
    container["env"] = [{"name": "VERSION", "value": env_value}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [container]},
            },
        },
    }


async def test_deployment_replaces_deleted_pods_and_rolls_templates(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        await h.client.create(DEPLOYMENTS, NS, deployment("api", 2, "v1"))

        async def ready_pods(hash_differs_from: str | None = None) -> list[JsonObj] | None:
            items, _ = await h.client.list(PODS, NS, label_selector="app=api")
            live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
            if len(live) != 2 or not all(is_ready(p) for p in live):
                return None
            hashes = {p["metadata"]["labels"]["pod-template-hash"] for p in live}
            if len(hashes) != 1 or hash_differs_from in hashes:
                return None
            return live

        async def available(generation: int) -> bool:
            d = await h.client.get(DEPLOYMENTS, NS, "api")
            st = d.get("status") or {}
            conds = {c["type"]: c for c in st.get("conditions") or []}
            return (
                st.get("observedGeneration") == generation
                and st.get("availableReplicas") == 2
                and st.get("updatedReplicas") == 2
                and st.get("replicas") == 2
                and conds.get("Available", {}).get("status") == "True"
                and conds.get("Progressing", {}).get("reason") == "NewReplicaSetAvailable"
            )

        pods = await eventually(ready_pods, what="2 ready deployment pods")
        for p in pods:
            assert p["metadata"]["name"].startswith("api-")
            assert len(p["metadata"]["name"]) == len("api-") + 5
            assert p["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
        await eventually(lambda: available(1), what="deployment available")

        victim = pods[0]["metadata"]["name"]
        await h.client.delete(PODS, NS, victim)

        async def replaced() -> list[JsonObj] | None:
            live = await ready_pods()
            if live and victim not in {p["metadata"]["name"] for p in live}:
                return live
            return None

        await eventually(replaced, what="deleted pod replaced")
        old_hash = pods[1]["metadata"]["labels"]["pod-template-hash"]

        await h.client.patch(
            DEPLOYMENTS,
            NS,
            "api",
            {"spec": {"template": deployment("api", 2, "v2")["spec"]["template"]}},
        )
        rolled = await eventually(lambda: ready_pods(old_hash), what="pods rolled to v2")
        assert all(
            p["spec"]["containers"][0]["env"] == [{"name": "VERSION", "value": "v2"}]
            for p in rolled
        )
        await eventually(lambda: available(2), what="deployment available after the roll")

        await h.client.patch(DEPLOYMENTS, NS, "api", {"spec": {"replicas": 0}})

        async def scaled_to_zero() -> bool:
            items, _ = await h.client.list(PODS, NS, label_selector="app=api")
            return not items

        await eventually(scaled_to_zero, what="deployment scaled to zero")


async def test_cluster_restart_reruns_pods_on_their_addresses(tmp_path: Path) -> None:
    """``LocalCluster(kubelet=True)`` as ``make run`` uses it: stop kills, start runs again."""
    port = free_port()
    data = tmp_path / "cluster"

    async def ready_web0(cluster: LocalCluster, client: RestClient) -> JsonObj:
        async def probe() -> JsonObj | None:
            pod = await client.get_or_none(PODS, NS, "web-0")
            return pod if is_ready(pod) else None

        return await eventually(probe, what="web-0 Ready")

    async with LocalCluster(data) as cluster:
        client = RestClient(cluster.url, cluster.token)
        try:
            await client.create(STATEFULSETS, NS, statefulset("web", 1, port))
            first = await ready_web0(cluster, client)
        finally:
            await client.close()
    pid = container_pid(first)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    async with LocalCluster(data) as cluster:
        client = RestClient(cluster.url, cluster.token)
        try:
            again = await ready_web0(cluster, client)
            ip = first["status"]["podIP"]
            assert again["metadata"]["uid"] == first["metadata"]["uid"]
            assert again["status"]["podIP"] == ip
            assert again["status"]["containerStatuses"][0]["restartCount"] == 1
            assert await http_get(f"http://{ip}:{port}/starts") == "2"
        finally:
            await client.close()


async def test_statefulset_rolls_template_changes_from_the_highest_ordinal(tmp_path: Path) -> None:
    def sts(version: str) -> JsonObj:
        container = sleeper_container()
        container["env"] = [{"name": "VERSION", "value": version}]
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": NS},
            "spec": {
                "serviceName": "db",
                "replicas": 3,
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {"terminationGracePeriodSeconds": 2, "containers": [container]},
                },
            },
        }

    async with running_cluster(tmp_path) as h:
        await h.client.create(STATEFULSETS, NS, sts("v1"))

        async def settled(version: str) -> JsonObj | None:
            s = await h.client.get(STATEFULSETS, NS, "db")
            st = s.get("status") or {}
            pods = [await h.pod(NS, f"db-{i}") for i in range(3)]
            if not all(is_ready(p) for p in pods):
                return None
            versions = {p["spec"]["containers"][0]["env"][0]["value"] for p in pods if p}
            if versions != {version} or st.get("updatedReplicas") != 3:
                return None
            if st.get("currentRevision") != st.get("updateRevision"):
                return None
            return s

        before = await eventually(lambda: settled("v1"), what="v1 settled")
        created = {}
        for i in range(3):
            pod = await h.pod(NS, f"db-{i}")
            assert pod is not None
            created[i] = pod["metadata"]["creationTimestamp"], pod["metadata"]["uid"]
        order: list[int] = []

        def record(etype: str, pod: JsonObj) -> None:
            name = pod["metadata"]["name"]
            if etype == "ADDED" and name.startswith("db-"):
                order.append(int(name.removeprefix("db-")))

        h.kubelet.pods.add_handler(record)
        await h.client.patch(
            STATEFULSETS, NS, "db", {"spec": {"template": sts("v2")["spec"]["template"]}}
        )
        after = await eventually(lambda: settled("v2"), within=60, what="v2 rolled out")
        assert after["status"]["updateRevision"] != before["status"]["updateRevision"]
        uids = {}
        for i in range(3):
            pod = await h.pod(NS, f"db-{i}")
            assert pod is not None
            uids[i] = pod["metadata"]["uid"]
            assert uids[i] != created[i][1]
        assert order == [2, 1, 0]
        pods, _ = await h.client.list(PODS, NS)
        revision = after["status"]["updateRevision"]
        assert all(p["metadata"]["labels"]["controller-revision-hash"] == revision for p in pods)


async def test_recreate_deployment_replaces_old_pods_before_new(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as h:
        d = deployment("batch", 2, "v1")
        d["spec"]["strategy"] = {"type": "Recreate"}
        await h.client.create(DEPLOYMENTS, NS, d)

        async def pods_with(version: str) -> list[JsonObj] | None:
            items, _ = await h.client.list(PODS, NS, label_selector="app=batch")
            if len(items) != 2 or not all(is_ready(p) for p in items):
                return None
            env = {p["spec"]["containers"][0]["env"][0]["value"] for p in items}
            return items if env == {version} else None

        await eventually(lambda: pods_with("v1"), what="v1 pods")
        seen_mixed = False

        def watch(etype: str, pod: JsonObj) -> None:
            nonlocal seen_mixed
            cache = h.kubelet.pods.items()
            versions = {
                p["spec"]["containers"][0]["env"][0]["value"]
                for p in cache
                if p["metadata"]["labels"].get("app") == "batch"
            }
            seen_mixed = seen_mixed or versions == {"v1", "v2"}

        h.kubelet.pods.add_handler(watch)
        await h.client.patch(
            DEPLOYMENTS,
            NS,
            "batch",
            {"spec": {"template": deployment("batch", 2, "v2")["spec"]["template"]}},
        )
        await eventually(lambda: pods_with("v2"), what="v2 pods")
        assert not seen_mixed
