"""The operator's integration stack on the real control plane: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler (``localcluster.controlplane.ControlPlane``), our
kubelet as its one node (``localcluster.nodekubelet.NodeKubelet``) and the claim provisioner,
the CRDs, and ``manifests/overlays/local`` applied with the pinned ``kubectl`` — three broker
pods (StatefulSet ``segment-broker``) and the operator Deployment run as local processes, each
under its own ServiceAccount, authorized by the Roles of ``manifests/`` through real RBAC.

Each stack gets a control plane of its own (a module-scoped fixture in each test module): the
operator is cluster-scoped (CRDs, ClusterRoles, cluster-wide watches of topics and pods), so two
stacks in one cluster would see each other's topics and brokers.

Operator processes can also be started directly (:meth:`Stack.start_operator`), e.g. with the
``SCALABLE_TOPICS_FAULT`` hook of ``controller/protocol.py``; they are real processes too, and
authenticate with a token of the operator's ServiceAccount, so RBAC applies to them as well.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from scalable_topics.core.jsontypes import JsonObj as JsonObj
from scalable_topics.localcluster.controlplane import ControlPlane, kube_binary
from scalable_topics.localcluster.datadir import HOLDER_FILE, LOCK_FILE, MARKER_FILE
from scalable_topics.localcluster.nodekubelet import NodeKubelet
from scalable_topics.localcluster.provisioner import ClaimProvisioner
from scalable_topics.localcluster.restclient import (
    PODS,
    ApiError,
    Resource,
    RestClient,
    client_from_kubeconfig,
)
from segment_broker.testing import free_port

from .conftest import SEGMENTS as SEGMENTS
from .conftest import TOPICS as TOPICS
from .conftest import KubectlResult, run_kubectl

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "manifests" / "overlays" / "local"
NAMESPACE = "scalable-topics"
OPERATOR_DEPLOYMENT = "scalable-topics-operator"

LEASES = Resource("coordination.k8s.io", "v1", "leases")
EVENTS = Resource("", "v1", "events")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
SHARD_LEASE = "scalable-topics-shard-0"
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts")
OPERATOR_SERVICE_ACCOUNT = "scalable-topics-operator"
NODE_NAME = "local"


async def eventually(
    probe: Callable[[], Awaitable[T | None]], within: float = 60.0, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            value = await probe()
        except (AssertionError, aiohttp.ClientError, OSError) as exc:
            value, last = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within}s (last: {last!r})")
        await asyncio.sleep(0.1)


def condition_of(obj: JsonObj | None, type_: str) -> JsonObj | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


@dataclass
class OperatorProcess:
    """An operator replica started by the test (not by the kubelet)."""

    proc: asyncio.subprocess.Process
    identity: str
    url: str
    log_path: Path

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def wait(self, within: float) -> int:
        return await asyncio.wait_for(self.proc.wait(), within)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Stack:
    cluster: ControlPlane
    kubelet: NodeKubelet
    api: RestClient
    http: aiohttp.ClientSession
    data_dir: Path
    broker_port: int
    kube: Path
    """The multi-call binary: ``(kube, "kubectl")`` is the kubectl of the server's release."""
    operators: list[OperatorProcess] = field(default_factory=list)

    # -- kubectl and the API -------------------------------------------------------------------

    async def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, within: float = 60
    ) -> KubectlResult:
        return await run_kubectl(
            self.cluster,
            *args,
            input=input,
            check=check,
            within=within,
            kubectl=(str(self.kube), "kubectl"),
        )

    async def topic(self, name: str, namespace: str = "default") -> JsonObj | None:
        return await self.api.get_or_none(TOPICS, namespace, name)

    async def segments(self, topic: str, namespace: str = "default") -> dict[int, JsonObj]:
        items, _ = await self.api.list(
            SEGMENTS, namespace, label_selector=f"scalabletopics.io/topic={topic}"
        )
        return {int(s["spec"]["segmentId"]): s for s in items}

    async def events(self, name: str, namespace: str = "default") -> list[JsonObj]:
        items, _ = await self.api.list(
            EVENTS, namespace, field_selector=f"involvedObject.name={name}"
        )
        return items

    async def lease(self) -> JsonObj | None:
        return await self.api.get_or_none(LEASES, NAMESPACE, SHARD_LEASE)

    async def pods(self, label: str) -> list[JsonObj]:
        items, _ = await self.api.list(PODS, NAMESPACE, label_selector=label)
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    async def ready_pods(self, label: str) -> list[JsonObj]:
        return [
            p
            for p in await self.pods(label)
            if (condition_of(p, "Ready") or {}).get("status") == "True"
        ]

    async def broker_urls(self) -> dict[str, str]:
        pods = await self.ready_pods("app.kubernetes.io/name=segment-broker")
        port = self.broker_port
        return {p["metadata"]["name"]: f"http://{p['status']['podIP']}:{port}" for p in pods}

    async def scale_operator(self, replicas: int) -> None:
        await self.api.patch(
            DEPLOYMENTS, NAMESPACE, OPERATOR_DEPLOYMENT, {"spec": {"replicas": replicas}}
        )
        label = "app.kubernetes.io/name=scalable-topics-operator"

        async def scaled() -> bool:
            return len(await self.pods(label)) == replicas and (
                replicas == 0 or len(await self.ready_pods(label)) == replicas
            )

        await eventually(scaled, 90, f"{replicas} operator pod(s)")

    # -- brokers -------------------------------------------------------------------------------

    async def broker_get(self, url: str, path: str) -> tuple[int, Any]:
        async with self.http.get(url + path) as response:
            return response.status, await response.json(content_type=None)

    async def broker_segments(self, topic: str, namespace: str = "default") -> dict[int, str]:
        """Segment id → broker URL for every segment of the topic hosted on any broker."""
        found: dict[int, str] = {}
        for url in (await self.broker_urls()).values():
            status, body = await self.broker_get(url, "/admin/v1/segments")
            assert status == 200, body
            for seg in body.get("segments") or []:
                if seg.get("namespace") == namespace and seg.get("topic") == topic:
                    found[int(seg["segmentId"])] = url
        return found

    async def segment_stats(
        self, url: str, topic: str, segment_id: int, namespace: str = "default"
    ) -> JsonObj | None:
        status, body = await self.broker_get(
            url, f"/admin/v1/segments/{namespace}/{topic}/{segment_id}"
        )
        return body if status == 200 else None

    # -- operator processes ----------------------------------------------------------------------

    async def start_operator(
        self,
        identity: str,
        *,
        fault: str | None = None,
        lease_duration: float = 3.0,
        renew_deadline: float = 2.0,
        retry_period: float = 0.5,
        extra: tuple[str, ...] = (),
    ) -> OperatorProcess:
        port = free_port()
        log_path = self.data_dir / f"operator-{identity}.log"
        kubeconfig = await self.operator_kubeconfig()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        env.pop("SCALABLE_TOPICS_FAULT", None)
        if fault:
            env["SCALABLE_TOPICS_FAULT"] = fault
        with log_path.open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "scalable_topics.controller",
                "--kubeconfig",
                str(kubeconfig),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--namespace",
                NAMESPACE,
                "--identity",
                identity,
                "--broker-port",
                str(self.broker_port),
                "--lease-duration",
                str(lease_duration),
                "--renew-deadline",
                str(renew_deadline),
                "--retry-period",
                str(retry_period),
                *extra,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
            )
        op = OperatorProcess(proc, identity, f"http://127.0.0.1:{port}", log_path)
        self.operators.append(op)
        return op

    async def operator_kubeconfig(self) -> Path:
        """A kubeconfig with a token of the operator's ServiceAccount (TokenRequest, one hour),
        so an operator started by the test has exactly the rights of the operator's pods."""
        path = self.data_dir / "operator.kubeconfig"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        }
        review = await self.api.request(
            "POST",
            SERVICE_ACCOUNTS.path(NAMESPACE, OPERATOR_SERVICE_ACCOUNT, "token"),
            body=request,
        )
        ca = base64.b64encode(self.cluster.ca_path.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.cluster.url, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": "operator", "user": {"token": review["status"]["token"]}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "operator"}}],
            "current-context": "local",
        }
        path.touch(mode=0o600)
        path.write_text(json.dumps(config))
        return path

    async def stop_operators(self) -> None:
        for op in self.operators:
            if op.proc.returncode is None:
                op.proc.send_signal(signal.SIGTERM)
        for op in self.operators:
            try:
                await op.wait(15)
            except TimeoutError:
                op.kill()
                await op.wait(5)
        self.operators.clear()

    async def leader(self) -> str:
        """The pod (or ``--identity``) of the shard's leader: the Lease holder is
        ``<identity>_<process uuid>``."""
        lease = await self.lease()
        holder = str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
        return holder.rsplit("_", 1)[0]

    # -- topics ----------------------------------------------------------------------------------

    async def apply_topic(self, body: JsonObj) -> None:
        await self.kubectl("apply", "-f", "-", input=json.dumps(body))

    async def wait_ready(
        self, name: str, within: float = 60, namespace: str = "default"
    ) -> JsonObj:
        async def ready() -> JsonObj | None:
            topic = await self.topic(name, namespace)
            cond = condition_of(topic, "Ready")
            gen = (topic or {}).get("metadata", {}).get("generation")
            if (
                cond
                and cond.get("status") == "True"
                and (topic or {}).get("status", {}).get("observedGeneration") == gen
            ):
                return topic
            return None

        return await eventually(ready, within, f"{namespace}/{name} Ready")

    async def lose_status(self, name: str, namespace: str = "default") -> JsonObj:
        """Replace the topic's status with an empty one (the status subresource), as a restore
        from a backup without status does; returns the status it had."""
        while True:
            topic = await self.topic(name, namespace)
            assert topic is not None, f"{namespace}/{name} not found"
            try:
                await self.api.request(
                    "PUT", TOPICS.path(namespace, name, "status"), body={**topic, "status": {}}
                )
            except ApiError as exc:
                if exc.status == 409:  # the operator wrote in between: read it again
                    continue
                raise
            return dict(topic.get("status") or {})

    async def request(self, name: str, request: JsonObj, namespace: str = "default") -> None:
        await self.kubectl(
            "annotate",
            "--overwrite",
            "-n",
            namespace,
            f"stopic/{name}",
            f"scalabletopics.io/request={json.dumps(request)}",
        )

    async def wait_request(
        self, name: str, request_id: str, within: float = 60, namespace: str = "default"
    ) -> JsonObj:
        async def done() -> JsonObj | None:
            topic = await self.topic(name, namespace)
            last = ((topic or {}).get("status") or {}).get("lastRequest") or {}
            if last.get("id") == request_id and not topic["status"].get("operation"):  # type: ignore[index]
                return topic
            return None

        return await eventually(done, within, f"request {request_id} on {name}")


