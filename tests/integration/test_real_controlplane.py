"""The real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler built
from hack/kube) run by ``localcluster.controlplane``, driven with the kubectl of the same
release, and our CRDs and admission rules against the real API server (issue 21).

One control plane serves the whole module (started once, ~10 s on a fresh data directory); the
binary comes from :func:`kube_binary`, which builds it on a machine that has none yet (about
14 minutes on two cores, not counted against the per-test timeout). The restart test stops and
starts that same control plane, so it runs last.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from scalable_topics.core import resources as r
from scalable_topics.core.crds import crd_manifests
from scalable_topics.core.layout import HashRange
from scalable_topics.localcluster.controlplane import (
    ADMIN_GROUP,
    ADMIN_USER,
    APISERVER,
    COMPONENTS,
    CONTROLLER_MANAGER,
    CONTROLLER_MANAGER_USER,
    ETCD,
    GO_GC_PERCENT,
    SCHEDULER,
    SCHEDULER_USER,
    ControlPlane,
    ControlPlaneError,
    kube_binary,
    pinned_versions,
)
from scalable_topics.localcluster.datadir import DataDirInUse

from .conftest import KubectlResult, eventually, run_kubectl

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    # The fixture may build the binary first; each test's own body stays bounded.
    pytest.mark.timeout(120, func_only=True),
]

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"
ORDERS = REPO / "manifests" / "examples" / "orders.yaml"

# Set while the control plane starts: none of it may reach the components.
LEAKY_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "example.invalid",
}


@pytest.fixture(scope="module")
def kube(pytestconfig: pytest.Config) -> Path:
    """The multi-call binary, built here (progress shown live) if this machine has none."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
        return kube_binary()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plane(
    kube: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ControlPlane]:
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane"), binary=kube)
    with pytest.MonkeyPatch.context() as env:
        for key, value in LEAKY_ENV.items():
            env.setenv(key, value)
        began = time.monotonic()
        await cp.start()
    print(f"control plane ready in {time.monotonic() - began:.1f}s: {cp.timings}")
    yield cp
    await cp.stop()


async def kubectl(
    plane: ControlPlane, *args: str, input: str | None = None, check: bool = True
) -> KubectlResult:
    kube = plane.binary
    assert kube is not None
    return await run_kubectl(plane, *args, input=input, check=check, kubectl=(str(kube), "kubectl"))


