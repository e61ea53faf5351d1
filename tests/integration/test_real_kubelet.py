"""Our kubelet as the node of the real control plane (issue 21): it authenticates as
``system:node:<name>``, registers a Ready Node and renews its Lease under the Node authorizer
and NodeRestriction, and runs the Pods the real scheduler binds to it as local processes; the
real garbage collector's deletions stop them; projected ServiceAccount tokens come from the
TokenRequest API.

One control plane and one kubelet serve the whole module (the control plane fixture is
``test_real_controlplane``'s).
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.localcluster.controlplane import (
    NODES_GROUP,
    SERVICE_CIDR,
    ControlPlane,
    node_user,
)
from scalable_topics.localcluster.kubelet import NODES
from scalable_topics.localcluster.nodekubelet import LEASES, NODE_LEASE_NAMESPACE, NodeKubelet
from scalable_topics.localcluster.podspec import volume_sources
from scalable_topics.localcluster.restclient import (
    EVENTS,
    PODS,
    SECRETS,
    ApiError,
    Resource,
    RestClient,
    client_from_kubeconfig,
)

from .conftest import eventually
from .kubelet_harness import eventually as eventually_value
from .kubelet_harness import free_port, is_ready, state_server_container
from .test_real_controlplane import kube, kubectl, plane  # noqa: F401  (module fixtures)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(120, func_only=True),
]

NODE = "real-node"
DEPLOYMENTS = Resource("apps", "v1", "deployments")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def admin(plane: ControlPlane) -> AsyncIterator[RestClient]:  # noqa: F811
    client = client_from_kubeconfig(plane.kubeconfig)
    yield client
    await client.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kubelet(
    plane: ControlPlane,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[NodeKubelet]:
    node = NodeKubelet.for_control_plane(
        plane,
        tmp_path_factory.mktemp("node"),
        NODE,
        renew_interval=1.0,
        status_interval=5.0,
        backoff_base=0.2,
        backoff_cap=1.0,
        stop_grace=3.0,
        # A 600 s token (the shortest the API server issues) is renewed after 3 s.
        token_refresh_fraction=0.005,
    )
    await node.start()
    yield node
    await node.stop()


def _condition(obj: JsonObj, ctype: str) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return str(cond.get("status"))
    return None


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def test_node_certificate_is_the_node_identity_not_admin(plane: ControlPlane) -> None:  # noqa: F811
    client = client_from_kubeconfig(plane.node_kubeconfig(NODE))
    try:
        review = await client.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        user = review["status"]["userInfo"]
        assert user["username"] == node_user(NODE) == f"system:node:{NODE}"
        assert NODES_GROUP in user["groups"]
        # The Node authorizer: secrets of Pods not bound to it are not its to read.
        with pytest.raises(ApiError) as refused:
            await client.list(SECRETS, "kube-system")
        assert refused.value.status == 403
    finally:
        await client.close()


async def test_node_registers_ready_untainted_and_renews_its_lease(
    kubelet: NodeKubelet, admin: RestClient
) -> None:
    node = await admin.get(NODES, None, NODE)
    assert _condition(node, "Ready") == "True"
    status = node["status"]
    assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]
    assert int(status["allocatable"]["pods"]) > 0
    assert status["capacity"]["memory"].endswith("Ki")
    assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == kubelet.port

    lease = await admin.get(LEASES, NODE_LEASE_NAMESPACE, NODE)
    assert lease["spec"]["holderIdentity"] == NODE
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first = lease["spec"]["renewTime"]

    async def renewed() -> bool:
        again = await admin.get(LEASES, NODE_LEASE_NAMESPACE, NODE)
        return bool(again["spec"]["renewTime"] != first)

    await eventually(renewed, within=10)
    assert kubelet.lease_renewals >= 2

    # The node lifecycle controller may taint a node it sees before its first status; it
    # lifts that, and then adds none while the Lease is fresh.
    async def untainted() -> bool:
        return not (await admin.get(NODES, None, NODE)).get("spec", {}).get("taints")

    await eventually(untainted, within=15)


async def test_deployment_runs_as_processes_and_stops_when_deleted(
    plane: ControlPlane,  # noqa: F811
    kubelet: NodeKubelet,
    admin: RestClient,
) -> None:
    port = free_port()
    labels = {"app": "web"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [state_server_container(port)],
                    "volumes": [{"name": "state", "emptyDir": {}}],
                    "terminationGracePeriodSeconds": 5,
                },
            },
        },
    }
    began = time.monotonic()
    await admin.create(DEPLOYMENTS, "default", deployment)

    async def ready_pods() -> list[JsonObj]:
        pods, _ = await admin.list(PODS, "default", label_selector="app=web")
        return pods if len(pods) == 2 and all(is_ready(p) for p in pods) else []

    pods: list[JsonObj] = []

    async def both_ready() -> bool:
        nonlocal pods
        pods = await ready_pods()
        return bool(pods)

    await eventually(both_ready, within=40)
    print(f"deployment ready in {time.monotonic() - began:.1f}s")
    service_range = ipaddress.ip_network(SERVICE_CIDR)
    pids = []
    async with aiohttp.ClientSession() as http:
        for pod in pods:
            assert pod["spec"]["nodeName"] == NODE
            assert pod["status"]["phase"] == "Running"
            ip = ipaddress.ip_address(pod["status"]["podIP"])
            assert ip.is_loopback and ip not in service_range
            assert pod["status"]["hostIP"] == "127.0.0.1"
            async with http.get(f"http://{ip}:{port}/whoami") as resp:
                assert (await resp.json(content_type=None))["pod"] == pod["metadata"]["name"]
            container_id = pod["status"]["containerStatuses"][0]["containerID"]
            pid = int(container_id.removeprefix("local://"))
            assert _alive(pid)
            pids.append(pid)

    async def started_event() -> bool:
        events, _ = await admin.list(
            EVENTS, "default", field_selector=f"involvedObject.name={pods[0]['metadata']['name']}"
        )
        return any(
            e["reason"] == "Started" and e["source"]["component"] == "kubelet" for e in events
        )

    await eventually(started_event, within=10)

    # `kubectl logs` goes API server -> kubelet over TLS (each checking the other's
    # certificate); the state server logged the /whoami request above to stderr.
    name = pods[0]["metadata"]["name"]
    logs = await kubectl(plane, "logs", "-n", "default", name, "--tail=5")
    assert "GET /whoami" in logs.stdout, logs

    # The kubelet API answers the API server's identity only, not even an admin.
    admin_tls = ssl.create_default_context(cafile=str(plane.ca_path))
    admin_tls.load_cert_chain(str(plane.pki_dir / "admin.crt"), str(plane.pki_dir / "admin.key"))
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"https://127.0.0.1:{kubelet.port}/containerLogs/default/{name}/server", ssl=admin_tls
        ) as refused,
    ):
        assert refused.status == 403

    await admin.delete(DEPLOYMENTS, "default", "web", propagation_policy="Background")

    async def stopped() -> bool:
        left, _ = await admin.list(PODS, "default", label_selector="app=web")
        return not left and not any(_alive(pid) for pid in pids)

    await eventually(stopped, within=30)


async def assert_pod_token(admin: RestClient, token: str, audience: str, pod: JsonObj) -> None:
    """A TokenReview authenticates ``token`` for ``audience`` as the Pod's ServiceAccount."""
    review = await admin.request(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        },
    )
    status = review["status"]
    assert status["authenticated"] is True, status
    assert status["user"]["username"] == "system:serviceaccount:default:default"
    extra = status["user"]["extra"]
    assert extra["authentication.kubernetes.io/pod-name"] == [pod["metadata"]["name"]]
    assert extra["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]


async def test_projected_service_account_token_is_bound_to_the_pod(
    plane: ControlPlane,  # noqa: F811
    kubelet: NodeKubelet,
    admin: RestClient,
) -> None:
    audience = "scalable-topics-test"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "token-reader", "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python3", "-c", "import time; time.sleep(3600)"],
                    "volumeMounts": [{"name": "identity", "mountPath": "/var/run/identity"}],
                }
            ],
            "volumes": [
                {
                    "name": "identity",
                    "projected": {
                        "sources": [
                            {
                                "serviceAccountToken": {
                                    "audience": audience,
                                    "expirationSeconds": 600,
                                    "path": "token",
                                }
                            }
                        ]
                    },
                }
            ],
        },
    }
    created = await admin.create(PODS, "default", pod)
    try:

        async def running() -> bool:
            current = await admin.get(PODS, "default", "token-reader")
            return (current.get("status") or {}).get("phase") == "Running"

        await eventually(running, within=30)
        volumes = volume_sources(created, kubelet.agent.layout)
        token = (volumes["identity"] / "token").read_text()
        # The API server's own ServiceAccount volume is projected the same way.
        api_access = next(v for name, v in volumes.items() if name.startswith("kube-api-access"))
        assert (api_access / "token").read_text()
        assert (api_access / "namespace").read_text() == "default"
        # From the kube-root-ca.crt ConfigMap, which the Node authorizer lets it read.
        assert (api_access / "ca.crt").read_bytes() == (plane.pki_dir / "ca.crt").read_bytes()

        await assert_pod_token(admin, token, audience, created)

        # Renewed before it expires: a new token in the file, bound to the same Pod.
        async def refreshed() -> bool:
            return (volumes["identity"] / "token").read_text() not in ("", token)

        await eventually(refreshed, within=10)
        await assert_pod_token(
            admin, (volumes["identity"] / "token").read_text(), audience, created
        )
        worker = kubelet.agent.workers[created["metadata"]["uid"]]
        assert worker.token_requests >= 4, "two tokens (ours, kube-api-access), then renewed"
    finally:
        await admin.delete(PODS, "default", "token-reader")