def topic_body(name: str, *, segments: int = 2, **spec: Any) -> JsonObj:
    return {
        "apiVersion": "scalabletopics.io/v1alpha1",
        "kind": "ScalableTopic",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "initialSegments": segments,
            "subscriptions": [{"name": "billing", "type": "Stream"}],
            **spec,
        },
    }


def write_overlay(
    directory: Path,
    broker_port: int,
    operator_port: int,
    *,
    operator_replicas: int = 2,
    brokers: int = 3,
) -> Path:
    """A kustomization on top of ``manifests/overlays/local`` that moves the ports (a second
    guard, besides each cluster's own loopback subnet, against test stacks running at the same
    time colliding), sets the replica counts, and suspends the recommender CronJob."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = {"httpGet": {"path": "/healthz", "port": broker_port}}
    broker = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "segment-broker", "namespace": NAMESPACE},
        "spec": {
            "replicas": brokers,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "broker",
                            "command": [
                                "python",
                                "-m",
                                "segment_broker",
                                "--host",
                                "$(POD_IP)",
                                "--port",
                                str(broker_port),
                                "--data-dir",
                                "/var/lib/segment-broker",
                            ],
                            "ports": [
                                {"$patch": "replace"},
                                {"name": "http", "containerPort": broker_port},
                            ],
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": broker_port}},
                            "startupProbe": probe,
                            "livenessProbe": probe,
                        }
                    ]
                }
            },
        },
    }
    operator = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": OPERATOR_DEPLOYMENT, "namespace": NAMESPACE},
        "spec": {
            "replicas": operator_replicas,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "operator",
                            "args": [
                                "--host=$(POD_IP)",
                                f"--port={operator_port}",
                                "--namespace=$(POD_NAMESPACE)",
                                "--identity=$(POD_NAME)",
                                "--shards=1",
                                f"--broker-port={broker_port}",
                                "--lease-duration=6",
                                "--renew-deadline=4",
                                "--retry-period=1",
                                "--resync-interval=30",
                            ],
                            "ports": [
                                {"$patch": "replace"},
                                {"name": "http", "containerPort": operator_port},
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": operator_port}
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/healthz", "port": operator_port}
                            },
                        }
                    ]
                }
            },
        },
    }
    # The recommender's Spark job would start a JVM whenever a test spans a 10-minute mark.
    recommender = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "scalable-topics-recommender", "namespace": NAMESPACE},
        "spec": {"suspend": True},
    }
    (directory / "recommender.json").write_text(json.dumps(recommender))
    (directory / "broker.json").write_text(json.dumps(broker))
    (directory / "operator.json").write_text(json.dumps(operator))
    (directory / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(OVERLAY, directory)],
                "patches": [
                    {"path": "broker.json"},
                    {"path": "operator.json"},
                    {"path": "recommender.json"},
                ],
            }
        )
    )
    return directory


TEMPLATE_DIR = "control-plane-template"
_TEMPLATE_DONE = ".complete"
_NOT_COPIED = shutil.ignore_patterns(LOCK_FILE, HOLDER_FILE, MARKER_FILE, _TEMPLATE_DONE, "logs")


async def control_plane_template(root: Path, kube: Path) -> Path:
    """The data directory of a control plane started once on a fresh directory and stopped:
    its PKI, and etcd holding what a first start makes (bootstrap RBAC, system namespaces, the
    controllers' ServiceAccounts, ``default``'s ServiceAccount). Made once under ``root`` (the
    session's base temporary directory); each stack starts on a copy, a restart (~4 s) instead
    of a first start (~10 s, most of it waiting for the controller-manager's ServiceAccounts)."""
    template = root / TEMPLATE_DIR
    if not (template / _TEMPLATE_DONE).is_file():
        staging = root / f".{TEMPLATE_DIR}.{os.getpid()}"
        await asyncio.to_thread(shutil.rmtree, staging, True)
        plane = ControlPlane(staging, binary=kube)
        await plane.start()
        await plane.stop()
        (staging / _TEMPLATE_DONE).touch()
        await asyncio.to_thread(shutil.rmtree, template, True)
        staging.rename(template)
    return template


@contextlib.asynccontextmanager
async def operator_stack(
    tmp_path: Path, *, operator_replicas: int = 2, brokers: int = 3
) -> AsyncIterator[Stack]:
    """A control plane of its own (see the module; started on a copy of
    :func:`control_plane_template`), the claim provisioner and one node
    (kubelet with short restart back-off and grace), ``kubectl apply -f crds/`` and
    ``-k manifests/overlays/local``; waits for the brokers and ``operator_replicas`` operator
    pods (0: none, tests start their own)."""
    data_dir = tmp_path / "cluster"
    kube = await asyncio.to_thread(kube_binary)
    template = await control_plane_template(tmp_path.parent, kube)
    await asyncio.to_thread(shutil.copytree, template, data_dir, ignore=_NOT_COPIED)
    async with contextlib.AsyncExitStack() as cleanup:
        plane = ControlPlane(data_dir, binary=kube, stop_grace=5.0)
        await plane.start()
        cleanup.push_async_callback(plane.stop)
        provisioner = ClaimProvisioner(
            client_from_kubeconfig(plane.kubeconfig), data_dir, NODE_NAME
        )
        cleanup.push_async_callback(provisioner.client.close)
        await provisioner.start()
        cleanup.push_async_callback(provisioner.stop)
        kubelet = NodeKubelet.for_control_plane(
            plane,
            data_dir,
            NODE_NAME,
            backoff_base=0.5,
            backoff_cap=2.0,
            stop_grace=5.0,
        )
        await kubelet.start()
        cleanup.push_async_callback(kubelet.stop)
        api = client_from_kubeconfig(plane.kubeconfig)
        cleanup.push_async_callback(api.close)
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15))
        cleanup.push_async_callback(http.close)
        broker_port = random.randint(20000, 32000)
        stack = Stack(plane, kubelet, api, http, data_dir, broker_port, kube)
        cleanup.push_async_callback(stack.stop_operators)
        await stack.kubectl("apply", "-f", str(REPO / "crds"))
        await stack.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        # = kubectl apply -k manifests/overlays/local, on ports of this stack's own
        overlay = write_overlay(
            tmp_path / "overlay",
            broker_port,
            broker_port + 1,
            operator_replicas=operator_replicas,
            brokers=brokers,
        )
        await stack.kubectl("apply", "-k", str(overlay))

        async def brokers_ready() -> bool:
            return len(await stack.broker_urls()) == brokers

        await eventually(brokers_ready, 120, f"{brokers} ready brokers")
        if operator_replicas:
            await stack.scale_operator(operator_replicas)

            async def led() -> bool:
                return bool(await stack.leader())

            await eventually(led, 60, "a shard leader")
        yield stack
