"""What our kubelet does with a Pod, on the real control plane (issue 21): init containers,
env and volumes from ConfigMaps and Secrets (read under the Node authorizer), probes, restart
policy, graceful termination, loopback addresses; and its part in a StatefulSet and a Job,
whose controllers are the real kube-controller-manager's.

One control plane and one kubelet serve the whole module (the fixtures are
``test_real_controlplane``'s and ``test_real_kubelet``'s).
"""

from __future__ import annotations

import base64
import ipaddress
import os
import signal
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.localcluster.controlplane import SERVICE_CIDR
from scalable_topics.localcluster.nodekubelet import NodeKubelet
from scalable_topics.localcluster.restclient import (
    CONFIGMAPS,
    JOBS,
    PODS,
    SECRETS,
    STATEFULSETS,
    RestClient,
)

from .conftest import eventually as until
from .kubelet_harness import eventually, free_port, is_ready, state_server_container
from .test_real_controlplane import kube, plane  # noqa: F401  (module fixtures)
from .test_real_kubelet import NODE, admin, kubelet  # noqa: F401  (module fixtures)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(180, func_only=True),
]

NS = "default"


def pod(name: str, spec: JsonObj) -> JsonObj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def python(code: str, **fields: Any) -> JsonObj:
    """A container that runs ``code`` (the image is required by the API server, and ignored:
    containers are local processes)."""
    return {"name": "main", "image": "python:3.11", "command": ["python3", "-c", code], **fields}


@pytest_asyncio.fixture(loop_scope="module")
async def pods(admin: RestClient) -> AsyncIterator[list[str]]:  # noqa: F811
    """Names of the Pods a test creates; deleted (and awaited gone) after it."""
    names: list[str] = []
    yield names
    for name in names:
        await admin.delete(PODS, NS, name, grace_period_seconds=0)

    async def all_gone() -> bool:
        return all([await admin.get_or_none(PODS, NS, n) is None for n in names])

    await eventually(all_gone, within=60, what="test pods deleted")


async def run(admin: RestClient, pods: list[str], name: str, spec: JsonObj) -> None:  # noqa: F811
    pods.append(name)
    await admin.create(PODS, NS, pod(name, spec))


async def in_phase(admin: RestClient, name: str, phase: str) -> JsonObj:  # noqa: F811
    async def probe() -> JsonObj | None:
        current = await admin.get_or_none(PODS, NS, name)
        return current if current and (current.get("status") or {}).get("phase") == phase else None

    return await eventually(probe, within=60, what=f"pod {name} {phase}")


def conditions(obj: JsonObj | None) -> dict[str, str]:
    found = ((obj or {}).get("status") or {}).get("conditions") or []
    return {c["type"]: c["status"] for c in found}


