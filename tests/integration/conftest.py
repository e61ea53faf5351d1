"""Shared fixtures for integration tests: the real control plane and a kubectl runner.

``local_cluster`` is a namespace of its own, created for the test, on ONE control plane for the
whole session (``controlplane.ControlPlane``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler), which runs on an event loop in a thread of its own
(:class:`SessionControlPlane`): tests on any loop scope, and synchronous tests, can use it, and
blocking calls (the ``kubernetes`` client, ``subprocess.run``) cannot stall it. ``local_node``
adds a node (our kubelet and the claim provisioner) to that plane for tests that run Pods.
Operator stacks get a control plane each (``operator_harness``). :func:`run_kubectl` runs the
kubectl of the server's release (``kube kubectl``; the machine's is outside the version skew).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scalable_topics.controller.kube import KubeApi
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import GROUP, SEGMENT_PLURAL, TOPIC_PLURAL, VERSION
from scalable_topics.core.resources.segment import segment_manifest
from scalable_topics.localcluster.controlplane import ControlPlane, kube_binary
from scalable_topics.localcluster.nodekubelet import NodeKubelet
from scalable_topics.localcluster.provisioner import ClaimProvisioner
from scalable_topics.localcluster.restclient import (
    ApiError,
    Resource,
    RestClient,
    client_from_kubeconfig,
)
from segment_broker.testing import BrokerProcess

from .client_harness import OperatorReplica, broker_processes, start_operator

T = TypeVar("T")
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts")
TOPICS = Resource(GROUP, VERSION, TOPIC_PLURAL)
SEGMENTS = Resource(GROUP, VERSION, SEGMENT_PLURAL)
NODE_NAME = "local"
CRDS = Path(__file__).resolve().parents[2] / "crds"


@functools.cache
def pinned_kubectl() -> tuple[str, ...]:
    """``(kube, "kubectl")``: the kubectl of the control plane's release (built if missing)."""
    return (str(kube_binary()), "kubectl")


@dataclass
class KubectlResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


class KubectlTarget(Protocol):
    """What :func:`run_kubectl` needs of a cluster: ``LocalCluster`` or ``ControlPlane``."""

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def data_dir(self) -> Path: ...