async def test_kubectl_logs_follow_ends_when_the_container_exits(
    plane: ControlPlane,  # noqa: F811
    kubelet: NodeKubelet,
    admin: RestClient,
) -> None:
    script = (
        "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.5)"
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "counter", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "python:3.11", "command": ["python3", "-c", script]}
            ],
        },
    }
    await admin.create(PODS, "default", pod)
    try:

        async def started() -> bool:
            current = await admin.get(PODS, "default", "counter")
            return (current.get("status") or {}).get("phase") in ("Running", "Succeeded")

        await eventually(started, within=30)
        followed = await kubectl(plane, "logs", "-f", "-n", "default", "counter")
        assert followed.stdout.split("\n")[:3] == ["line 0", "line 1", "line 2"], followed
    finally:
        await admin.delete(PODS, "default", "counter")


async def test_restarted_kubelet_runs_its_pods_again_with_their_secrets(
    plane: ControlPlane,  # noqa: F811
    admin: RestClient,
    tmp_path: Path,
) -> None:
    """A second node, bound to directly: its Pod reads a Secret (allowed because the Pod
    uses it), and a new kubelet on the same data directory runs the Pod again."""
    node = "second-node"
    port = free_port()
    await admin.create(
        SECRETS,
        "default",
        {"metadata": {"name": "greeting"}, "stringData": {"word": "hello"}},
    )
    container = state_server_container(port)
    container["env"].append(
        {"name": "WORD", "valueFrom": {"secretKeyRef": {"name": "greeting", "key": "word"}}}
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pinned", "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [container],
            "volumes": [{"name": "state", "emptyDir": {}}],
        },
    }
    options: dict[str, Any] = {"renew_interval": 1.0, "backoff_base": 0.2, "stop_grace": 2.0}
    first = NodeKubelet.for_control_plane(plane, tmp_path, node, **options)
    await first.start()
    try:
        await admin.create(PODS, "default", pod)

        async def ready_pid() -> int | None:
            current = await admin.get(PODS, "default", "pinned")
            if not is_ready(current):
                return None
            return int(current["status"]["containerStatuses"][0]["containerID"].split("//")[1])

        pid = await eventually_value(ready_pid)
        assert b"WORD=hello" in _environ(pid)
    finally:
        await first.stop()
    assert not _alive(pid)

    second = NodeKubelet.for_control_plane(plane, tmp_path, node, **options)
    await second.start()
    try:

        async def restarted() -> int | None:
            again = await ready_pid()
            return again if again is not None and again != pid else None

        new_pid = await eventually_value(restarted)
        assert _alive(new_pid)
        current = await admin.get(PODS, "default", "pinned")
        assert current["status"]["containerStatuses"][0]["restartCount"] >= 1
    finally:
        await admin.delete(PODS, "default", "pinned")
        await admin.delete(SECRETS, "default", "greeting")

        async def gone() -> bool:
            return await admin.get_or_none(PODS, "default", "pinned") is None

        await eventually(gone, within=20)
        await second.stop()