def container_status(obj: JsonObj | None) -> JsonObj:
    statuses = ((obj or {}).get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def container_pid(obj: JsonObj) -> int:
    return int(container_status(obj)["containerID"].removeprefix("local://"))


async def test_init_containers_env_and_volumes_from_configmaps_and_secrets(
    kubelet: NodeKubelet,  # noqa: F811
    admin: RestClient,  # noqa: F811
    pods: list[str],
) -> None:
    await admin.create(
        CONFIGMAPS,
        NS,
        {"metadata": {"name": "app"}, "data": {"greeting": "hello", "app.conf": "mode=fast\n"}},
    )
    await admin.create(
        SECRETS,
        NS,
        {"metadata": {"name": "creds"}, "data": {"token": base64.b64encode(b"s3cret").decode()}},
    )
    main = (
        "import os, pathlib; "
        "print(os.environ['GREETING'], os.environ['TOKEN'], os.environ['CFG_greeting']); "
        "print(pathlib.Path('/etc/app/app.conf').read_text().strip()); "
        "print(pathlib.Path('/work/init.txt').read_text().strip()); "
        "print(os.environ['LOCALCLUSTER_MOUNT_SCRATCH'] == os.getcwd())"
    )
    init = python(
        "import sys; open(sys.argv[1], 'w').write('from init')",
        name="init",
        args=["/work/init.txt"],
        volumeMounts=[{"name": "scratch", "mountPath": "/work"}],
    )
    spec = {
        "restartPolicy": "Never",
        "initContainers": [init],
        "containers": [
            python(
                main,
                workingDir="/work",
                env=[
                    {
                        "name": "GREETING",
                        "valueFrom": {"configMapKeyRef": {"name": "app", "key": "greeting"}},
                    },
                    {
                        "name": "TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}},
                    },
                ],
                envFrom=[{"configMapRef": {"name": "app"}, "prefix": "CFG_"}],
                volumeMounts=[
                    {"name": "scratch", "mountPath": "/work"},
                    {"name": "config", "mountPath": "/etc/app", "readOnly": True},
                ],
            )
        ],
        "volumes": [
            {"name": "scratch", "emptyDir": {}},
            {"name": "config", "configMap": {"name": "app"}},
        ],
    }
    try:
        await run(admin, pods, "feature", spec)
        done = await in_phase(admin, "feature", "Succeeded")
        assert done["spec"]["nodeName"] == NODE
        init_status = done["status"]["initContainerStatuses"][0]
        assert init_status["state"]["terminated"]["reason"] == "Completed"
        log = kubelet.agent.layout.log_path(NS, "feature", "main").read_text().splitlines()
        assert log == ["hello s3cret hello", "mode=fast", "from init", "True"]
        assert conditions(done)["Initialized"] == "True" and conditions(done)["Ready"] == "False"
    finally:
        await admin.delete(CONFIGMAPS, NS, "app")
        await admin.delete(SECRETS, NS, "creds")


async def test_a_missing_configmap_blocks_the_container_until_created(
    kubelet: NodeKubelet,  # noqa: F811
    admin: RestClient,  # noqa: F811
    pods: list[str],
) -> None:
    env = [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "late", "key": "v"}}}]
    spec = {
        "restartPolicy": "Never",
        "containers": [python("import os; print(os.environ['V'])", env=env)],
    }
    await run(admin, pods, "waiter", spec)

    async def blocked() -> bool:
        current = await admin.get_or_none(PODS, NS, "waiter")
        waiting = container_status(current).get("state", {}).get("waiting") or {}
        return waiting.get("reason") == "CreateContainerConfigError"

    await eventually(blocked, within=60, what="CreateContainerConfigError")
    await admin.create(CONFIGMAPS, NS, {"metadata": {"name": "late"}, "data": {"v": "arrived"}})
    try:
        await in_phase(admin, "waiter", "Succeeded")
        assert kubelet.agent.layout.log_path(NS, "waiter", "main").read_text() == "arrived\n"
    finally:
        await admin.delete(CONFIGMAPS, NS, "late")


async def test_a_failing_liveness_probe_restarts_the_container(
    kubelet: NodeKubelet,  # noqa: F811
    admin: RestClient,  # noqa: F811
    pods: list[str],
) -> None:
    probe = {"tcpSocket": {"port": free_port()}, "periodSeconds": 1, "failureThreshold": 1}
    spec = {
        "terminationGracePeriodSeconds": 1,
        "containers": [python("import time; time.sleep(3600)", livenessProbe=probe)],
    }
    await run(admin, pods, "unhealthy", spec)

    async def restarted() -> JsonObj | None:
        current = await admin.get_or_none(PODS, NS, "unhealthy")
        return current if container_status(current).get("restartCount", 0) >= 1 else None

    current = await eventually(restarted, within=60, what="liveness restart")
    assert current["status"]["phase"] == "Running"


async def test_deletion_sends_sigterm_first(
    kubelet: NodeKubelet,  # noqa: F811
    admin: RestClient,  # noqa: F811
    pods: list[str],
    tmp_path: Path,
) -> None:
    marker = tmp_path / "got-sigterm"
    code = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('bye')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('up', flush=True)\n"
        "time.sleep(3600)\n"
    )
    # Were SIGTERM not sent, the grace period would end in SIGKILL and no marker.
    spec = {"terminationGracePeriodSeconds": 20, "containers": [python(code)]}
    await run(admin, pods, "polite", spec)
    log = kubelet.agent.layout.log_path(NS, "polite", "main")
    await until(lambda: log.exists() and "up" in log.read_text(), within=60)
    await admin.delete(PODS, NS, "polite")

    async def gone() -> bool:
        return await admin.get_or_none(PODS, NS, "polite") is None

    await eventually(gone, within=60, what="pod deleted")
    assert marker.read_text() == "bye"