def topic(name: str, **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": r.API_VERSION,
            "kind": r.TOPIC_KIND,
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def environment_names(pid: int) -> set[str]:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return {entry.partition(b"=")[0].decode() for entry in environ if entry}


def tables(output: str) -> dict[str, list[list[str]]]:
    """``kubectl get a,b`` output: each table's rows (header first) keyed by its resource."""
    found: dict[str, list[list[str]]] = {}
    for block in output.strip().split("\n\n"):
        rows = [line.split() for line in block.splitlines()]
        kind = rows[1][0].split("/")[0]
        found[kind] = rows
    return found


async def test_start_reports_each_step_and_isolates_the_processes(plane: ControlPlane) -> None:
    steps = ["pki", ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER, "default-serviceaccount"]
    assert list(plane.timings) == steps
    values = [plane.timings[step] for step in steps]
    assert all(v > 0 for v in values) and values == sorted(values)

    assert set(plane.pids) == set(COMPONENTS)
    for name, pid in plane.pids.items():
        assert os.getpgid(pid) == pid, f"{name} is not in a process group of its own"
        names = environment_names(pid)
        assert names.isdisjoint(LEAKY_ENV), (name, names & set(LEAKY_ENV))
        assert plane.log_path(name).stat().st_size > 0


async def test_the_api_server_runs_with_its_gc_percent(plane: ControlPlane) -> None:
    metrics = (await kubectl(plane, "get", "--raw", "/metrics")).stdout
    found = re.search(r"^go_gc_gogc_percent (\S+)$", metrics, re.M)
    assert found is not None, "the API server's Go runtime metrics have no go_gc_gogc_percent"
    expected = os.environ.get("GOGC", GO_GC_PERCENT[APISERVER])
    assert float(found.group(1)) == float(expected)
    assert ("GOGC" in environment_names(plane.pids[ETCD])) == ("GOGC" in os.environ)


async def test_kubectl_and_server_are_the_pinned_release(plane: ControlPlane) -> None:
    pinned = pinned_versions()["KUBERNETES_VERSION"]
    version = (await kubectl(plane, "version", "-o", "json")).json()
    assert version["clientVersion"]["gitVersion"] == pinned
    assert version["serverVersion"]["gitVersion"] == pinned

    livez = (await kubectl(plane, "get", "--raw", "/livez?verbose")).stdout
    for check in (
        "etcd",
        "poststarthook/rbac/bootstrap-roles",
        "poststarthook/crd-informer-synced",
    ):
        assert f"[+]{check} ok" in livez, livez
    assert "livez check passed" in livez


async def test_requests_without_a_client_certificate_are_refused(plane: ControlPlane) -> None:
    trusting = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    async with aiohttp.ClientSession() as http:
        for path in ("/api/v1/namespaces", "/livez", "/version"):
            async with http.get(plane.url + path, ssl=trusting) as resp:
                assert resp.status == 401, (path, resp.status, await resp.text())
        # The same request with the admin certificate passes: the refusal is the credential's.
        admin = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
        admin.load_cert_chain(plane.pki_dir / "admin.crt", plane.pki_dir / "admin.key")
        async with http.get(plane.url + "/api/v1/namespaces", ssl=admin) as resp:
            assert resp.status == 200


async def test_each_component_has_its_own_identity(plane: ControlPlane) -> None:
    whoami = (await kubectl(plane, "auth", "whoami", "-o", "json")).json()["status"]["userInfo"]
    assert whoami["username"] == ADMIN_USER and ADMIN_GROUP in whoami["groups"]

    for component, user in (
        (CONTROLLER_MANAGER, CONTROLLER_MANAGER_USER),
        (SCHEDULER, SCHEDULER_USER),
    ):
        own = f"--kubeconfig={plane.component_kubeconfig(component)}"
        info = (await kubectl(plane, own, "auth", "whoami", "-o", "json")).json()
        assert info["status"]["userInfo"]["username"] == user
        assert ADMIN_GROUP not in info["status"]["userInfo"]["groups"]

    async def can(component: str, *question: str) -> str:
        own = f"--kubeconfig={plane.component_kubeconfig(component)}"
        result = await kubectl(plane, own, "auth", "can-i", *question, check=False)
        return result.stdout.strip()

    # What the bootstrap RBAC policy grants each identity, and no more.
    assert await can(SCHEDULER, "create", "pods", "--subresource=binding") == "yes"
    assert await can(SCHEDULER, "create", "deployments") == "no"
    assert await can(SCHEDULER, "get", "secrets") == "no"
    token = ("create", "serviceaccounts", "--subresource=token", "-n", "kube-system")
    assert await can(CONTROLLER_MANAGER, *token) == "yes"
    assert await can(CONTROLLER_MANAGER, "create", "deployments") == "no"

    # --use-service-account-credentials: each controller runs as a ServiceAccount of its own.
    accounts = await kubectl(plane, "get", "serviceaccounts", "-n", "kube-system", "-o", "json")
    names = {item["metadata"]["name"] for item in accounts.json()["items"]}
    assert {"deployment-controller", "replicaset-controller", "generic-garbage-collector"} <= names


async def test_deployment_makes_a_replicaset_and_unschedulable_pods(plane: ControlPlane) -> None:
    await kubectl(
        plane, "create", "deployment", "web", "--image=registry.k8s.io/pause:3.10", "--replicas=2"
    )

    pods: list[dict[str, Any]] = []

    async def two_pods_marked_unschedulable() -> bool:
        nonlocal pods
        out = await kubectl(plane, "get", "pods", "-l", "app=web", "-o", "json")
        pods = out.json()["items"]
        return len(pods) == 2 and all(
            any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in p["status"].get("conditions", [])
            )
            for p in pods
        )

    await eventually(two_pods_marked_unschedulable, within=30)
    replicasets = (await kubectl(plane, "get", "rs", "-l", "app=web", "-o", "json")).json()["items"]
    assert len(replicasets) == 1
    assert replicasets[0]["metadata"]["ownerReferences"][0]["name"] == "web"
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["name"] == replicasets[0]["metadata"]["name"]
        assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
        (scheduled,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert scheduled["reason"] == "Unschedulable"  # written by the scheduler: no node


async def test_service_account_token_is_issued_and_reviewed(plane: ControlPlane) -> None:
    token = (await kubectl(plane, "create", "token", "default")).stdout.strip()

    async def review(candidate: str) -> dict[str, Any]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": candidate},
        }
        out = await kubectl(plane, "create", "-f", "-", "-o", "json", input=json.dumps(body))
        status: dict[str, Any] = out.json()["status"]
        return status

    status = await review(token)
    assert status["authenticated"] is True
    assert status["user"]["username"] == "system:serviceaccount:default:default"
    header, payload, signature = token.split(".")
    forged = await review(f"{header}.{payload}.{signature[:-4]}AAAA")
    assert not forged.get("authenticated")