async def run_kubectl(
    cluster: KubectlTarget,
    *args: str,
    input: str | None = None,
    check: bool = True,
    within: float = 60,
    kubectl: Sequence[str] | None = None,
) -> KubectlResult:
    """Run ``kubectl`` with ``KUBECONFIG=<cluster's>`` as a subprocess of the running loop.

    ``kubectl`` is the command: by default the pinned release's (:func:`pinned_kubectl`)."""
    if kubectl is None:
        kubectl = await asyncio.to_thread(pinned_kubectl)
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "KUBECACHEDIR": str(cluster.data_dir / "kubectl-cache"),
        "HOME": str(cluster.data_dir),
    }
    proc = await asyncio.create_subprocess_exec(
        *kubectl,
        *args,
        stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(
        proc.communicate(input.encode() if input is not None else None), within
    )
    result = KubectlResult(proc.returncode or 0, out.decode(), err.decode())
    if check and result.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result


async def eventually(
    predicate: Callable[[], Awaitable[bool] | bool], within: float = 30.0, interval: float = 0.05
) -> None:
    """Await ``predicate`` until it is true, failing after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(interval)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Metric samples by name and sorted ``(label, value)`` pairs."""


async def metric_samples(url: str) -> Samples:
    """Every sample a process (a broker, the operator) serves at ``<url>/metrics``."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class SessionControlPlane:
    """A :class:`ControlPlane` (and, on demand, one node) served by an event loop running in a
    thread of its own, for the whole test session.

    Everything that touches the plane's processes and clients runs on that loop
    (:meth:`call` from synchronous code, :meth:`run` from any other loop); the loop's thread
    lives until :meth:`close`, so the components (whose parent-death signal follows the thread
    that started them) live as long as the session.
    """

    def __init__(self, data_dir: Path, binary: Path, *, start_timeout: float = 180.0) -> None:
        self.plane = ControlPlane(data_dir, binary=binary)
        self.binary = binary
        self.start_timeout = start_timeout
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="session-control-plane", daemon=True
        )
        self._thread.start()
        self.admin: RestClient | None = None
        self.node: NodeKubelet | None = None
        self.provisioner: ClaimProvisioner | None = None
        self._node_lock = threading.Lock()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        """Run ``coro`` on the plane's loop and wait for it (from synchronous code)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the plane's loop, awaited from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def start(self) -> None:
        async def start() -> RestClient:
            await self.plane.start()
            return client_from_kubeconfig(self.plane.kubeconfig)

        self.admin = self.call(start(), self.start_timeout)

    def ensure_node(self, data_dir: Path) -> NodeKubelet:
        """Start the node (claim provisioner and kubelet, short restart back-off) once."""
        with self._node_lock:
            if self.node is None:

                async def start() -> tuple[ClaimProvisioner, NodeKubelet]:
                    provisioner = ClaimProvisioner(
                        client_from_kubeconfig(self.plane.kubeconfig), data_dir, NODE_NAME
                    )
                    await provisioner.start()
                    node = NodeKubelet.for_control_plane(
                        self.plane,
                        data_dir,
                        NODE_NAME,
                        backoff_base=0.5,
                        backoff_cap=2.0,
                        stop_grace=5.0,
                    )
                    await node.start()
                    return provisioner, node

                self.provisioner, self.node = self.call(start())
            return self.node

    def close(self) -> None:
        async def stop() -> None:
            try:
                if self.node is not None:
                    await self.node.stop()
                if self.provisioner is not None:
                    await self.provisioner.stop()
                    await self.provisioner.client.close()
                if self.admin is not None:
                    await self.admin.close()
            finally:
                await self.plane.stop()

        try:
            self.call(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()


@pytest.fixture(scope="session")
def session_plane(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionControlPlane]:
    """The session's control plane (see :class:`SessionControlPlane`); built first if this
    machine has no binary yet (progress shown live)."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
        binary = kube_binary()
    session = SessionControlPlane(tmp_path_factory.mktemp("session-plane"), binary)
    try:
        session.start()
        yield session
    finally:
        session.close()


@dataclass
class ClusterNamespace:
    """A namespace of the session's control plane, for one test.

    ``kubeconfig`` is the admin's with this namespace as its context's default, so ``kubectl``
    without ``-n`` works in it; ``data_dir`` holds it (and kubectl's cache)."""

    session: SessionControlPlane
    namespace: str
    kubeconfig: Path
    data_dir: Path

    @property
    def url(self) -> str:
        return self.session.plane.url

    @property
    def kube(self) -> Path:
        return self.session.binary

    async def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, within: float = 60
    ) -> KubectlResult:
        return await run_kubectl(
            self,
            *args,
            input=input,
            check=check,
            within=within,
            kubectl=(str(self.kube), "kubectl"),
        )

    async def apply_crds(self) -> None:
        """``kubectl apply -f crds/`` and wait until they are served (idempotent)."""
        await self.kubectl("apply", "-f", str(CRDS))
        await self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")


async def _new_namespace(admin: RestClient, name: str, within: float = 60.0) -> None:
    await admin.create(
        NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    # Pods are refused until the namespace's ServiceAccount exists (the controller-manager's
    # serviceaccount controller makes it).
    deadline = time.monotonic() + within
    while await admin.get_or_none(SERVICE_ACCOUNTS, name, "default") is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"no default ServiceAccount in {name} within {within}s")
        await asyncio.sleep(0.1)


async def _drop_namespace(admin: RestClient, name: str) -> None:
    """Delete it; the namespace controller empties it in the background."""
    try:
        await admin.delete(NAMESPACES, None, name)
    except ApiError as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def local_cluster(session_plane: SessionControlPlane, tmp_path: Path) -> Iterator[ClusterNamespace]:
    """A fresh namespace on the session's control plane, deleted after the test."""
    admin = session_plane.admin
    assert admin is not None
    name = f"t-{uuid.uuid4().hex[:10]}"
    session_plane.call(_new_namespace(admin, name))
    config = yaml.safe_load(session_plane.plane.kubeconfig.read_text())
    for context in config.get("contexts") or []:
        context["context"]["namespace"] = name
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.touch(mode=0o600)
    kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        yield ClusterNamespace(session_plane, name, kubeconfig, tmp_path)
    finally:
        session_plane.call(_drop_namespace(admin, name))


@dataclass(frozen=True)
class CrdClients:
    """The CRDs applied in ``local_cluster``'s namespace, and two clients of its API server:
    the tests' own (``api``) and the operator's (``kube``)."""

    namespace: str
    api: RestClient
    kube: KubeApi

    async def create_topic(self, name: str, initial_segments: int) -> dict[str, Any]:
        return await self.api.create(
            TOPICS,
            self.namespace,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ScalableTopic",
                "metadata": {"name": name},
                "spec": {"initialSegments": initial_segments},
            },
        )

    async def create_first_segments(
        self, topic: dict[str, Any], *, owned: bool = True
    ) -> list[dict[str, Any]]:
        """The Segment resources of the topic's first layout, in segment order, as the operator
        writes them (owned by the topic, or ``owned=False``: orphaned, as a topic's deletion
        leaves them)."""
        meta = topic["metadata"]
        layout = SegmentLayout.initial(topic["spec"]["initialSegments"])
        created = []
        for sid, info in sorted(layout.segments.items()):
            body = segment_manifest(
                topic=meta["name"],
                namespace=self.namespace,
                topic_uid=meta["uid"],
                segment_id=sid,
                hash_range=info.hash_range,
            )
            if not owned:
                body["metadata"]["ownerReferences"] = []
            created.append(await self.api.create(SEGMENTS, self.namespace, body))
        return created


@pytest.fixture
async def crd_clients(local_cluster: ClusterNamespace) -> AsyncIterator[CrdClients]:
    await local_cluster.apply_crds()
    api = client_from_kubeconfig(local_cluster.kubeconfig)
    kube = await KubeApi.connect(str(local_cluster.kubeconfig))
    try:
        yield CrdClients(local_cluster.namespace, api, kube)
    finally:
        await api.close()
        await kube.close()


@pytest.fixture
def local_node(
    session_plane: SessionControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> NodeKubelet:
    """Node ``local`` of the session's control plane (started by the first test asking)."""
    return session_plane.ensure_node(tmp_path_factory.getbasetemp() / "session-node")


@pytest.fixture
def kubectl(local_cluster: ClusterNamespace) -> Callable[..., Awaitable[KubectlResult]]:
    """``await kubectl("get", "pods", "-o", "json")`` in ``local_cluster``'s namespace."""

    async def run(*args: str, input: str | None = None, check: bool = True) -> KubectlResult:
        return await local_cluster.kubectl(*args, input=input, check=check)

    return run


# -- client tests: real broker processes and one operator session server ---------------------


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    """Two real broker processes shared by a test module."""
    with broker_processes(tmp_path_factory.mktemp("brokers"), 2) as procs:
        yield procs


@pytest.fixture
async def operator() -> AsyncIterator[OperatorReplica]:
    """The operator's real session server over an in-memory DAG source (client_harness)."""
    replica = await start_operator()
    yield replica
    await replica.stop()