async def test_exec_readiness_probe_and_a_projected_volume(
    kubelet: NodeKubelet,  # noqa: F811
    admin: RestClient,  # noqa: F811
    pods: list[str],
) -> None:
    await admin.create(CONFIGMAPS, NS, {"metadata": {"name": "proj"}, "data": {"k": "v"}})
    check = "import os, sys; sys.exit(0 if os.path.exists('/flags/ready') else 1)"
    container = python(
        "import time; time.sleep(3600)",
        readinessProbe={
            "exec": {"command": ["python3", "-c", check]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
        volumeMounts=[
            {"name": "flags", "mountPath": "/flags"},
            {"name": "meta", "mountPath": "/etc/meta"},
        ],
    )
    projected = {
        "sources": [
            {"configMap": {"name": "proj", "items": [{"key": "k", "path": "cm/k"}]}},
            {
                "downwardAPI": {
                    "items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]
                }
            },
        ]
    }
    spec = {
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
        "volumes": [{"name": "flags", "emptyDir": {}}, {"name": "meta", "projected": projected}],
    }
    try:
        await run(admin, pods, "gated", spec)
        flags = kubelet.agent.layout.volume_dir(NS, "gated", "flags")
        meta = kubelet.agent.layout.volume_dir(NS, "gated", "meta")

        async def running_with_ready(ready: str) -> bool:
            current = await admin.get_or_none(PODS, NS, "gated")
            phase = ((current or {}).get("status") or {}).get("phase")
            return phase == "Running" and conditions(current).get("Ready") == ready

        await eventually(lambda: running_with_ready("False"), within=60, what="running, unready")
        assert (meta / "cm" / "k").read_text() == "v"
        assert (meta / "name").read_text() == "gated"
        (flags / "ready").touch()
        await eventually(lambda: running_with_ready("True"), within=60, what="ready")
        (flags / "ready").unlink()
        await eventually(lambda: running_with_ready("False"), within=60, what="unready again")
    finally:
        await admin.delete(CONFIGMAPS, NS, "proj")


async def test_a_startup_probe_gates_readiness(
    kubelet: NodeKubelet,  # noqa: F811
    admin: RestClient,  # noqa: F811
    pods: list[str],
) -> None:
    check = "import os, sys; sys.exit(0 if os.path.exists('/flags/started') else 1)"
    container = python(
        "import time; time.sleep(3600)",
        startupProbe={
            "exec": {"command": ["python3", "-c", check]},
            "periodSeconds": 1,
            "failureThreshold": 120,
        },
        volumeMounts=[{"name": "flags", "mountPath": "/flags"}],
    )
    spec = {
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
        "volumes": [{"name": "flags", "emptyDir": {}}],
    }
    await run(admin, pods, "slow-start", spec)

    async def started_and_ready(started: bool, ready: bool) -> bool:
        status = container_status(await admin.get_or_none(PODS, NS, "slow-start"))
        running = bool(status.get("state", {}).get("running"))
        return running and (status.get("started"), status.get("ready")) == (started, ready)

    await eventually(lambda: started_and_ready(False, False), within=60, what="not started")
    (kubelet.agent.layout.volume_dir(NS, "slow-start", "flags") / "started").touch()
    await eventually(lambda: started_and_ready(True, True), within=60, what="started, ready")


async def http_get(url: str) -> str:
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession() as http, http.get(url, timeout=timeout) as resp:
        resp.raise_for_status()
        return await resp.text()


async def test_statefulset_pods_keep_their_names_and_addresses(
    kubelet: NodeKubelet,  # noqa: F811
    admin: RestClient,  # noqa: F811
) -> None:
    """The real StatefulSet controller makes web-0 and web-1; our kubelet runs them on loopback
    addresses of their own, restarts a killed container in place, and keeps a Pod's address
    for its name while it is gone (sticky)."""
    port = free_port()
    labels = {"app": "web"}
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "serviceName": "web",
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [state_server_container(port)],
                    "volumes": [{"name": "state", "emptyDir": {}}],
                },
            },
        },
    }
    await admin.create(STATEFULSETS, NS, statefulset)
    try:

        async def ready(name: str, unlike: str | None = None) -> JsonObj | None:
            current = await admin.get_or_none(PODS, NS, name)
            if not is_ready(current) or current is None:
                return None
            return current if current["metadata"]["uid"] != unlike else None

        pods = [
            await eventually(partial(ready, name), within=90, what=f"{name} ready")
            for name in ("web-0", "web-1")
        ]
        ips = [p["status"]["podIP"] for p in pods]
        assert len(set(ips)) == 2
        service_range = ipaddress.ip_network(SERVICE_CIDR)
        for i, (current, ip) in enumerate(zip(pods, ips, strict=True)):
            address = ipaddress.ip_address(ip)
            assert address.is_loopback and address not in service_range
            assert not ip.startswith("127.0.0.")
            assert current["status"]["podIPs"] == [{"ip": ip}]
            assert current["spec"]["nodeName"] == NODE
            whoami = await http_get(f"http://{ip}:{port}/whoami")
            state = kubelet.agent.layout.volume_dir(NS, f"web-{i}", "state")
            assert f'"pod": "web-{i}"' in whoami and str(state) in whoami

        # SIGKILL: restarted in place (restartPolicy Always), on the same address.
        os.kill(container_pid(pods[0]), signal.SIGKILL)

        async def restarted() -> JsonObj | None:
            current = await ready("web-0")
            if current and container_status(current).get("restartCount") == 1:
                return current
            return None

        web0 = await eventually(restarted, within=60, what="web-0 restarted once")
        assert container_status(web0)["lastState"]["terminated"]["exitCode"] == 137
        assert web0["status"]["podIP"] == ips[0]
        assert await http_get(f"http://{ips[0]}:{port}/starts") == "2"

        # Scaled down, web-1's address stays reserved: a Pod started meanwhile gets another,
        # and web-1, scaled up again, gets its own back.
        uid = pods[1]["metadata"]["uid"]
        await admin.patch(STATEFULSETS, NS, "web", {"spec": {"replicas": 1}})

        async def web1_gone() -> bool:
            return await admin.get_or_none(PODS, NS, "web-1") is None

        await eventually(web1_gone, within=60, what="web-1 scaled away")
        squatter = pod("squatter", {"containers": [python("import time; time.sleep(3600)")]})
        squatter["spec"]["terminationGracePeriodSeconds"] = 1
        await admin.create(PODS, NS, squatter)
        try:
            running = await in_phase(admin, "squatter", "Running")
            assert running["status"]["podIP"] not in ips
            await admin.patch(STATEFULSETS, NS, "web", {"spec": {"replicas": 2}})
            web1 = await eventually(
                partial(ready, "web-1", unlike=uid), within=90, what="web-1 back"
            )
            assert web1["status"]["podIP"] == ips[1]
        finally:
            await admin.delete(PODS, NS, "squatter", grace_period_seconds=0)
    finally:
        await admin.delete(STATEFULSETS, NS, "web", propagation_policy="Foreground")

    async def gone() -> bool:
        left, _ = await admin.list(PODS, NS, label_selector="app=web")
        return not left

    await eventually(gone, within=60, what="statefulset pods deleted")


async def test_a_job_runs_to_completion(
    kubelet: NodeKubelet,  # noqa: F811
    admin: RestClient,  # noqa: F811
) -> None:
    """The real Job controller counts the completions our kubelet reports."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ok", "namespace": NS},
        "spec": {
            "completions": 3,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [python("print('done')")],
                }
            },
        },
    }
    await admin.create(JOBS, NS, job)
    try:

        async def complete() -> JsonObj | None:
            current = await admin.get(JOBS, NS, "ok")
            done = conditions(current).get("Complete") == "True"
            return current if done else None

        finished = await eventually(complete, within=120, what="job complete")
        assert finished["status"]["succeeded"] == 3
        assert not finished["status"].get("failed")
        assert "completionTime" in finished["status"] and "startTime" in finished["status"]
        pods, _ = await admin.list(PODS, NS, label_selector="batch.kubernetes.io/job-name=ok")
        assert len(pods) == 3 and all(p["status"]["phase"] == "Succeeded" for p in pods)
        terminated = container_status(pods[0])["state"]["terminated"]
        assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    finally:
        await admin.delete(JOBS, NS, "ok", propagation_policy="Foreground")