async def test_crds_and_admission_rules_on_the_real_api_server(plane: ControlPlane) -> None:
    await kubectl(plane, "apply", "-f", str(CRDS))
    names = [crd["metadata"]["name"] for crd in crd_manifests()]
    await kubectl(
        plane, "wait", "--for=condition=Established", *[f"crd/{n}" for n in names], "--timeout=60s"
    )
    for crd in (await kubectl(plane, "get", "crd", *names, "-o", "json")).json()["items"]:
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("NonStructuralSchema") is None, crd["status"]

    async def apply(document: str) -> KubectlResult:
        return await kubectl(plane, "apply", "-f", "-", input=document, check=False)

    too_long = await apply(topic("t" * (r.MAX_TOPIC_NAME + 1)))
    assert too_long.returncode != 0
    assert f"metadata.name: Too long: may not be more than {r.MAX_TOPIC_NAME}" in too_long.stderr
    assert (await apply(topic("t" * r.MAX_TOPIC_NAME))).returncode == 0

    above = await apply(topic("above", initialSegments=9, autoScale={"maxSegments": 8}))
    assert above.returncode != 0
    assert r.TOPIC_RULES[0]["message"] in above.stderr, above.stderr
    inverted = await apply(topic("inverted", autoScale={"minSegments": 4, "maxSegments": 2}))
    assert inverted.returncode != 0
    assert "spec.autoScale: Invalid value: maxSegments must be >= minSegments" in inverted.stderr
    # The bound itself is allowed (the rule is <=, not <).
    assert (
        await apply(topic("within", initialSegments=8, autoScale={"maxSegments": 8}))
    ).returncode == 0

    await kubectl(plane, "apply", "-f", str(ORDERS))
    orders = (await kubectl(plane, "get", "stopic", "orders", "-o", "json")).json()
    segment = r.segment_manifest(
        topic="orders",
        namespace="default",
        topic_uid=orders["metadata"]["uid"],
        segment_id=0,
        hash_range=HashRange(0, 0x7FFF),
    )
    await kubectl(plane, "apply", "-f", "-", input=yaml.safe_dump(segment))

    shown = tables((await kubectl(plane, "get", "stopic,seg")).stdout)
    for crd in crd_manifests():
        columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        header = ["NAME", *(c["name"].upper() for c in columns if not c.get("priority"))]
        kind = f"{crd['spec']['names']['singular']}.{crd['spec']['group']}"
        assert shown[kind][0] == header, shown[kind][0]
    segment_row = next(row for row in shown[f"segment.{r.GROUP}"][1:] if "orders-0" in row[0])
    assert segment_row[1:4] == ["orders", "0", "0000-7fff"]


async def test_a_second_start_on_a_running_data_dir_is_refused(plane: ControlPlane) -> None:
    with pytest.raises(DataDirInUse):
        await ControlPlane(plane.data_dir, binary=plane.binary).start()
    assert set(plane.pids) == set(COMPONENTS)


async def test_a_component_that_exits_fails_the_start_with_its_log(
    kube: Path, tmp_path: Path
) -> None:
    data_dir = tmp_path / "broken"
    data_dir.mkdir()
    (data_dir / "etcd").write_text("not a directory\n")
    cp = ControlPlane(data_dir, binary=kube)
    with pytest.raises(ControlPlaneError, match=r"etcd exited with code \d+ while waiting") as err:
        await cp.start()
    assert str(cp.log_path(ETCD)) in str(err.value)
    assert cp.pids == {} and not cp.lock.held


async def test_restart_on_the_same_data_dir_keeps_objects(plane: ControlPlane) -> None:
    await kubectl(plane, "create", "configmap", "kept", "--from-literal=answer=42")
    before = (await kubectl(plane, "get", "configmap", "kept", "-o", "json")).json()
    pids = set(plane.pids.values())

    began = time.monotonic()
    await plane.stop()
    stopped = time.monotonic() - began
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    began = time.monotonic()
    await plane.start()
    print(f"stopped in {stopped:.1f}s, ready again in {time.monotonic() - began:.1f}s")
    assert set(plane.pids.values()).isdisjoint(pids)

    after = (await kubectl(plane, "get", "configmap", "kept", "-o", "json")).json()
    assert after["data"] == {"answer": "42"}
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
